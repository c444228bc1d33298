"""What every objective's trainer owns: the trainable weights (full or LoRA), optimizer, EMA.

An objective (``flow_grpo``, ``nft``) subclasses :class:`PolicyTrainer` and adds its update (and
the static description of its work, ``rl.work``). The runner uses only the :class:`Trainer`
protocol, which the objectives' trainers and the cluster's
multi-process ``TrainerJob`` implement (``tests/test_interfaces.py`` checks all three).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from spotlight_jax.models import AttentionSpec
from spotlight_jax.parallel.mesh import place_batch
from spotlight_jax.rl import lora as lora_lib
from spotlight_jax.rl.advantages import advantages, decoupled_advantages
from spotlight_jax.rl.work import ObjectiveWork, needs_reward_parts

ADVANTAGES = ("reward", "decoupled")


@runtime_checkable
class Trainer(Protocol):
    """The trainer interface a run uses: the update, the advantages and the policy's states.

    ``cfg``: the objective's frozen config. ``work``: what one update does
    (:class:`~spotlight_jax.rl.work.ObjectiveWork`: its rows, passes, shards and cost-model
    charges), for whoever counts or prices it without holding a trainer. ``batch_keys``: the
    rollout fields ``update`` reads (plus ``advantages``). ``state_parts``: the attributes a
    checkpoint holds (read and set by name).
    """

    cfg: Any
    batch_keys: tuple[str, ...]
    state_parts: tuple[str, ...]

    @property
    def work(self): ...

    def advantages(self, rewards, prompt_ids, parts=None, weights=None) -> np.ndarray:
        """The batch's advantages, as the objective's config asks (``parts`` [B, K] and their
        ``weights`` [K] where ``work.needs_reward_parts``)."""

    def update(self, batch: dict, key, step: int, generator=None) -> dict:
        """One update on ``batch``; ``generator``: the policy that sampled it, when that is not
        the current sampling policy (:meth:`generator` of that moment). Returns metrics."""

    def update_sharded(self, batch: dict, key, step: int, shards: int, run,
                       generator=None) -> dict:
        """:meth:`update` with each optimizer step cut into ``shards`` gradient shards that
        ``run(rl.shards.ShardedStep)`` has computed by whoever it chooses; equal to
        :meth:`update` to float rounding."""

    def sampling_state(self):
        """The weights rollouts and exploration use: θ, or the forward-process objective's
        lagging θ_old."""

    def sampling_trainable(self):
        """The trainable tree behind :meth:`sampling_state`: with ``cfg.lora_rank`` the LoRA
        factors (``sampling_state`` is them merged into the frozen base), else the full
        weights. What a process holding the base needs per policy version."""

    def eval_state(self):
        """The weights the held-out evaluation uses (the EMA if kept)."""

    def generator(self):
        """What a later ``update(..., generator=...)`` needs of the policy that samples now."""

    def exported_lora(self):
        """The evaluated policy's LoRA factors (the EMA's when kept) as host-readable arrays
        to export, or None: full fine-tuning, or a trainer whose weights live elsewhere."""


def check_policy_fields(cfg) -> None:
    """One-line ValueErrors (``name=value: ...``) for the fields every objective's config shares:
    the group, the advantages, the LoRA policy and its optimiser."""
    def bad(name, why):
        raise ValueError(f"{name}={getattr(cfg, name)!r}: {why}")

    if cfg.group_size < 2:
        bad("group_size", "must be >= 2 (advantages compare rollouts within a group)")
    if not cfg.lr > 0:
        bad("lr", "must be > 0 (e.g. lr=1e-3)")
    if not cfg.grad_clip > 0:
        bad("grad_clip", "must be > 0 (e.g. grad_clip=1.0)")
    if cfg.weight_decay < 0:
        bad("weight_decay", "must be >= 0")
    if cfg.lora_rank < 0:
        bad("lora_rank", "must be >= 0 (0 = full fine-tuning)")
    if cfg.lora_rank > 0 and not cfg.lora_alpha > 0:
        bad("lora_alpha", f"must be > 0 with lora_rank={cfg.lora_rank} (e.g. lora_alpha="
                          f"{2.0 * cfg.lora_rank})")
    if not 0.0 <= cfg.ema < 1.0:
        bad("ema", "must be in [0, 1) (0 = no EMA)")
    if not cfg.adv_clip > 0:
        bad("adv_clip", "must be > 0 (e.g. adv_clip=5.0)")
    if cfg.advantage not in ADVANTAGES:
        bad("advantage", f"use {' or '.join(map(repr, ADVANTAGES))}")
    if cfg.advantage == "decoupled" and cfg.global_std:
        bad("global_std", "advantage='decoupled' normalises within each group; set "
                          "global_std=False (or advantage='reward')")
    if cfg.minibatches < 1:
        bad("minibatches", "must be >= 1")


def make_optimizer(cfg):
    """Grad-norm clip then AdamW, from a config with ``grad_clip``, ``lr``, ``weight_decay``."""
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                       optax.adamw(cfg.lr, b1=0.9, b2=0.999, weight_decay=cfg.weight_decay))


def policy_model(graphdef, cfg, trainable, base):
    """The NNX model of ``trainable`` for a train step: the full weights, or under
    ``cfg.lora_rank`` the frozen ``base`` with the LoRA factors applied factored
    (``lora.adapted_model``: no weight gradient of the base is formed)."""
    if cfg.lora_rank:
        return lora_lib.adapted_model(graphdef, base, trainable, cfg.lora_alpha / cfg.lora_rank)
    return nnx.merge(graphdef, trainable)


class PolicyTrainer:
    """Trainable weights, optimizer state and EMA over a frozen base (the reference policy).

    ``cfg`` needs ``lora_rank``, ``lora_alpha``, ``lr``, ``grad_clip``, ``weight_decay``, ``ema``.
    ``seed``: the run's seed, which draws the LoRA A factors (so the seeds of a grid start apart).
    """

    batch_keys: tuple[str, ...] = ()
    state_parts: tuple[str, ...] = ("trainable", "opt_state", "ema")

    def __init__(self, graphdef, base_state, cfg, mesh=None, attn=None, seed: int = 0):
        self.graphdef, self.cfg, self.mesh = graphdef, cfg, mesh
        # how the update's forwards lay out attention (dense, or sequence-parallel on mesh)
        self.attn = attn if attn is not None else AttentionSpec()
        self.base = base_state
        rep = None
        if mesh is not None:
            # committed to the mesh like the train step's outputs (LoRA factors and scalar
            # optimizer counters replicated), so the second step does not compile the program
            # again for other input shardings
            from jax.sharding import NamedSharding, PartitionSpec  # noqa: PLC0415

            rep = NamedSharding(mesh, PartitionSpec())
        if cfg.lora_rank:
            self.trainable = lora_lib.init_lora(base_state, cfg.lora_rank, jax.random.key(seed))
            if rep is not None:
                self.trainable = jax.device_put(self.trainable, rep)
        else:
            self.trainable = jax.tree.map(jnp.copy, base_state)
        self.tx = make_optimizer(cfg)
        self.opt_state = self.tx.init(self.trainable)
        if rep is not None:
            self.opt_state = jax.tree.map(
                lambda x: jax.device_put(x, rep) if x.ndim == 0 else x, self.opt_state)
        self.ema = jax.tree.map(jnp.copy, self.trainable) if cfg.ema else None

    def merged(self, trainable):
        if self.cfg.lora_rank:
            return lora_lib.merge(self.base, trainable, self.cfg.lora_alpha / self.cfg.lora_rank)
        return trainable

    def policy_state(self):
        return self.merged(self.trainable)

    def sampling_state(self):
        """The weights that draw this objective's training rollouts (θ itself here)."""
        return self.policy_state()

    def sampling_trainable(self):
        return self.trainable

    def generator(self):
        """What a later ``update(..., generator=...)`` needs to know of the policy that samples
        now, for a batch trained on one iteration later (``spotlight_pipelined``): None when the
        batch itself carries it (Flow-GRPO's rollout log-probs are the PPO ratio's old policy)."""
        return None

    def eval_state(self):
        return self.merged(self.ema) if self.ema is not None else self.policy_state()

    def exported_lora(self):
        """The LoRA factors :meth:`eval_state` merges (the EMA's when kept); None for full
        fine-tuning."""
        if not self.cfg.lora_rank:
            return None
        return self.ema if self.ema is not None else self.trainable

    @property
    def work(self):
        """What one update of this trainer's objective does (``rl.work.ObjectiveWork``)."""
        return ObjectiveWork(self.cfg, self.sampler, type(self))

    @property
    def needs_reward_parts(self) -> bool:
        """Whether :meth:`advantages` needs the reward's parts (:func:`needs_reward_parts`)."""
        return needs_reward_parts(self.cfg)

    def advantages(self, rewards, prompt_ids, parts=None, weights=None) -> np.ndarray:
        """The batch's advantages as this objective's config asks: of the scalar reward
        (group mean removed, group or batch std, clipped), or with ``parts`` ``[B, K]`` (the
        reward's components, weighted by ``weights`` [K]: a reward mix's) each part normalised
        on its own (:attr:`needs_reward_parts`)."""
        if self.needs_reward_parts:
            if parts is None:
                raise ValueError("advantage='decoupled' needs the reward's parts; use a reward "
                                 "with components (e.g. geneval_lite)")
            return decoupled_advantages(parts, prompt_ids, weights=weights,
                                        clip=self.cfg.adv_clip)
        return advantages(rewards, prompt_ids, global_std=self.cfg.global_std,
                          clip=self.cfg.adv_clip)

    @staticmethod
    def check_finite(metrics: dict, step: int, name: str, fix: str) -> None:
        """Stops on a NaN/Inf loss or gradient norm, naming the iteration and the fix."""
        for k in ("loss", "grad_norm"):
            if not np.isfinite(metrics[k]):
                raise FloatingPointError(f"{name} {k} is {metrics[k]} at iteration {step}; {fix}")

    def _place(self, x):
        """A per-sample array or pytree (``tokens`` of a prompt-embedding file) on the mesh."""
        return place_batch(x, self.mesh)
