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


def define_model_flags(flag_values: flags.FlagValues, depth: int) -> None:
    """The flags naming the programs :func:`step_programs` builds (``--config``, ``--depth``,
    ``--latent``, ``--batch``, ``--rank``), shared with ``bench.gpu_lowering``."""
    fv = {"flag_values": flag_values}
    flags.DEFINE_string("config", str(programs.REPO / "configs" / "qwen_image.py"),
                        "Config file whose model is analysed.", **fv)
    flags.DEFINE_integer("depth", depth, "Blocks of the model (real width).", **fv)
    flags.DEFINE_integer("latent", 64, "Latent cells per side (64 = a 512^2 image at /8).", **fv)
    flags.DEFINE_integer("batch", 1, "Latents per program.", **fv)
    flags.DEFINE_integer("rank", 32, "LoRA rank.", **fv)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    define_model_flags(flag_values, depth=1)
    flags.DEFINE_string("out", None, "Also write the counts as JSON here.",
                        flag_values=flag_values)


def reduced_overrides(config_path: str, depth: int, latent: int) -> dict:
    """Config overrides that give the config's model ``depth`` blocks, a ``latent``-cell
    square input (a video model keeps its frames) and unscanned blocks (one program per block,
    as XLA's counts and the lowered program's calls are read). ``depth`` counts the dual-stream
    blocks: single-stream ones (FLUX.1) shrink in proportion, and a second attention (SD3.5)
    stays on the blocks that remain."""
    from spotlight_jax import config as conf  # noqa: PLC0415
    from spotlight_jax.models.factory import is_video  # noqa: PLC0415

    full = conf.model_config(conf.load_config(config_path))
    video = is_video(full)
    overrides = {"model.num_layers" if video else "model.depth": depth,
                 "model.image_size": latent, "model.scan_blocks": False}
    if video:
        overrides["model.image_width"] = 0          # square, as for the image models
        return overrides
    if full.single_blocks:
        overrides["model.single_blocks"] = max(1, round(full.single_blocks * depth / full.depth))
    if full.dual_attention_layers:
        overrides["model.dual_attention_layers"] = tuple(
            i for i in full.dual_attention_layers if i < depth)
    return overrides


def step_programs(config_path: str, depth: int, latent: int, batch: int, rank: int,
                  attn=None, **model):
    """``(model config, {name: (fn, args)})``: the forward and the gradients of a flow-matching
    loss under full fine-tuning and under LoRA of ``rank`` (merged and factored) of the config's
    model at ``depth`` blocks, over abstract parameters and inputs (nothing is allocated).
    ``attn``: the model's ``AttentionSpec`` (its default when None); ``model``: overrides of
    the model section (``remat_policy="dots"``)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from spotlight_jax import config as conf  # noqa: PLC0415
    from spotlight_jax.models.factory import abstract_model  # noqa: PLC0415
    from spotlight_jax.rl import lora as lora_lib  # noqa: PLC0415

    config = conf.load_config(config_path, {**reduced_overrides(config_path, depth, latent),
                                            **{f"model.{k}": v for k, v in model.items()}})
    cfg = conf.model_config(config)
    graphdef, state = abstract_model(cfg)
    x = jax.ShapeDtypeStruct((batch, *cfg.latent_shape), jnp.float32)
    t = jax.ShapeDtypeStruct((batch,), jnp.float32)
    if cfg.text_width:
        tokens = jax.ShapeDtypeStruct((batch, cfg.text_len), jnp.int32)
    else:
        tokens = jax.ShapeDtypeStruct((batch, cfg.text_len, cfg.text_embed_dim), jnp.float32)
    mask = jax.ShapeDtypeStruct((batch, cfg.text_len), jnp.bool_)
    conditions = {}           # what a model takes beside the text: a pooled embedding, guidance
    if cfg.pooled == "input":
        conditions["pooled"] = jax.ShapeDtypeStruct((batch, cfg.pooled_dim), jnp.float32)
    if cfg.guidance_embed:
        conditions["guidance"] = jax.ShapeDtypeStruct((batch,), jnp.float32)
    lora = jax.eval_shape(lambda: lora_lib.init_lora(state, rank, jax.random.key(0)))
    scale = 2.0
    kw = {} if attn is None else {"attn": attn}

    def flow_loss(model, x, t, tokens, mask, conditions):
        eps = jnp.ones_like(x)      # the loss's values do not change its FLOPs
        tb = t.reshape((-1,) + (1,) * (x.ndim - 1))
        xt = (1 - tb) * x + tb * eps
        v = model(xt, t, tokens, mask, **conditions, **kw)
        return jnp.mean((v - (eps - x)) ** 2)

    def forward(s, base, x, t, tokens, mask, conditions):
        return nnx.merge(graphdef, s)(x, t, tokens, mask, **conditions, **kw)

    def full(s, base, *a):
        return flow_loss(nnx.merge(graphdef, s), *a)

    def lora_merged(lo, base, *a):
        return flow_loss(nnx.merge(graphdef, lora_lib.merge(base, lo, scale)), *a)

    def lora_factored(lo, base, *a):
        return flow_loss(lora_lib.adapted_model(graphdef, base, lo, scale), *a)

    data = (state, x, t, tokens, mask, conditions)
    return cfg, {"forward": (forward, (state, *data)), "full": (jax.grad(full), (state, *data)),
                 "lora_merged": (jax.grad(lora_merged), (lora, *data)),
                 "lora_factored": (jax.grad(lora_factored), (lora, *data))}


def step_flops(config_path: str, depth: int, latent: int, batch: int, rank: int) -> dict:
    """XLA's FLOP counts of the forward and of the three gradients (see the module doc)."""
    import jax  # noqa: PLC0415

    _, progs = step_programs(config_path, depth, latent, batch, rank)
    out = {"config": config_path, "depth": depth, "latent": latent, "batch": batch,
           "rank": rank, "backend": jax.default_backend()}
    for name, (fn, args) in progs.items():
        analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
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
