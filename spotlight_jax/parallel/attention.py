"""Sequence-parallel (SP) attention: dense, Ulysses, ring and USP (Ulysses x ring).

One entry point, :func:`attention`, computes bidirectional softmax attention of
``[batch, seq, heads, head_dim]`` inputs with the sequence sharded over one or two mesh axes:

* ``dense``: plain local attention (the kernel of ``parallel.kernels``: splash attention on
  TPUs, cuDNN flash attention on NVIDIA GPUs where it can run, XLA elsewhere); no SP.
* ``ulysses``: ``all_to_all`` turns sequence shards into head shards, attention runs locally over
  the whole sequence, and the inverse ``all_to_all`` restores sequence shards. Needs
  ``heads % sp == 0``; otherwise falls back to ``ring`` (logged once per configuration).
* ``ring``: K/V blocks travel around the SP group with ``ppermute`` while each device accumulates
  an online softmax in float32 (block logits via einsum); under a fused kernel (cuDNN,
  splash) each block is the kernel's and the blocks merge by their log-sum-exp. The backward
  pass is a custom VJP that recomputes block probabilities from the saved log-sum-exp and
  sends dK/dV home around the same ring: only one ``(seq/sp)^2`` block of logits is live at a
  time and nothing per step is kept for the backward pass.
* ``usp``: Ulysses over groups of ``u`` consecutive SP ranks, then ring over the ``r`` groups
  (``u * r == sp``). ``axis`` is either ``(ulysses_axis, ring_axis)`` or one axis whose size is
  split; ``u`` is the largest degree dividing both the head count and the Ulysses axis size.

Sequences that the SP degree does not divide are padded; padded keys are masked, combined with the
caller's ``kv_mask``, and padded query rows are sliced off. A query row whose keys are all masked
(a batch element with an all-False ``kv_mask``) returns **zeros** in every strategy, with zero,
finite gradients.

Inputs may be plain single-device arrays or intermediates inside ``jax.jit``: they are placed on
the mesh here (``device_put`` eagerly; ``with_sharding_constraint`` for ``Auto`` meshes or
``jax.sharding.reshard`` for meshes with ``Explicit`` axes inside a trace). The batch dimension is
sharded over the mesh axes outside the SP group that divide it, and replicated otherwise.

Called eagerly (concrete inputs, also under eager ``jax.grad``/``jax.vjp``), the output's sharding
*type* follows the inputs': inputs not on an ``Explicit`` mesh (plain arrays, or arrays on an
``Auto`` mesh) run on an ``Auto`` view of ``mesh`` (same devices and axis names), so the result,
like its inputs, carries no explicit sharding in its type. Eager ``jax.grad`` of a loss built from
it then needs no mesh context: JAX cannot make the seed cotangent of a scalar typed on an
``Explicit`` mesh outside ``jax.set_mesh``, and an ``Explicit``-typed output would make every such
loss one. Inputs already on an ``Explicit`` mesh keep it (so the output mixes with the caller's
other explicitly sharded arrays); eager ``jax.grad`` there needs ``with jax.set_mesh(mesh)``, as
it does for any explicitly sharded value. Inside ``jit`` none of this applies: inputs are
constrained onto ``mesh`` as given.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spotlight_jax.parallel import kernels
from spotlight_jax.parallel.kernels import Kernel

STRATEGIES = ("dense", "ulysses", "ring", "usp")

_log = logging.getLogger(__name__)


@functools.cache
def _log_once(message: str) -> None:
    """Logs each distinct fallback message once per process (callers run every step)."""
    _log.warning(message)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Static description of one SP attention layout; hashable, so it keys the jit cache.

    Ranks of the SP group are numbered ``i = r * ulysses + u`` over ``sp_axes`` (row-major), so a
    Ulysses group is ``ulysses`` consecutive ranks and the ring links equal ``u`` across groups.
    """

    mesh: Mesh
    sp_axes: tuple[str, ...]
    batch_axes: tuple[str, ...]
    ulysses: int
    ring: int
    kernel: Kernel = kernels.XLA

    @property
    def degree(self) -> int:
        return self.ulysses * self.ring

    @property
    def ulysses_groups(self) -> tuple[tuple[int, ...], ...] | None:
        if self.ulysses == self.degree:
            return None  # the whole SP group: no axis_index_groups needed
        u = self.ulysses
        return tuple(tuple(r * u + j for j in range(u)) for r in range(self.ring))

    @property
    def ring_perm(self) -> tuple[tuple[int, int], ...]:
        u, r = self.ulysses, self.ring
        return tuple((i * u + j, ((i + 1) % r) * u + j) for i in range(r) for j in range(u))


def attention(q, k, v, *, mesh: Mesh | None = None, strategy: str = "dense",
              axis: str | tuple[str, ...] = "sp", kv_mask=None,
              implementation: str | Kernel = "auto"):
    """Bidirectional multi-head attention, sequence-parallel over ``axis`` of ``mesh``.

    Args:
      q: ``[batch, q_seq, heads, head_dim]``.
      k, v: ``[batch, kv_seq, heads, head_dim]``.
      mesh: device mesh holding ``axis``; ``None`` means local attention.
      strategy: one of :data:`STRATEGIES`.
      axis: SP mesh axis name, or a tuple of names. For ``usp`` a pair means
        ``(ulysses_axis, ring_axis)``; for ``ulysses``/``ring`` a tuple is one combined SP group.
      kv_mask: optional bool ``[batch, kv_seq]``, True where the key is valid.
      implementation: the local kernel, ``auto``, ``xla``, ``cudnn`` or ``splash`` (or a resolved
        :class:`~spotlight_jax.parallel.kernels.Kernel`); see ``parallel.kernels``. Under
        cuDNN the valid keys of ``kv_mask`` must come first.

    Returns:
      ``[batch, q_seq, heads, head_dim]`` in ``q.dtype``; rows with no valid key are zeros.

    Raises:
      ValueError: unknown strategy or implementation, a forced ``cudnn`` that cannot run, an
        axis the mesh lacks, or mismatched shapes.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown attention strategy {strategy!r}; choose one of {STRATEGIES}")
    _check_shapes(q, k, v, kv_mask)
    kernel = kernels.resolve(implementation, q.dtype, q.shape[-1],
                             None if mesh is None else mesh.devices.flat)
    plan = None if mesh is None else _make_plan(mesh, strategy, axis, q.shape[0], q.shape[2],
                                                kernel)
    if plan is None:
        return kernels.attend(kernel, q, k, v, kv_mask)
    args = (q, k, v) if kv_mask is None else (q, k, v, kv_mask)
    if all(_is_concrete(x) for x in args):
        # Eager call (maybe under eager autodiff): commit the inputs to the mesh (batch-sharded,
        # sequence whole); the jitted body pads and reshards the sequence. device_put is
        # differentiable, so gradients return placed like their inputs.
        context = jax.sharding.get_abstract_mesh().axis_types
        if AxisType.Explicit not in context and not any(_on_explicit_mesh(x) for x in args):
            plan = dataclasses.replace(plan, mesh=_auto_view(plan.mesh))
        args = tuple(
            jax.device_put(x, NamedSharding(plan.mesh, P(plan.batch_axes or None)))
            for x in args)
    return _sp_attention(plan, *args)


def _is_concrete(x) -> bool:
    """True for a concrete array, or an eager autodiff tracer around one (``jax.grad`` outside
    ``jit``); False for values being traced by ``jit``, ``vmap`` and the like."""
    return not isinstance(x, jax.core.Tracer) or x.to_concrete_value() is not None


def _on_explicit_mesh(x) -> bool:
    """Whether ``x``'s type carries a mesh with ``Explicit`` axes (``jax.typeof`` sees through
    autodiff tracers, which have no ``.sharding``)."""
    return AxisType.Explicit in jax.typeof(x).sharding.mesh.axis_types


def _auto_view(mesh: Mesh) -> Mesh:
    """``mesh`` with every axis ``Auto``: same devices and names, so no data moves."""
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def _check_shapes(q, k, v, kv_mask) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be [batch, seq, heads, head_dim]; got shapes "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {k.shape} vs {v.shape}")
    b, _, h, d = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (b, h, d):
        raise ValueError(f"q {q.shape} and k {k.shape} must agree in batch, heads and head_dim")
    if kv_mask is not None and tuple(kv_mask.shape) != (b, k.shape[1]):
        raise ValueError(f"kv_mask must be [batch, kv_seq] = {(b, k.shape[1])}; "
                         f"got {tuple(kv_mask.shape)}")


def _make_plan(mesh: Mesh, strategy: str, axis, batch: int, heads: int,
               kernel: Kernel = kernels.XLA) -> _Plan | None:
    """Chooses the SP layout, or ``None`` for local attention (``dense`` or SP degree 1)."""
    if strategy == "dense":
        return None  # the SP axis is irrelevant (and need not exist)
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    missing = [a for a in names if a not in mesh.axis_names]
    if not names or missing or len(set(names)) != len(names):
        raise ValueError(f"attention axis {axis!r} is not a set of distinct axes of the mesh; "
                         f"valid axis names: {tuple(mesh.axis_names)}")
    sizes = dict(mesh.shape)
    if strategy == "usp" and len(names) == 2:
        ulysses_axis, ring_axis = names
        sp_axes = (ring_axis, ulysses_axis)  # rank = r * size(ulysses_axis) + u
        ulysses_cap = sizes[ulysses_axis]
    elif strategy == "usp" and len(names) > 2:
        raise ValueError(f"usp takes one axis or a pair (ulysses_axis, ring_axis); got {axis!r}")
    else:
        sp_axes = names
        ulysses_cap = math.prod(sizes[a] for a in names)
    degree = math.prod(sizes[a] for a in sp_axes)
    if degree == 1:
        return None

    if strategy == "ring":
        ulysses = 1
    elif strategy == "ulysses":
        ulysses = degree
        if heads % degree:
            ulysses = 1
            _log_once(f"{heads} heads do not divide SP degree {degree}; using ring attention")
    else:  # usp
        ulysses = math.gcd(heads, ulysses_cap)
        if ulysses < ulysses_cap:
            what = "ring attention" if ulysses == 1 else (
                f"usp with ulysses {ulysses} x ring {degree // ulysses}")
            which = "Ulysses" if len(names) == 2 else "SP"
            _log_once(f"{heads} heads do not divide {which} degree {ulysses_cap}; using {what}")

    batch_axes, prod = [], 1
    for name in mesh.axis_names:
        if name not in sp_axes and sizes[name] > 1 and batch % (prod * sizes[name]) == 0:
            batch_axes.append(name)
            prod *= sizes[name]
    return _Plan(mesh=mesh, sp_axes=tuple(sp_axes), batch_axes=tuple(batch_axes),
                 ulysses=ulysses, ring=degree // ulysses, kernel=kernel)


def _constrain(x, mesh: Mesh, spec: P):
    """Places a traced value on ``mesh`` with ``spec`` in the way the mesh's axis types allow."""
    sharding = NamedSharding(mesh, spec)
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return jax.lax.with_sharding_constraint(x, sharding)
    return jax.sharding.reshard(x, sharding)


def _pad_seq(x, length: int, value=0):
    extra = length - x.shape[1]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


@functools.partial(jax.jit, static_argnums=0)
def _sp_attention(plan: _Plan, q, k, v, kv_mask=None):
    q_len, kv_len = q.shape[1], k.shape[1]
    n = plan.degree
    q_pad, kv_pad = -(-q_len // n) * n, -(-kv_len // n) * n
    if kv_pad != kv_len and kv_mask is None:
        kv_mask = jnp.ones((k.shape[0], kv_len), bool)
    batch = plan.batch_axes or None
    qkv_spec, mask_spec = P(batch, plan.sp_axes, None, None), P(batch, plan.sp_axes)
    args = [_constrain(_pad_seq(x, pad), plan.mesh, qkv_spec)
            for x, pad in ((q, q_pad), (k, kv_pad), (v, kv_pad))]
    specs = [qkv_spec] * 3
    if kv_mask is not None:
        args.append(_constrain(_pad_seq(kv_mask.astype(bool), kv_pad, False), plan.mesh,
                               mask_spec))
        specs.append(mask_spec)
    # Pallas kernels (splash) do not type their outputs' variance: check it for the others.
    out = jax.shard_map(functools.partial(_sp_body, plan), mesh=plan.mesh, in_specs=tuple(specs),
                        out_specs=qkv_spec, check_vma=plan.kernel.impl != "splash")(*args)
    if q_pad != q_len:
        if not all(t == AxisType.Auto for t in plan.mesh.axis_types):
            # Explicit sharding cannot slice an unevenly split dimension; gather it first.
            out = jax.sharding.reshard(out, NamedSharding(plan.mesh, P(batch)))
        out = out[:, :q_len]
    return out


def _sp_body(plan: _Plan, q, k, v, mask=None):
    """Per-device body: Ulysses all_to_all (if any), local or ring attention, inverse."""
    axes, groups = plan.sp_axes, plan.ulysses_groups
    if plan.ulysses > 1:
        # Sequence shards -> head shards: [b, s/n, h, d] -> [b, s*u/n, h/u, d].
        q, k, v = (jax.lax.all_to_all(x, axes, 2, 1, tiled=True, axis_index_groups=groups)
                   for x in (q, k, v))
        if mask is not None:
            mask = jax.lax.all_gather(mask, axes, axis=1, tiled=True, axis_index_groups=groups)
    if plan.ring == 1:
        out = kernels.attend(plan.kernel, q, k, v, mask)
    else:
        out = _ring_attention(q, k, v, mask, plan)
    if plan.ulysses > 1:
        out = jax.lax.all_to_all(out, axes, 1, 2, tiled=True, axis_index_groups=groups)
    return out


# ----------------------------------------------------------------------------- ring attention

def _fresh(shape, value, plan: _Plan):
    """A float32 loop carry created inside shard_map, typed as varying like the sharded inputs.

    Under ``check_vma=True`` a ``fori_loop`` carry must keep its type, and the block results vary
    over every axis the inputs are sharded over (batch and SP axes).
    """
    x = jnp.full(shape, value, jnp.float32)
    return jax.lax.pcast(x, plan.batch_axes + plan.sp_axes, to="varying")


def _block_logits(q, k, mask, scale):
    """float32 logits ``[b, h, q, k]`` of one block, masked keys at -inf."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    if mask is not None:
        s = jnp.where(mask[:, None, None, :], s, -jnp.inf)
    return s


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _ring_attention(q, k, v, mask, plan: _Plan):
    return _ring_forward(q, k, v, mask, plan)[0]


def _ring_forward(q, k, v, mask, plan: _Plan):
    """Online softmax over the ``plan.ring`` K/V blocks; returns (out, lse), lse=-inf if no key.
    A fused kernel (cuDNN, splash) computes each block itself and the blocks merge by their
    log-sum-exp (:func:`_ring_forward_merged`)."""
    if plan.kernel.fused:
        return _ring_forward_merged(q, k, v, mask, plan)
    axes, perm = plan.sp_axes, plan.ring_perm
    b, s_q, h, d = q.shape
    scale = 1.0 / math.sqrt(d)

    def accumulate(stats, kb, vb, mb):
        m, denom, acc = stats
        s = _block_logits(q, kb, mb, scale)
        m_new = jnp.maximum(m, s.max(axis=-1))
        m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)  # all keys so far masked
        p = jnp.exp(s - m_safe[..., None])
        corr = jnp.exp(m - m_safe)
        denom = denom * corr + p.sum(axis=-1)
        pv = jnp.einsum("bhqk,bkhd->bhqd", p.astype(vb.dtype), vb,
                        preferred_element_type=jnp.float32)
        return m_new, denom, acc * corr[..., None] + pv

    def step(_, carry):
        kv, stats = carry
        nxt = jax.lax.ppermute(kv, axes, perm)  # independent of the compute: overlaps with it
        return nxt, accumulate(stats, *kv)

    stats = (_fresh((b, h, s_q), -jnp.inf, plan), _fresh((b, h, s_q), 0.0, plan),
             _fresh((b, h, s_q, d), 0.0, plan))
    kv, stats = jax.lax.fori_loop(0, plan.ring - 1, step, ((k, v, mask), stats))
    m, denom, acc = accumulate(stats, *kv)  # last block: no further send
    has_key = denom > 0
    denom = jnp.where(has_key, denom, 1.0)
    out = (acc / denom[..., None]).transpose(0, 2, 1, 3).astype(q.dtype)
    lse = jnp.where(has_key, m + jnp.log(denom), -jnp.inf)
    return out, lse


def _ring_forward_merged(q, k, v, mask, plan: _Plan):
    """The ring's forward with each block attended by ``plan.kernel`` (which returns the block's
    log-sum-exp): ``out = sum_i exp(lse_i - lse) out_i`` with ``lse = logaddexp_i lse_i``, kept
    in float32; no block's scores are materialised. The backward is the ring's own."""
    axes, perm = plan.sp_axes, plan.ring_perm
    b, s_q, h, d = q.shape

    def accumulate(stats, kb, vb, mb):
        lse, acc = stats
        out_b, lse_b = kernels.attend_with_lse(plan.kernel, q, kb, vb, mb)
        new = jnp.logaddexp(lse, lse_b)
        safe = jnp.where(jnp.isneginf(new), 0.0, new)           # no key in any block so far
        w_old, w_new = jnp.exp(lse - safe), jnp.exp(lse_b - safe)
        out_b = out_b.astype(jnp.float32).transpose(0, 2, 1, 3)  # [b, h, q, d]
        return new, acc * w_old[..., None] + out_b * w_new[..., None]

    def step(_, carry):
        kv, stats = carry
        nxt = jax.lax.ppermute(kv, axes, perm)
        return nxt, accumulate(stats, *kv)

    stats = (_fresh((b, h, s_q), -jnp.inf, plan), _fresh((b, h, s_q, d), 0.0, plan))
    kv, stats = jax.lax.fori_loop(0, plan.ring - 1, step, ((k, v, mask), stats))
    lse, acc = accumulate(stats, *kv)
    return acc.transpose(0, 2, 1, 3).astype(q.dtype), lse


def _ring_fwd(q, k, v, mask, plan: _Plan):
    out, lse = _ring_forward(q, k, v, mask, plan)
    return out, (q, k, v, mask, out, lse)


def _ring_bwd(plan: _Plan, res, g):
    """Flash-style backward: K/V and their dK/dV accumulators travel the ring together."""
    q, k, v, mask, out, lse = res
    axes, perm = plan.sp_axes, plan.ring_perm
    scale = 1.0 / math.sqrt(q.shape[-1])
    g = g.astype(q.dtype)
    delta = jnp.einsum("bqhd,bqhd->bhq", g, out, preferred_element_type=jnp.float32)
    lse_safe = jnp.where(jnp.isneginf(lse), 0.0, lse)[..., None]  # masked logits stay -inf

    def grads(kb, vb, mb):
        p = jnp.exp(_block_logits(q, kb, mb, scale) - lse_safe)
        dv = jnp.einsum("bhqk,bqhd->bkhd", p.astype(g.dtype), g,
                        preferred_element_type=jnp.float32)
        dp = jnp.einsum("bqhd,bkhd->bhqk", g, vb, preferred_element_type=jnp.float32)
        ds = (p * (dp - delta[..., None])) * scale
        dq = jnp.einsum("bhqk,bkhd->bqhd", ds.astype(kb.dtype), kb,
                        preferred_element_type=jnp.float32)
        dk = jnp.einsum("bhqk,bqhd->bkhd", ds.astype(q.dtype), q,
                        preferred_element_type=jnp.float32)
        return dq, dk, dv

    def step(_, carry):
        kv, dq, dkv = carry
        nxt = jax.lax.ppermute(kv, axes, perm)
        dq_b, dk_b, dv_b = grads(*kv)
        dkv = jax.lax.ppermute((dkv[0] + dk_b, dkv[1] + dv_b), axes, perm)
        return nxt, dq + dq_b, dkv

    zeros = lambda x: _fresh(x.shape, 0.0, plan)
    kv, dq, (dk, dv) = jax.lax.fori_loop(
        0, plan.ring - 1, step, ((k, v, mask), zeros(q), (zeros(k), zeros(v))))
    dq_b, dk_b, dv_b = grads(*kv)
    # After ring - 1 hops each accumulator sits one hop before its block's owner: send it home.
    dk, dv = jax.lax.ppermute((dk + dk_b, dv + dv_b), axes, perm)
    mask_ct = None if mask is None else np.zeros(mask.shape, jax.dtypes.float0)
    return (dq + dq_b).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), mask_ct


_ring_attention.defvjp(_ring_fwd, _ring_bwd)
