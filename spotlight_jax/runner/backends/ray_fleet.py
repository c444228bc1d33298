"""The run's Ray spot hosts (``deployment.transport='ray'``): one fleet, three kinds of work.

:class:`RayFleet` owns the spot host actors (:mod:`spotlight_jax.cluster.ray_hosts`): one per
spot node, started on first use, replaced when found dead, each told the policy version to
install; a version's weights are published into the object store once, and hosts pull them from
there (a host that joins late pulls the latest, never from the trainer's devices). The rollout
phase (``backends.ray_rollouts.RayRollouts``) and exploration (``backends.ray_explorer.
RayExplorer``) hand the same hosts requests through a queue the runner owns; a shared update
(``backends.ray_shards.RayShards``) hands them gradient shards as actor calls between those
requests.
"""
from __future__ import annotations

import threading

import numpy as np
from absl import logging

from spotlight_jax import sched
from spotlight_jax.cluster import ray_hosts
from spotlight_jax.sched.requests import pixels

# how each serving thread's loop may end (ray_hosts.serve); hosts that left otherwise are gone
_STILL_UP = ("done", "stopped")


class RayFleet:
    """The spot host actors of a run over ``state`` (a ``RunState``)."""

    def __init__(self, state):
        self.state = state
        self.hosts: list = []             # live spot host workers (ray_hosts.RayWorker)
        self.starting: list = []          # (actor, info ref) of hosts still starting
        self._next_host = 0
        self._published = None            # (version, object ref) of the last weights
        self.where = None                 # the Ray cluster joined (ray_hosts.connect)
        self._base = None                 # the base's object ref (LoRA runs), put once
        self.publish_bytes = 0            # bytes of the last published version
        self._counts = {"started": 0, "dead": 0}   # since the last take_counts()

    def worker_config(self) -> dict:
        """The hosts' ``WorkerConfig``: a mode that trains on explored candidates has them
        retain their trajectories (fetched for the chosen ones only)."""
        d = self.state.deploy
        keep = bool(getattr(getattr(self.state, "mode", None), "keep_candidates", False))
        return {"commit_every": d.cfg.commit_every, "steps_per_call": 1, "microbatch": 4,
                "retain": keep}

    def publish(self, version: int, params) -> object:
        """The object ref of ``version`` (``params``, the sampling weights), put into the
        object store once: with LoRA only the trainer's sampling factors (the hosts merge them
        into their resident base), else the full weights. ``publish_bytes`` is its size."""
        if self._published is None or self._published[0] != version:
            tr = self.state.trainer
            rank = int(getattr(tr.cfg, "lora_rank", 0) or 0)
            if rank:
                ref, self.publish_bytes = ray_hosts.publish_policy(
                    lora=tr.sampling_trainable(), scale=tr.cfg.lora_alpha / rank)
            else:
                ref, self.publish_bytes = ray_hosts.publish_policy(full=params)
            self._published = (version, ref, bool(rank))
        return self._published[1]

    def _base_ref(self):
        """The frozen base in the object store, put once per run (hosts that cannot load it
        themselves pull it when they join): what a LoRA version is merged into, and the
        reference a gradient shard's KL term needs (a shared update, LoRA or not)."""
        if self._base is None:
            self._base = ray_hosts.publish(self.state.base_state)
        return self._base

    def connect(self) -> None:
        """Joins ``deployment.ray_address`` (default ``RAY_ADDRESS``), else starts a local Ray
        instance with a CPU per spot host and the spot resource on it."""
        if self.where is None:
            s, d = self.state, self.state.deploy
            res = s.settings.ray_spot_resource
            self.where = ray_hosts.connect(
                s.settings.ray_address, local_cpus=d.cfg.spot_nodes,
                local_resources={res: d.cfg.spot_nodes} if res else None)

    def top_up(self, version: int, params) -> tuple[int, int]:
        """Has every live host hold ``version`` (``params``, published once), starts hosts for
        the missing spot nodes and admits those that are up; returns (started, found dead).

        A host still starting does not hold the phase up: it joins a later one (on a real
        cluster its replacement may wait for a new node). The phase waits for the hosts it just
        started only up to ``deployment.ray_host_wait_s`` seconds, or, on a local instance this
        process started (which has every host's resources), until they are up."""
        d = self.state.deploy
        self.connect()
        ref = self.publish(version, params)
        lost = self._install(ref, version)
        missing = d.cfg.spot_nodes - len(self.hosts) - len(self.starting)
        for _ in range(max(missing, 0)):
            self._launch()
        wait = self.state.settings.ray_host_wait_s
        if missing > 0 and wait <= 0 and self.where == "local":
            wait = 600.0
        lost += self._admit(wait if missing > 0 else 0.0)
        lost += self._install(ref, version)
        self._counts["started"] += max(missing, 0)
        self._counts["dead"] += lost
        return max(missing, 0), lost

    def take_counts(self) -> dict:
        """Hosts started and found dead (idle, starting or being handed weights) since the last
        call: each counted once, whichever phase's row reports it."""
        out, self._counts = self._counts, {"started": 0, "dead": 0}
        return out

    def _launch(self) -> None:
        s, d = self.state, self.state.deploy
        i, self._next_host = self._next_host, self._next_host + 1
        res = s.settings.ray_spot_resource
        actor, info = ray_hosts.launch_host(
            f"spot{i}", s.spec.plain(), cpu_devices=d.cfg.spot_devices_per_node,
            worker=self.worker_config(), resources={res: 1} if res else None)
        self.starting.append((actor, info))

    def _admit(self, timeout_s: float) -> int:
        """Hosts whose start finished (within ``timeout_s``) join the fleet; returns how many
        died while starting."""
        if not self.starting:
            return 0
        import ray  # noqa: PLC0415 - the optional cluster extra
        refs = [info for _, info in self.starting]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(timeout_s, 0.0))
        ready = set(ready)
        died, still = 0, []
        for actor, info in self.starting:
            if info not in ready:
                still.append((actor, info))
                continue
            try:
                self.hosts.append(ray_hosts.RayWorker(actor, ray.get(info)))
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
                # a lost node, or a host that could not start (its error, first line)
                logging.warning("a spot host died while starting: %s",
                                str(e).strip().splitlines()[0] if str(e).strip() else e)
                died += 1
        self.starting = still
        return died

    def _install(self, ref, version: int, hosts=None) -> int:
        """``version`` (and, for LoRA or a shared update, the base) onto each of ``hosts``
        (default: every live host) that lacks it; drops the dead ones from the fleet and
        returns how many."""
        hosts = self.hosts if hosts is None else hosts
        alive, lost = [], 0
        base = self._published[2] or self.state.shared_update.enabled
        for w in hosts:
            try:
                if base and not w.has_base:
                    w.set_base(self._base_ref())
                if w.policy_version != version:
                    w.set_policy(ref, version)
                alive.append(w)
            except ray_hosts.WorkerLost:
                lost += 1
        dead = {id(w) for w in hosts} - {id(w) for w in alive}
        self.hosts = [w for w in self.hosts if id(w) not in dead]
        return lost

    def serve(self, queue, *, stop: threading.Event | None = None,
              rewards: dict | None = None, poll_s: float = 0.2) -> dict:
        """Every host pulls from ``queue`` (one thread each) until it is drained, ``stop`` is
        set or the host leaves; a host that finishes starting meanwhile installs the current
        version and joins at once; hosts that left are dropped. Returns how each loop ended,
        the request-steps the hosts computed and how many joined mid-phase."""
        steps_before = {w.group_id: w.steps for w in self.hosts}
        stats: dict = {}
        threads = ray_hosts.serve_in_threads(self.hosts, queue, stop=stop, rewards=rewards,
                                             out=stats)[0]
        joined = 0
        while alive := [t for t in threads if t.is_alive()]:
            alive[0].join(timeout=poll_s)
            if self.starting and not queue.all_done and not (stop is not None and stop.is_set()):
                new = self._join_now()
                joined += len(new)
                steps_before.update({w.group_id: w.steps for w in new})
                threads += ray_hosts.serve_in_threads(new, queue, stop=stop, rewards=rewards,
                                                      out=stats)[0]
        left = {g: st["left"] for g, st in stats.items()}
        computed = sum(w.steps - steps_before[w.group_id] for w in self.hosts)
        self.hosts = [w for w in self.hosts if left.get(w.group_id, "done") in _STILL_UP]
        return {"left": left, "steps": computed, "joined": joined,
                "lost": sum(v == "lost" for v in left.values()),
                "noticed": sum(v == "notice" for v in left.values())}

    def _join_now(self) -> list:
        """Hosts that finished starting, holding the published version: they join the phase
        being served."""
        before = len(self.hosts)
        self._counts["dead"] += self._admit(0.0)
        new = self.hosts[before:]
        version, ref, _ = self._published
        self._counts["dead"] += self._install(ref, version, new)
        return [w for w in new if w in self.hosts]

    @staticmethod
    def accounting(queue, served: dict) -> dict:
        """What a phase's queue says about its requests once the hosts stopped: request-steps
        the hosts computed but never committed (redone elsewhere after a loss, or dropped) and
        commits refused because their request was already complete. Call before any local
        finishing (its commits are not the hosts')."""
        return {"redone_steps": max(served["steps"] - queue.stats["committed_steps"], 0),
                "duplicates": queue.stats["duplicates"]}

    def finish_locally(self, queue, params, version: int) -> int:
        """Runs what is left in ``queue`` on the trainer's devices (no host could); returns the
        calls made."""
        s = self.state
        local = sched.InProcessWorker(
            "od0", sched.SamplerStepper(s.sampler, s.mcfg.text_len,
                                        tokenize=s.prompt_source.tokenize),
            config=sched.WorkerConfig(commit_every=s.deploy.cfg.commit_every, microbatch=4),
            params=params, version=version)
        return local.run(queue)["calls"]

    def final_images(self, latents: np.ndarray) -> np.ndarray:
        """Images of final latents, as a host computes them (the VAE for a latent model)."""
        dec = self.state.decoder
        return pixels(latents) if dec is None else np.asarray(dec.decode(latents))

    def close(self) -> None:
        if self.hosts or self.starting:
            import ray  # noqa: PLC0415 - the optional cluster extra
            for actor in [w.actor for w in self.hosts] + [a for a, _ in self.starting]:
                ray.kill(actor)
            self.hosts, self.starting = [], []

