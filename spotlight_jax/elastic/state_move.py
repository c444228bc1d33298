"""State moves: rebuild a pytree of arrays on a new mesh from live devices only.

After a regroup the group's state (policy weights, replicated over the group or sharded) must live
on the new mesh. Every shard of the new array is taken from the cheapest *live* source, in order:

1. **reuse**: the same device already holds exactly that shard (a survivor after a shrink): its
   buffer is re-wrapped with ``jax.make_array_from_single_device_arrays``, zero copy;
2. **copy** from a live replica on the same node (a rejoined device after a grow), device to device
   with ``jax.device_put`` (all copies of a move in one batched call);
3. **copy** from a peer: the ``peers`` trees (another spot node's group, the trainer's copy), for a
   node that lost every device and came back. Never from storage;
4. **assemble** (resharding, e.g. FSDP shards of another size): the target region is cut from live
   shards of one source that together cover it.

Only single-device shard buffers on devices the pool says are alive are ever read or dispatched on
(a device outside the pool, such as the trainer's when the pool holds only spot nodes, is not the
pool's to lose: its buffers are live unless deleted):
the old multi-device array still references its dead devices' buffers, and on CPU dispatching a
computation on it crashes the process. A device that was lost and has rejoined is alive again but
its memory was lost: its old buffers must be gone too (deleted, as the tests do; on real hardware
they are); deleted buffers are skipped. The :class:`MoveReport` lists the source device of every
target shard so tests can check that, and times the move.

JAX's multi-device array refuses to list its shards once the buffer on its first device is deleted;
:func:`shard_views` captures per-device views (no copy) while everything is alive, and
:func:`move_tree` accepts them in place of arrays, so survivors can always be re-wrapped.

Re-wrapped arrays share buffers with the old ones: drop the old tree, but do not ``.delete()`` it
(that would free the survivors' buffers the new arrays now use).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

logger = logging.getLogger(__name__)

Region = tuple[tuple[int, int], ...]


class StateLostError(RuntimeError):
    """No live device (in the tree or its peers) holds some part of the state."""


@dataclasses.dataclass(frozen=True)
class ShardSource:
    """Where the shard of ``leaf`` on ``target_device`` came from (reuse, copy or assemble)."""

    leaf: str
    target_device: int
    source_devices: tuple[int, ...]
    method: str
    nbytes: int


@dataclasses.dataclass(frozen=True)
class MoveReport:
    """One reconfiguration: kind ('shrink'|'grow'|'peer_pull'|'reshard'|'same'), devices before and
    after, bytes re-wrapped and bytes copied, seconds (until every copied buffer is ready)."""

    kind: str
    devices_before: tuple[int, ...]
    devices_after: tuple[int, ...]
    bytes_reused: int
    bytes_copied: int
    seconds: float
    sources: tuple[ShardSource, ...]

    @property
    def source_devices(self) -> frozenset[int]:
        """Every device whose buffer was read (or re-wrapped) by the move."""
        return frozenset(d for s in self.sources for d in s.source_devices)


@dataclasses.dataclass(frozen=True)
class ShardViews:
    """Per-device views of an array's buffers, captured while all were alive (no copy).

    JAX's multi-device array stops listing its shards once the buffer on its first device is
    deleted; these views keep every surviving buffer reachable so a shrink can still re-wrap them.
    """

    shape: tuple[int, ...]
    dtype: object
    sharding: jax.sharding.Sharding
    shards: tuple[jax.Shard, ...]


def shard_views(tree):
    """Captures :class:`ShardViews` of every array leaf; keep them next to a group's state and pass
    them to :func:`move_tree` in place of the arrays (or as peers)."""
    def views(x):
        if not isinstance(x, jax.Array):
            return x
        shards = tuple(x.addressable_shards)
        for s in shards:
            _ = s.index  # computed now, from the sharding only
        return ShardViews(x.shape, x.dtype, x.sharding, shards)
    return jax.tree.map(views, tree)


@dataclasses.dataclass(frozen=True)
class _Candidate:
    shard: jax.Shard
    region: Region
    device: jax.Device
    rank: int  # 0 = the tree being moved, 1.. = peers in the given order


def move_tree(tree, mesh: Mesh, pool, *, specs=None, peers: Sequence = (),
              log: bool = True):
    """Rebuilds ``tree`` (a pytree of jax Arrays or ShardViews, or None) on ``mesh`` from live
    devices only.

    ``specs``: a pytree of PartitionSpec for the target (default: each leaf's current spec, or
    replicated). ``peers``: trees of the same structure holding the same values elsewhere (a peer
    group, the trainer), used when no device of the target's node holds a live copy. Returns
    ``(new_tree, MoveReport)``.
    """
    t0 = time.perf_counter()
    if tree is None and not peers:
        raise ValueError("move_tree: no tree and no peers: there is nothing to move the state from")
    dead_targets = [d.id for d in mesh.devices.flat if not pool.is_alive(d)]
    if dead_targets:
        raise ValueError(f"move_tree: target mesh includes dead devices {dead_targets}")
    ref = tree if tree is not None else peers[0]
    leaves, treedef = jax.tree_util.tree_flatten_with_path(ref)
    peer_leaves = []
    for i, p in enumerate(peers):
        pl, ptd = jax.tree_util.tree_flatten(p)
        if ptd != treedef:
            raise ValueError(f"move_tree: peer {i} has tree structure {ptd}, expected {treedef}")
        peer_leaves.append(pl)
    own_leaves = jax.tree_util.tree_leaves(tree) if tree is not None else [None] * len(leaves)
    if specs is None:
        spec_leaves = [_spec_of(leaf) for _, leaf in leaves]
    else:
        spec_leaves = treedef.flatten_up_to(specs)

    sources: list[ShardSource] = []
    plans = []
    for i, (path, ref_leaf) in enumerate(leaves):
        if not isinstance(ref_leaf, (jax.Array, ShardViews)):
            plans.append(ref_leaf)
            continue
        srcs = [own_leaves[i]] + [pl[i] for pl in peer_leaves]
        plan = _plan_array(jax.tree_util.keystr(path), srcs, mesh, spec_leaves[i], pool)
        plans.append(plan)
        sources.extend(plan.used)
    # Every device-to-device copy of the move in one batched transfer.
    jobs = [(plan, j) for plan in plans if isinstance(plan, _Plan)
            for j, b in enumerate(plan.buffers) if isinstance(b, _Copy)]
    if jobs:
        copied = jax.device_put([p.buffers[j].data for p, j in jobs],
                                [p.buffers[j].device for p, j in jobs])
        for (p, j), buf in zip(jobs, copied):
            p.buffers[j] = buf
    new_leaves = []
    for plan in plans:
        if isinstance(plan, _Plan):
            plan = jax.make_array_from_single_device_arrays(plan.shape, plan.sharding,
                                                            plan.buffers)
        new_leaves.append(plan)
    for plan in plans:
        if isinstance(plan, _Plan):
            for b, u in zip(plan.buffers, plan.used):
                if u.method != "reuse":
                    b.block_until_ready()
    seconds = time.perf_counter() - t0
    new_tree = jax.tree_util.tree_unflatten(treedef, new_leaves)

    before = _devices_of(tree)
    after = tuple(sorted(d.id for d in mesh.devices.flat))
    report = MoveReport(
        kind=_kind(before, after, sources, pool, tree is None),
        devices_before=before, devices_after=after,
        bytes_reused=sum(s.nbytes for s in sources if s.method == "reuse"),
        bytes_copied=sum(s.nbytes for s in sources if s.method != "reuse"),
        seconds=seconds, sources=tuple(sources))
    if log:
        logger.info("reconfig %s: devices %s -> %s, %.1f MiB re-wrapped, %.1f MiB copied, %.1f ms",
                    report.kind, list(before), list(after), report.bytes_reused / 2**20,
                    report.bytes_copied / 2**20, 1e3 * seconds)
    return new_tree, report


@dataclasses.dataclass
class _Copy:
    data: jax.Array
    device: jax.Device


@dataclasses.dataclass
class _Plan:
    shape: tuple[int, ...]
    sharding: NamedSharding
    buffers: list  # per target device: a live buffer (reuse / assembled) or a pending _Copy
    used: list[ShardSource]


def _plan_array(name: str, srcs: list, mesh: Mesh, spec: PartitionSpec, pool) -> _Plan:
    ref = next(s for s in srcs if s is not None)
    shape, dtype = ref.shape, ref.dtype
    for s in srcs:
        if s is not None and (s.shape != shape or s.dtype != dtype):
            raise ValueError(f"move_tree: {name}: sources disagree on shape/dtype "
                             f"({s.shape}/{s.dtype} vs {shape}/{dtype})")
    sharding = NamedSharding(mesh, spec)
    candidates = []
    for rank, src in enumerate(srcs):
        if src is None or not any(_readable(pool, d) for d in src.sharding.device_set):
            continue
        for shard in _shards_of(src, name):
            # The pool is asked first: a dead device's buffer is never touched. A device that
            # was lost and rejoined is alive but its old buffers are gone (deleted): skip them.
            if _readable(pool, shard.device) and not shard.data.is_deleted():
                candidates.append(_Candidate(shard, _region(shard.index, shape), shard.device,
                                             rank))
    buffers, used = [], []
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        region = _region(index, shape)
        node = pool.node_of(device)
        exact = [c for c in candidates if c.region == region]
        if exact:
            best = min(exact, key=lambda c: (c.device != device, pool.node_of(c.device) != node,
                                             c.rank, c.device.id))
            assert _readable(pool, best.device)
            data = best.shard.data
            if best.device == device:
                buf, method = data, "reuse"
            else:
                buf, method = _Copy(data, device), "copy"
            used.append(ShardSource(name, device.id, (best.device.id,), method, data.nbytes))
        else:
            buf, src_ids = _assemble(name, candidates, region, device, node, pool, dtype)
            used.append(ShardSource(name, device.id, src_ids, "assemble", buf.nbytes))
        buffers.append(buf)
    return _Plan(shape, sharding, buffers, used)


def _shards_of(src, name: str) -> tuple[jax.Shard, ...]:
    if isinstance(src, ShardViews):
        return src.shards
    try:
        return tuple(src.addressable_shards)
    except RuntimeError:
        # JAX's wrapper refuses to list shards once its *first* buffer is deleted, even if the
        # others live: views captured by shard_views() before the loss do not have that problem.
        logger.warning("move_tree: %s: the array's first buffer is gone and its shards cannot be "
                       "listed; keep shard_views(state) taken before the loss to re-wrap the "
                       "survivors. Looking for other sources.", name)
        return ()


def _assemble(name, candidates, region: Region, device, node, pool, dtype):
    """Cuts ``region`` out of live shards of one source that together cover it, on ``device``."""
    for rank in sorted({c.rank for c in candidates}):
        pieces: dict[Region, _Candidate] = {}
        for c in candidates:
            if c.rank != rank or _intersect(c.region, region) is None:
                continue
            prev = pieces.get(c.region)
            key = lambda x: (x.device != device, pool.node_of(x.device) != node, x.device.id)
            if prev is None or key(c) < key(prev):
                pieces[c.region] = c
        covered = sum(_volume(_intersect(r, region)) for r in pieces)
        if covered != _volume(region):
            continue
        out = jnp.zeros(tuple(b - a for a, b in region), dtype, device=device)
        for r, c in pieces.items():
            inter = _intersect(r, region)
            assert _readable(pool, c.device)
            local = tuple(slice(a - ra, b - ra) for (a, b), (ra, _) in zip(inter, r))
            piece = jax.device_put(c.shard.data[local], device)
            dst = tuple(slice(a - qa, b - qa) for (a, b), (qa, _) in zip(inter, region))
            out = out.at[dst].set(piece)
        return out, tuple(sorted({c.device.id for c in pieces.values()}))
    raise StateLostError(
        f"move_tree: {name}: no live device holds region {region} of the state (neither the tree "
        "nor any peer); pass a peer group's or the trainer's copy as peers=")


def _readable(pool, device) -> bool:
    """A source device may be read: alive in the pool, or outside it (the pool does not manage
    it, e.g. the trainer's device next to a pool of spot nodes)."""
    return pool.is_alive(device) or pool.node_of(device) is None


def _region(index, shape) -> Region:
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _intersect(a: Region, b: Region) -> Region | None:
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return None if any(lo >= hi for lo, hi in out) and out else out


def _volume(r: Region | None) -> int:
    return 0 if r is None else math.prod(b - a for a, b in r)


def _spec_of(leaf) -> PartitionSpec:
    s = getattr(leaf, "sharding", None)
    return s.spec if isinstance(s, NamedSharding) else PartitionSpec()


def _devices_of(tree) -> tuple[int, ...]:
    if tree is None:
        return ()
    ids = set()
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, (jax.Array, ShardViews)):
            ids.update(d.id for d in leaf.sharding.device_set)
    return tuple(sorted(ids))


def _kind(before, after, sources, pool, no_tree) -> str:
    if no_tree or any(
            m.method != "reuse" and any(pool.node_of(s) != pool.node_of(m.target_device)
                                        for s in m.source_devices) for m in sources):
        return "peer_pull"
    live_before = {d for d in before if pool.is_alive(d)}
    if set(after) == set(before):
        return "same"
    if set(after) == live_before:
        return "shrink"
    if live_before < set(after):
        return "grow"
    return "reshard"
