"""The rollout interface (:class:`Rollouts`), and its backend on the trainer's devices.

A rollout phase turns an iteration's prompts and seeds into a training batch (``latents``,
``log_probs``, ``images``, ``tokens``, ``mask``, ``rewards``, ``prompt_ids``, ``seeds``) with the
trainer's current sampling state, charges its emulated duration to the deployment's clock
(:meth:`Rollouts.charge`; the trace's losses inside it cost the work they interrupt), then
applies the trace events that fell inside it (:meth:`Rollouts.settle`). Every backend produces
the same batch for the same (prompts, seeds, state): a seed fixes the rollout's noise, wherever
it runs.

* :class:`DirectRollouts`: chunked rollouts on the trainer's mesh; time from the cost model's
  capacity-weighted split over the on-demand devices and (``use_spot``) the live spot groups.
* ``backends.scheduled.ScheduledRollouts``: one request per (prompt, seed) through
  ``spotlight_jax.sched``'s simulation of the pull scheduler on the emulated pool (leases,
  periodic commits, the trace's notices and losses inside the phase); time is the simulation's
  makespan.
* ``backends.ray_rollouts.RayRollouts``: the same requests pulled by Ray spot host actors (real
  processes, real preemption signals); what no host finishes runs on the trainer's devices.
* :class:`ReadyBatch`: nothing to roll out (a batch sampled during the previous update).
"""
from __future__ import annotations

import contextlib
import logging as pylogging

import jax
import numpy as np

from spotlight_jax import sched
from spotlight_jax.diffusion.engine import candidate_seeds


def group_seeds(run_seed: int, k: int, num_prompts: int, group_size: int,
                shared_bits: int = 0) -> list[np.ndarray]:
    """The random baseline's seeds: the first G exploration candidates of each prompt slot."""
    return [candidate_seeds(run_seed, k, i, group_size, shared_bits)
            for i in range(num_prompts)]


def rollout_on_groups(setting) -> bool:
    """Resolves ``deployment.rollout_on_groups``: ``'auto'`` computes scheduled rollouts on the
    groups' own devices where they are separate hardware (not the CPU backend, whose emulated
    devices share the same cores; docs/spotlight.md)."""
    if isinstance(setting, bool):
        return setting
    choice = str(setting).lower()
    if choice not in ("auto", "true", "false"):
        raise ValueError(f"deployment.rollout_on_groups={setting!r}: use 'true', 'false' or "
                         "'auto'")
    return jax.default_backend() != "cpu" if choice == "auto" else choice == "true"


def with_group_ids(batch: dict, seeds_per_prompt) -> dict:
    """Adds ``prompt_ids`` (the group of each trajectory) and the flat ``seeds``."""
    batch["prompt_ids"] = np.repeat(np.arange(len(seeds_per_prompt)),
                                    [len(ss) for ss in seeds_per_prompt])
    batch["seeds"] = np.concatenate([np.asarray(ss, np.uint32) for ss in seeds_per_prompt])
    return batch


def flat_requests(prompts, seeds_per_prompt) -> list[tuple[str, int]]:
    return [(p, int(s)) for p, ss in zip(prompts, seeds_per_prompt) for s in ss]


@contextlib.contextmanager
def quiet(*names):
    """Raises the given loggers to WARNING for a block (the emulated pool of a scheduled
    rollout phase would log its node losses and joins at every iteration)."""
    loggers = [pylogging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(pylogging.WARNING)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


class Rollouts:
    """A rollout phase backend over a :class:`~spotlight_jax.runner.state.RunState`."""

    # whether the batch's rewards were computed, and charged, where it was sampled (the
    # iteration then charges no reward phase)
    rewarded = False

    def __init__(self, state, use_spot: bool = False):
        self.state, self.use_spot = state, use_spot

    def rollout(self, k: int, prompts, seeds_per_prompt) -> tuple[dict, dict]:
        """The batch of ``prompts`` x their seeds, and the backend's numbers for the row."""
        raise NotImplementedError

    def charge(self, n: int, info: dict) -> None:
        """Emulated time of a phase not simulated request by request: the cost model's
        capacity-weighted split; the spot groups' share as ``Deployment.charge_spot_work``
        prices it (the trace's losses inside the phase cost the work they interrupt), what no
        spot node is left to finish done by the on-demand devices after their own share."""
        d = self.state.deploy
        od_s, spot_s = d.rollout_split(n, self.use_spot)
        with d.clock.concurrent() as phase:
            if not spot_s:
                phase.run("rollout", d.od, od_s)
                return
            spot = d.charge_spot_work(phase, "rollout", spot_s * d.spot_devices)
            phase.run("rollout", d.od, od_s + spot.handover_device_s / d.od.num_devices)

    def reward_devices(self) -> int:
        """The devices that hold the phase's images and score them (``Deployment.reward_s``)."""
        d = self.state.deploy
        return d.cfg.on_demand_devices + (d.spot_devices if self.use_spot else 0)

    def settle(self, row: dict) -> None:
        """Applies the trace events up to now (what they cost the phase was charged with it)."""
        self.state.deploy.advance()

    def batch_from_results(self, results, rids, flat, seeds_per_prompt) -> dict:
        """A training batch from a drained queue's finished requests."""
        s = self.state
        trajs = [results[r].trajectory() for r in rids]
        batch = {key: np.stack([t[key] for t in trajs])
                 for key in ("latents", "log_probs", "images")}
        if s.decoder is not None:       # a latent model: the requests hold latents, not pixels
            batch["images"] = np.asarray(s.decoder.decode(batch["latents"][:, -1]))
        flat_prompts = [p for p, _ in flat]
        batch["tokens"], batch["mask"] = s.prompt_source.tokenize(flat_prompts, s.mcfg.text_len)
        batch["rewards"] = np.asarray(s.engine.reward_fn(batch["images"], flat_prompts),
                                      np.float32)
        return with_group_ids(batch, seeds_per_prompt)

    def requests(self, k: int, flat) -> tuple[list[str], list[sched.Request]]:
        T = self.state.train_sampler_cfg.num_steps
        rids = [f"k{k:05d}r{i:04d}" for i in range(len(flat))]
        return rids, [sched.Request(rid=r, prompt=p, seed=s, num_steps=T, policy_version=k)
                      for r, (p, s) in zip(rids, flat)]

    def close(self) -> None:
        pass


class ReadyBatch(Rollouts):
    """A phase with nothing to roll out: the batch was sampled during the previous update
    (``spotlight_pipelined``). No time is charged, and no spot rollout was in flight; the spot
    groups rewarded the candidates while exploring (their exploration charge includes it), so
    the iteration charges no reward phase either."""

    rewarded = True

    def rollout(self, k, prompts, seeds_per_prompt):
        raise RuntimeError("a ready batch is not rolled out")

    def charge(self, n, info):
        pass


class DirectRollouts(Rollouts):
    """Chunked rollouts on the trainer's mesh. The engine scores chunk ``i`` while chunk
    ``i + 1`` samples, which hides the host's wait; on an accelerator both share the same
    devices, so the clock adds the rewards' device time (``Deployment.reward_s``)."""

    def rollout(self, k, prompts, seeds_per_prompt):
        s = self.state
        flat = [p for p, ss in zip(prompts, seeds_per_prompt) for _ in range(len(ss))]
        seeds = np.concatenate([np.asarray(ss, np.uint32) for ss in seeds_per_prompt])
        batch = s.engine.run(s.trainer.sampling_state(), flat, seeds)
        return with_group_ids(batch, seeds_per_prompt), {}

