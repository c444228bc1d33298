"""Shared test fixtures: a micro model that compiles in seconds."""
import jax
from flax import nnx

from spotlight_jax.models import MMDiT, MMDiTConfig

MICRO = MMDiTConfig(image_size=16, patch_size=4, width=32, depth=2, num_heads=4, mlp_ratio=2.0,
                    vocab_size=64, text_len=12, text_width=16, text_layers=1, text_heads=2,
                    conv_stem=4, conv_head=True)


def micro_model(seed=0, **overrides):
    import dataclasses
    cfg = dataclasses.replace(MICRO, **overrides)
    model = MMDiT(cfg, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model)
    # adaLN-Zero makes a fresh model output exactly 0; perturb so tests see real numerics.
    state = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(seed + 1),
                                                                x.shape, x.dtype), state)
    return cfg, graphdef, state


# A whole run of the tiny config shrunk to the micro model (seconds per iteration), as dotted
# overrides of configs/tiny.py: shared by the resume, mode, notebook and cluster tests.
MICRO_RUN_OVERRIDES = {
    **{f"model.{f}": getattr(MICRO, f) for f in MICRO.__dataclass_fields__},
    "mode": "flow_grpo", "rl.objective": "flow_grpo", "world.image_size": MICRO.image_size,
    "sampler.num_steps": 3,
    "sampler.sde_window": None,
    "sampler.eval_steps": 2, "rl.prompts_per_iter": 2, "rl.group_size": 4, "rl.train_steps": 2,
    "rl.minibatches": 2, "rl.eval_every": 0, "rl.eval_prompts": 2, "rl.eval_seeds": 1,
    "rl.lr": 1e-3, "checkpoint.every": 1,
    "rl.nft.times": 2,                  # of the 2 grid times a 3-step sampler has in (0, 1)
}


def micro_config(iterations, **overrides):
    from spotlight_jax.builders import load_config
    return load_config("tiny", {**MICRO_RUN_OVERRIDES, "rl.iterations": iterations, **overrides})
