"""The prompt-embedding file: a real text encoder's output for a fixed list of prompts, computed
once on a machine that has the encoder's weights, read at run time without torch or downloads.

Format (version 1): one safetensors file (``spotlight_jax.io.safetensors_format``) with

* ``embeds`` ``[N + 1, L, D]``: the encoder's per-token embeddings (float32, bfloat16 or float16,
  as the encoder produced them);
* ``mask`` ``[N + 1, L]`` bool: True on real tokens (the model's text key mask);
* ``pooled`` ``[N + 1, P]`` (optional): the pooled embedding of families that have one (SD3);
* ``__metadata__`` (strings): ``format`` (``FORMAT``), ``version``, ``family`` (e.g. ``sd3``,
  ``qwen_image``), ``encoder`` (what produced it), ``prompts`` and ``splits`` (JSON lists of
  the N + 1 prompts and their splits: ``train``, ``val``, or ``""`` for the empty prompt) and
  ``info`` (a JSON object, e.g. the encoder's ``max_sequence_length``).

An *edit file* (an image-editing pipeline's, e.g. Qwen-Image-Edit: its text encoder sees the
input image with the instruction) keys each row by an (instruction, input image) pair and adds

* ``image_latents`` ``[M, H', W', C]``: the VAE latents of the M distinct input images, channels
  last and normalised as the pipeline feeds them to its transformer (the model's
  ``image_latents``);
* ``image_index`` ``[N + 1]`` int64: each row's input image (an index into ``image_latents``);
* metadata ``instructions`` (each row's instruction) and ``images`` (the M images' names, as the
  encoder's input listed them), with each row's prompt the key :func:`edit_key` of its pair.

Its first M rows are the null prompts, one per image in ``images`` order: the empty instruction
with that image (split ``""``), since the encoder's empty prompt depends on the image it sees;
every other row's null prompt is its image's. A text-only file has neither tensor and reads as
before.

Row ``EMPTY_INDEX`` (0) is the empty prompt ``""`` (an edit file's: its first image's null
prompt): the null prompt of classifier-free guidance, encoded like any other prompt. ``L`` is
fixed for the file: rows are padded with zero embeddings and False mask entries to the longest
row, or hold whatever fixed length the encoder produces (SD3: 77 CLIP + ``max_sequence_length``
T5 tokens, all real). A reader pads to a model's
``text_len`` on lookup and never truncates: dropping real tokens would silently change what the
model is conditioned on.
"""
from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

import numpy as np

from spotlight_jax.io import safetensors_format

FORMAT = "spotlight_jax.prompt_embeddings"
VERSION = 1
EMPTY_INDEX = 0
SPLITS = ("train", "val")
_HOW_TO_WRITE = "write one with python -m spotlight_jax.tools.encode_prompts"
EDIT_SEPARATOR = " | "
# the tensors and metadata only an edit file has
EDIT_TENSORS, EDIT_METADATA = ("image_latents", "image_index"), ("instructions", "images")


class PromptEmbeddingError(ValueError):
    """A prompt-embedding file that cannot be used (the message names the file and the fix)."""


def edit_key(instruction: str, image: str) -> str:
    """The prompt of an (instruction, input image) pair: how a run's prompt pools list it and an
    edit file looks its row up (``"make the sky red | beach.jpg"``; an image's null prompt is
    ``" | beach.jpg"``). ``image`` is the image's name as the encoder's input listed it."""
    return f"{instruction}{EDIT_SEPARATOR}{image}"


def pad_rows(embeds: Sequence[np.ndarray], masks: Sequence[np.ndarray] | None = None,
             length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Ragged rows ``[L_i, D]`` (with their ``[L_i]`` masks; None = all real) stacked into
    ``([N, L, D], [N, L])``, padded with zeros and False to ``length`` (None = the longest)."""
    masks = [np.ones(len(e), bool) for e in embeds] if masks is None else masks
    longest = max((len(e) for e in embeds), default=0)
    length = longest if length is None else int(length)
    if length < longest:
        raise PromptEmbeddingError(f"length={length}: shorter than the longest row ({longest} "
                                   "tokens); pad to at least that")
    dim = int(np.shape(embeds[0])[-1]) if len(embeds) else 0
    dtype = np.asarray(embeds[0]).dtype if len(embeds) else np.float32
    out = np.zeros((len(embeds), length, dim), dtype)
    out_mask = np.zeros((len(embeds), length), bool)
    for i, (e, m) in enumerate(zip(embeds, masks)):
        out[i, :len(e)] = e
        out_mask[i, :len(m)] = np.asarray(m, bool)
    return out, out_mask


def write(path, prompts: Sequence[str], embeds, mask, pooled=None, *, splits=None,
          family: str, encoder: str, info: dict | None = None) -> None:
    """Writes a prompt-embedding file (the format in the module docstring).

    ``prompts[0]`` must be the empty prompt ``""``, with its embedding in row 0; ``splits``
    gives each other prompt's split (None = all ``train``); row 0's split is ``""``.
    """
    path = pathlib.Path(path)
    prompts = list(prompts)
    embeds, mask = np.asarray(embeds), np.asarray(mask)
    splits = [""] + ["train"] * (len(prompts) - 1) if splits is None else list(splits)
    if len(splits) != len(prompts):
        raise PromptEmbeddingError(f"{path}: {len(splits)} splits for {len(prompts)} prompts; "
                                   "give one split per prompt")
    tensors = {"embeds": embeds, "mask": mask}
    if pooled is not None:
        tensors["pooled"] = np.asarray(pooled)
    _save(path, prompts, splits, tensors, family=family, encoder=encoder, info=info)


def _save(path, prompts, splits, tensors, *, family, encoder, info, edits=None) -> None:
    meta = {"format": FORMAT, "version": str(VERSION), "family": str(family),
            "encoder": str(encoder), "prompts": json.dumps(prompts),
            "splits": json.dumps(splits), "info": json.dumps(info or {})}
    if edits is not None:
        meta.update({k: json.dumps(list(v)) for k, v in zip(EDIT_METADATA, edits)})
    check(path, prompts, splits, tensors, edits)
    safetensors_format.save(path, tensors, meta)


def write_edits(path, instructions: Sequence[str], image_index, images: Sequence[str],
                image_latents, embeds, mask, pooled=None, *, splits, family: str, encoder: str,
                info: dict | None = None) -> None:
    """Writes an edit file (the format in the module docstring): row i is the pair
    (``instructions[i]``, ``images[image_index[i]]``), its prompt their :func:`edit_key`;
    ``image_latents [M, H', W', C]`` are the ``images``' latents. The first M rows must be the
    images' null prompts (instruction ``""``, image m in row m, split ``""``)."""
    path = pathlib.Path(path)
    instructions, images = [str(i) for i in instructions], [str(i) for i in images]
    image_index = np.asarray(image_index, np.int64)
    if len(image_index) != len(instructions) or (
            len(images) and not 0 <= image_index.min() <= image_index.max() < len(images)):
        raise PromptEmbeddingError(f"{path}: image_index must give each of the "
                                   f"{len(instructions)} rows one of the {len(images)} images")
    prompts = [edit_key(t, images[k]) for t, k in zip(instructions, image_index)]
    tensors = {"embeds": np.asarray(embeds), "mask": np.asarray(mask),
               "image_latents": np.asarray(image_latents), "image_index": image_index}
    if pooled is not None:
        tensors["pooled"] = np.asarray(pooled)
    if len(splits) != len(prompts):
        raise PromptEmbeddingError(f"{path}: {len(splits)} splits for {len(prompts)} rows; "
                                   "give one split per row")
    _save(path, prompts, list(splits), tensors, family=family, encoder=encoder, info=info,
          edits=(instructions, images))


def check(path, prompts: list, splits: list, tensors: dict, edits=None) -> None:
    """Raises :class:`PromptEmbeddingError` naming the first thing wrong with a file's parts
    (``edits``: an edit file's ``(instructions, images)`` metadata, None for a text-only
    file)."""
    def bad(why):
        raise PromptEmbeddingError(f"{path}: {why}")

    if not all(isinstance(p, str) for p in prompts):
        bad("prompts must be strings")
    has = [k for k in EDIT_TENSORS if k in tensors]
    if (has or edits is not None) and (edits is None or len(has) < len(EDIT_TENSORS)):
        bad(f"an edit file needs both tensors {EDIT_TENSORS} and the metadata {EDIT_METADATA}"
            f"; this one has {has or 'no tensor'} and {'no' if edits is None else 'the'} "
            f"metadata; {_HOW_TO_WRITE}")
    if edits is not None:
        _check_edits(bad, prompts, splits, tensors, *edits)
    elif not prompts or prompts[EMPTY_INDEX] != "":
        first = repr(prompts[0]) if prompts else "nothing"
        bad(f'row {EMPTY_INDEX} must be the empty prompt "" (the null prompt of '
            f"classifier-free guidance), found {first}; {_HOW_TO_WRITE}")
    seen = set()
    for p in prompts:
        if p in seen:
            bad(f"prompt {p!r} appears twice; keep one row per prompt")
        seen.add(p)
    if len(splits) != len(prompts):
        bad(f"{len(splits)} splits for {len(prompts)} prompts; {_HOW_TO_WRITE}")
    nulls = len(edits[1]) if edits is not None else 1      # rows that are null prompts
    wrong = [s for i, s in enumerate(splits) if i >= nulls and s not in SPLITS]
    if wrong or any(splits[:nulls]):
        bad(f"split {wrong[0] if wrong else next(s for s in splits[:nulls] if s)!r}: each "
            f"prompt's split must be one of {SPLITS} (the null prompts' \"\")")
    if "embeds" not in tensors or "mask" not in tensors:
        bad(f"no {'embeds' if 'embeds' not in tensors else 'mask'} tensor; {_HOW_TO_WRITE}")
    e, m = tensors["embeds"], tensors["mask"]
    if e.ndim != 3 or e.shape[0] != len(prompts):
        bad(f"embeds has shape {list(e.shape)}; it must be [prompts + 1 = {len(prompts)}, L, D]")
    if not (np.issubdtype(e.dtype, np.floating) or e.dtype.name == "bfloat16"):
        bad(f"embeds has dtype {e.dtype}; it must be a float type")
    if m.shape != e.shape[:2] or m.dtype != np.bool_:
        bad(f"mask is {m.dtype} {list(m.shape)}; it must be bool {list(e.shape[:2])} "
            "(True on real tokens)")
    p = tensors.get("pooled")
    if p is not None and (p.ndim != 2 or p.shape[0] != len(prompts)):
        bad(f"pooled has shape {list(p.shape)}; it must be [prompts + 1 = {len(prompts)}, P]")


def _check_edits(bad, prompts, splits, tensors, instructions, images) -> None:
    """The edit file's own rules (module docstring): one instruction per row, the images'
    latents and each row's image, the first M rows the images' null prompts, each row's prompt
    the key of its pair."""
    if not all(isinstance(x, str) for x in [*instructions, *images]):
        bad("instructions and images must be strings")
    if len(instructions) != len(prompts) or not prompts:
        bad(f"{len(instructions)} instructions for {len(prompts)} rows; {_HOW_TO_WRITE}")
    lat, index = tensors["image_latents"], tensors["image_index"]
    if lat.ndim != 4 or lat.shape[0] != len(images) or not len(images):
        bad(f"image_latents has shape {list(lat.shape)}; it must be [images = {len(images)} "
            "(at least 1), H', W', C]")
    if not (np.issubdtype(lat.dtype, np.floating) or lat.dtype.name == "bfloat16"):
        bad(f"image_latents has dtype {lat.dtype}; it must be a float type")
    if (index.shape != (len(prompts),) or not np.issubdtype(index.dtype, np.integer)
            or index.min() < 0 or index.max() >= len(images)):
        bad(f"image_index is {index.dtype} {list(index.shape)}; it must be integer "
            f"[{len(prompts)}] indices into the {len(images)} images")
    m = len(images)
    if len(prompts) < m or any(instructions[:m]) or list(index[:m]) != list(range(m)):
        bad(f"the first {m} rows must be the null prompts of the {m} images in order (the "
            f"empty instruction with image i in row i); {_HOW_TO_WRITE}")
    for i, (t, k) in enumerate(zip(instructions, index)):
        if i >= m and not t:
            bad(f"row {i} has an empty instruction for image {images[k]!r}, whose null prompt "
                f"is row {k}; give each edit row an instruction")
        if prompts[i] != edit_key(t, images[k]):
            bad(f"row {i}'s prompt {prompts[i]!r} is not the key of its pair "
                f"{edit_key(t, images[k])!r}; {_HOW_TO_WRITE}")


def read(path) -> PromptEmbeddings:
    """The prompt-embedding file at ``path`` (tensors memory-mapped), checked."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise PromptEmbeddingError(f"{path}: no such prompt-embedding file; {_HOW_TO_WRITE}")
    try:
        meta = safetensors_format.metadata(path)
        tensors = safetensors_format.load(path)
    except safetensors_format.SafetensorsError as e:
        raise PromptEmbeddingError(f"{e}; {_HOW_TO_WRITE}") from e
    if meta.get("format") != FORMAT:
        raise PromptEmbeddingError(f"{path}: not a prompt-embedding file (metadata format="
                                   f"{meta.get('format')!r}, expected {FORMAT!r}); "
                                   f"{_HOW_TO_WRITE}")
    if meta.get("version") != str(VERSION):
        raise PromptEmbeddingError(f"{path}: format version {meta.get('version')!r}; this "
                                   f"reader reads version {VERSION}: re-run "
                                   "python -m spotlight_jax.tools.encode_prompts")
    try:
        prompts, splits = json.loads(meta["prompts"]), json.loads(meta["splits"])
        info = json.loads(meta.get("info", "{}"))
    except (KeyError, json.JSONDecodeError) as e:
        raise PromptEmbeddingError(f"{path}: metadata prompts/splits/info unreadable ({e!r}); "
                                   f"{_HOW_TO_WRITE}") from e
    edits = None
    if any(k in meta for k in EDIT_METADATA):
        try:
            edits = tuple(json.loads(meta[k]) for k in EDIT_METADATA)
        except (KeyError, json.JSONDecodeError) as e:
            raise PromptEmbeddingError(f"{path}: metadata instructions/images unreadable "
                                       f"({e!r}); {_HOW_TO_WRITE}") from e
    check(path, prompts, splits, tensors, edits)
    return PromptEmbeddings(path, prompts, splits, tensors, family=meta.get("family", ""),
                            encoder=meta.get("encoder", ""), info=info, edits=edits)


class PromptEmbeddings:
    """A read prompt-embedding file: the prompts it holds, and batched lookup of their rows."""

    def __init__(self, path, prompts, splits, tensors, *, family, encoder, info, edits=None):
        self.path, self.family, self.encoder, self.info = pathlib.Path(path), family, encoder, info
        self.all_prompts, self.splits = list(prompts), list(splits)
        self.embeds, self.mask = tensors["embeds"], tensors["mask"]
        self.pooled = tensors.get("pooled")
        self._row = {p: i for i, p in enumerate(self.all_prompts)}
        # an edit file's rows: instruction, input image (name, latents); None for text-only
        self.instructions, self.images = (None, None) if edits is None else map(list, edits)
        self.image_latents = tensors.get("image_latents")
        self.image_index = tensors.get("image_index")

    @property
    def is_edit(self) -> bool:
        """Whether rows are (instruction, input image) pairs carrying the image's latents."""
        return self.image_latents is not None

    @property
    def latent_shape(self) -> tuple[int, int, int] | None:
        """``(H', W', C)`` of the input images' latents; None for a text-only file."""
        return None if self.image_latents is None else tuple(self.image_latents.shape[1:])

    @property
    def text_len(self) -> int:
        """``L``: tokens per prompt in the file."""
        return int(self.embeds.shape[1])

    @property
    def dim(self) -> int:
        """``D``: the width of a token embedding."""
        return int(self.embeds.shape[2])

    @property
    def pooled_dim(self) -> int | None:
        """``P``: the width of the pooled embedding, None when the family has none."""
        return None if self.pooled is None else int(self.pooled.shape[1])

    def prompts(self, split: str | None = None) -> list[str]:
        """The file's prompts (not the null ones), in file order; only ``split``'s if given."""
        return [p for p, s in zip(self.all_prompts, self.splits)
                if s and (split is None or s == split)]

    def rows(self, prompts: Sequence[str]) -> np.ndarray:
        """Row indices of ``prompts``; a prompt the file lacks is an error naming it."""
        if isinstance(prompts, str):
            raise PromptEmbeddingError(f"prompts={prompts!r}: expected a list of prompts, got "
                                       "one str")
        out = np.empty(len(prompts), np.int64)
        for i, p in enumerate(prompts):
            row = self._row.get(p)
            if row is None:
                raise PromptEmbeddingError(
                    f"prompt {p!r} is not in {self.path} ({len(self._row) - 1} prompts); add it: "
                    "re-run python -m spotlight_jax.tools.encode_prompts with it among the prompts")
            out[i] = row
        return out

    def lookup(self, prompts: Sequence[str], text_len: int | None = None):
        """``(embeds float32 [B, T, D], mask bool [B, T], pooled float32 [B, P] or None)`` of
        ``prompts`` in order, padded (zeros, False) to ``T = text_len`` (None = the file's L)."""
        idx = self.rows(prompts)
        t = self.text_len if text_len is None else int(text_len)
        if t < self.text_len:
            raise PromptEmbeddingError(
                f"text_len={t}: shorter than the {self.text_len} tokens per prompt of "
                f"{self.path}; use a text_len >= {self.text_len} (tokens are never truncated)")
        embeds = np.zeros((len(idx), t, self.dim), np.float32)
        mask = np.zeros((len(idx), t), bool)
        embeds[:, :self.text_len] = np.asarray(self.embeds[idx], np.float32)
        mask[:, :self.text_len] = self.mask[idx]
        pooled = None if self.pooled is None else np.asarray(self.pooled[idx], np.float32)
        return embeds, mask, pooled

    def input_latents(self, prompts: Sequence[str]) -> np.ndarray:
        """An edit file's input-image latents of ``prompts`` in order, float32 ``[B, H', W',
        C]``."""
        if self.image_latents is None:
            raise PromptEmbeddingError(f"{self.path} is text-only (family {self.family!r}): no "
                                       "input images; write an edit file from an editing "
                                       "pipeline's folder with python -m "
                                       "spotlight_jax.tools.encode_prompts")
        return np.asarray(self.image_latents[self.image_index[self.rows(prompts)]], np.float32)

    def null_prompts(self, prompts: Sequence[str]) -> list[str]:
        """Each of ``prompts``' null prompt: the empty prompt (a text-only file), or the empty
        instruction with the row's input image (an edit file)."""
        rows = self.rows(prompts)
        if self.image_index is None:
            return [self.all_prompts[EMPTY_INDEX]] * len(rows)
        return [self.all_prompts[k] for k in self.image_index[rows]]

    def empty(self, text_len: int | None = None):
        """The empty prompt's ``(embeds [T, D], mask [T], pooled [P] or None)``: the null
        prompt of classifier-free guidance."""
        e, m, p = self.lookup([""], text_len)
        return e[0], m[0], None if p is None else p[0]
