"""The Wan transformer's FLOP formula (emulation.flops) equals the matmul FLOPs of its jaxpr."""
import math

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from helpers import dot_flops

from spotlight_jax.emulation import flops
from spotlight_jax.models import WanConfig, WanTransformer

TINY = [
    # the tiny video world's layout: a prompt encoder over token ids
    WanConfig(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=3,
              out_channels=3, text_dim=16, freq_dim=8, ffn_dim=40, num_layers=2, frames=3,
              image_size=6, text_len=5, vocab_size=11, text_width=16, text_heads=2,
              text_layers=1),
    # UMT5 states in, a temporal patch, odd frames
    WanConfig(patch_size=(2, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
              out_channels=4, text_dim=20, freq_dim=16, ffn_dim=32, num_layers=3, frames=4,
              image_size=4, text_len=7),
]


@pytest.mark.parametrize("cfg", TINY, ids=["encoder", "umt5_states"])
def test_wan_flop_formula_matches_the_model_jaxpr(cfg):
    """Both are integers and must agree exactly; the parameter count and the LoRA factor count
    (q, k, v, out of both attentions of every block) too."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: WanTransformer(cfg, rngs=nnx.Rngs(0))))
    b, f32 = 2, jnp.float32
    x = jax.ShapeDtypeStruct((b, *cfg.latent_shape), f32)
    t = jax.ShapeDtypeStruct((b,), f32)
    tok = (jax.ShapeDtypeStruct((b, cfg.text_len), jnp.int32) if cfg.text_width
           else jax.ShapeDtypeStruct((b, cfg.text_len, cfg.text_dim), f32))
    mask = jax.ShapeDtypeStruct((b, cfg.text_len), jnp.bool_)
    jaxpr = jax.make_jaxpr(lambda st, *a: nnx.merge(graphdef, st)(*a))(state, x, t, tok, mask)
    assert flops.forward_flops(cfg, batch=b) == dot_flops(jaxpr.jaxpr)
    n_params = sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(state, nnx.Param)))
    assert flops.param_count(cfg) == n_params
    from spotlight_jax.rl.lora import init_lora  # noqa: PLC0415
    lora = init_lora(nnx.state(state, nnx.Param), 3, jax.random.key(0))
    assert flops.lora_param_count(cfg, 3) == sum(x.size for x in jax.tree.leaves(lora))
