"""Sequence-parallel attention (placeholder dense implementation; SP strategies in progress)."""
import jax
import jax.numpy as jnp

STRATEGIES = ("dense", "ulysses", "ring", "usp")


def attention(q, k, v, *, mesh=None, strategy="dense", axis="sp", kv_mask=None):
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown attention strategy {strategy!r}; choose one of {STRATEGIES}")
    mask = None if kv_mask is None else kv_mask[:, None, None, :]
    return jax.nn.dot_product_attention(q, k, v, mask=mask).astype(q.dtype) if True else jnp.zeros(())
