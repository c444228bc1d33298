"""The real text encoders of a diffusers pipeline, run once to write a prompt-embedding file.

Needs torch, transformers and diffusers (the optional ``[encode]`` extra); they are imported
inside the functions, so this module imports without them and says how to install them when a
function needs them. Only the pipeline's text encoders and tokenizers are loaded (the pipeline
is built with ``transformer=None, vae=None``), and each family's embeddings are the pipeline's
own ``encode_prompt``:

* ``sd3`` (``StableDiffusion3Pipeline``, SD3 and SD3.5): CLIP-L and CLIP-G penultimate states
  (concatenated, zero-padded to T5's width) followed by T5's, ``[77 + max_sequence_length,
  4096]``, every token real (SD3 attends to all of them), and the pooled CLIP-L + CLIP-G
  embedding ``[2048]``;
* ``qwen_image`` (``QwenImagePipeline``): Qwen2.5-VL's last hidden state of the prompt in the
  pipeline's chat template with the template's prefix dropped, ``[L, 3584]`` with its mask (rows
  of a batch padded to the batch's longest; no pooled embedding);
* ``flux`` (``FluxPipeline``, FLUX.1 [dev] and [schnell]): T5's last hidden state padded to
  ``max_sequence_length`` (512), ``[512, 4096]``, every token real (Flux attends to all of them),
  and CLIP-L's pooled output ``[768]``;
* ``wan`` (``WanPipeline``, Wan 2.1 / 2.2 text-to-video): UMT5's last hidden state of the
  prompt's tokens, zero rows after them up to ``max_sequence_length`` (512), ``[512, 4096]``,
  every row attended (Wan's cross-attention takes the zero rows too; no pooled embedding);
* ``z_image`` (``ZImagePipeline``): Qwen3's second-to-last hidden state of the prompt in the
  tokenizer's chat template (thinking on, as the pipeline renders it), ``[L, 2560]`` (Z-Image
  6B's Qwen3-4B). The pipeline returns each prompt's *real* tokens alone (a list of ``[L_i,
  D]``, at most ``max_sequence_length``, 512), which its transformer pads per prompt with a
  learned pad token; the file pads rows with zeros and a False mask, and the Z-Image model
  takes exactly a row's masked-in tokens (``models.z_image_transformer``), so the padding never
  reaches it;
* ``flux2`` (``Flux2Pipeline``, FLUX.2 [dev]): Mistral Small 3.x's hidden states after layers
  10, 20 and 30 of the prompt in the pipeline's chat (its system message, then the prompt),
  stacked per token, ``[512, 3 x 5120 = 15360]``, padded to ``max_sequence_length`` by the
  tokenizer and every row attended (the transformer takes no text mask: the pad tokens' states
  are part of the prompt, so a run's ``model.text_len`` must be the file's ``L``);
* ``flux2_klein`` (``Flux2KleinPipeline``, FLUX.2 [klein]): the same from Qwen3's layers 9, 18
  and 27 of the prompt in its chat template (thinking off), ``[512, 3 x 2560 = 7680]`` for
  [klein] 4B (``3 x 4096`` for 9B).

The editing families write *edit files* (``file.write_edits``): rows keyed by (instruction, input
image), the pipeline loaded with its VAE too (:func:`encode_edits_to_file`):

* ``qwen_image_edit`` (``QwenImageEditPipeline``): the image resized as the pipeline resizes it
  (``--image_area`` pixels, the pipeline's 1024 x 1024 by default, at the image's aspect ratio,
  sides multiples of 32); Qwen2.5-VL's last hidden state of the instruction in the pipeline's
  chat template *with that image* (its vision tokens are part of the prompt, so ``L`` grows with
  the image), prefix dropped, rows padded as ``qwen_image``'s; and the image's VAE latents
  (``vae.encode``'s mode, normalised by the VAE's ``latents_mean`` / ``latents_std``), as the
  pipeline's ``encode_prompt(prompt, image)`` and ``prepare_latents`` compute them;
* ``qwen_image_edit_plus`` (``QwenImageEditPlusPipeline``, -2509 / -2511) with one input image
  per row: the same, the text encoder seeing the image at the pipeline's condition size (384 x
  384 pixels' area) and the VAE at ``--image_area``; one row per encoder call (the pipeline
  encodes one prompt at a time).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import json
import pathlib
from collections.abc import Sequence

import numpy as np

from spotlight_jax.prompt_embeddings.file import (
    PromptEmbeddingError,
    pad_rows,
    write,
    write_edits,
)

# diffusers pipeline class -> family, and each family's default max_sequence_length (the
# pipelines' own defaults)
FAMILIES = {"StableDiffusion3Pipeline": "sd3", "QwenImagePipeline": "qwen_image",
            "FluxPipeline": "flux", "WanPipeline": "wan",
            "QwenImageEditPipeline": "qwen_image_edit",
            "QwenImageEditPlusPipeline": "qwen_image_edit_plus",
            "ZImagePipeline": "z_image", "Flux2Pipeline": "flux2",
            "Flux2KleinPipeline": "flux2_klein"}
MAX_SEQUENCE_LENGTH = {"sd3": 256, "qwen_image": 1024, "flux": 512, "wan": 512,
                       "qwen_image_edit": 1024, "qwen_image_edit_plus": 1024, "z_image": 512,
                       "flux2": 512, "flux2_klein": 512}
# the model.family (config.sections.FAMILY_CONFIGS) whose transformer each family's embeddings
# condition: a file of one is refused by a run of another (config.builders.prompts_of)
MODEL_FAMILY = {"sd3": "mmdit", "qwen_image": "mmdit", "flux": "mmdit", "wan": "wan",
                "qwen_image_edit": "mmdit", "qwen_image_edit_plus": "mmdit",
                "z_image": "z_image", "flux2": "flux2", "flux2_klein": "flux2"}
# families whose transformer attends to every text token of a row, pad tokens included, and
# has no text mask of its own: a run's text_len must be the file's (no extra zero tokens)
EVERY_TOKEN_FAMILIES = ("flux2", "flux2_klein")
# the tokenizer classes (a model_index.json's) that transformers builds only with torchvision:
# FLUX.2 [dev]'s Mistral processor
TORCHVISION_TOKENIZERS = ("PixtralProcessor",)
# families whose rows are (instruction, input image) pairs: their files hold the image latents
EDIT_FAMILIES = ("qwen_image_edit", "qwen_image_edit_plus")
# the pixels the edit pipelines give the input image they VAE-encode (1024 x 1024's area)
PIPELINE_IMAGE_AREA = 1024 * 1024
DTYPES = ("float32", "bfloat16", "float16")
_INSTALL = 'pip install -e ".[encode]"'


def require_encode_extra():
    """``(torch, diffusers)``, or an ImportError naming what is missing and how to install it."""
    try:      # torch first: without it the others fail to import anyway
        import torch  # noqa: I001, PLC0415
        import transformers  # noqa: F401, PLC0415
        import diffusers  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(f"encoding prompts needs torch, transformers and diffusers ({e.name} "
                          f"is missing): {_INSTALL}") from e
    return torch, diffusers


def pipeline_family(pipeline_dir) -> tuple[str, str]:
    """``(family, pipeline class name)`` of a diffusers pipeline folder (its model_index.json)."""
    d = pathlib.Path(pipeline_dir)
    index = d / "model_index.json"
    if not index.is_file():
        raise PromptEmbeddingError(f"pipeline={str(d)!r}: no model_index.json there; pass a "
                                   "diffusers pipeline folder (e.g. the SD3.5 or Qwen-Image "
                                   "snapshot)")
    name = json.loads(index.read_text()).get("_class_name", "")
    if name not in FAMILIES:
        raise PromptEmbeddingError(f"pipeline={str(d)!r}: a {name or 'unnamed'} pipeline; "
                                   f"prompts can be encoded for {sorted(FAMILIES)}")
    return FAMILIES[name], name


def load_pipeline(pipeline_dir, *, device: str = "cpu", dtype: str = "float32"):
    """The pipeline of ``pipeline_dir`` with its text encoders and tokenizers only (no
    transformer; no VAE but for an editing family, which encodes its input images too), on
    ``device`` in ``dtype``, in eval mode."""
    torch, diffusers = require_encode_extra()
    if dtype not in DTYPES:
        raise PromptEmbeddingError(f"dtype={dtype!r}: choose one of {DTYPES}")
    family, name = pipeline_family(pipeline_dir)
    drop = {"transformer": None} if family in EDIT_FAMILIES else {"transformer": None,
                                                                  "vae": None}
    if family in EDIT_FAMILIES and importlib.util.find_spec("torchvision") is None:
        # transformers builds Qwen2.5-VL's processor (the pipeline's processor/) with its video
        # part, which needs torchvision even where only images are encoded
        raise ImportError(f"pipeline={str(pipeline_dir)!r}: a {name} loads Qwen2.5-VL's "
                          "processor, which transformers builds only with torchvision: pip "
                          "install torchvision (the build matching your torch)")
    tokenizer = _component_class(pipeline_dir, "tokenizer")
    if tokenizer in TORCHVISION_TOKENIZERS and importlib.util.find_spec("torchvision") is None:
        raise ImportError(f"pipeline={str(pipeline_dir)!r}: a {name} loads its tokenizer as a "
                          f"{tokenizer}, which transformers builds only with torchvision: pip "
                          "install torchvision (the build matching your torch)")
    pipe = getattr(diffusers, name).from_pretrained(str(pipeline_dir), **drop,
                                                    torch_dtype=getattr(torch, dtype))
    return pipe.to(device)


def _component_class(pipeline_dir, component: str) -> str | None:
    """The class name model_index.json gives the pipeline's ``component`` (None: none)."""
    entry = json.loads((pathlib.Path(pipeline_dir) / "model_index.json").read_text()).get(
        component)
    return entry[1] if isinstance(entry, list) and len(entry) == 2 else None


def family_of(pipe) -> str:
    name = type(pipe).__name__
    if name not in FAMILIES:
        raise PromptEmbeddingError(f"pipeline {name}: prompts can be encoded for "
                                   f"{sorted(FAMILIES)}")
    return FAMILIES[name]


def encode_batch(pipe, prompts: list[str], max_sequence_length: int):
    """The pipeline's ``encode_prompt`` of one batch as numpy: ``(embeds [B, L, D], mask
    [B, L] bool, pooled [B, P] or None)``, in the encoders' dtype."""
    torch, _ = require_encode_extra()
    family = family_of(pipe)
    if family in EDIT_FAMILIES:
        raise PromptEmbeddingError(f"pipeline {type(pipe).__name__}: an editing pipeline "
                                   "encodes (instruction, input image) pairs; use "
                                   "encode_edits_to_file")
    with torch.no_grad():
        if family == "sd3":
            if pipe.text_encoder_3 is None:
                raise PromptEmbeddingError("the SD3 pipeline has no T5 encoder (text_encoder_3); "
                                           "encode with the full pipeline")
            embeds, _, pooled, _ = pipe.encode_prompt(
                prompt=prompts, prompt_2=None, prompt_3=None, do_classifier_free_guidance=False,
                max_sequence_length=max_sequence_length)
            mask = torch.ones(embeds.shape[:2], dtype=torch.bool)
        elif family == "flux":
            embeds, pooled, _ = pipe.encode_prompt(prompt=prompts, prompt_2=None,
                                                   max_sequence_length=max_sequence_length)
            mask = torch.ones(embeds.shape[:2], dtype=torch.bool)
        elif family == "wan":
            embeds, _ = pipe.encode_prompt(prompt=prompts, do_classifier_free_guidance=False,
                                           max_sequence_length=max_sequence_length)
            mask, pooled = torch.ones(embeds.shape[:2], dtype=torch.bool), None
        elif family == "z_image":
            # each prompt's real tokens alone (a list; the pipeline rewrites the list it is
            # given in place, so it gets a copy): padded here, the mask keeping the real ones
            rows, _ = pipe.encode_prompt(prompt=list(prompts), do_classifier_free_guidance=False,
                                         max_sequence_length=max_sequence_length)
            embeds, mask = pad_rows([_numpy(r) for r in rows])
            return embeds, mask, None
        elif family in ("flux2", "flux2_klein"):
            embeds, _ = pipe.encode_prompt(prompt=list(prompts),
                                           max_sequence_length=max_sequence_length)
            mask, pooled = torch.ones(embeds.shape[:2], dtype=torch.bool), None
        else:
            embeds, mask = pipe.encode_prompt(prompt=prompts,
                                              max_sequence_length=max_sequence_length)
            pooled = None
            mask = (torch.ones(embeds.shape[:2], dtype=torch.bool) if mask is None
                    else mask.bool())
    return (_numpy(embeds), mask.cpu().numpy(), None if pooled is None else _numpy(pooled))


def _numpy(t):
    """A torch tensor as numpy in the same dtype (bfloat16 through ml_dtypes)."""
    import ml_dtypes  # noqa: PLC0415
    import torch  # noqa: PLC0415
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


def encode(pipe, prompts: Sequence[str], *, max_sequence_length: int | None = None,
           batch_size: int = 16):
    """``(embeds [N, L, D], mask [N, L], pooled [N, P] or None)`` of ``prompts`` encoded in
    batches of ``batch_size``, each batch's rows padded to the longest of all (zeros, False)."""
    family = family_of(pipe)
    msl = MAX_SEQUENCE_LENGTH[family] if max_sequence_length is None else max_sequence_length
    if batch_size < 1:
        raise PromptEmbeddingError(f"batch_size={batch_size}: must be >= 1")
    rows, masks, pooled = [], [], []
    for i in range(0, len(prompts), batch_size):
        e, m, p = encode_batch(pipe, list(prompts[i:i + batch_size]), msl)
        rows += list(e)
        masks += list(m)
        if p is not None:
            pooled.append(p)
    embeds, mask = pad_rows(rows, masks)
    return embeds, mask, (np.concatenate(pooled) if pooled else None)


def encode_to_file(pipe, path, prompts: Sequence[str], splits: Sequence[str] | None = None, *,
                   max_sequence_length: int | None = None, batch_size: int = 16,
                   info: dict | None = None) -> None:
    """Encodes the empty prompt and ``prompts`` (split ``splits``, default all ``train``) with
    ``pipe`` and writes the prompt-embedding file ``path``."""
    import diffusers  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    family = family_of(pipe)
    msl = MAX_SEQUENCE_LENGTH[family] if max_sequence_length is None else max_sequence_length
    prompts = list(prompts)
    if "" in prompts:
        raise PromptEmbeddingError("prompts: the empty prompt is among them; it is added as row "
                                   "0 by itself (the null prompt), drop it from the list")
    splits = ["train"] * len(prompts) if splits is None else list(splits)
    embeds, mask, pooled = encode(pipe, ["", *prompts], max_sequence_length=msl,
                                  batch_size=batch_size)
    # a prompt the tokenizer truncated away entirely (FLUX.2 [dev]'s template puts a system
    # message of ~100 tokens first) is encoded exactly as the empty prompt: refuse it
    lost = [p for p, e, m in zip(prompts, embeds[1:], mask[1:])
            if np.array_equal(m, mask[0]) and np.array_equal(e, embeds[0])]
    if lost:
        raise PromptEmbeddingError(
            f"prompt {lost[0]!r}: its embeddings equal the empty prompt's ({len(lost)} such): "
            f"max_sequence_length={msl} tokens leave none of its words after the pipeline's "
            f"chat template; raise --max_sequence_length (the pipeline's default: "
            f"{MAX_SEQUENCE_LENGTH[family]})")
    encoders = [type(getattr(pipe, n)).__name__ for n in
                ("text_encoder", "text_encoder_2", "text_encoder_3")
                if getattr(pipe, n, None) is not None]
    layers = stacked_layers(pipe)
    write(path, ["", *prompts], embeds, mask, pooled, splits=["", *splits], family=family,
          encoder=f"{type(pipe).__name__}: {' + '.join(encoders)}",
          info={"max_sequence_length": msl, "diffusers": diffusers.__version__,
                "transformers": transformers.__version__,
                **({"text_encoder_out_layers": layers} if layers else {}), **(info or {})})


def stacked_layers(pipe) -> list[int] | None:
    """The encoder layers whose hidden states a FLUX.2 pipeline stacks per token (its
    ``encode_prompt``'s default ``text_encoder_out_layers``, which the file records); None for
    a pipeline that takes one layer."""
    param = inspect.signature(pipe.encode_prompt).parameters.get("text_encoder_out_layers")
    return None if param is None else [int(i) for i in param.default]


@dataclasses.dataclass(frozen=True)
class EditRow:
    """One (instruction, input image) pair to encode: ``image`` is the image's name (the key's
    part, as the input listed it), ``path`` the file it names."""
    instruction: str
    image: str
    path: pathlib.Path


def read_image(row: EditRow):
    """The row's image as an RGB PIL image (as diffusers' ``load_image`` gives it); a file that
    is not an image is an error naming it."""
    from PIL import Image, UnidentifiedImageError  # noqa: PLC0415
    try:
        with Image.open(row.path) as im:
            return im.convert("RGB")
    except (OSError, UnidentifiedImageError) as e:
        raise PromptEmbeddingError(f"image {row.image!r} ({row.path}): cannot be read as an "
                                   f"image ({type(e).__name__}); give a PNG, JPEG or WebP "
                                   "file") from e


def edit_image_sizes(pipe, size: tuple[int, int], image_area: int):
    """``((w, h) the text encoder sees, (w, h) the VAE encodes)`` of an input image of ``size``
    (w, h) pixels: the pipeline's own ``calculate_dimensions`` of an area at the image's aspect
    ratio (sides rounded to multiples of 32), the VAE's area ``image_area``; the text encoder
    sees the same image (Edit) or one of the pipeline's condition area (Edit Plus)."""
    module = importlib.import_module(type(pipe).__module__)
    w, h = size

    def dims(area):
        return tuple(int(v) for v in module.calculate_dimensions(area, w / h)[:2])

    vae = dims(image_area)
    if family_of(pipe) == "qwen_image_edit_plus":
        return dims(module.CONDITION_IMAGE_SIZE), vae
    return vae, vae


def prepare_edit_image(pipe, row: EditRow, image_area: int):
    """``(the PIL image the text encoder sees, the VAE's input [1, 3, 1, H, W] in [-1, 1])`` of
    the row's image, resized and preprocessed by the pipeline's own image processor as its
    ``__call__`` does; an image too small or too narrow for ``image_area`` is an error naming
    it."""
    image = read_image(row)
    (cw, ch), (vw, vh) = edit_image_sizes(pipe, image.size, image_area)
    if min(cw, ch, vw, vh) <= 0:
        raise PromptEmbeddingError(
            f"image {row.image!r} ({row.path}): {image.size[0]}x{image.size[1]} pixels resize to "
            f"{vw}x{vh} at image_area={image_area} (sides are multiples of 32), which the VAE "
            "cannot encode; crop it to a less extreme aspect ratio or raise --image_area")
    proc = pipe.image_processor
    seen = proc.resize(image, ch, cw)
    # Edit: the VAE encodes the image the text encoder sees; Edit Plus: the original, resized
    # by preprocess to the VAE's size
    vae_in = proc.preprocess(seen if family_of(pipe) == "qwen_image_edit" else image, vh, vw)
    return seen, vae_in.unsqueeze(2)


def encode_edit_image(pipe, vae_input):
    """The pipeline's normalised latents of a prepared image (its ``_encode_vae_image``: the
    VAE posterior's mode, minus ``latents_mean``, over ``latents_std``), channels last
    ``[H', W', C]`` as numpy in the VAE's dtype."""
    torch, _ = require_encode_extra()
    vae = pipe.vae
    if vae is None:
        raise PromptEmbeddingError(f"pipeline {type(pipe).__name__}: no VAE; load it with its "
                                   "vae/ (encoders.load_pipeline keeps it for editing families)")
    with torch.no_grad():
        x = vae_input.to(device=pipe._execution_device, dtype=vae.dtype)
        lat = pipe._encode_vae_image(image=x, generator=None)          # [1, C, 1, H', W']
    return _numpy(lat[0, :, 0].permute(1, 2, 0))


def encode_edit_batch(pipe, instructions: list[str], images: list):
    """The pipeline's ``encode_prompt(instructions, image=images)`` (one PIL image per
    instruction, as prepared by :func:`prepare_edit_image`) as numpy ``(embeds [B, L, D], mask
    [B, L] bool)``; Edit Plus one row per call (its pipeline encodes one prompt at a time:
    every image it is given is numbered into each prompt)."""
    torch, _ = require_encode_extra()
    family = family_of(pipe)
    if family not in EDIT_FAMILIES:
        editing = ", ".join(n for n, f in FAMILIES.items() if f in EDIT_FAMILIES)
        raise PromptEmbeddingError(f"pipeline {type(pipe).__name__}: a text-only pipeline; "
                                   f"(instruction, image) pairs need an editing one ({editing})")
    groups = ([[i] for i in range(len(instructions))] if family == "qwen_image_edit_plus"
              else [list(range(len(instructions)))])
    rows, masks = [], []
    with torch.no_grad():
        for g in groups:
            embeds, mask = pipe.encode_prompt([instructions[i] for i in g],
                                              image=[images[i] for i in g])
            mask = (torch.ones(embeds.shape[:2], dtype=torch.bool) if mask is None
                    else mask.bool())
            rows += list(_numpy(embeds))
            masks += list(mask.cpu().numpy())
    return pad_rows(rows, masks)


def encode_edits_to_file(pipe, path, rows: Sequence[EditRow], splits: Sequence[str] | None = None,
                         *, image_area: int | None = None, batch_size: int = 16,
                         info: dict | None = None) -> None:
    """Encodes the (instruction, input image) pairs ``rows`` (split ``splits``, default all
    ``train``) with the editing pipeline ``pipe`` and writes the edit file ``path``
    (``file.write_edits``): each distinct image's VAE latents once, its null prompt (the empty
    instruction with it) in the first rows, then every pair's embeddings, each as the pipeline
    computes it (module docstring). Every image must give latents of one shape (a run batches
    them): images of another aspect ratio are an error naming the first."""
    import diffusers  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    family = family_of(pipe)
    area = PIPELINE_IMAGE_AREA if image_area is None else int(image_area)
    rows = list(rows)
    splits = ["train"] * len(rows) if splits is None else list(splits)
    if batch_size < 1:
        raise PromptEmbeddingError(f"batch_size={batch_size}: must be >= 1")
    if area < 32 * 32:
        raise PromptEmbeddingError(f"image_area={area}: the VAE's input is at least 32 x 32 "
                                   "pixels; give an area >= 1024 (the pipeline's: 1048576)")
    if not rows:
        raise PromptEmbeddingError("no (instruction, image) rows to encode; give at least one")
    if len(splits) != len(rows):
        raise PromptEmbeddingError(f"{len(splits)} splits for {len(rows)} rows; give one split "
                                   "per row")
    empty = [r for r in rows if not r.instruction]
    if empty:
        raise PromptEmbeddingError(f"image {empty[0].image!r}: a row with an empty instruction; "
                                   "each image's empty instruction is added by itself (its null "
                                   "prompt), drop that row")
    first = {}                          # image name -> its first row (in input order)
    for r in rows:
        if first.setdefault(r.image, r).path != r.path:
            raise PromptEmbeddingError(f"image {r.image!r} names two files ({first[r.image].path} "
                                       f"and {r.path}); give each image one name")
    images = list(first)
    latents = []
    for name in images:
        _, vae_in = prepare_edit_image(pipe, first[name], area)
        lat = encode_edit_image(pipe, vae_in)
        if latents and lat.shape != latents[0].shape:
            raise PromptEmbeddingError(
                f"image {name!r}: its latents are {lat.shape[0]}x{lat.shape[1]} cells, those of "
                f"{images[0]!r} (the first image) {latents[0].shape[0]}x{latents[0].shape[1]}; a "
                "run batches input images, so give images of one aspect ratio (crop them)")
        latents.append(lat)
    index = {name: i for i, name in enumerate(images)}
    every = [EditRow("", name, first[name].path) for name in images] + rows
    embeds, masks = [], []
    for i in range(0, len(every), batch_size):
        batch = every[i:i + batch_size]
        seen = [prepare_edit_image(pipe, r, area)[0] for r in batch]
        e, m = encode_edit_batch(pipe, [r.instruction for r in batch], seen)
        embeds += list(e)
        masks += list(m)
    embeds, mask = pad_rows(embeds, masks)
    latent_shape = list(latents[0].shape)
    write_edits(path, [r.instruction for r in every], [index[r.image] for r in every], images,
                np.stack(latents), embeds, mask, splits=[""] * len(images) + splits,
                family=family, encoder=f"{type(pipe).__name__}: "
                f"{type(pipe.text_encoder).__name__} + {type(pipe.vae).__name__}",
                info={"image_area": area, "latent_shape": latent_shape,
                      "diffusers": diffusers.__version__,
                      "transformers": transformers.__version__, **(info or {})})
