"""The emulated deployment's spot nodes as real elastic state, driven by the spot trace.

In ``spotlight`` mode (emulated transport) the spot nodes are emulated devices of this process
held in a :class:`~spotlight_jax.elastic.DevicePool`, one :class:`~spotlight_jax.elastic.node.
SpotNode` per node (a :class:`~spotlight_jax.elastic.node.SpotFleet`): each node's SP group holds
the policy weights and the rollout program compiled ahead of time for it. When the trace preempts
a node, its devices are marked lost and the buffers on them are really deleted; when a node
rejoins, it regroups and pulls the weights device-to-device from a live peer node (or the
trainer). :meth:`FleetExplorer.sync` applies the deployment's alive set and returns what the
regroups measured (seconds, bytes, XLA compiles: 0 when the programs were precompiled).

:class:`FleetExplorer` is the exploration scorer of that fleet, with the
:class:`~spotlight_jax.explore.explorer.Explorer` protocol: candidates are cut into fixed-size
chunks dealt round-robin to the live groups (dispatched asynchronously, so the groups run
concurrently), then rewarded. The weights it scores with are the ones last installed by
:meth:`FleetExplorer.pull` (the stale θ_k), not the ``state`` argument.

Time and money stay emulated (the cost model charges the phases); what is real here is the
state: which devices hold which weights, what a regroup copies, and which programs run where.
"""
from __future__ import annotations

import concurrent.futures
import time

import jax
import numpy as np

from spotlight_jax import world
from spotlight_jax.diffusion import SamplerConfig, batches
from spotlight_jax.elastic import DevicePool, GroupConfig, PoolConfig
from spotlight_jax.elastic.node import SpotFleet
from spotlight_jax.explore.explorer import take_rows
from spotlight_jax.models import MMDiTConfig

STAT_KEYS = ("fleet_regroups", "fleet_regroup_s", "fleet_regroup_max_s", "fleet_compiles",
             "fleet_bytes_copied", "fleet_bytes_reused")


class FleetExplorer:
    """Spot nodes ``spot0..spot{n-1}`` of ``per_node`` devices each, on ``devices``.

    Args:
      devices: ``num_nodes * per_node`` devices (see ``parallel.mesh.fleet_devices``).
      alive_nodes: the nodes up at the start (the others are built lost).
      chunk: rollouts per program call (the one precompiled batch size).
      reward: the run's resolved training reward (``rewards.Reward``).
      tokenize: the run's prompt source's ``tokenize(prompts, text_len)`` (default the world's).
    """

    def __init__(self, devices, num_nodes: int, per_node: int, graphdef, params,
                 model_cfg: MMDiTConfig, sampler_cfg: SamplerConfig, *, sp_degree: int,
                 reward, chunk: int, alive_nodes=None, tokenize=world.tokenize,
                 decoder=None):
        names = tuple(f"spot{i}" for i in range(num_nodes))
        self.pool = DevicePool(PoolConfig(nodes=tuple((n, "spot", per_node) for n in names)),
                               devices)
        alive = set(names if alive_nodes is None else alive_nodes)
        for n in names:
            if n not in alive:
                self.pool.mark_node_lost(n, reason="down at start")
        self.model_cfg, self.chunk, self.tokenize = model_cfg, int(chunk), tokenize
        # a latent model's VAE: the node programs return latents, decoded here before the reward
        # (on the VAE's device, not the spot group's: see docs/real_models.md)
        self.decoder = decoder
        self.reward_fn = reward
        t0 = time.perf_counter()
        # Spot VMs are preempted and rejoin as whole nodes: each node only ever forms its full
        # group again, so that is the one program it precompiles.
        self.fleet = SpotFleet(self.pool, graphdef, params, model_cfg, sampler_cfg,
                               group_config=GroupConfig(heads=model_cfg.num_heads,
                                                        sp_degree=min(sp_degree, per_node)),
                               batch_sizes=(self.chunk,), coverage="node",
                               # the programs take the source's prompt structure (pooled, null)
                               tokens_like=tokenize([], model_cfg.text_len)[0])
        self.setup_s = time.perf_counter() - t0
        self._rewards = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                              thread_name_prefix="fleet-reward")

    # ---- state -----------------------------------------------------------------------------
    @property
    def alive_nodes(self) -> set[str]:
        return {n for n, devs in self.pool.alive_by_node("spot").items() if devs}

    @property
    def groups(self):
        return self.fleet.groups

    def sync(self, alive_nodes, trainer_params) -> dict:
        """Applies the deployment's alive nodes: a node that went down loses its devices (and the
        buffers on them are deleted: its memory is gone); one that came back regroups and pulls
        the weights from a live peer or ``trainer_params`` (a tree, or a function returning one,
        called only when a node rejoins). Returns this call's regroup numbers
        (keys ``STAT_KEYS``; zeros when nothing changed)."""
        want = set(alive_nodes)
        changed = False
        for node, snode in self.fleet.nodes.items():
            up = bool(self.pool.alive_devices(node))
            if up and node not in want:
                ids = [d.id for d in self.pool.devices(node=node, alive=None)]
                doomed = snode.device_buffers(ids)
                self.pool.mark_node_lost(node, reason="trace: preempted")
                for buf in doomed:
                    buf.delete()
                changed = True
            elif not up and node in want:
                self.pool.mark_node_joined(node, reason="trace: joined")
                changed = True
        stats = dict.fromkeys(STAT_KEYS, 0)
        if not changed:
            return stats
        if callable(trainer_params):
            trainer_params = trainer_params()
        reports = [r for r in self.fleet.on_change(self.pool, trainer=trainer_params)
                   if r.kind != "unchanged"]
        stats.update(
            fleet_regroups=len(reports),
            fleet_regroup_s=float(sum(r.total_s for r in reports)),
            fleet_regroup_max_s=float(max((r.total_s for r in reports), default=0.0)),
            fleet_compiles=int(sum(r.compiles for r in reports)),
            fleet_bytes_copied=int(sum(r.bytes_copied for r in reports)),
            fleet_bytes_reused=int(sum(r.bytes_reused for r in reports)))
        return stats

    def pull(self, params) -> tuple[float, int]:
        """Installs ``params`` (θ_k) on every live group: the spot nodes' weight pull. Returns
        ``(seconds, bytes placed)``."""
        t0 = time.perf_counter()
        nbytes = sum(int(x.nbytes) for x in jax.tree.leaves(params))
        placed = 0
        for node in self.fleet.nodes.values():
            if node.groups:
                node.update_params(params)
                placed += nbytes * len(node.devices)
        return time.perf_counter() - t0, placed

    # ---- exploration -------------------------------------------------------------------------
    def score(self, state, prompts, seeds_per_prompt, keep_trajectories: bool = False):
        """Per-prompt reward arrays of the candidates, scored on the live groups with the pulled
        weights (``state`` is not used: the groups hold θ_k since :meth:`pull`); with
        ``keep_trajectories`` also the candidates' rollout batch (host arrays, as
        :meth:`~spotlight_jax.diffusion.engine.RolloutEngine.run` returns), for a mode that
        trains on what the spot groups sampled."""
        del state
        groups = self.fleet.groups
        if not groups:
            raise RuntimeError("no spot node is alive: nothing to explore on")
        flat_p = [p for p, ss in zip(prompts, seeds_per_prompt) for _ in range(len(ss))]
        flat_s = np.concatenate([np.asarray(s, np.uint32) for s in seeds_per_prompt])
        calls = []
        for j, (ps, ss, n) in enumerate(batches.padded_chunks(flat_p, flat_s, self.chunk)):
            tokens, mask = self.tokenize(ps, self.model_cfg.text_len)
            node, g, _ = groups[j % len(groups)]
            out = node.rollout(tokens, mask, ss, group=g)   # asynchronous dispatch
            if self.decoder is not None:
                out = {**out, "images": self.decoder.decode(np.asarray(out["latents"])[:, -1])}
            calls.append((out, batches.take(tokens, slice(0, n)), mask[:n], ps[:n], n))
        futures = [self._rewards.submit(lambda im, ps, n: self.reward_fn(np.asarray(im)[:n], ps),
                                        out["images"], ps, n) for out, _, _, ps, n in calls]
        flat_r = np.concatenate([f.result() for f in futures]).astype(np.float32)
        per_prompt = np.split(flat_r, np.cumsum([len(s) for s in seeds_per_prompt])[:-1])
        if not keep_trajectories:
            return per_prompt
        batch = {key: np.concatenate([np.asarray(out[key])[:n] for out, *_, n in calls])
                 for key in ("latents", "log_probs", "images")}
        batch["tokens"] = batches.concat([t for _, t, _, _, _ in calls])
        batch["mask"] = np.concatenate([m for _, _, m, _, _ in calls])
        batch["rewards"] = flat_r
        return per_prompt, batch

    def select(self, kept, rows) -> dict:
        return take_rows(kept, rows)

    def close(self):
        self._rewards.shutdown(wait=True)
