"""One spot node at run time: its SP groups, the policy weights on each, and compiled rollouts.

A :class:`SpotNode` ties the elastic pieces together for one node of a :class:`DevicePool`:

* **groups**: the node's SP groups, formed from its alive devices
  (:func:`~spotlight_jax.elastic.groups.form_node_groups`; groups never span nodes);
* **state**: the policy weights replicated on every group, plus per-device views of their buffers
  (:func:`~spotlight_jax.elastic.state_move.shard_views`), captured while all were alive so a
  shrink can re-wrap the survivors' buffers even after the group's first device is gone;
* **programs**: the rollout program of the real MMDiT (the same computation as
  :class:`~spotlight_jax.diffusion.Sampler`'s rollout, with the group's attention layout), compiled
  ahead of time from abstract shapes for every group the node can reach and every batch size it
  uses (:class:`~spotlight_jax.elastic.exec_cache.ExecutableCache`, keyed by the exact device
  tuple).

:meth:`SpotNode.on_change` runs after the pool changes: it re-forms the node's groups from the
surviving devices, rebuilds each changed group's weights from live devices only (re-wrap the
survivors' buffers; device-to-device copy from a live replica on the node; for a node that lost
every device and came back, a pull from a peer node or the trainer -- never from storage) and looks
the cached executables up. It returns a :class:`NodeReport` with the latency breakdown (regroup,
state move, executable lookup) and the number of XLA compiles it caused (0 unless a program was
missing: a cache miss compiles on the critical path and is logged as a warning naming the group).

Liveness rules. A device the pool marks lost takes its memory with it; one that was lost and
came back is alive but empty. So a rebuild never reads a buffer on a device that is dead now *or
was lost at any point since the node's last* ``on_change`` (the pool's event history says which),
and :meth:`SpotNode.rollout` refuses to run while the pool holds events for this node that
``on_change`` has not seen: nothing is ever dispatched on an array that references a dead device.

:class:`SpotFleet` holds one :class:`SpotNode` per spot node of a pool, with one shared executable
cache, and routes peers: nodes that kept some live state are rebuilt first, then nodes that lost
everything pull from them (or from the trainer's copy).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spotlight_jax.diffusion import prompt
from spotlight_jax.diffusion.rollout import (
    SamplerConfig,
    rollout_body,
    sampling_compiler_options,
)
from spotlight_jax.elastic.exec_cache import (
    CacheMiss,
    ExecutableCache,
    count_backend_compiles,
    reachable_groups,
)
from spotlight_jax.elastic.groups import GroupConfig, SPGroup, choose_strategy, form_node_groups
from spotlight_jax.elastic.pool import DevicePool
from spotlight_jax.elastic.state_move import (
    MoveReport,
    ShardViews,
    StateLostError,
    move_tree,
    shard_views,
)
from spotlight_jax.models import AttentionSpec, MMDiTConfig

logger = logging.getLogger(__name__)

PROGRAM = "rollout"


class StaleGroupsError(RuntimeError):
    """The pool changed for this node since its last ``on_change``: its groups may reference dead
    devices, so nothing may run on them until ``on_change(pool)`` has rebuilt them."""


# ---- the rollout program --------------------------------------------------------------------
def rollout_fn(graphdef, image_shape, cfg: SamplerConfig, attn: AttentionSpec = AttentionSpec()
               ) -> Callable:
    """The pure rollout ``(params, tokens, mask, seeds) -> {latents, log_probs, images}``.

    The same computation as :class:`spotlight_jax.diffusion.Sampler`'s rollout (``params`` is the
    model state as a pure dict, see ``nnx.to_pure_dict``), left unjitted so the caller can lower
    it for the abstract shardings of any group.
    """
    return rollout_body(graphdef, tuple(image_shape), cfg.validate(), attn)


def input_specs(model_cfg: MMDiTConfig, batch_size: int, tokens_like=None):
    """``jax.ShapeDtypeStruct`` of the prompt inputs ``(tokens, mask, seeds)`` for one batch;
    ``tokens`` is a pytree when the prompts are (``diffusion.prompt``).

    ``tokens_like``: the run's prompt source's tokens of any batch (e.g. ``tokenize([], L)[0]``),
    whose structure, dtypes and per-row shapes the programs take (its pooled embedding and
    guidance null prompt included). None: what the model config implies (token ids with a
    prompt encoder, else float embeddings, with a pooled embedding for ``pooled='input'``)."""
    b, n = batch_size, model_cfg.text_len
    if tokens_like is not None:
        tokens = jax.tree.map(lambda a: jax.ShapeDtypeStruct((b,) + np.shape(a)[1:],
                                                             np.asarray(a).dtype), tokens_like)
    elif model_cfg.text_width:
        tokens = jax.ShapeDtypeStruct((b, n), jnp.int32)
    else:  # precomputed text-encoder embeddings
        tokens = jax.ShapeDtypeStruct((b, n, model_cfg.text_embed_dim), jnp.float32)
        if model_cfg.pooled == "input":
            tokens = {prompt.EMBEDS: tokens, prompt.POOLED: jax.ShapeDtypeStruct(
                (b, model_cfg.pooled_dim), jnp.float32)}
    return (tokens, jax.ShapeDtypeStruct((b, n), jnp.bool_),
            jax.ShapeDtypeStruct((b,), jnp.uint32))


def abstract_rollout_args(params, model_cfg: MMDiTConfig, mesh: Mesh, batch_size: int,
                          tokens_like=None):
    """Abstract ``(params, tokens, mask, seeds)`` replicated over ``mesh`` (weights are replicated
    on every device of a group; the activations are split by the attention inside).
    ``tokens_like``: as in :func:`input_specs`."""
    rep = NamedSharding(mesh, P())
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep),
                            params)
    inputs = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep),
                          input_specs(model_cfg, batch_size, tokens_like))
    return (abstract, *inputs)


def attention_for(mesh: Mesh, heads: int, allow_usp: bool = False) -> AttentionSpec:
    """The attention layout regrouping chooses for a group's mesh (see ``choose_strategy``)."""
    strategy, _, _ = choose_strategy(heads, dict(mesh.shape)["sp"], allow_usp=allow_usp)
    return AttentionSpec(mesh=mesh, strategy=strategy, axis="sp")


# ---- reports ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class NodeReport:
    """One reconfiguration of one node.

    ``kind``: 'unchanged', 'lost' (no device left), or the state moves' kinds ('shrink' = re-wrap,
    'grow' = intra-node copy, 'peer_pull', 'reshard', joined with '+' when groups differ).
    Seconds: ``regroup_s`` (forming groups), ``move_s`` (weights on the new meshes, copies
    finished), ``lookup_s`` (executables in hand), ``total_s`` (the whole ``on_change``).
    ``compiles``: XLA backend compiles during the change (0 when every program was cached).
    """

    node: str
    kind: str
    devices_before: tuple[int, ...]
    devices_after: tuple[int, ...]
    groups_before: tuple[tuple[int, ...], ...]
    groups_after: tuple[tuple[int, ...], ...]
    strategies: tuple[str, ...]
    regroup_s: float
    move_s: float
    lookup_s: float
    total_s: float
    bytes_reused: int
    bytes_copied: int
    compiles: int
    misses: tuple[CacheMiss, ...]
    moves: tuple[MoveReport, ...]

    @property
    def source_devices(self) -> frozenset[int]:
        """Every device whose buffer was read (re-wrapped or copied from) by the change."""
        return frozenset().union(*(m.source_devices for m in self.moves))

    def summary(self) -> str:
        return (f"node {self.node} {self.kind}: devices {list(self.devices_before)} -> "
                f"{list(self.devices_after)}, groups {list(self.groups_before)} -> "
                f"{list(self.groups_after)} {list(self.strategies)}, "
                f"{self.bytes_reused / 2**20:.1f} MiB re-wrapped, "
                f"{self.bytes_copied / 2**20:.1f} MiB copied; regroup {1e3 * self.regroup_s:.2f} "
                f"ms, move {1e3 * self.move_s:.2f} ms, lookup {1e3 * self.lookup_s:.2f} ms, "
                f"total {1e3 * self.total_s:.2f} ms, {self.compiles} compiles")


@dataclasses.dataclass
class GroupState:
    """One SP group of a node with its weights, their buffer views and its executables."""

    group: SPGroup
    params: dict
    views: dict
    executables: dict[int, jax.stages.Compiled]


# ---- the node ---------------------------------------------------------------------------------
class SpotNode:
    """The SP groups of one node, the weights replicated on each, and precompiled rollouts.

    Args:
      node: the node's name in ``pool``.
      pool: the device pool (liveness and event history).
      graphdef: the model's graph (``nnx.split(model)[0]``).
      params: the weights, an ``nnx.State`` or its pure dict, anywhere (host, the trainer's
        devices): the initial placement pulls them once onto every group.
      model_cfg: the model config (head count, image and prompt shapes).
      sampler_cfg: the rollout's sampler config.
      group_config: how groups are cut (default: one group over all alive devices, the model's head
        count, ring when heads do not divide).
      batch_sizes: rollout batch sizes to precompile.
      tokens_like: the prompt source's tokens of any batch, whose structure the programs take
        (see :func:`input_specs`; None: what ``model_cfg`` implies).
      coverage: which survivor sets to precompile for (see ``reachable_survivor_sets``).
      cache: an executable cache to share between nodes (default: a new one).
      precompile: compile every reachable group's programs now (else call :meth:`precompile`).
    """

    def __init__(self, node: str, pool: DevicePool, graphdef, params, model_cfg: MMDiTConfig,
                 sampler_cfg: SamplerConfig, *, group_config: GroupConfig | None = None,
                 batch_sizes: Sequence[int] = (1,), coverage: str = "auto",
                 cache: ExecutableCache | None = None, precompile: bool = True,
                 tokens_like=None):
        pool.role(node)  # raises KeyError naming the pool's nodes
        self.node = node
        self.pool = pool
        self.graphdef = graphdef
        self.model_cfg = model_cfg.validate()
        self.sampler_cfg = sampler_cfg.validate()
        self.image_shape = model_cfg.latent_shape
        self.group_config = group_config or GroupConfig(heads=model_cfg.num_heads)
        if self.group_config.heads != model_cfg.num_heads:
            raise ValueError(f"group_config.heads={self.group_config.heads} but the model has "
                             f"{model_cfg.num_heads} heads")
        self.batch_sizes = tuple(int(b) for b in batch_sizes)
        # one row of the prompt structure (zero rows keep no data alive)
        self.tokens_like = (None if tokens_like is None else
                            jax.tree.map(lambda a: np.zeros((0,) + np.shape(a)[1:],
                                                            np.asarray(a).dtype), tokens_like))
        self.coverage = coverage
        self.cache = cache if cache is not None else ExecutableCache()
        self.reports: list[NodeReport] = []
        params = _pure(params)
        self._abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
        self._seen = len(pool.history)
        self._groups: list[GroupState] = []
        for g in form_node_groups(node, pool.alive_devices(node), self.group_config):
            placed = jax.device_put(params, NamedSharding(g.mesh, P()))
            jax.block_until_ready(placed)
            self._groups.append(GroupState(g, placed, shard_views(placed), {}))
        self.cache.register(PROGRAM, self._program_for, self._abstract_args, per_mesh=True,
                            compiler_options=sampling_compiler_options())
        self.precompile_s = 0.0
        if precompile:
            self.precompile()

    # ---- programs ----------------------------------------------------------------------------
    def _program_for(self, mesh: Mesh) -> Callable:
        attn = attention_for(mesh, self.model_cfg.num_heads, self.group_config.allow_usp)
        return rollout_fn(self.graphdef, self.image_shape, self.sampler_cfg, attn)

    def _abstract_args(self, mesh: Mesh, batch_size: int):
        return abstract_rollout_args(self._abstract, self.model_cfg, mesh, batch_size,
                                     self.tokens_like)

    def reachable_groups(self) -> tuple[SPGroup, ...]:
        """Every group this node can form by losing (and regaining) devices, under ``coverage``."""
        return reachable_groups(self.node, self.pool.devices(node=self.node, alive=None),
                                self.group_config, self.coverage)

    def precompile(self, groups: Sequence[SPGroup] | None = None) -> float:
        """Compiles the rollout for every reachable group (or only ``groups``) and batch size,
        skipping cached ones, then binds the current groups' executables. Off the critical path;
        returns seconds."""
        groups = self.reachable_groups() if groups is None else groups
        dt = self.cache.precompile(PROGRAM, self._program_for, self._abstract_args, groups,
                                   batch_sizes=self.batch_sizes, per_mesh=True,
                                   compiler_options=sampling_compiler_options())
        self.precompile_s += dt
        for gs in self._groups:
            gs.executables = {b: self.cache.get(PROGRAM, gs.group, b) for b in self.batch_sizes}
        return dt

    # ---- queries -----------------------------------------------------------------------------
    @property
    def groups(self) -> tuple[SPGroup, ...]:
        return tuple(gs.group for gs in self._groups)

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(sorted(d for gs in self._groups for d in gs.group.device_ids))

    def group_params(self, i: int = 0):
        """The weights of group ``i`` (a pure dict of arrays replicated on its mesh)."""
        return self._groups[i].params

    def device_buffers(self, device_ids) -> list[jax.Array]:
        """The single-device buffers of the node's weights on ``device_ids`` (fault injection:
        deleting them simulates losing those devices' memory for real)."""
        ids = set(device_ids)
        return [s.data for gs in self._groups
                for v in jax.tree.leaves(gs.views, is_leaf=lambda x: isinstance(x, ShardViews))
                if isinstance(v, ShardViews) for s in v.shards if s.device.id in ids]

    def unseen_events(self):
        """Pool events touching this node that :meth:`on_change` has not handled yet."""
        return [e for e in self.pool.history[self._seen:] if e.node == self.node]

    def live_sources(self) -> list[dict]:
        """Views of the node's weights restricted to buffers that are certainly still there: on
        devices alive now and not lost at any point since the last ``on_change``. Empty when the
        node holds nothing live. Peers pass these to a rejoining node."""
        unsafe = _lost_since(self.pool, self._seen)
        out = []
        for gs in self._groups:
            keep = {i for i in gs.group.device_ids if self.pool.is_alive(i) and i not in unsafe}
            if keep:
                out.append(_restrict(gs.views, keep))
        return out

    # ---- running -----------------------------------------------------------------------------
    def rollout(self, tokens, mask, seeds, *, group: int = 0):
        """Runs the cached rollout program of group ``group`` on a batch of prompts and seeds.

        Refuses (:class:`StaleGroupsError`) while the pool holds unhandled events for this node.
        A batch size that was not precompiled is a logged cache miss (compiled now).
        """
        pending = self.unseen_events()
        if pending:
            what = ", ".join(f"{e.kind} {list(e.devices)}" for e in pending)
            raise StaleGroupsError(
                f"node {self.node}: the pool changed ({what}) since the last on_change(pool); "
                "call it before running anything on the node")
        if not self._groups:
            raise StaleGroupsError(f"node {self.node} has no alive device and no group")
        gs = self._groups[group]
        dead = [i for i in gs.group.device_ids if not self.pool.is_alive(i)]
        if dead:  # cannot happen after on_change; guards against misuse of the internals
            raise StaleGroupsError(f"node {self.node}: group {gs.group.device_ids} has dead "
                                   f"devices {dead}")
        b = int(np.shape(seeds)[0])
        exe = gs.executables.get(b)
        if exe is None:
            exe = self._lookup(gs.group, b)
            gs.executables[b] = exe
        rep = NamedSharding(gs.group.mesh, P())
        specs = input_specs(self.model_cfg, b, self.tokens_like)
        if jax.tree.structure(tokens) != jax.tree.structure(specs[0]):
            raise ValueError(f"tokens of structure {jax.tree.structure(tokens)}: the node's "
                             f"programs take {jax.tree.structure(specs[0])}; build the node "
                             "with tokens_like=<the prompt source's tokens>")

        def put(x, spec):
            return jax.device_put(np.asarray(x, spec.dtype), rep)

        return exe(gs.params, jax.tree.map(put, tokens, specs[0]), put(mask, specs[1]),
                   put(seeds, specs[2]))

    def _lookup(self, group: SPGroup, batch_size: int) -> jax.stages.Compiled:
        n = self.cache.num_misses
        exe = self.cache.get(PROGRAM, group, batch_size)
        if self.cache.num_misses > n:
            m = self.cache.misses[-1]
            logger.warning("node %s: group %s (%s, SP degree %d) had no precompiled rollout for "
                           "batch %d: compiled on the critical path in %.2fs (cache miss)",
                           self.node, list(group.device_ids), group.strategy, group.degree,
                           batch_size, m.compile_s)
        return exe

    # ---- reconfiguration ---------------------------------------------------------------------
    def on_change(self, pool: DevicePool | None = None, *, peers: Sequence = ()) -> NodeReport:
        """Re-forms the node's groups after a pool change and rebuilds their state from live
        devices only; see the module doc. ``peers``: weights held elsewhere (other nodes'
        :meth:`live_sources`, the trainer's params), used when the node holds no live copy.
        Raises :class:`StateLostError` when no live device anywhere holds the weights."""
        if pool is not None and pool is not self.pool:
            raise ValueError(f"node {self.node} belongs to another DevicePool")
        pool = self.pool
        n_miss = self.cache.num_misses
        with count_backend_compiles() as compiles:
            t0 = time.perf_counter()
            sources = self.live_sources()
            unsafe = _lost_since(pool, self._seen)
            before = self._groups
            new_groups = form_node_groups(self.node, pool.alive_devices(self.node),
                                          self.group_config)
            t1 = time.perf_counter()
            kept = {gs.group.key: gs for gs in before
                    if not set(gs.group.device_ids) & unsafe
                    and all(pool.is_alive(i) for i in gs.group.device_ids)}
            peer_trees = [_pure(p) for p in peers]
            states, moves, fresh = [], [], []
            for g in new_groups:
                if g.key in kept:
                    states.append(kept[g.key])
                    continue
                own = sorted(sources, key=lambda v: -len(_devices_in(v) & set(g.device_ids)))
                tree, rest = (own[0], own[1:]) if own else (None, [])
                if tree is None and not peer_trees:
                    raise StateLostError(
                        f"node {self.node}: no live device of the node holds the weights for "
                        f"group {list(g.device_ids)} and no peer was given; pass a peer node's "
                        "live_sources() or the trainer's params (never reloaded from storage)")
                params, rep = move_tree(tree, g.mesh, pool, peers=[*rest, *peer_trees],
                                        log=False)
                moves.append(rep)
                gs = GroupState(g, params, shard_views(params), {})
                states.append(gs)
                fresh.append(gs)
            t2 = time.perf_counter()
            for gs in fresh:
                gs.executables = {b: self._lookup(gs.group, b) for b in self.batch_sizes}
            t3 = time.perf_counter()
        self._groups = states
        self._seen = len(pool.history)
        report = NodeReport(
            node=self.node, kind=_node_kind(before, states, moves),
            devices_before=tuple(sorted(d for gs in before for d in gs.group.device_ids)),
            devices_after=self.devices,
            groups_before=tuple(gs.group.device_ids for gs in before),
            groups_after=tuple(gs.group.device_ids for gs in states),
            strategies=tuple(gs.group.strategy for gs in states),
            regroup_s=t1 - t0, move_s=t2 - t1, lookup_s=t3 - t2, total_s=t3 - t0,
            bytes_reused=sum(m.bytes_reused for m in moves),
            bytes_copied=sum(m.bytes_copied for m in moves),
            compiles=compiles["n"], misses=tuple(self.cache.misses[n_miss:]), moves=tuple(moves))
        self.reports.append(report)
        if report.kind != "unchanged":
            logger.info("reconfig %s", report.summary())
        return report

    def update_params(self, params) -> float:
        """Installs new policy weights (the trainer's broadcast) on every group; returns seconds.
        The old buffers are dropped, not deleted (other arrays may share them)."""
        t0 = time.perf_counter()
        params = _pure(params)
        for gs in self._groups:
            placed = jax.device_put(params, NamedSharding(gs.group.mesh, P()))
            jax.block_until_ready(placed)
            gs.params, gs.views = placed, shard_views(placed)
        return time.perf_counter() - t0

    def __repr__(self) -> str:
        return (f"SpotNode({self.node}: groups {[gs.group.device_ids for gs in self._groups]}, "
                f"{len(self.cache)} cached programs)")


class SpotFleet:
    """One :class:`SpotNode` per spot node of ``pool``, sharing one executable cache.

    ``on_change(pool, trainer=None)`` rebuilds every node: those with live state first, then nodes
    that lost everything, which pull from the other nodes' live copies (then ``trainer``).
    Keyword arguments are passed to every :class:`SpotNode`.
    """

    def __init__(self, pool: DevicePool, graphdef, params, model_cfg: MMDiTConfig,
                 sampler_cfg: SamplerConfig, *, role: str = "spot", **kwargs):
        self.pool = pool
        self.cache = kwargs.pop("cache", None) or ExecutableCache()
        self.nodes = {name: SpotNode(name, pool, graphdef, params, model_cfg, sampler_cfg,
                                     cache=self.cache, **kwargs)
                      for name in pool.nodes_with_role(role)}

    @property
    def groups(self) -> tuple[tuple[SpotNode, int, SPGroup], ...]:
        """``(node, index, group)`` of every group of every node."""
        return tuple((n, i, g) for n in self.nodes.values() for i, g in enumerate(n.groups))

    @property
    def precompile_s(self) -> float:
        return sum(n.precompile_s for n in self.nodes.values())

    def on_change(self, pool: DevicePool | None = None, *, trainer=None) -> list[NodeReport]:
        if pool is not None and pool is not self.pool:
            raise ValueError("SpotFleet.on_change: another DevicePool")
        live = {name: n.live_sources() for name, n in self.nodes.items()}
        order = sorted(self.nodes, key=lambda name: not live[name])  # live state first (stable)
        reports = []
        for name in order:
            node = self.nodes[name]
            if live[name] or not self.pool.alive_devices(name):
                peers = []
            else:  # lost everything and came back: pull from peers (rebuilt ones are current)
                peers = [v for other in order if other != name
                         for v in self.nodes[other].live_sources()]
                if trainer is not None:
                    peers.append(trainer)
            reports.append(node.on_change(self.pool, peers=peers))
        return reports


# ---- helpers ----------------------------------------------------------------------------------
def _pure(tree):
    return nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree


def _lost_since(pool: DevicePool, seq: int) -> set[int]:
    """Devices marked lost at any point after event ``seq``: their old memory is gone even if they
    have rejoined since."""
    return {d for e in pool.history[seq:] if e.kind == "lost" for d in e.devices}


def _restrict(views_tree, keep: set[int]):
    """The views with only the shards on devices in ``keep`` (other buffers are never touched)."""
    def f(v):
        if not isinstance(v, ShardViews):
            return v
        return dataclasses.replace(v, shards=tuple(s for s in v.shards if s.device.id in keep))
    return jax.tree.map(f, views_tree, is_leaf=lambda x: isinstance(x, ShardViews))


def _devices_in(views_tree) -> set[int]:
    return {s.device.id for v in jax.tree.leaves(views_tree, is_leaf=lambda x: isinstance(
        x, ShardViews)) if isinstance(v, ShardViews) for s in v.shards}


def _node_kind(before, after, moves) -> str:
    if not after:
        return "lost" if before else "unchanged"
    if not moves and [g.group.key for g in before] == [g.group.key for g in after]:
        return "unchanged"
    kinds = sorted({m.kind for m in moves} - {"same"})
    return "+".join(kinds) if kinds else "regroup"
