"""Rollout throughput vs the cost of the same number of bare model forwards.

  python -m spotlight_jax.bench.sampler [--batch 64] [--steps 10] [--repeats 5]

A rollout is one jitted scan over denoising steps (noise from (seed, step), SDE step, log-prob),
so its time should be close to ``steps`` forwards of the model: the printed overhead is
``rollout / (steps x forward) - 1`` (target <= 20%). Medians of ``--repeats`` runs.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def _median_time(fn, repeats):
    fn()  # compile / warm up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[2] / "configs"
                                            / "tiny.py"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from spotlight_jax import world
    from spotlight_jax.builders import create_model, load_config, model_config
    from spotlight_jax.diffusion import Sampler, SamplerConfig

    config = load_config(args.config)
    mcfg = model_config(config)
    graphdef, state = create_model(mcfg)
    prompts = (world.train_prompts(world.WorldConfig(image_size=mcfg.image_size))
               * 10)[:args.batch]
    tokens, mask = world.tokenize(prompts, mcfg.text_len)
    seeds = np.arange(args.batch, dtype=np.uint32)
    shape = (args.batch, mcfg.image_size, mcfg.image_size, mcfg.channels)
    x = jnp.asarray(np.random.default_rng(0).normal(size=shape), jnp.float32)
    t = jnp.full((args.batch,), 0.5)
    forward = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x, t, tokens, mask))
    rows = []
    for mode, sc in [("sde", SamplerConfig(num_steps=args.steps)),
                     ("ode", SamplerConfig(num_steps=args.steps, noise_level=0.0,
                                           sde_type="ode"))]:
        sampler = Sampler(graphdef, shape[1:], sc)
        t_fwd = _median_time(lambda: forward(state, x).block_until_ready(), args.repeats)
        t_roll = _median_time(lambda sampler=sampler: jax.block_until_ready(
            sampler.rollout(state, tokens, mask, seeds)), args.repeats)
        rows.append((mode, t_fwd, t_roll, args.batch / t_roll, t_roll / (args.steps * t_fwd) - 1))
    print(f"config={Path(args.config).name} batch={args.batch} steps={args.steps} "
          f"devices={jax.device_count()} ({jax.devices()[0].platform}); medians of "
          f"{args.repeats}")
    print(f"{'sampler':<8}{'forward s':>11}{'rollout s':>11}{'images/s':>10}{'overhead':>10}")
    for mode, tf, tr, ips, ov in rows:
        print(f"{mode:<8}{tf:>11.3f}{tr:>11.3f}{ips:>10.1f}{ov:>+10.1%}")


if __name__ == "__main__":
    main()
