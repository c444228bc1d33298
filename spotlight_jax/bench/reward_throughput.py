"""Reward throughput: our jitted Flax CLIP (PickScore's architecture) against transformers'
PyTorch eager ``CLIPModel`` on the same images, in one process on the same cores.

The model is PickScore's CLIP-H/14 at real widths (vision 1280 wide, 16 heads of 80, MLP 5120,
224 px in 14 px patches; text 1024 wide, 16 heads, MLP 4096, 77 tokens; projection 1024; exact
gelu) with the depth reduced (``--layers`` per tower; the real model has 32 and 24), random
weights loaded identically into both (transformers' ``save_pretrained``, our loader). One
measurement is a PickScore of ``--batch`` preprocessed images against their prompts (image and
text towers, normalised embeddings, scaled cosine), timed after a warm-up; the median of
``--repeats``, images/s, and the scores' agreement are printed. Needs torch and transformers.

  python -m spotlight_jax.bench.reward_throughput [--layers=2] [--batch=16] [--repeats=5]
"""
from __future__ import annotations

import statistics
import tempfile
import time

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This benchmark's flags (defined only when it runs as the program)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_integer("layers", 2, "Layers per tower (the real PickScore model: 32 and 24).",
                         **fv)
    flags.DEFINE_integer("batch", 16, "Images (and prompts) per measurement.", **fv)
    flags.DEFINE_integer("repeats", 5, "Timed measurements per side; the median is reported.",
                         **fv)
    flags.DEFINE_integer("threads", 0, "torch intra-op threads (0 = torch's default).", **fv)


def _model(layers: int, folder: str):
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    text = dict(vocab_size=49408, hidden_size=1024, intermediate_size=4096,
                num_hidden_layers=layers, num_attention_heads=16, max_position_embeddings=77,
                hidden_act="gelu", eos_token_id=2)
    vision = dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=layers,
                  num_attention_heads=16, image_size=224, patch_size=14, hidden_act="gelu")
    torch.manual_seed(0)
    model = transformers.CLIPModel(transformers.CLIPConfig(
        text_config=text, vision_config=vision, projection_dim=1024)).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


def measure(layers: int, batch: int, repeats: int) -> dict:
    import jax  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from spotlight_jax.rewards import clip_model, learned  # noqa: PLC0415
    rng = np.random.default_rng(0)
    pixels = rng.normal(size=(batch, 224, 224, 3)).astype(np.float32)
    ids = rng.integers(1, 49000, size=(batch, 77)).astype(np.int32)
    ids[:, 20] = 49407                                      # the end of text: the largest id
    ids[:, 21:] = 0
    with tempfile.TemporaryDirectory() as d:
        tmodel = _model(layers, d)
        ours, _ = clip_model.from_transformers(d)
    graphdef, state = nnx.split(ours)

    def run_jax():
        return np.asarray(learned.score(graphdef, "pickscore", state, pixels, ids, None))

    tpx, tids = torch.from_numpy(pixels).permute(0, 3, 1, 2), torch.from_numpy(ids).long()

    def run_torch():
        with torch.inference_mode():
            img = tmodel.get_image_features(pixel_values=tpx)
            txt = tmodel.get_text_features(input_ids=tids)
            img, txt = getattr(img, "pooler_output", img), getattr(txt, "pooler_output", txt)
            img = img / img.norm(dim=-1, keepdim=True)
            txt = txt / txt.norm(dim=-1, keepdim=True)
            return (tmodel.logit_scale.exp() * (img * txt).sum(-1)).numpy()

    out = {}
    for name, fn in (("jax", run_jax), ("torch", run_torch)):
        first = fn()                                          # compile / warm up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name] = (batch / statistics.median(times), first)
    return {"jax_images_per_s": out["jax"][0], "torch_images_per_s": out["torch"][0],
            "ratio": out["jax"][0] / out["torch"][0],
            "max_score_diff": float(np.abs(out["jax"][1] - out["torch"][1]).max()),
            "devices": str(jax.devices()[0]), "torch_threads": torch.get_num_threads()}


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import torch  # noqa: PLC0415
    if FLAGS.threads:
        torch.set_num_threads(FLAGS.threads)
    r = measure(FLAGS.layers, FLAGS.batch, FLAGS.repeats)
    print(f"PickScore architecture, {FLAGS.layers} layers per tower, batch {FLAGS.batch}, "
          f"median of {FLAGS.repeats}: JAX (jit, {r['devices']}) {r['jax_images_per_s']:.2f} "
          f"images/s, PyTorch eager ({r['torch_threads']} threads) "
          f"{r['torch_images_per_s']:.2f} images/s: {r['ratio']:.2f}x; scores agree to "
          f"{r['max_score_diff']:.2g}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
