"""GRPO for flow-matching DiTs (Flow-GRPO): the clipped per-step loss and the train step.

The loss of one trained step ``j`` of a trajectory is
``max(-A * r, -A * clip(r, 1 - eps, 1 + eps)) + beta * KL`` with ``r = exp(logp_new - logp_old)``,
``logp`` the Flow-GRPO SDE log-density of the recorded transition ``x_j -> x_{j+1}`` and
``KL = mean((mean_theta - mean_ref)^2) / (2 std_t^2)`` against the frozen reference policy. All the
trained steps of a minibatch go through the model as one batch (equivalent to accumulating their
gradients), so the whole update is one jitted program.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from spotlight_jax.diffusion import SamplerConfig, batches, velocity
from spotlight_jax.diffusion.rollout import project_at, resolve_window, step_at
from spotlight_jax.models import AttentionSpec
from spotlight_jax.parallel.mesh import fold_in, on_device
from spotlight_jax.rl import shards as shards_lib
from spotlight_jax.rl.policy import (
    PolicyTrainer,
    check_policy_fields,
    make_optimizer,
    policy_model,
)
from spotlight_jax.rl.work import UpdateRows


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    group_size: int = 8
    lr: float = 1e-4
    beta: float = 0.02
    # With block noise (sampler.noise_patch > 1) the within-block detail of every step is
    # deterministic: no log-prob, so no policy gradient reaches it, and it only drifts as a side
    # effect of the shared weights. detail_beta weighs the KL term's within-block part (the
    # squared mean difference to the reference off the noise subspace, scaled like a per-pixel
    # step's KL) on its own, to anchor the detail to the base; None = beta (one KL term).
    detail_beta: float | None = None
    clip_eps: float = 1e-3
    adv_clip: float = 5.0
    global_std: bool = False
    # 'reward': advantages of the scalar reward. 'decoupled': a reward that is a mean of parts
    # (geneval_lite's constraints) has each part normalised within its group on its own, then
    # averaged and re-normalised per group, so a part with a wide spread (position) cannot drown
    # the others' contrast (shape, count): :func:`decoupled_advantages`.
    advantage: str = "reward"
    train_steps: int = 4          # timesteps per trajectory per update (subsampled, 0 = all)
    # How the trained steps' policy terms are weighed. 'uniform': equally (Flow-GRPO). 'score':
    # step j's term is scaled by 1 / c_j, c_j = |d mean / d v| / noise scale, the factor that a
    # step's log-prob score (eps * c_j * dv/dtheta) carries, and rescaled so the steps' total
    # score energy is unchanged: every step then pushes with its noise at unit scale, instead of
    # the late small-std steps (fine detail) dominating the update (:func:`step_weights`).
    step_weight: str = "uniform"
    minibatches: int = 2
    inner_epochs: int = 1
    grad_clip: float = 1.0
    weight_decay: float = 1e-4
    lora_rank: int = 0
    lora_alpha: float = 0.0
    ema: float = 0.0
    # Re-score old log-probs with the pre-update weights in the training program's batch shapes
    # (one more forward per trained step) instead of taking the rollout's; they differ by float
    # rounding only (~1e-7, reported as rollout_logp_dev), so it is off by default.
    rescore: bool = False

    def validate(self) -> GRPOConfig:
        """Returns self, or raises a one-line ValueError naming the bad field (``name=value:``)."""
        check_policy_fields(self)
        for name in ("beta", "detail_beta"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name}={v!r}: must be >= 0 (0 = no KL term)")
        if not self.clip_eps > 0:
            raise ValueError(f"clip_eps={self.clip_eps!r}: must be > 0 (e.g. clip_eps=1e-3)")
        if self.train_steps < 0:
            raise ValueError(f"train_steps={self.train_steps!r}: must be >= 0 (0 = every SDE "
                             "step)")
        if self.step_weight not in STEP_WEIGHTS:
            raise ValueError(f"step_weight={self.step_weight!r}: choose one of {STEP_WEIGHTS}")
        if self.inner_epochs < 1:
            raise ValueError(f"inner_epochs={self.inner_epochs!r}: must be >= 1")
        return self


def select_steps(key, stochastic: np.ndarray, batch: int, k: int):
    """``[batch, k]`` distinct stochastic step indices per trajectory (uniform, no repeats)."""
    steps = np.flatnonzero(stochastic)
    if k <= 0 or k >= len(steps):
        return jnp.broadcast_to(jnp.asarray(steps, jnp.int32), (batch, len(steps)))
    keys = jax.random.split(key, batch)
    return jax.vmap(lambda kk: jax.random.permutation(kk, jnp.asarray(steps, jnp.int32))[:k])(keys)


STEP_WEIGHTS = ("uniform", "score")


def score_scales(sampler: SamplerConfig) -> np.ndarray:
    """``[num_steps]``: ``c_j = |d mean_j / d v| / (std_j sqrt(-dt_j))`` of every SDE step (0 for
    ODE steps): a step's log-prob score is ``eps_j * c_j * dv/dtheta`` (``eps_j`` unit noise), so
    ``c_j^2`` is how much of the update's gradient energy the step's noise gets."""
    if sampler.sde_type != "sde":
        raise ValueError(f"rl.step_weight='score' needs sampler.sde_type='sde', got "
                         f"{sampler.sde_type!r}; use rl.step_weight='uniform'")
    sig = np.asarray(sampler.sigmas, np.float64)
    out = np.zeros(sampler.num_steps)
    for j in np.flatnonzero(sampler.stochastic_steps()):
        s, dt = sig[j], sig[j + 1] - sig[j]
        s_safe = sig[1] if s >= 1.0 else s
        std = sampler.noise_level * np.sqrt(s / (1.0 - s_safe))
        out[j] = np.sqrt(-dt) * (1 + std ** 2 * (1 - s) / (2 * s)) / std
    return out


def step_weights(sampler: SamplerConfig, kind: str) -> np.ndarray:
    """``[num_steps]`` weight of each step's policy term (ODE steps, never trained, get 1).

    ``'uniform'``: 1. ``'score'``: ``rms(c) / c_j`` over the SDE steps (:func:`score_scales`),
    so each step's weighted score has the scale the steps' scores have on average."""
    if kind not in STEP_WEIGHTS:
        raise ValueError(f"rl.step_weight={kind!r}: use one of {STEP_WEIGHTS}")
    w = np.ones(sampler.num_steps)
    if kind == "score":
        c = score_scales(sampler)
        on = c > 0
        w = np.where(on, np.sqrt(np.mean(c[on] ** 2)) / np.where(on, c, 1.0), 1.0)
    return w


def _gather_steps(latents, log_probs, idx):
    """Flattens (trajectory, trained step) pairs: returns x_j, x_{j+1}, logp_old and j."""
    b, k = idx.shape
    rows = jnp.repeat(jnp.arange(b), k)
    j = idx.reshape(-1)
    return latents[rows, j], latents[rows, j + 1], log_probs[rows, j], j, rows


def step_terms(model, latents, log_probs, idx, tokens, mask, sampler: SamplerConfig,
               ref_model=None, attn=AttentionSpec()):
    """Per (trajectory, step) pair: new log-prob, old log-prob, KL to the reference split into
    ``(on the noise subspace, off it)`` (the second is 0 without block noise), and the rows."""
    x, x_next, logp_old, j, rows = _gather_steps(latents, log_probs, idx)
    sigmas = jnp.asarray(sampler.sigmas)
    sigma, sigma_next = sigmas[j], sigmas[j + 1]
    tok, msk = batches.take(tokens, rows), mask[rows]
    step = step_at(sampler, j)
    v = velocity(model, x, sigma, tok, msk, guidance=sampler.guidance, attn=attn)
    _, logp, mean, std = step(x, v, sigma, sigma_next, noise_level=sampler.noise_level,
                              prev_sample=x_next, sigma_max=sigmas[1])
    if ref_model is None:
        kl = (jnp.zeros_like(logp), jnp.zeros_like(logp))
    else:
        v_ref = jax.lax.stop_gradient(velocity(ref_model, x, sigma, tok, msk,
                                               guidance=sampler.guidance, attn=attn))
        _, _, mean_ref, _ = step(x, v_ref, sigma, sigma_next, noise_level=sampler.noise_level,
                                 prev_sample=x_next, sigma_max=sigmas[1])
        diff = mean - mean_ref
        on = project_at(sampler, j, diff)    # orthogonal split (block noise): sums add up

        def msq(a):
            return (a ** 2).reshape(a.shape[0], -1).mean(-1)

        std0 = std.reshape(std.shape[0], -1)[:, 0]
        # A deterministic step (std 0: CPS into sigma = 0) has no KL term, not 0/0.
        scale = jnp.where(std0 > 0, 1.0 / (2 * jnp.maximum(std0, 1e-12) ** 2), 0.0)
        kl = (msq(on) * scale, msq(diff - on) * scale)
    return logp, logp_old, kl, rows, j


def grpo_loss(model, batch, idx, sampler: SamplerConfig, cfg: GRPOConfig, ref_model=None,
              on_policy=False, attn=AttentionSpec(), denom=None):
    """Clipped GRPO loss and metrics. ``on_policy`` (bool or traced bool scalar): the weights are
    the ones that sampled the batch (first minibatch of an iteration), so the old log-prob *is*
    this forward's log-prob. ``denom``: the count the sums are divided by (default: the
    batch's rows with a non-zero advantage; a shard of a minibatch passes the minibatch's)."""
    logp, logp_old, kl, rows, j = step_terms(model, batch["latents"], batch["log_probs"], idx,
                                             batch["tokens"], batch["mask"], sampler, ref_model,
                                             attn)
    gap = jnp.abs(logp - logp_old)        # the trainer's log-prob against the rollout's
    rollout_dev = jnp.max(gap)
    steps = batch["log_probs"].shape[1]
    if "logp_old" in batch:  # re-scored with the pre-update weights (GRPOTrainer.update)
        logp_old = batch["logp_old"]
    # A traced flag (not a static one): both minibatch kinds share one compiled program.
    logp_old = jnp.where(on_policy, jax.lax.stop_gradient(logp), logp_old)
    adv = batch["advantages"][rows]
    ratio = jnp.exp(logp - logp_old)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps)
    policy = jnp.maximum(unclipped, clipped)
    if cfg.step_weight != "uniform":
        policy = policy * jnp.asarray(step_weights(sampler, cfg.step_weight), jnp.float32)[j]
    # Samples with advantage exactly 0 contribute nothing (their groups carry no signal).
    weight = (adv != 0).astype(jnp.float32)
    denom = jnp.maximum(weight.sum(), 1.0) if denom is None else denom
    kl_on, kl_detail = ((k * weight).sum() / denom for k in kl)
    detail_beta = cfg.beta if cfg.detail_beta is None else cfg.detail_beta
    loss = (policy * weight).sum() / denom + cfg.beta * kl_on + detail_beta * kl_detail
    metrics = {
        "policy_loss": (policy * weight).sum() / denom,
        "kl": kl_on + kl_detail,
        "kl_detail": kl_detail,
        "clip_frac": ((jnp.abs(ratio - 1) > cfg.clip_eps) * weight).sum() / denom,
        "approx_kl": (0.5 * (logp - logp_old) ** 2 * weight).sum() / denom,
        "ratio_dev": jnp.max(jnp.abs(ratio - 1)),
        "rollout_logp_dev": rollout_dev,
        # per sampler step (-inf / 0 where no trajectory of the minibatch trained it)
        "rollout_logp_gap_by_step": jax.ops.segment_max(gap, j, num_segments=steps),
        "trained_by_step": jax.ops.segment_sum(jnp.ones_like(gap), j, num_segments=steps),
    }
    return loss, metrics


class GRPOTrainer(PolicyTrainer):
    """Flow-GRPO's trainer: the policy (full weights or LoRA factors), optimizer, reference, EMA.

    ``policy_state()`` is the merged NNX state that samplers use; ``update(batch, key, step)``
    runs ``inner_epochs x minibatches`` optimizer steps as one jitted, donated program per
    minibatch.
    """

    batch_keys = ("latents", "log_probs", "tokens", "mask")

    def __init__(self, graphdef, base_state, cfg: GRPOConfig, sampler: SamplerConfig, mesh=None,
                 attn=None, seed: int = 0):
        step_weights(sampler, cfg.step_weight)   # a bad name fails here, not inside a trace
        super().__init__(graphdef, base_state, cfg, mesh, attn, seed)
        self.sampler = sampler

    @staticmethod
    def update_rows(cfg: GRPOConfig, sampler: SamplerConfig, batch: int) -> UpdateRows:
        """A minibatch's trajectories at each of their trained SDE steps, at the rollout's CFG
        scale; the reference policy's forward of the same rows when a KL term is on."""
        stochastic = int(np.sum(sampler.stochastic_steps()))
        steps = cfg.train_steps if 0 < cfg.train_steps < stochastic else stochastic
        rows = batch // cfg.minibatches * steps
        ref = cfg.beta > 0 or bool(cfg.detail_beta)
        return UpdateRows(grad=rows, forward=rows if ref else 0, guidance=sampler.guidance)

    @staticmethod
    def gradient_passes(cfg: GRPOConfig) -> int:
        """One pass (and optimizer step) per minibatch of every inner epoch."""
        return cfg.inner_epochs * cfg.minibatches

    @staticmethod
    def shard_units(cfg: GRPOConfig, batch: int) -> tuple[int, int]:
        """One optimizer step per minibatch of every inner epoch, its shards dividing the
        minibatch's trajectories."""
        return cfg.inner_epochs * cfg.minibatches, batch // cfg.minibatches

    @staticmethod
    def workload(cfg: GRPOConfig, sampler: SamplerConfig, cfg_passes: int) -> dict:
        """The cost model's charges: SDE rollouts, ``train_steps`` of each trajectory's
        stochastic window trained (0 = all of them), a KL reference forward when a KL term is
        on."""
        start, end = resolve_window(sampler.sde_window, sampler.num_steps)
        ts = cfg.train_steps
        trained = ts if 0 < ts < end - start else end - start
        kl = cfg.beta > 0 or bool(cfg.detail_beta)
        return dict(num_steps=sampler.num_steps, train_steps=trained,
                    inner_epochs=cfg.inner_epochs, kl=kl, rescore=bool(cfg.rescore),
                    cfg_passes=cfg_passes, lora_rank=cfg.lora_rank, notes=(
                        ("sampler_steps", sampler.num_steps, "steps",
                         "run config sampler.num_steps"),
                        ("train_steps", trained, "steps/trajectory",
                         "run config rl.train_steps (0 = every stochastic step)"),
                        ("inner_epochs", cfg.inner_epochs, "", "run config rl.inner_epochs"),
                        ("kl_reference_forward", kl, "",
                         "run config rl.beta > 0 or rl.detail_beta > 0")))

    # -- update ------------------------------------------------------------------------------
    # The jitted programs are built by module-level cached builders keyed by the (hashable) graph
    # and configs, so every trainer of the same model shares compiled executables.
    @property
    def _step(self):
        return _train_step(self.graphdef, _program_config(self.cfg), self.sampler, self.attn)

    @property
    def _score(self):
        return _score_fn(self.graphdef, self.cfg, self.sampler, self.attn)

    @property
    def _select(self):
        return _select_fn(self.sampler, self.cfg.train_steps)

    def update(self, batch: dict, key, step: int, generator=None) -> dict:
        """Runs the optimizer steps of one iteration on ``batch`` (numpy/jax arrays with
        ``latents [B,T+1,...]``, ``log_probs [B,T]``, ``advantages [B]``, ``tokens``, ``mask``).

        Old log-probs: the rollout's own come from a program with other batch shapes, whose
        float rounding differs by ~1e-7 (reported as ``rollout_logp_dev``). So the first
        minibatch, still on the sampling weights, takes its old log-prob from its own forward
        (ratio exactly 1). Later minibatches use the rollout's log-probs, or with
        ``cfg.rescore`` log-probs re-scored with the pre-update weights before any update
        (``rescore_dev`` reports how far those were from the rollout's).
        """
        plan, devs = self._plan(batch, key, step)
        metrics = []
        for i, (sub, idx) in enumerate(plan):
            self.trainable, self.opt_state, self.ema, m = self._step(
                self.trainable, self.opt_state, self.ema, self.base, sub, idx,
                on_device(np.bool_(i == 0)))
            metrics.append(m)
        return self._summary(metrics, devs, step)

    def update_sharded(self, batch: dict, key, step: int, shards: int, run,
                       generator=None) -> dict:
        """:meth:`update` with each optimizer step's minibatch cut into ``shards`` shards of
        trajectories (each with its trained steps): ``run(ShardedStep)`` returns one result per
        shard, computed by whoever the caller chose; they are summed in shard order and the
        step taken. Equal to :meth:`update` to float rounding (:mod:`spotlight_jax.rl.shards`).
        """
        plan, devs = self._plan(batch, key, step)
        progs = _sharded_programs(self.graphdef, _program_config(self.cfg), self.sampler,
                                  self.attn)
        metrics = []
        for i, (sub, idx) in enumerate(plan):
            n, k = idx.shape
            per = shards_lib.check_shards(n, shards, "trajectories")
            # every shard divides by the minibatch's count of rows with a non-zero advantage
            denom = np.float32(max(k * int(np.count_nonzero(np.asarray(sub["advantages"]))), 1))
            on_policy = np.bool_(i == 0)
            trainable, version = self.trainable, int(step) * len(plan) + i

            def compute(j, sub=sub, idx=idx, trainable=trainable, on_policy=on_policy,
                        denom=denom, per=per) -> shards_lib.ShardResult:
                part = _shard_rows(sub, j * per, (j + 1) * per)
                grads, m = progs.shard(trainable, self.base, part, idx[j * per:(j + 1) * per],
                                       on_policy, denom)
                return shards_lib.ShardResult(j, grads, m)

            def inputs(j, sub=sub, idx=idx, trainable=trainable, on_policy=on_policy,
                       denom=denom, per=per) -> tuple:
                return (trainable,), (_shard_rows(sub, j * per, (j + 1) * per),
                                      idx[j * per:(j + 1) * per], on_policy, denom)

            def apply(results) -> dict:
                grads, m = shards_lib.sum_results(results, shards)
                self.trainable, self.opt_state, self.ema, gnorm = progs.apply(
                    self.trainable, self.opt_state, self.ema, grads)
                m["grad_norm"] = gnorm
                metrics.append(m)
                return m

            run(shards_lib.ShardedStep(shards=shards, rows=per * k, version=version,
                                       compute=compute, apply=apply, inputs=inputs))
            if len(metrics) != i + 1:
                raise RuntimeError(f"sharded GRPO step {i} was never applied by its runner")
        return self._summary(metrics, devs, step)

    @staticmethod
    def shard_program(graphdef, cfg: GRPOConfig, sampler: SamplerConfig):
        """``program(base, weights, rows)``: a shard's gradient and metric sums from a
        :class:`~spotlight_jax.rl.shards.ShardedStep`'s ``inputs(i)``, in another process (a
        spot host) holding the same base; single-device attention."""
        progs = _sharded_programs(graphdef, _program_config(cfg), sampler)

        def program(base, weights, rows):
            (trainable,), (part, idx, on_policy, denom) = weights, rows
            return progs.shard(trainable, base, part, idx, on_policy, denom)

        return program

    def _summary(self, metrics: list, devs: list, step: int) -> dict:
        """The update's metrics from its optimizer steps' (means over steps; the log-prob gap
        and first ratio from the first step, on the sampling weights)."""
        by_step = {k: np.asarray(jax.device_get(metrics[0][k]))
                   for k in ("rollout_logp_gap_by_step", "trained_by_step")}
        out = {k: float(np.mean([jax.device_get(m[k]) for m in metrics])) for k in metrics[0]
               if k not in by_step}
        # the rollout-vs-trainer log-prob gap of each sampler step the first minibatch trained
        # (on the sampling weights: numerics only), keyed by the step's index
        out["rollout_logp_gap_by_step"] = {
            str(t): float(by_step["rollout_logp_gap_by_step"][t])
            for t in np.flatnonzero(by_step["trained_by_step"])}
        out["first_ratio_dev"] = float(jax.device_get(metrics[0]["ratio_dev"]))
        # on the sampling weights only (first minibatch): pure numerics, no policy change
        out["rollout_logp_dev"] = float(jax.device_get(metrics[0]["rollout_logp_dev"]))
        if devs:
            out["rescore_dev"] = float(np.max(jax.device_get(devs)))
        self.check_finite(out, step, "GRPO", "lower rl.lr or raise rl.beta")
        return out

    def lower_update(self, batch: dict, generator=None):
        """The update's program (one per minibatch, all of one shape) lowered for ``batch``'s
        shapes (``jax.stages.Lowered``: ``.compile().memory_analysis()`` is what it takes)."""
        sub, idx = self._plan(batch, jax.random.key(0), 0, rescore=False)[0][0]
        return self._step.lower(self.trainable, self.opt_state, self.ema, self.base, sub, idx,
                                np.bool_(True))

    def _plan(self, batch: dict, key, step: int, rescore: bool | None = None):
        """``([(minibatch, trained step indices)] in update order, re-score deviations)``."""
        n = batch["latents"].shape[0]
        mb = self.cfg.minibatches
        if n % mb:
            raise ValueError(f"batch of {n} trajectories does not split into {mb} minibatches")
        size = n // mb
        key = fold_in(key, step)
        plan = []
        for epoch in range(self.cfg.inner_epochs):
            perm = np.asarray(jax.random.permutation(fold_in(key, 2 * epoch), n))
            for i in range(mb):
                sel = perm[i * size:(i + 1) * size]
                sub = self._place(batches.take(jax.tree.map(np.asarray, batch), sel))
                idx = self._select(fold_in(key, 2 * (epoch * mb + i) + 1), size)
                plan.append((sub, idx))
        devs = []
        for sub, idx in plan[1:] if (self.cfg.rescore if rescore is None else rescore) else ():
            logp, dev = self._score(self.trainable, self.base, sub, idx)
            sub["logp_old"] = logp
            devs.append(dev)
        # Every minibatch carries ``logp_old`` (the rollout's log-probs of its trained steps unless
        # re-scored above; the first minibatch's is replaced by its own forward's), so all of them
        # have one batch structure and share one compiled program.
        for sub, idx in plan:
            if "logp_old" not in sub:
                sub["logp_old"] = jnp.take_along_axis(sub["log_probs"], idx, axis=1).reshape(-1)
        return plan, devs


def _program_config(cfg: GRPOConfig) -> GRPOConfig:
    """``cfg`` with the fields the train-step program does not read reset, so trainers that
    differ only in batching, advantage or re-scoring options share one compiled program."""
    return dataclasses.replace(cfg, group_size=0, adv_clip=0.0, global_std=False, train_steps=0,
                               minibatches=1, inner_epochs=1, rescore=False, advantage="reward")


def _shard_rows(sub: dict, start: int, stop: int) -> dict:
    """Trajectories ``start:stop`` of a minibatch (its flattened ``logp_old`` [n * k] too)."""
    n = sub["latents"].shape[0]
    out = {key: v for key, v in sub.items() if key != "logp_old"}
    out = shards_lib.slice_rows(out, start, stop)
    out["logp_old"] = sub["logp_old"].reshape(n, -1)[start:stop].reshape(-1)
    return out


@dataclasses.dataclass(frozen=True)
class _ShardedPrograms:
    """One shard's gradient and metric sums; the optimizer step from summed gradients."""

    shard: object
    apply: object


@functools.lru_cache(maxsize=32)
def _sharded_programs(graphdef, cfg: GRPOConfig, sampler: SamplerConfig,
                      attn=AttentionSpec()) -> _ShardedPrograms:
    tx = make_optimizer(cfg)

    def shard(trainable, base, batch, idx, on_policy, denom):
        ref = nnx.merge(graphdef, base) if cfg.beta > 0 or cfg.detail_beta else None

        def loss_fn(t):
            return grpo_loss(policy_model(graphdef, cfg, t, base), batch, idx, sampler, cfg, ref,
                             on_policy, attn, denom=denom)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
        return grads, {**metrics, "loss": loss}

    def apply(trainable, opt_state, ema, grads):
        updates, opt_state = tx.update(grads, opt_state, trainable)
        trainable = optax.apply_updates(trainable, updates)
        if ema is not None:
            ema = jax.tree.map(lambda e, p: cfg.ema * e + (1 - cfg.ema) * p, ema, trainable)
        return trainable, opt_state, ema, optax.tree.norm(grads)

    return _ShardedPrograms(shard=jax.jit(shard), apply=jax.jit(apply, donate_argnums=(0, 1, 2)))


@functools.lru_cache(maxsize=32)
def _train_step(graphdef, cfg: GRPOConfig, sampler: SamplerConfig, attn=AttentionSpec()):
    tx = make_optimizer(cfg)

    def step(trainable, opt_state, ema, base, batch, idx, on_policy):
        ref = nnx.merge(graphdef, base) if cfg.beta > 0 or cfg.detail_beta else None

        def loss_fn(t):
            return grpo_loss(policy_model(graphdef, cfg, t, base), batch, idx, sampler, cfg, ref,
                             on_policy, attn)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
        gnorm = optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        trainable = optax.apply_updates(trainable, updates)
        if ema is not None:
            ema = jax.tree.map(lambda e, p: cfg.ema * e + (1 - cfg.ema) * p, ema, trainable)
        return trainable, opt_state, ema, {**metrics, "loss": loss, "grad_norm": gnorm}

    return jax.jit(step, donate_argnums=(0, 1, 2))


@functools.lru_cache(maxsize=32)
def _score_fn(graphdef, cfg: GRPOConfig, sampler: SamplerConfig, attn=AttentionSpec()):
    """Log-probs of the recorded transitions under the given (pre-update) policy."""
    def score(trainable, base, batch, idx):
        logp, logp_old, _, _, _ = step_terms(policy_model(graphdef, cfg, trainable, base),
                                             batch["latents"], batch["log_probs"], idx,
                                             batch["tokens"], batch["mask"], sampler, None,
                                             attn)
        return logp, jnp.max(jnp.abs(logp - logp_old))
    return jax.jit(score)


@functools.lru_cache(maxsize=32)
def _select_fn(sampler: SamplerConfig, k: int):
    stochastic = sampler.stochastic_steps()
    return jax.jit(lambda key, n: select_steps(key, stochastic, n, k), static_argnums=1)
