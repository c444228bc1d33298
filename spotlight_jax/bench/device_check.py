"""The accelerator check: a real-shape model at reduced depth, timed on whatever device JAX has.

  python -m spotlight_jax.bench.device_check [--config=configs/qwen_image.py] [--depth=2]
      [--latent=128] [--batch=1] [--out=device_check.json]

One short script for a lent GPU (see docs/performance.md, "Accelerator check"), in four parts,
each a median of ``--repeats`` timed runs after a compile:

1. ``attention``: ``jax.nn.dot_product_attention`` at the model's joint sequence (text + image
   tokens, heads, head_dim) in the compute dtype, ``implementation='xla'`` against ``'cudnn'``
   (flash attention; GPU only), forward and forward+backward, with the largest difference.
2. ``forward``: one velocity evaluation of the config's MMDiT at ``--depth`` blocks (the real
   width, heads, text length and dtype), ``--batch`` latents of ``--latent``^2 cells.
3. ``train_step``: the same model's flow-matching loss, gradient and AdamW update (full
   fine-tuning, donated state): seconds per step and samples per second.
4. ``concurrent``: with two or more devices, a train step on one device while a rollout step
   runs on another (training and exploration on disjoint devices), against running them one
   after the other; skipped, and said so, with one device.

On a CPU it runs too (``--config=configs/tiny.py --depth=1 --latent=8``: what the tests do), so the
script cannot rot between GPU loans; the cuDNN row then says it was skipped.
"""
from __future__ import annotations

import json
import statistics
import time

from absl import app, flags

from spotlight_jax import programs

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("config", str(programs.REPO / "configs" / "qwen_image.py"),
                        "Config file whose model shapes are checked.", **fv)
    flags.DEFINE_integer("depth", 2, "Blocks of the model (reduced depth, real width).", **fv)
    flags.DEFINE_integer("latent", 128, "Latent cells per side (128 = a 1024^2 image at /8).",
                         **fv)
    flags.DEFINE_integer("batch", 1, "Latents per forward / train step.", **fv)
    flags.DEFINE_integer("repeats", 5, "Timed runs per measurement (median).", **fv)
    flags.DEFINE_string("out", None, "Write the results as JSON here.", **fv)


def median_seconds(fn, repeats: int) -> float:
    """Median wall seconds of ``fn()`` (which must block on its result) after one warm-up."""
    fn()
    ts = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def check_attention(batch, seq, heads, head_dim, dtype, repeats):
    """Rows ``{implementation, fwd_ms, fwd_bwd_ms, max_abs_diff_vs_xla}``; cuDNN only on GPU."""
    import jax  # noqa: PLC0415 - benchmarks import JAX after the device set-up
    import jax.numpy as jnp  # noqa: PLC0415

    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, (batch, seq, heads, head_dim), dtype) for kk in keys)
    rows, ref = [], None
    for impl in ("xla", "cudnn"):
        if impl == "cudnn" and jax.default_backend() != "gpu":
            rows.append({"implementation": impl, "skipped": "not a GPU backend"})
            continue

        def fwd(q, k, v, impl=impl):
            return jax.nn.dot_product_attention(q, k, v, implementation=impl)

        def loss(q, k, v, impl=impl):
            return jnp.sum(fwd(q, k, v).astype(jnp.float32) ** 2)

        try:
            f = jax.jit(fwd)
            g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            out = f(q, k, v).block_until_ready()
            row = {"implementation": impl,
                   "fwd_ms": 1e3 * median_seconds(lambda f=f: f(q, k, v).block_until_ready(),
                                                  repeats),
                   "fwd_bwd_ms": 1e3 * median_seconds(
                       lambda g=g: jax.block_until_ready(g(q, k, v)), repeats)}
        except Exception as e:  # noqa: BLE001 - an unsupported kernel is a result, not a crash
            rows.append({"implementation": impl, "skipped": f"{type(e).__name__}: {e}"[:200]})
            continue
        if ref is None:
            ref = out.astype(jnp.float32)
        row["max_abs_diff_vs_xla"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)))
        rows.append(row)
    return rows


def build(config_path: str, depth: int, latent: int):
    """``(model config, graphdef, state)`` of the config's model at ``depth`` blocks and a
    ``latent``^2 input, initialised at random on the default device."""
    from spotlight_jax import config as conf  # noqa: PLC0415
    from spotlight_jax.models.build import create_model  # noqa: PLC0415

    config = conf.load_config(config_path, {"model.depth": depth, "model.image_size": latent,
                                            "model.scan_blocks": False})
    cfg = conf.model_config(config)
    graphdef, state = create_model(cfg)
    return cfg, graphdef, state


def inputs(cfg, batch: int, seed: int = 0):
    """Random latents, flow times and prompt inputs of the model's shapes and dtypes."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    ks = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(ks[0], (batch, cfg.image_size, cfg.image_size, cfg.channels))
    t = jax.random.uniform(ks[1], (batch,))
    if cfg.text_width:
        tokens = jax.random.randint(ks[2], (batch, cfg.text_len), 0, cfg.vocab_size)
    else:
        tokens = jax.random.normal(ks[2], (batch, cfg.text_len, cfg.text_embed_dim))
    return x, t, tokens, jnp.ones((batch, cfg.text_len), bool)


def check_model(cfg, graphdef, state, batch: int, repeats: int):
    """Forward and train-step timings of the model (full fine-tuning, AdamW, donated state)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import optax  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from spotlight_jax.models import count_params  # noqa: PLC0415

    x, t, tokens, mask = inputs(cfg, batch)
    params = nnx.to_pure_dict(state)

    def velocity(p, x, t):
        s = jax.tree.map(lambda a: a, state)
        nnx.replace_by_pure_dict(s, p)
        return nnx.merge(graphdef, s)(x, t, tokens, mask)

    fwd = jax.jit(velocity)
    opt = optax.adamw(1e-5)
    opt_state = jax.jit(opt.init)(params)

    def step(p, o, x, t, eps):
        def loss(p):
            xt = (1 - t[:, None, None, None]) * x + t[:, None, None, None] * eps
            return jnp.mean((velocity(p, xt, t) - (eps - x)) ** 2)
        value, grads = jax.value_and_grad(loss)(p)
        updates, o = opt.update(grads, o, p)
        return optax.apply_updates(p, updates), o, value

    train = jax.jit(step, donate_argnums=(0, 1))
    eps = jax.random.normal(jax.random.key(1), x.shape)
    fwd_s = median_seconds(lambda: fwd(params, x, t).block_until_ready(), repeats)
    carry = {"p": params, "o": opt_state}

    def one_step():
        carry["p"], carry["o"], value = train(carry["p"], carry["o"], x, t, eps)
        value.block_until_ready()

    step_s = median_seconds(one_step, repeats)
    return {"params": count_params(state), "forward_ms": 1e3 * fwd_s,
            "train_step_ms": 1e3 * step_s, "train_samples_per_s": batch / step_s}, \
        (fwd, train, carry, (x, t, eps))


def check_concurrent(parts, repeats: int):
    """A train step on device 0 and a forward (one rollout step) on device 1, dispatched together,
    against one after the other. Needs two devices."""
    import jax  # noqa: PLC0415

    devices = jax.devices()
    if len(devices) < 2:
        return {"skipped": f"{len(devices)} device: training and exploration need two"}
    fwd, train, carry, (x, t, eps) = parts
    on1 = jax.device_put((jax.tree.map(lambda a: a, carry["p"]), x, t), devices[1])
    on0 = jax.device_put((x, t, eps), devices[0])

    def explore():
        return fwd(*on1)

    def learn():
        carry["p"], carry["o"], value = train(carry["p"], carry["o"], *on0)
        return value

    seq = median_seconds(lambda: (learn().block_until_ready(), explore().block_until_ready()),
                         repeats)
    both = median_seconds(lambda: jax.block_until_ready((learn(), explore())), repeats)
    return {"sequential_ms": 1e3 * seq, "concurrent_ms": 1e3 * both,
            "overlap_speedup": seq / both}


def run(config_path: str, depth: int, latent: int, batch: int, repeats: int) -> dict:
    import jax  # noqa: PLC0415

    from spotlight_jax.models import as_dtype  # noqa: PLC0415

    cfg, graphdef, state = build(config_path, depth, latent)
    seq = cfg.text_len + (latent // cfg.patch_size) ** 2
    result = {"backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
              "config": str(config_path), "depth": depth, "latent": latent, "batch": batch,
              "width": cfg.width, "heads": cfg.num_heads, "seq": seq, "dtype": cfg.dtype}
    result["attention"] = check_attention(batch, seq, cfg.num_heads, cfg.head_dim,
                                          as_dtype(cfg.dtype), repeats)
    timings, parts = check_model(cfg, graphdef, state, batch, repeats)
    result.update(timings)
    result.update(utilisation(cfg, batch, timings))
    result["concurrent"] = check_concurrent(parts, repeats)
    return result


def utilisation(cfg, batch: int, timings: dict) -> dict:
    """Model FLOP/s and MFU of the forward and the train step (``spotlight_jax.utilization``:
    matmul FLOPs, the step's backward counted as two forwards) against the device's peak (its
    datasheet's dense bf16, or a measured f32 matmul where there is none)."""
    import jax  # noqa: PLC0415

    from spotlight_jax import utilization  # noqa: PLC0415
    from spotlight_jax.emulation.flops import forward_flops  # noqa: PLC0415

    peak, source = utilization.device_peak(jax.devices()[0])
    fwd = float(forward_flops(cfg, batch=batch))
    fwd_s, step_s = timings["forward_ms"] / 1e3, timings["train_step_ms"] / 1e3
    return {"peak_tflops": peak / 1e12, "peak_source": source,
            "forward_tflops": fwd / fwd_s / 1e12,
            "forward_mfu": utilization.mfu(fwd, fwd_s, peak, 1),
            "train_step_tflops": 3 * fwd / step_s / 1e12,
            "train_step_mfu": utilization.mfu(3 * fwd, step_s, peak, 1)}


def table(result: dict) -> str:
    """The result as the markdown lines docs/performance.md records."""
    lines = [f"{result['device']} ({result['backend']}), {result['config']}, depth "
             f"{result['depth']}, {result['params'] / 1e6:.0f}M params, {result['dtype']}, "
             f"batch {result['batch']}, {result['seq']} tokens", "",
             "| measurement | value |", "|---|---|",
             f"| forward | {result['forward_ms']:.1f} ms ({result['forward_tflops']:.1f} model "
             f"TFLOP/s, MFU {result['forward_mfu']:.1%}) |",
             f"| train step (AdamW, full) | {result['train_step_ms']:.1f} ms "
             f"({result['train_samples_per_s']:.2f} samples/s, "
             f"{result['train_step_tflops']:.1f} model TFLOP/s, MFU "
             f"{result['train_step_mfu']:.1%}) |",
             f"| peak per device | {result['peak_tflops']:.4g} TFLOP/s ({result['peak_source']}) |"]
    for row in result["attention"]:
        name = f"attention `{row['implementation']}`"
        if "skipped" in row:
            lines.append(f"| {name} | skipped: {row['skipped']} |")
        else:
            lines.append(f"| {name} | fwd {row['fwd_ms']:.2f} ms, fwd+bwd "
                         f"{row['fwd_bwd_ms']:.2f} ms, max diff vs xla "
                         f"{row['max_abs_diff_vs_xla']:.2e} |")
    c = result["concurrent"]
    lines.append("| train + explore on disjoint devices | "
                 + (f"skipped: {c['skipped']}" if "skipped" in c else
                    f"{c['concurrent_ms']:.1f} ms together vs {c['sequential_ms']:.1f} ms one "
                    f"after the other ({c['overlap_speedup']:.2f}x)") + " |")
    return "\n".join(lines)


def main(argv):
    del argv
    result = run(FLAGS.config, FLAGS.depth, FLAGS.latent, FLAGS.batch, FLAGS.repeats)
    print(table(result))
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    define_flags()
    app.run(main)
