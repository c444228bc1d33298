"""Seed exploration for the runner: plan candidates, score them, keep each prompt's
max-variance G-subset, and (``spotlight`` mode) do it with stale weights on spot devices
concurrently with the update.

:func:`explore` is one exploration round with the planner. :class:`SpotExploration` owns where
``spotlight`` explores while the trainer updates: the Ray spot hosts (a ``backends.ray_explorer.
RayExplorer``, ``deployment.transport='ray'``), a ``backends.emulated_fleet.FleetExplorer`` of
emulated spot nodes that the trace regroups (emulated transport), else a
data-parallel mesh of devices the trainer does not use, else the trainer's own devices; and the
worker thread that scores there while the main thread dispatches the update (JAX releases the
GIL while programs run). Both computations are pure functions of their inputs, so the results do
not depend on the interleaving.
"""
from __future__ import annotations

import concurrent.futures
import time

import jax
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec

from spotlight_jax.diffusion import Sampler
from spotlight_jax.diffusion.engine import RolloutEngine, candidate_seeds
from spotlight_jax.explore import max_variance_subset
from spotlight_jax.explore.explorer import LocalExplorer
from spotlight_jax.parallel.mesh import explore_mesh, fleet_devices
from spotlight_jax.runner.backends.emulated_fleet import FleetExplorer
from spotlight_jax.runner.backends.ray_explorer import RayExplorer


def extras_budget_s(window_s: float, devices: int, base_candidates: int,
                    per_candidate_s: float) -> float:
    """Device-seconds the planner may spend on extra candidates so that the whole exploration
    (the ``base_candidates`` = prompts x G it always scores, plus the extras) fits in
    ``window_s`` seconds on ``devices`` devices: the window's device-seconds minus the base
    candidates' (0 when they alone fill it)."""
    return max(window_s * devices - base_candidates * per_candidate_s, 0.0)


def chosen_rows(cands, chosen) -> np.ndarray:
    """Indices into the flat candidate batch (prompt after prompt) of each prompt's chosen
    candidates."""
    offsets = np.cumsum([0] + [len(cc) for cc in cands])[:-1]
    return np.concatenate([o + np.asarray(i) for o, i in zip(offsets, chosen)])


def within_capacity(counts: list[int], group_size: int, capacity: float) -> list[bool]:
    """Which prompts to score when only ``capacity`` candidates fit in the window: a prompt's
    pool (its G base candidates plus the planner's extras) gains only as a whole, so the prompts
    with the most extras are taken first while their whole pools fit; the others keep their G
    base seeds unscored (the seeds the baseline trains on)."""
    order = sorted(range(len(counts)), key=lambda i: (-(counts[i] - group_size), i))
    keep, used = [False] * len(counts), 0
    for i in order:
        if counts[i] > group_size and used + counts[i] <= capacity:
            keep[i], used = True, used + counts[i]
    return keep


def explore(state, k_next: int, prompts, budget_s: float, per_candidate_s: float, *,
            explorer, params, keep: bool = False, capacity: float | None = None):
    """Plans candidates per prompt within ``budget_s`` device-seconds, scores them with
    ``params`` on ``explorer``'s devices, selects each prompt's max-variance G-subset, and
    updates the planner. Returns ``(candidates, chosen indices, batch or None, info)``.

    An explorer with a deadline may leave candidates unscored (NaN rewards): a prompt's subset
    is chosen among its scored ones; a prompt with fewer than G scored keeps its G base
    candidates (unscored, so no trajectory of them is complete: ``info['explore_short']``
    counts those prompts, and a mode must not train on the kept batch then).

    ``capacity`` (candidates that fit in a wall-clock window): only the prompts
    :func:`within_capacity` picks are scored; with ``keep``, only when a whole batch (G per
    prompt) cannot fit (then no batch is kept: the pipelined mode explores as ``spotlight``)."""
    G = state.settings.group_size
    plan = state.planner.plan(prompts, budget_s, per_candidate_s)
    cands = [candidate_seeds(state.settings.seed, k_next, i, plan[p],
                             state.train_sampler_cfg.shared_init_bits)
             for i, p in enumerate(prompts)]
    if keep and capacity is not None and capacity < G * len(prompts):
        keep = False      # no whole batch fits in the window: explore for seeds, as spotlight
    picked = (range(len(prompts)) if capacity is None or keep else
              [i for i, ok in enumerate(within_capacity([plan[p] for p in prompts], G,
                                                        capacity)) if ok])
    rewards = [np.full(len(c), np.nan, np.float32) for c in cands]
    batch = None
    if picked:
        out = explorer.score(params, [prompts[i] for i in picked], [cands[i] for i in picked],
                             keep_trajectories=keep)
        got, batch = out if keep else (out, None)
        for i, r in zip(picked, got):
            rewards[i] = r
    chosen, gains, short = [], [], 0
    for p, r in zip(prompts, rewards):
        scored = np.flatnonzero(np.isfinite(r))
        if len(scored) < G:
            short += 1
            chosen.append(np.arange(G))
            continue
        state.planner.update(p, r[scored])
        idx = scored[max_variance_subset(r[scored], G)]
        chosen.append(idx)
        gains.append(float(np.var(r[idx]) - np.var(r[scored[:G]])))
    if batch is not None:     # the chosen candidates' trajectories (none with a short prompt)
        batch = None if short else explorer.select(batch, chosen_rows(cands, chosen))
    n = int(sum(len(cands[i]) for i in picked))          # submitted for scoring
    info = {"explore_candidates": n, "explore_extra": n - G * len(picked),
            "explore_var_gain": float(np.mean(gains)) if gains else 0.0,
            "explore_prompts": len(picked)}
    if short:
        info["explore_short"] = short
    return cands, chosen, batch, info


class SpotExploration:
    """Where and how ``spotlight`` mode explores with θ_k during the update θ_k -> θ_{k+1}."""

    def __init__(self, state, base):
        s, d = state, state.deploy
        self.state = state
        self.mesh = None
        self.fleet = None
        self.ray = None
        self.explorer = state.explorer           # the trainer's devices unless replaced below
        layout = None
        if s.settings.transport == "ray":
            self.ray = self.explorer = RayExplorer(s.ray_fleet,
                                                   deadline=s.settings.ray_explore_deadline)
        elif s.settings.transport == "emulated" and s.settings.fleet:
            layout = fleet_devices(s.mesh, s.devices, d.cfg.spot_nodes,
                                   d.cfg.spot_devices_per_node)
            if layout is None:
                logging.warning("spotlight: %d device(s) cannot hold %d spot nodes besides the "
                                "trainer's; exploring on one mesh without regroups",
                                len(s.devices), d.cfg.spot_nodes)
        if layout is not None:
            devs, per_node = layout
            self.fleet = FleetExplorer(
                devs, d.cfg.spot_nodes, per_node, s.graphdef, base, s.mcfg,
                s.train_sampler_cfg, sp_degree=d.cfg.spot_sp, reward=s.reward,
                chunk=s.engine.chunk, alive_nodes=d.alive_nodes,
                tokenize=s.prompt_source.tokenize, decoder=s.decoder)
            self.explorer = self.fleet
            logging.info("spotlight: %d spot nodes x %d devices as a SpotFleet (groups %s); "
                         "precompiled in %.1fs", d.cfg.spot_nodes, per_node,
                         [g.device_ids for _, _, g in self.fleet.groups], self.fleet.setup_s)
        elif self.ray is None:
            self.mesh = explore_mesh(s.mesh, s.devices, batch_multiple=s.engine.chunk)
            if self.mesh is not None:
                sampler = Sampler(s.graphdef, s.image_shape, s.train_sampler_cfg, mesh=self.mesh,
                                  decoder=s.decoder)
                self.explorer = LocalExplorer(RolloutEngine(sampler, s.mcfg.text_len,
                                                       s.engine.reward_fn, chunk=s.engine.chunk,
                                                       tokenize=s.prompt_source.tokenize))
            else:
                logging.warning("spotlight: the trainer uses every device; exploration shares "
                                "its devices")
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                           thread_name_prefix="explore")

    def pull(self, params, version: int):
        """θ_k (policy ``version``) onto the exploration devices (replicated): device-to-device
        copies, the spot groups' weight pull (the Ray hosts: from the object store). Returns
        ``(params there, seconds, bytes)``."""
        if self.ray is not None:
            return params, *self.ray.pull(params, version)
        if self.fleet is not None:
            return params, *self.fleet.pull(params)
        if self.mesh is None:
            return params, 0.0, 0
        t0 = time.perf_counter()
        spec = NamedSharding(self.mesh, PartitionSpec())
        placed = jax.block_until_ready(jax.tree.map(lambda x: jax.device_put(x, spec), params))
        nbytes = sum(int(x.nbytes) for x in jax.tree.leaves(params))
        return placed, time.perf_counter() - t0, nbytes * self.mesh.size

    def submit(self, params, k_next: int, prompts, budget_s: float, per_candidate_s: float,
               keep: bool = False, capacity: float | None = None):
        """Explores in the worker thread; returns a future of ``(explore(...) result, (start,
        end) wall times)``; ``keep``: with the candidates' rollout batch."""
        def work():
            t0 = time.perf_counter()
            out = explore(self.state, k_next, prompts, budget_s, per_candidate_s,
                          explorer=self.explorer, params=params, keep=keep, capacity=capacity)
            return out, (t0, time.perf_counter())
        return self._pool.submit(work)

    def plan_budget(self, budget_s: float, per_candidate_s: float,
                    base_candidates: int) -> tuple[float, float, float | None]:
        """The planner's budget, seconds per candidate and the candidates that fit in the window
        (None: all are scored): the cost model's, unless the explorer runs on the wall clock
        (the Ray hosts with a deadline) and has measured its own."""
        if self.ray is not None:
            return self.ray.plan_budget(budget_s, per_candidate_s, base_candidates)
        return budget_s, per_candidate_s, None

    def update_done(self, update_s: float) -> None:
        """The update the exploration overlaps has ended after ``update_s`` wall seconds (an
        explorer with a deadline drops what is unfinished)."""
        if self.ray is not None:
            self.ray.update_done(update_s)

    def info(self) -> dict:
        """The explorer's own numbers of the last exploration (the Ray hosts')."""
        return dict(self.ray.last) if self.ray is not None else {}

    def sync(self, row: dict | None = None) -> None:
        """Applies the deployment's alive spot nodes to the fleet (real regroups) and adds what
        they measured to ``row``."""
        if self.fleet is None:
            return
        got = self.fleet.sync(self.state.deploy.alive_nodes, self.state.trainer.sampling_state)
        if row is not None:
            for key, v in got.items():
                row[key] = max(row.get(key, 0), v) if key.endswith("max_s") else (
                    row.get(key, 0) + v)

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.close()
        self._pool.shutdown(wait=True)
