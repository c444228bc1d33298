"""The laptop demo's rollout phase, its model calls alone (docs/performance.md): 64 images of the
tiny base as 16 leases of 4, 10 steps in segments of 2 with each segment's outputs copied to the
host (as the pull scheduler commits them), against the same segments dispatched without waiting,
16 calls of 10 steps, and one call of 64. Medians of 5, printed.

    python results/cpu_path/segment_calls.py
"""
import tempfile
import time

import jax.numpy as jnp
import numpy as np

from spotlight_jax.config import RunSpec, load_config
from spotlight_jax.diffusion.rollout import Sampler, initial_noise
from spotlight_jax.runner import base_model

spec = RunSpec.from_config(load_config("tiny", {}))
with tempfile.TemporaryDirectory() as w:
    graphdef, state, _ = base_model.load_or_pretrain_base(spec, w, allow_pretrain=False)
cfg, shape = spec.sampler, spec.model.latent_shape
sampler = Sampler(graphdef, shape, cfg)
source = spec.prompt_source()
tokens, mask = source.tokenize(["a red square"] * 4, spec.model.text_len)
tokens64, mask64 = source.tokenize(["a red square"] * 64, spec.model.text_len)
T = cfg.num_steps


def noise(seeds):
    return initial_noise(jnp.asarray(seeds, jnp.uint32), shape, cfg.shared_init_bits)


def leases(steps, wait):
    outs = []
    for lease in range(16):
        seeds = np.arange(4 * lease, 4 * lease + 4, dtype=np.uint32)
        x = noise(seeds)
        for start in range(0, T, steps):
            out = sampler.segment(state, x, start, tokens, mask, seeds, steps)
            x = out["x"]
            if wait:
                np.asarray(out["x"]), np.asarray(out["latents"]), np.asarray(out["log_probs"])
            outs.append(out)
    for out in outs:
        np.asarray(out["latents"])


def one_call():
    seeds = np.arange(64, dtype=np.uint32)
    np.asarray(sampler.segment(state, noise(seeds), 0, tokens64, mask64, seeds, T)["latents"])


cases = {"80 calls of 2 steps, each copied to the host": lambda: leases(2, True),
         "80 calls of 2 steps, not waited for": lambda: leases(2, False),
         "16 calls of 10 steps": lambda: leases(T, False),
         "1 call of 64": one_call}
for fn in cases.values():
    fn()                                    # compile
times = {name: [] for name in cases}
for _ in range(5):
    for name, fn in cases.items():
        t0 = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - t0)
for name, ts in times.items():
    print(f"{name}: median {np.median(ts):.3f} s")
