"""Rollout throughput vs the cost of the same number of bare model forwards.

  python -m spotlight_jax.bench.sampler [--batch 64] [--steps 10] [--repeats 5] [--torch]
                                        [--devices 2]

A rollout is one jitted scan over denoising steps (noise from (seed, step), SDE step, log-prob),
so its time should be close to ``steps`` forwards of the model: the printed overhead is
``rollout / (steps x forward) - 1`` (target <= 20%). Medians of ``--repeats`` runs.

``--torch`` also times the same ODE rollout written the way a PyTorch user would, eagerly
(``bench._torch_reference``: the same model and weights, the prompt encoded once), alternating
with the jitted one in this process, and prints the ratio (needs ``pip install torch``).
``--devices N`` (N > 1) gives JAX N emulated host devices and adds a third contender to that
comparison: the same jitted rollout with its batch split over a data mesh of the N devices (the
weights replicated), which is how a JAX program uses several CPU cores beyond XLA's intra-op
threads; the other rows stay on one device.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from absl import app, flags

from spotlight_jax import programs

FLAGS = flags.FLAGS


def _median_time(fn, repeats):
    fn()  # compile / warm up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This benchmark's flags (defined only when it runs as the program; see ``programs``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("config", programs.TINY_CONFIG, "Path to a config file (configs/*.py).",
                        **fv)
    flags.DEFINE_integer("batch", 64, "Rollouts per batch.", **fv)
    flags.DEFINE_integer("steps", 10, "Denoising steps.", **fv)
    flags.DEFINE_integer("repeats", 5, "Timed runs (median).", **fv)
    flags.DEFINE_bool("torch", False, "Also time a PyTorch eager port of the ODE rollout "
                      "(needs torch).", **fv)
    flags.DEFINE_integer("devices", 1, "Emulated host devices; > 1 adds the ODE rollout with "
                         "its batch split over all of them to the --torch comparison.", **fv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.devices < 1 or FLAGS.batch % FLAGS.devices:
        raise app.UsageError(f"--devices={FLAGS.devices}: must be >= 1 and divide --batch="
                             f"{FLAGS.batch}")
    programs.emulate_devices(FLAGS.devices)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from spotlight_jax import world
    from spotlight_jax.config import load_config, model_config
    from spotlight_jax.diffusion import Sampler, SamplerConfig
    from spotlight_jax.diffusion.rollout import sampling_compiler_options
    from spotlight_jax.models.factory import create_model

    config = load_config(FLAGS.config)
    mcfg = model_config(config)
    graphdef, state = create_model(mcfg)
    prompts = (world.train_prompts(world.WorldConfig(image_size=mcfg.image_size))
               * 10)[:FLAGS.batch]
    tokens, mask = world.tokenize(prompts, mcfg.text_len)
    seeds = np.arange(FLAGS.batch, dtype=np.uint32)
    shape = (FLAGS.batch, *mcfg.latent_shape)
    x = jnp.asarray(np.random.default_rng(0).normal(size=shape), jnp.float32)
    t = jnp.full((FLAGS.batch,), 0.5)
    # every row but --torch's data-parallel one runs on the first device
    state, tokens, mask = jax.device_put((state, tokens, mask), jax.devices()[0])
    forward = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x, t, tokens, mask),
                      compiler_options=sampling_compiler_options())  # as the rollout's
    rows = []
    for mode, sc in [("sde", SamplerConfig(num_steps=FLAGS.steps)),
                     ("ode", SamplerConfig(num_steps=FLAGS.steps, noise_level=0.0,
                                           sde_type="ode"))]:
        sampler = Sampler(graphdef, shape[1:], sc)
        t_fwd = _median_time(lambda: forward(state, x).block_until_ready(), FLAGS.repeats)
        t_roll = _median_time(lambda sampler=sampler: jax.block_until_ready(
            sampler.rollout(state, tokens, mask, seeds)), FLAGS.repeats)
        rows.append((mode, t_fwd, t_roll, FLAGS.batch / t_roll, t_roll / (FLAGS.steps * t_fwd) - 1))
    print(f"config={Path(FLAGS.config).name} batch={FLAGS.batch} steps={FLAGS.steps} "
          f"devices=1 of {jax.device_count()} ({jax.devices()[0].platform}); medians of "
          f"{FLAGS.repeats}")
    print(f"{'sampler':<8}{'forward s':>11}{'rollout s':>11}{'images/s':>10}{'overhead':>10}")
    for mode, tf, tr, ips, ov in rows:
        print(f"{mode:<8}{tf:>11.3f}{tr:>11.3f}{ips:>10.1f}{ov:>+10.1%}")
    if FLAGS.torch:
        _compare_with_torch(mcfg, graphdef, state, tokens, mask, seeds, FLAGS.steps,
                            FLAGS.repeats)


def _compare_with_torch(mcfg, graphdef, state, tokens, mask, seeds, steps, repeats):
    """Times the jitted ODE rollout (on one device, and with more than one device present also
    with its batch split over all of them) and the PyTorch eager port alternately (same process,
    same weights and x_T); prints each and its ratio to the eager port."""
    import jax
    import numpy as np
    import torch
    from flax import nnx

    from spotlight_jax.bench._torch_reference import TorchMMDiT
    from spotlight_jax.diffusion import Sampler, SamplerConfig
    from spotlight_jax.diffusion.rollout import initial_noise
    from spotlight_jax.parallel.mesh import make_mesh, replicated

    sc = SamplerConfig(num_steps=steps, noise_level=0.0, sde_type="ode")
    sampler = Sampler(graphdef, mcfg.latent_shape, sc)
    ref = TorchMMDiT(mcfg, nnx.to_pure_dict(state))
    x_t = torch.from_numpy(np.array(initial_noise(seeds, sampler.image_shape)))
    tok, msk = torch.from_numpy(np.array(tokens)), torch.from_numpy(np.array(mask))
    runs = {"jax jit": lambda: jax.block_until_ready(sampler.rollout(state, tokens, mask,
                                                                     seeds)),
            "torch eager": lambda: ref.ode_rollout(x_t, sc.sigmas, tok, msk)}
    n_dev = jax.device_count()
    if n_dev > 1:                                   # the batch over a data mesh of every device
        mesh = make_mesh()
        sharded = Sampler(graphdef, sampler.image_shape, sc, mesh=mesh)
        state_r = jax.device_put(state, replicated(mesh))
        runs[f"jax jit x{n_dev}"] = lambda: jax.block_until_ready(
            sharded.rollout(state_r, tokens, mask, seeds))
        gap = np.abs(np.asarray(sharded.rollout(state_r, tokens, mask, seeds)["images"])
                     - np.asarray(sampler.rollout(state, tokens, mask, seeds)["images"])).max()
        print(f"batch over {n_dev} devices: images within {gap:.1e} of one device's")
    times = {name: [] for name in runs}
    for fn in runs.values():
        fn()                                        # compile / warm up
    for _ in range(repeats):                        # alternate: both see the same machine
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    n = len(seeds)
    print(f"ODE rollout, {steps} steps, batch {n}, prompt encoded once; torch "
          f"{torch.__version__} with {torch.get_num_threads()} threads")
    for name, t in med.items():
        print(f"{name:<14}{t:>8.3f} s{n / t:>8.1f} images/s")
    for name in med:
        if name.startswith("jax"):
            print(f"{name} / torch eager: {med['torch eager'] / med[name]:.2f}x")


if __name__ == "__main__":
    define_flags()
    app.run(main)
