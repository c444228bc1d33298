"""The objectives' tests' shared inputs: Flow-GRPO's rollout batch (built once per worker: its
rollout compiles) and an nft batch of random latents."""
import numpy as np
import pytest
from helpers import micro_model

from spotlight_jax import world
from spotlight_jax.diffusion import Sampler, SamplerConfig
from spotlight_jax.rl import advantages

SAMPLER = SamplerConfig(num_steps=4, shift=3.0, noise_level=0.7)


@pytest.fixture(scope="session")
def rollout_batch():
    """``(graphdef, state, batch)``: 8 SDE rollouts of the micro model (2 prompts x 4) with
    their log-probs and group advantages."""
    cfg, graphdef, state = micro_model(seed=3)
    prompts = ["a red bar"] * 4 + ["two blue squares"] * 4
    tokens, mask = world.tokenize(prompts, cfg.text_len)
    out = Sampler(graphdef, (16, 16, 3), SAMPLER).rollout(state, tokens, mask, np.arange(8))
    r = np.array([0.1, 0.5, 0.9, 0.3, 0.2, 0.2, 0.8, 0.4], np.float32)
    batch = {"latents": np.asarray(out["latents"]), "log_probs": np.asarray(out["log_probs"]),
             "advantages": advantages(r, np.repeat([0, 1], 4)), "tokens": tokens, "mask": mask}
    return graphdef, state, batch


def nft_batch(cfg, n=4, adv=None):
    """``n`` random latent trajectories of 5 steps for ``n // 2`` world prompts (2 images
    each) with advantages ``adv`` (default: 1, -1, 2, -2 repeated)."""
    rng = np.random.default_rng(0)
    prompts = world.train_prompts(world.WorldConfig(image_size=cfg.image_size))[:n // 2]
    tokens, mask = world.tokenize([p for p in prompts for _ in range(2)], cfg.text_len)
    shape = (n, 5, cfg.image_size, cfg.image_size, cfg.channels)
    return {"latents": rng.normal(size=shape).astype(np.float32), "tokens": tokens,
            "mask": mask, "prompt_ids": np.repeat(np.arange(n // 2), 2),
            "advantages": (np.resize(np.array([1.0, -1.0, 2.0, -2.0], np.float32), n)
                           if adv is None else adv)}
