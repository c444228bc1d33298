"""Command line: write a prompt-embedding file with a diffusers pipeline's real text encoders.

Run it once, on a machine that has the pipeline's weights; training runs then read the file
without torch and without downloads (``spotlight_jax.prompt_embeddings``):

  pip install -e ".[encode]"         # torch, transformers, diffusers: needed here only
  python -m spotlight_jax.tools.encode_prompts --pipeline=/models/stable-diffusion-3.5-medium \\
      --prompts=train.txt --val_prompts=val.txt --output=/data/sd35_prompts.safetensors
  python -m spotlight_jax.tools.encode_prompts --pipeline=/models/Qwen-Image --world \\
      --output=/data/qwen_world.safetensors --device=cuda --dtype=bfloat16

``--prompts``/``--val_prompts``: text files, one prompt per line (blank lines and repeats
skipped); ``--world``: the synthetic world's train and val prompts instead. The file always
holds the empty prompt too (row 0, the null prompt). A run then uses it with
``--config.model.text_width=0 --config.model.text_embed_dim=<D> --config.model.text_len=<L>
--config.prompts.embeddings_file=<file>`` (D and L are printed at the end).

Z-Image (``ZImagePipeline``) and FLUX.2 (``Flux2Pipeline``, ``Flux2KleinPipeline``) files are
read by a run of the same folder: ``--config.base_checkpoint=<folder>
--config.model.text_len=<L> --config.prompts.embeddings_file=<file>`` (their transformers take
the width from the folder; FLUX.2 attends to all ``L`` tokens, so ``text_len`` is exactly ``L``).

An editing pipeline (``QwenImageEditPipeline``, ``QwenImageEditPlusPipeline``) encodes
(instruction, input image) pairs instead: ``--prompts``/``--val_prompts`` are then JSON Lines
files, one ``{"prompt": "<instruction>", "image": "<path>"}`` per line (a path relative to the
file's folder, or absolute; blank lines and repeats skipped), and the file written is an edit
file (``prompt_embeddings.file``): each pair's Qwen2.5-VL embeddings with its image, each
image's VAE latents at ``--image_area`` pixels (the pipeline's 1024 x 1024 by default), each
image's null prompt. A run of the pipeline's folder takes it with
``--config.base_checkpoint=<folder> --config.prompts.embeddings_file=<file>
--config.model.text_len=<L>``:

  python -m spotlight_jax.tools.encode_prompts --pipeline=/models/Qwen-Image-Edit \
      --prompts=edits.jsonl --val_prompts=val_edits.jsonl --output=/data/edits.safetensors
"""
from __future__ import annotations

import json
import pathlib
import sys

from absl import app, flags


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """The tool's flags (defined only when it is the program, so importing it adds none)."""
    fv = {"flag_values": flag_values}
    flags.DEFINE_string("pipeline", None, "A diffusers pipeline folder (model_index.json): "
                        "StableDiffusion3Pipeline (SD3, SD3.5), QwenImagePipeline, "
                        "FluxPipeline, WanPipeline (Wan 2.1/2.2 text-to-video), "
                        "ZImagePipeline, Flux2Pipeline (FLUX.2 [dev]), Flux2KleinPipeline, "
                        "or the editing QwenImageEditPipeline / QwenImageEditPlusPipeline.",
                        **fv)
    flags.DEFINE_string("output", None, "The prompt-embedding file to write (.safetensors).", **fv)
    flags.DEFINE_string("prompts", None, "Training prompts: a text file, one per line (an "
                        'editing pipeline: JSON Lines, one {"prompt": ..., "image": <path>} '
                        "per line).", **fv)
    flags.DEFINE_string("val_prompts", None, "Held-out prompts: as --prompts.", **fv)
    flags.DEFINE_integer("image_area", None, "Editing pipelines: the pixels of the input image "
                         "the VAE encodes, at the image's aspect ratio (default the "
                         "pipeline's, 1024 * 1024).", **fv)
    flags.DEFINE_bool("world", False, "Encode the synthetic world's train and val prompts.", **fv)
    flags.DEFINE_bool("video_world", False, "--world: the video world's prompts ('a red "
                      "square moving left') instead of the image world's.", **fv)
    flags.DEFINE_integer("world_image_size", 32, "--world: the world's image size (its prompts "
                         "depend on it).", **fv)
    flags.DEFINE_integer("max_sequence_length", None, "Text tokens per prompt (SD3: T5's, "
                         "default 256; Qwen-Image: at most, default 1024; Z-Image: at most, "
                         "default 512; Flux, Wan, FLUX.2: default 512).", **fv)
    flags.DEFINE_integer("batch_size", 16, "Prompts per encoder call.", **fv)
    flags.DEFINE_string("device", "cpu", "torch device of the text encoders (cpu, cuda, ...).",
                        **fv)
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "float16"],
                      "The encoders' dtype, and the file's.", **fv)
    flags.mark_flags_as_required(["pipeline", "output"], **fv)


def read_prompt_lines(path) -> list[str]:
    """The prompts of a text file, one per line, stripped; blank lines and repeats skipped."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise ValueError(f"prompts file {str(p)!r} does not exist (one prompt per line)")
    return list(dict.fromkeys(line.strip() for line in p.read_text().splitlines()
                              if line.strip()))


EDIT_LINE = '{"prompt": "<instruction>", "image": "<path>"}'
# the model families (config.sections.FAMILY_CONFIGS) a prompt file serves only as a run of the
# pipeline's folder (their configs have no text_width / text_embed_dim: the folder gives them)
FOLDER_ONLY = ("z_image", "flux2")


def read_edit_rows(path) -> list:
    """The (instruction, image) rows of a JSON Lines file (``EDIT_LINE`` per line; blank lines
    and repeats skipped) as ``encoders.EditRow``s, each image path relative to the file's folder
    and checked to exist; a bad line is an error naming the file, the line and the fix."""
    from spotlight_jax.prompt_embeddings.encoders import EditRow  # noqa: PLC0415
    p = pathlib.Path(path)
    if not p.is_file():
        raise ValueError(f"edits file {str(p)!r} does not exist (JSON Lines: one {EDIT_LINE} "
                         "per line)")
    rows = {}
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if (not isinstance(row, dict) or not isinstance(row.get("prompt"), str)
                or not isinstance(row.get("image"), str) or not row["prompt"].strip()
                or not row["image"].strip()):
            raise ValueError(f"{p} line {n}: {line.strip()[:60]!r} is not {EDIT_LINE} (a "
                             "non-empty instruction and an image path); write one such JSON "
                             "object per line")
        name = row["image"].strip()
        image = p.parent / name
        if not image.is_file():
            raise ValueError(f"{p} line {n}: image {name!r} does not exist (looked for "
                             f"{image}); image paths are relative to the JSON Lines file's "
                             "folder, or absolute")
        rows.setdefault((row["prompt"].strip(), name), EditRow(row["prompt"].strip(), name,
                                                               image))
    return list(rows.values())


def edit_lists(prompts_file=None, val_file=None):
    """``(rows, splits)``: the (instruction, image) rows of the JSON Lines files, training then
    held-out; a pair in both is an error."""
    if not prompts_file:
        raise ValueError(f"no edits: an editing pipeline encodes (instruction, image) pairs; "
                         f"give --prompts=<file.jsonl> (and --val_prompts=<file.jsonl>), one "
                         f"{EDIT_LINE} per line")
    train = read_edit_rows(prompts_file)
    val = read_edit_rows(val_file) if val_file else []
    both = sorted({(r.instruction, r.image) for r in train} & {(r.instruction, r.image)
                                                               for r in val})
    if both:
        raise ValueError(f"pair {both[0]!r} is both a training and a held-out edit "
                         f"({len(both)} such); keep each in one file")
    return train + val, ["train"] * len(train) + ["val"] * len(val)


def edit_rows_in(path) -> bool:
    """Whether the text file ``path``'s first non-blank line is an (instruction, image) JSON
    object (an editing pipeline's input given to a text-only one)."""
    p = pathlib.Path(path)
    if not p.is_file():
        return False
    line = next((x for x in p.read_text().splitlines() if x.strip()), "")
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(row, dict) and "image" in row


def prompt_lists(prompts_file=None, val_file=None, world_image_size=None, video=False):
    """``(prompts, splits)`` from the prompt files, or the world's (``world_image_size`` set;
    ``video``: the video world's)."""
    if world_image_size is not None:
        if prompts_file or val_file:
            raise ValueError("--world: encodes the world's prompts; drop --prompts and "
                             "--val_prompts (or drop --world)")
        from spotlight_jax import world  # noqa: PLC0415
        cfg = world.WorldConfig(image_size=world_image_size)
        if video:
            train, val = world.video.video_train_prompts(cfg), world.video.video_val_prompts(cfg)
        else:
            train, val = world.train_prompts(cfg), world.val_prompts(cfg)
    elif video:
        raise ValueError("--video_world: chooses the world's prompts; add --world (or drop "
                         "--video_world)")
    elif prompts_file:
        train = read_prompt_lines(prompts_file)
        val = read_prompt_lines(val_file) if val_file else []
    else:
        raise ValueError("no prompts: give --prompts=<file> (and --val_prompts=<file>) or --world")
    both = sorted(set(train) & set(val))
    if both:
        raise ValueError(f"prompt {both[0]!r} is both a training and a held-out prompt "
                         f"({len(both)} such); keep each in one file")
    return train + val, ["train"] * len(train) + ["val"] * len(val)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    f = flags.FLAGS
    from spotlight_jax.prompt_embeddings import encoders, read  # noqa: PLC0415
    info = {"pipeline": str(pathlib.Path(f.pipeline).name), "dtype": f.dtype}
    try:
        family, name = encoders.pipeline_family(f.pipeline)
        if family in encoders.EDIT_FAMILIES:
            if f.world:
                raise ValueError(f"--world: the world's prompts are text; pipeline "
                                 f"{f.pipeline!r} is a {name}, which encodes (instruction, "
                                 "image) pairs: give --prompts=<edits.jsonl> instead")
            if f.max_sequence_length is not None:
                raise ValueError(f"--max_sequence_length={f.max_sequence_length}: a {name} "
                                 "keeps every token of the instruction and its image (its "
                                 "encode_prompt truncates nothing); drop the flag")
            rows, splits = edit_lists(f.prompts, f.val_prompts)
            pipe = encoders.load_pipeline(f.pipeline, device=f.device, dtype=f.dtype)
            encoders.encode_edits_to_file(pipe, f.output, rows, splits, image_area=f.image_area,
                                          batch_size=f.batch_size, info=info)
        else:
            if f.image_area is not None:
                raise ValueError(f"--image_area={f.image_area}: only editing pipelines encode "
                                 f"input images; pipeline {f.pipeline!r} is a {name} (text "
                                 "only): drop --image_area")
            for given in (f.prompts, f.val_prompts):
                if given and edit_rows_in(given):
                    raise ValueError(f"{given}: (instruction, image) rows, which only an "
                                     f"editing pipeline encodes; pipeline {f.pipeline!r} is a "
                                     f"{name} (text only): give one prompt per line, or a "
                                     "QwenImageEditPipeline folder")
            prompts, splits = prompt_lists(f.prompts, f.val_prompts,
                                           f.world_image_size if f.world else None,
                                           f.video_world)
            pipe = encoders.load_pipeline(f.pipeline, device=f.device, dtype=f.dtype)
            encoders.encode_to_file(pipe, f.output, prompts, splits,
                                    max_sequence_length=f.max_sequence_length,
                                    batch_size=f.batch_size, info=info)
    except (ValueError, ImportError) as e:         # PromptEmbeddingError is a ValueError
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    out = read(f.output)
    pooled = f", pooled width {out.pooled_dim}" if out.pooled_dim else ""
    if out.is_edit:
        h, w, c = out.latent_shape
        print(f"{f.output}: {len(out.prompts('train'))} train + {len(out.prompts('val'))} val "
              f"(instruction, image) pairs + {len(out.images)} images' null prompts, family "
              f"{out.family}, L={out.text_len} tokens of width D={out.dim}, input latents "
              f"{h}x{w}x{c}\nuse it with --config.base_checkpoint={f.pipeline} "
              f"--config.model.text_len={out.text_len} "
              f"--config.prompts.embeddings_file={f.output}")
        return
    if encoders.MODEL_FAMILY.get(out.family) in FOLDER_ONLY:
        # models without a prompt encoder of their own: a run takes the width from the folder
        print(f"{f.output}: {len(out.prompts('train'))} train + {len(out.prompts('val'))} val "
              f"prompts + the empty one, family {out.family}, L={out.text_len} tokens of width "
              f"D={out.dim}\nuse it with --config.base_checkpoint={f.pipeline} "
              f"--config.model.text_len={out.text_len} "
              f"--config.prompts.embeddings_file={f.output}")
        return
    print(f"{f.output}: {len(out.prompts('train'))} train + {len(out.prompts('val'))} val "
          f"prompts + the empty one, family {out.family}, L={out.text_len} tokens of width "
          f"D={out.dim}{pooled}\nuse it with --config.model.text_width=0 "
          f"--config.model.text_embed_dim={out.dim} --config.model.text_len={out.text_len} "
          f"--config.prompts.embeddings_file={f.output}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
