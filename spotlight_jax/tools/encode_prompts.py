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
"""
from __future__ import annotations

import pathlib
import sys

from absl import app, flags


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """The tool's flags (defined only when it is the program, so importing it adds none)."""
    fv = {"flag_values": flag_values}
    flags.DEFINE_string("pipeline", None, "A diffusers pipeline folder (model_index.json): "
                        "StableDiffusion3Pipeline (SD3, SD3.5), QwenImagePipeline, "
                        "FluxPipeline or WanPipeline (Wan 2.1/2.2 text-to-video).", **fv)
    flags.DEFINE_string("output", None, "The prompt-embedding file to write (.safetensors).", **fv)
    flags.DEFINE_string("prompts", None, "Training prompts: a text file, one per line.", **fv)
    flags.DEFINE_string("val_prompts", None, "Held-out prompts: a text file, one per line.", **fv)
    flags.DEFINE_bool("world", False, "Encode the synthetic world's train and val prompts.", **fv)
    flags.DEFINE_bool("video_world", False, "--world: the video world's prompts ('a red "
                      "square moving left') instead of the image world's.", **fv)
    flags.DEFINE_integer("world_image_size", 32, "--world: the world's image size (its prompts "
                         "depend on it).", **fv)
    flags.DEFINE_integer("max_sequence_length", None, "Text tokens per prompt (SD3: T5's, "
                         "default 256; Qwen-Image: at most, default 1024; Flux, Wan: "
                         "default 512).", **fv)
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
    try:
        prompts, splits = prompt_lists(f.prompts, f.val_prompts,
                                       f.world_image_size if f.world else None, f.video_world)
        encoders.pipeline_family(f.pipeline)
        pipe = encoders.load_pipeline(f.pipeline, device=f.device, dtype=f.dtype)
        encoders.encode_to_file(pipe, f.output, prompts, splits,
                                max_sequence_length=f.max_sequence_length,
                                batch_size=f.batch_size,
                                info={"pipeline": str(pathlib.Path(f.pipeline).name),
                                      "dtype": f.dtype})
    except (ValueError, ImportError) as e:         # PromptEmbeddingError is a ValueError
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    out = read(f.output)
    pooled = f", pooled width {out.pooled_dim}" if out.pooled_dim else ""
    print(f"{f.output}: {len(out.prompts('train'))} train + {len(out.prompts('val'))} val "
          f"prompts + the empty one, family {out.family}, L={out.text_len} tokens of width "
          f"D={out.dim}{pooled}\nuse it with --config.model.text_width=0 "
          f"--config.model.text_embed_dim={out.dim} --config.model.text_len={out.text_len} "
          f"--config.prompts.embeddings_file={f.output}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
