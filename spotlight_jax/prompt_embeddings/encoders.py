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
  every row attended (Wan's cross-attention takes the zero rows too; no pooled embedding).
"""
from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

import numpy as np

from spotlight_jax.prompt_embeddings.file import PromptEmbeddingError, pad_rows, write

# diffusers pipeline class -> family, and each family's default max_sequence_length (the
# pipelines' own defaults)
FAMILIES = {"StableDiffusion3Pipeline": "sd3", "QwenImagePipeline": "qwen_image",
            "FluxPipeline": "flux", "WanPipeline": "wan"}
MAX_SEQUENCE_LENGTH = {"sd3": 256, "qwen_image": 1024, "flux": 512, "wan": 512}
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
    transformer, no VAE), on ``device`` in ``dtype``, in eval mode."""
    torch, diffusers = require_encode_extra()
    if dtype not in DTYPES:
        raise PromptEmbeddingError(f"dtype={dtype!r}: choose one of {DTYPES}")
    _, name = pipeline_family(pipeline_dir)
    pipe = getattr(diffusers, name).from_pretrained(str(pipeline_dir), transformer=None,
                                                    vae=None, torch_dtype=getattr(torch, dtype))
    return pipe.to(device)


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
    encoders = [type(getattr(pipe, n)).__name__ for n in
                ("text_encoder", "text_encoder_2", "text_encoder_3")
                if getattr(pipe, n, None) is not None]
    write(path, ["", *prompts], embeds, mask, pooled, splits=["", *splits], family=family,
          encoder=f"{type(pipe).__name__}: {' + '.join(encoders)}",
          info={"max_sequence_length": msl, "diffusers": diffusers.__version__,
                "transformers": transformers.__version__, **(info or {})})
