"""The local attention kernel every attention path ends in: XLA's, cuDNN's flash attention on
NVIDIA GPUs, or the Pallas splash attention kernel on TPUs.

``resolve(requested, dtype, head_dim, devices)`` turns a requested implementation (``auto``,
``xla``, ``cudnn``, ``splash``) into a :class:`Kernel`. ``auto`` is splash attention on TPUs,
cuDNN flash attention where it can run (an NVIDIA GPU, bf16 or fp16, a head dim that is a
multiple of 8 and at most 128, or 256 from Hopper on) and XLA elsewhere; a forced ``cudnn`` or
``splash`` that cannot run is a ValueError naming why.

Splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``) takes the padding as
segment ids (a key of another segment than the query is masked), so any mask works, not only a
prefix; sequences are padded to its 128-wide tiles here. ``Kernel("splash", interpret=True)``
runs the same Pallas kernel in interpret mode on any backend: how its paths are tested on CPU.

Padding reaches cuDNN as key lengths, so its keys must be valid first and padded last (a
*prefix* mask per batch element); the models order their joint sequences that way when
:func:`wants_valid_keys_first`. A mask that is not a prefix gives NaN rows under such a kernel
(loud, never silently wrong). XLA takes the mask as it is.

:func:`attend` is plain attention; :func:`attend_with_lse` also returns the float32
log-sum-exp of each query row, which blockwise (ring) attention merges blocks with instead of
materialising their scores. Rows without a valid key are zeros (their log-sum-exp ``-inf``) for
every kernel, as in the ring kernel of ``parallel.attention``.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash")
HALF = (jnp.bfloat16, jnp.float16)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """``impl``: ``xla``, ``cudnn``, ``splash`` (or ``recompute``, below). ``by_lengths``: the
    padding is handed to the kernel as key lengths (valid keys first), as cuDNN needs;
    ``even_lengths``: an odd sequence is padded by one masked position (JAX's cuDNN attention
    refuses odd lengths when differentiated: SD3.5's 333 text + 1024 image tokens). XLA's kernel
    can take either form (how the cuDNN code path is tested on a CPU). ``interpret``: run a
    Pallas kernel (splash) in interpret mode, on any backend."""

    impl: str = "xla"
    by_lengths: bool = False
    even_lengths: bool = False
    interpret: bool = False

    @property
    def fused(self) -> bool:
        """Whether ring attention hands each block to this kernel and merges the blocks by
        their log-sum-exp: a fused kernel (cuDNN, splash) or XLA standing in for cuDNN's code
        path (``by_lengths``)."""
        return self.impl in ("cudnn", "splash") or self.by_lengths


XLA = Kernel()
CUDNN = Kernel("cudnn", by_lengths=True, even_lengths=True)
SPLASH = Kernel("splash")
# XLA's arithmetic with a fused kernel's memory: the backward keeps q, k, v, the output and each
# row's log-sum-exp and recomputes the probabilities (:func:`attend_recomputed`). What the dry
# run traces to count a flash kernel's residuals on a machine without one; not a user setting.
RECOMPUTE = Kernel("recompute")


# What a rematerialised block can keep so that its backward does not run a fused attention's
# forward again: the outputs of cuDNN's forward (JAX's primitive: the attention's output and
# its softmax statistics), splash's and the XLA stand-in's (RECOMPUTE: output and row
# log-sum-exp, named). O(sequence) per head, against the O(sequence^2) work of recomputing them.
SAVED_NAME = "fused_attention"
_CUDNN_FORWARD = ("dot_product_attention_fwd_wrapper", "dot_product_attention_fwd")


def keeps_fused_attention(prim, *_, **params) -> bool:
    """A ``jax.checkpoint`` policy: save what a fused attention's forward returns (see above),
    recompute the rest. A kernel it does not know is recomputed as before, never wrong."""
    if prim.name in _CUDNN_FORWARD:
        return True
    return prim.name == "name" and params.get("name") == SAVED_NAME


def cudnn_refusal(dtype, head_dim: int, devices=None) -> str | None:
    """Why cuDNN flash attention cannot run on ``devices`` (default: the default backend's)
    for ``dtype`` inputs of head dim ``head_dim``; None when it can."""
    devices = list(devices) if devices is not None else jax.devices()
    kinds = {d.platform for d in devices}
    if kinds != {"gpu"} or not all("nvidia" in d.device_kind.lower() or
                                   hasattr(d, "compute_capability") for d in devices):
        found = ", ".join(sorted({f"{d.platform} ({d.device_kind})" for d in devices}))
        return f"cuDNN flash attention needs NVIDIA GPUs; the devices are {found}"
    if jnp.dtype(dtype) not in [jnp.dtype(t) for t in HALF]:
        return (f"cuDNN flash attention takes bfloat16 or float16 inputs, not "
                f"{jnp.dtype(dtype).name} (set the model's dtype to bfloat16)")
    cap = min(float(getattr(d, "compute_capability", "0")) for d in devices)
    largest = 256 if cap >= 9.0 else 128
    if head_dim % 8 or head_dim > largest:
        return (f"cuDNN flash attention needs a head dim that is a multiple of 8 and at most "
                f"{largest} on these GPUs; this model's is {head_dim}")
    return None


def splash_refusal(devices=None) -> str | None:
    """Why splash attention cannot run on ``devices`` (default: the default backend's); None
    on TPUs. (Interpret mode runs anywhere; it is a testing aid, not a user setting.)"""
    devices = list(devices) if devices is not None else jax.devices()
    if {d.platform for d in devices} != {"tpu"}:
        found = ", ".join(sorted({f"{d.platform} ({d.device_kind})" for d in devices}))
        return f"splash attention is a TPU kernel; the devices are {found}"
    return None


def fused_on_gpus(requested: str, dtype, head_dim: int) -> bool:
    """Whether ``requested`` (``auto`` or ``cudnn``) runs cuDNN flash attention for ``dtype``
    inputs of ``head_dim`` on NVIDIA Hopper GPUs: what a plan made elsewhere (the dry run on
    CPU devices) should count for a GPU run."""
    return (requested in ("auto", "cudnn") and jnp.dtype(dtype) in [jnp.dtype(t) for t in HALF]
            and head_dim % 8 == 0 and head_dim <= 256)


def resolve(requested: str, dtype, head_dim: int, devices=None) -> Kernel:
    """The kernel for ``requested`` (one of :data:`IMPLEMENTATIONS`, or a :class:`Kernel`,
    returned as is when ``dtype`` suits it); a forced ``cudnn`` that cannot run is a one-line
    ValueError."""
    if isinstance(requested, Kernel):
        if requested.impl == "cudnn" and jnp.dtype(dtype) not in [jnp.dtype(t) for t in HALF]:
            raise ValueError(f"attention inputs of {jnp.dtype(dtype).name} for the cuDNN "
                             "kernel, which takes bfloat16 or float16 (the model's dtype)")
        return requested
    if requested not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {requested!r}: choose one of "
                         f"{IMPLEMENTATIONS}")
    if requested == "xla":
        return XLA
    devices = None if devices is None else list(devices)      # may be an iterator
    if requested in ("auto", "splash"):
        why = splash_refusal(devices)
        if why is None:
            return SPLASH
        if requested == "splash":
            raise ValueError(f"attention_impl='splash' cannot run here: {why}; use 'auto' "
                             "(splash on TPUs, cuDNN on NVIDIA GPUs, XLA elsewhere) or 'xla'")
    why = cudnn_refusal(dtype, head_dim, devices)
    if why is None:
        return CUDNN
    if requested == "cudnn":
        raise ValueError(f"attention_impl='cudnn' cannot run here: {why}; use 'auto' (cuDNN "
                         "where it can run, XLA elsewhere) or 'xla'")
    return XLA


def wants_valid_keys_first(kernel: Kernel) -> bool:
    """Whether ``kernel`` needs every padded key after the valid ones (key lengths)."""
    return kernel.by_lengths


def attend(kernel: Kernel, q, k, v, mask=None):
    """``[b, q, h, d]`` attention of ``q`` over ``k``/``v`` (``[b, s, h, d]``) with the bool
    ``mask`` ``[b, s]`` (True = valid key) or None; rows without a valid key are zeros."""
    if kernel.impl == "recompute":
        return attend_recomputed(q, k, v, mask)
    if kernel.impl == "splash":
        return splash_attend(q, k, v, mask, interpret=kernel.interpret)
    if kernel.even_lengths and (q.shape[1] % 2 or k.shape[1] % 2):
        even = dataclasses.replace(kernel, even_lengths=False)
        return attend(even, *_padded_to_even(q, k, v, mask))[:, :q.shape[1]]
    if mask is None:
        return jax.nn.dot_product_attention(q, k, v, implementation=kernel.impl).astype(q.dtype)
    mask = jnp.asarray(mask, bool)
    if kernel.by_lengths:
        lengths, usable = _lengths(mask)
        out = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths,
                                           implementation=kernel.impl)
        return _finish(out, mask, usable).astype(q.dtype)
    out = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None, None, :],
                                       implementation=kernel.impl)
    # XLA's kernel averages V over a fully masked row; make that row zero like the ring kernel.
    return _finish(out, mask, None).astype(q.dtype)


def attend_with_lse(kernel: Kernel, q, k, v, mask=None):
    """``(out, lse)``: :func:`attend`'s output and the float32 log-sum-exp of each row's
    scaled logits, ``[b, h, q]`` (``-inf`` for a row without a valid key)."""
    if kernel.even_lengths and (q.shape[1] % 2 or k.shape[1] % 2):
        even = dataclasses.replace(kernel, even_lengths=False)
        out, lse = attend_with_lse(even, *_padded_to_even(q, k, v, mask))
        return out[:, :q.shape[1]], lse[:, :, :q.shape[1]]
    b, s = k.shape[:2]
    mask = jnp.ones((b, s), bool) if mask is None else jnp.asarray(mask, bool)
    if kernel.impl == "splash":
        return splash_attend(q, k, v, mask, interpret=kernel.interpret, with_lse=True)
    lengths, usable = _lengths(mask)
    if kernel.impl == "cudnn":
        out, lse = _cudnn_with_stats(q, k, v, lengths)
    else:
        impl = "xla" if kernel.impl == "recompute" else kernel.impl
        out, lse = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths,
                                                implementation=impl,
                                                return_residual=True)
        lse = lse.astype(jnp.float32).transpose(0, 2, 1)       # [b, q, h] -> [b, h, q]
    has_key = jnp.any(mask, axis=-1)[:, None, None]
    lse = jnp.where(has_key, lse, -jnp.inf)
    if usable is not None:
        lse = jnp.where(usable[:, None, None], lse, jnp.nan)
    return _finish(out, mask, usable).astype(q.dtype), lse


def _padded_to_even(q, k, v, mask):
    """``(q, k, v, mask)`` with an odd query or key length padded by one position: a zero
    query row (sliced off by the caller) or a masked zero key, last (so a prefix mask stays
    one)."""
    def pad(x, n):
        return jnp.pad(x, [(0, 0), (0, n)] + [(0, 0)] * (x.ndim - 2))

    b, s = k.shape[:2]
    mask = jnp.ones((b, s), bool) if mask is None else jnp.asarray(mask, bool)
    return pad(q, q.shape[1] % 2), pad(k, s % 2), pad(v, s % 2), pad(mask, s % 2)


def _lengths(mask):
    """``(lengths, usable)``: each row's count of valid keys (at least 1, so the kernel never
    sees an empty row; :func:`_finish` zeroes those) and whether its mask is a prefix."""
    n = mask.sum(axis=-1).astype(jnp.int32)
    prefix = jnp.arange(mask.shape[-1])[None, :] < n[:, None]
    return jnp.maximum(n, 1), jnp.all(mask == prefix, axis=-1)


def _finish(out, mask, usable):
    """Rows without a valid key -> 0; rows whose mask a lengths kernel cannot express -> NaN."""
    out = jnp.where(jnp.any(mask, axis=-1)[:, None, None, None], out, 0)
    if usable is not None:
        out = jnp.where(usable[:, None, None, None], out, jnp.nan)
    return out


def _cudnn_with_stats(q, k, v, lengths):
    """cuDNN flash attention's output and its float32 softmax statistics ``[b, h, q]`` (the
    public ``return_residual`` rounds them to the inputs' dtype, too coarse to merge blocks)."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn  # noqa: PLC0415

    q_len = jnp.full((q.shape[0],), q.shape[1], jnp.int32)
    out, stats = cudnn.dot_product_attention(
        q, k, v, q_seqlen=q_len, kv_seqlen=lengths, scale=q.shape[-1] ** -0.5,
        mask_type=cudnn.MaskType.PADDING, qkv_layout="BTNH", return_residual=True)
    return out, stats.astype(jnp.float32)


SPLASH_TILE = 128     # splash's block sizes are multiples of the TPU's 128 lanes


def _splash_blocks(length: int) -> int:
    """The largest of splash's block sizes 512, 256, 128 that divides ``length`` (a multiple of
    :data:`SPLASH_TILE`)."""
    return next(b for b in (512, 256, SPLASH_TILE) if length % b == 0)


def _splash_kernel(heads: int, q_len: int, kv_len: int, with_lse: bool, interpret: bool):
    """Splash attention over ``heads`` heads of ``q_len`` queries and ``kv_len`` keys (both
    multiples of :data:`SPLASH_TILE`), every query seeing every key of its segment;
    ``with_lse``: also return each row's log-sum-exp (forward only: no gradient). Made per
    call, not cached: it holds arrays of the trace it is made in. Its residuals (output,
    log-sum-exp) are named :data:`SAVED_NAME`, so a remat policy that keeps a fused
    attention's outputs keeps them."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash  # noqa: PLC0415
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    bq, bkv = _splash_blocks(q_len), _splash_blocks(kv_len)
    blocks = splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv,
                               block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
                               block_q_dq=bq, block_kv_dq=bkv)
    mask = masks.MultiHeadMask([masks.FullMask((q_len, kv_len))] * heads)
    return splash.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1,
                                  save_residuals=with_lse, interpret=interpret,
                                  residual_checkpoint_name=None if with_lse else SAVED_NAME)


def splash_attend(q, k, v, mask, *, interpret: bool = False, with_lse: bool = False):
    """:func:`attend` (``with_lse``: :func:`attend_with_lse`) by splash attention: ``q``
    pre-scaled, the layout ``[b, s, h, d]`` -> ``[h, s, d]`` per batch element, both sequences
    padded to whole tiles, the key mask as segment ids (valid 0, masked 1; queries 0). A batch
    element without a valid key attends every key (finite values and gradients) and is zeroed
    after, as every kernel here returns it."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash  # noqa: PLC0415

    (b, s_q, h, d), s_k = q.shape, k.shape[1]
    mask = jnp.ones((b, s_k), bool) if mask is None else jnp.asarray(mask, bool)
    has_key = jnp.any(mask, axis=-1)
    q_pad, k_pad = -(-s_q // SPLASH_TILE) * SPLASH_TILE, -(-s_k // SPLASH_TILE) * SPLASH_TILE

    def heads_first(x, length):
        x = jnp.pad(x, [(0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)])
        return x.transpose(0, 2, 1, 3)                                     # [b, h, s, d]

    qh = heads_first(q * jnp.asarray(d ** -0.5, q.dtype), q_pad)
    kh, vh = heads_first(k, k_pad), heads_first(v, k_pad)
    valid = jnp.pad(mask | ~has_key[:, None], [(0, 0), (0, k_pad - s_k)])
    segments = splash.SegmentIds(q=jnp.zeros((b, q_pad), jnp.int32),
                                 kv=jnp.where(valid, 0, 1).astype(jnp.int32))
    kernel = _splash_kernel(h, q_pad, k_pad, with_lse, interpret)
    out = jax.vmap(lambda q, k, v, seg: kernel(q, k, v, segment_ids=seg))(qh, kh, vh, segments)
    if with_lse:
        out, (lse,) = out
        lse = jnp.where(has_key[:, None, None], lse[:, :, :s_q].astype(jnp.float32), -jnp.inf)
    out = out.transpose(0, 2, 1, 3)[:, :s_q]
    out = jnp.where(has_key[:, None, None, None], out, 0).astype(q.dtype)
    return (out, lse) if with_lse else out


def attend_recomputed(q, k, v, mask=None):
    """:func:`attend` computed by XLA, differentiated as a flash kernel is: the residuals are
    ``q``, ``k``, ``v``, the output and the float32 row log-sum-exp (O(sequence), not the
    O(sequence^2) probabilities), which the backward recomputes."""
    b, s = k.shape[:2]
    valid = jnp.ones((b, s), bool) if mask is None else jnp.asarray(mask, bool)
    bias = jnp.where(valid, 0.0, -jnp.inf).astype(jnp.float32)[:, None, None, :]
    out = _recomputed(q, k, v, bias)
    return jnp.where(jnp.any(valid, axis=-1)[:, None, None, None], out, 0).astype(q.dtype)


def _probabilities(q, k, bias):
    """``(p, lse)``: softmax probabilities ``[b, h, q, s]`` (float32) and the row log-sum-exp
    ``[b, h, q]`` (0 for a row without a valid key, whose probabilities are then 0)."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    logits = logits * (q.shape[-1] ** -0.5) + bias
    lse = jax.nn.logsumexp(logits, axis=-1)
    lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
    return jnp.exp(logits - lse[..., None]), lse


@jax.custom_vjp
def _recomputed(q, k, v, bias):
    p, _ = _probabilities(q, k, bias)
    return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v)


def _recomputed_fwd(q, k, v, bias):
    p, lse = _probabilities(q, k, bias)
    out = jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v)
    # named, so a remat policy that keeps a fused attention's outputs keeps these
    out, lse = checkpoint_name(out, SAVED_NAME), checkpoint_name(lse, SAVED_NAME)
    return out, (q, k, v, bias, out, lse)


def _recomputed_bwd(res, g):
    q, k, v, bias, out, lse = res
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    p = jnp.exp(logits * (q.shape[-1] ** -0.5) + bias - lse[..., None])
    g32 = g.astype(jnp.float32)
    dv = jnp.einsum("bhqk,bqhd->bkhd", p, g32)
    dp = jnp.einsum("bqhd,bkhd->bhqk", g32, v.astype(jnp.float32))
    row = jnp.einsum("bqhd,bqhd->bhq", g32, out.astype(jnp.float32))
    ds = p * (dp - row[..., None]) * (q.shape[-1] ** -0.5)
    dq = jnp.einsum("bhqk,bkhd->bqhd", ds, k.astype(jnp.float32))
    dk = jnp.einsum("bhqk,bqhd->bkhd", ds, q.astype(jnp.float32))
    return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), jnp.zeros_like(bias))


_recomputed.defvjp(_recomputed_fwd, _recomputed_bwd)
