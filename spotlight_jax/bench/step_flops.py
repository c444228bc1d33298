"""Where a train step's compute goes, from XLA's cost analysis of the compiled programs.

  python -m spotlight_jax.bench.step_flops [--config=configs/qwen_image.py] [--depth=1]
      [--latent=64] [--batch=1] [--rank=32] [--out=FILE.json]

Compiles (never runs: parameters stay abstract, so a full-width model fits a laptop) the
config's model at ``--depth`` blocks and a ``--latent``^2 input, and prints the FLOPs XLA counts
for one forward and for the gradient of a flow-matching loss under full fine-tuning and under
LoRA of ``--rank`` applied both ways (``rl.lora``): merged into the kernels (``x (W + s a b)``,
whose backward forms every adapted kernel's weight gradient) and factored (``x W + s (x a) b``,
what the objectives' train steps differentiate). Ratios are to the forward: the cost model
charges a step as ``1 + backward factor`` forwards (``cost.backward_factor_full`` /
``cost.backward_factor_lora``).
"""
from __future__ import annotations

from absl import app, flags

from spotlight_jax import programs

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    fv = {"flag_values": flag_values}
    flags.DEFINE_string("config", str(programs.REPO / "configs" / "qwen_image.py"),
                        "Config file whose model is analysed.", **fv)
    flags.DEFINE_integer("depth", 1, "Blocks of the model (real width).", **fv)
    flags.DEFINE_integer("latent", 64, "Latent cells per side (64 = a 512^2 image at /8).", **fv)
    flags.DEFINE_integer("batch", 1, "Latents per step.", **fv)
    flags.DEFINE_integer("rank", 32, "LoRA rank.", **fv)
    flags.DEFINE_string("out", None, "Also write the counts as JSON here.", **fv)


def step_flops(config_path: str, depth: int, latent: int, batch: int, rank: int) -> dict:
    """XLA's FLOP counts of the forward and of the three gradients (see the module doc)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from spotlight_jax import config as conf  # noqa: PLC0415
    from spotlight_jax.models.build import abstract_model  # noqa: PLC0415
    from spotlight_jax.rl import lora as lora_lib  # noqa: PLC0415

    config = conf.load_config(config_path, {"model.depth": depth, "model.image_size": latent,
                                            "model.scan_blocks": False})
    cfg = conf.model_config(config)
    graphdef, state = abstract_model(cfg)
    x = jax.ShapeDtypeStruct((batch, *cfg.latent_shape), jnp.float32)
    t = jax.ShapeDtypeStruct((batch,), jnp.float32)
    if cfg.text_width:
        tokens = jax.ShapeDtypeStruct((batch, cfg.text_len), jnp.int32)
    else:
        tokens = jax.ShapeDtypeStruct((batch, cfg.text_len, cfg.text_embed_dim), jnp.float32)
    mask = jax.ShapeDtypeStruct((batch, cfg.text_len), jnp.bool_)
    lora = jax.eval_shape(lambda: lora_lib.init_lora(state, rank, jax.random.key(0)))
    scale = 2.0

    def flow_loss(model, x, t, tokens, mask):
        eps = jnp.ones_like(x)      # the loss's values do not change its FLOPs
        tb = t.reshape((-1,) + (1,) * (x.ndim - 1))
        xt = (1 - tb) * x + tb * eps
        return jnp.mean((model(xt, t, tokens, mask) - (eps - x)) ** 2)

    def forward(s, base, *a):
        return nnx.merge(graphdef, s)(*a)

    def full(s, base, *a):
        return flow_loss(nnx.merge(graphdef, s), *a)

    def lora_merged(lo, base, *a):
        return flow_loss(nnx.merge(graphdef, lora_lib.merge(base, lo, scale)), *a)

    def lora_factored(lo, base, *a):
        return flow_loss(lora_lib.adapted_model(graphdef, base, lo, scale), *a)

    out = {"config": config_path, "depth": depth, "latent": latent, "batch": batch,
           "rank": rank, "backend": jax.default_backend()}
    for name, fn, first in (("forward", forward, state), ("full", jax.grad(full), state),
                            ("lora_merged", jax.grad(lora_merged), lora),
                            ("lora_factored", jax.grad(lora_factored), lora)):
        lowered = jax.jit(fn).lower(first, state, x, t, tokens, mask)
        analysis = lowered.compile().cost_analysis()
        if isinstance(analysis, (list, tuple)):        # older JAX: one dict per program
            analysis = analysis[0]
        out[f"{name}_flops"] = float(analysis["flops"])
    for name in ("full", "lora_merged", "lora_factored"):
        out[f"{name}_over_forward"] = out[f"{name}_flops"] / out["forward_flops"]
    out["factored_saving"] = 1.0 - out["lora_factored_flops"] / out["lora_merged_flops"]
    return out


def table(r: dict) -> str:
    rows = [("forward", "forward_flops", None), ("full fine-tuning step", "full_flops", "full"),
            (f"LoRA r{r['rank']} step, merged", "lora_merged_flops", "lora_merged"),
            (f"LoRA r{r['rank']} step, factored", "lora_factored_flops", "lora_factored")]
    lines = [f"{r['config']} at {r['depth']} block(s), {r['latent']}^2 latent, batch "
             f"{r['batch']} (XLA cost analysis, {r['backend']}):"]
    for label, key, ratio in rows:
        rel = f"{r[ratio + '_over_forward']:.2f}x forward" if ratio else ""
        lines.append(f"  {label:<28} {r[key]:.3e} FLOPs  {rel}")
    lines.append(f"  factored LoRA saves {100 * r['factored_saving']:.1f}% of the merged "
                 "step's FLOPs")
    return "\n".join(lines)


def main(argv):
    del argv
    result = step_flops(FLAGS.config, FLAGS.depth, FLAGS.latent, FLAGS.batch, FLAGS.rank)
    programs.emit(result, table(result), FLAGS.out)


if __name__ == "__main__":
    define_flags()
    app.run(main)
