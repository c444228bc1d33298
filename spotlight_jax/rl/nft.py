"""The forward-process objective (DiffusionNFT family): reward-weighted flow matching on finished
rollout images at fresh forward-process noise.

Per iteration the *sampling policy* θ_old (a lagging copy of the trained θ) draws G images per
prompt with the deterministic ODE sampler; only each image's x0 is kept. Rewards become
advantages A (group mean removed, batch or group std, clipped to ±A_max) and optimality
probabilities ``p = 0.5 + 0.5 clip(A / A_max, -1, 1)``. Each image is trained at K flow times t
of the sampler's grid (stratified, t = 1 and t = 0 excluded), with ``x_t = (1 - t) x0 + t eps``.
By default every member of a prompt's group shares the same (t, eps) per slot (DGPO's shared
noise: advantages sum to ~0 in a group, so the regression noise common to the group cancels).

With ``v = v_θ(x_t)``, ``v_old = sg(v_θold(x_t))`` the implicit positive and negative policies are
``v+ = β v + (1 - β) v_old`` and ``v- = (1 + β) v_old - β v``; the loss (:func:`nft_loss`) pulls
v+ toward the image for likely-good samples and v- for likely-bad ones, each squared error
normalised by its own stop-gradient mean absolute error. At θ = θ_old its gradient is
``-(2/N)(t^2 / w) a (u - v_old)`` with ``a = 2p - 1``, ``u = eps - x0``: advantage-weighted flow
matching, β acting as a trust region. No per-step log-probs are needed, so the sampler can be
any ODE solver.

After each optimizer step ``θ_old <- η_k θ_old + (1 - η_k) θ`` with
``η_k = min(eta_rate * (k - eta_delay), eta_max)`` (0 before ``eta_delay``): a sampling policy
that follows θ closely at first and lags it more as training goes on (fully on-policy sampling,
η = 0 throughout, was measured to collapse).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from spotlight_jax.diffusion import SamplerConfig, batches, encode_prompt, velocity
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

ANCHORS = ("current", "sampler")
"""``NFTConfig.anchor``: the v_old of a batch drawn by an older sampling policy than the current
θ_old (``spotlight_pipelined``'s ready batch): the current θ_old's, or that of the policy that
drew it. The loss's fixed point for a neutral sample is v_old, so the anchor is where the trust
region is centred: on the policy of the moment, or one update behind it."""


@dataclasses.dataclass(frozen=True)
class NFTConfig:
    group_size: int = 8
    lr: float = 5e-4
    grad_clip: float = 1.0
    weight_decay: float = 1e-4
    lora_rank: int = 16
    lora_alpha: float = 32.0
    ema: float = 0.0
    adv_clip: float = 5.0          # A_max
    global_std: bool = True        # advantages' std over the whole batch (False: per group)
    advantage: str = "reward"      # or 'decoupled' (rl.grpo.decoupled_advantages)
    beta: float = 1.0              # trust region of the implicit policies
    kl_beta: float = 0.0           # weight of mean((v - v_ref)^2) to the frozen base
    times: int = 4                 # K flow times per image
    shared_noise: bool = True      # one (t, eps) per group and slot (False: per image)
    eta_rate: float = 0.01
    eta_max: float = 0.5
    eta_delay: int = 0             # iterations with η = 0 (θ_old = θ) before the ramp
    minibatches: int = 1           # gradient accumulation over this many sample chunks
    anchor: str = "current"        # v_old of a batch an older policy drew: today's, or 'sampler'

    def validate(self) -> NFTConfig:
        """Returns self, or raises a one-line ValueError naming the bad field (``name=value:``)."""
        check_policy_fields(self)
        if not self.beta > 0:
            raise ValueError(f"beta={self.beta!r}: must be > 0 (1.0 in the anchor; 0.1 for "
                             "text rewards)")
        if self.anchor not in ANCHORS:
            raise ValueError(f"anchor={self.anchor!r}: use {' or '.join(map(repr, ANCHORS))}")
        if self.times < 1:
            raise ValueError(f"times={self.times!r}: must be >= 1 flow time per image")
        if not 0.0 <= self.eta_max < 1.0:
            raise ValueError(f"eta_max={self.eta_max!r}: must be in [0, 1)")
        if self.eta_rate < 0:
            raise ValueError(f"eta_rate={self.eta_rate!r}: must be >= 0")
        if self.eta_delay < 0:
            raise ValueError(f"eta_delay={self.eta_delay!r}: must be >= 0 iterations")
        if self.kl_beta < 0:
            raise ValueError(f"kl_beta={self.kl_beta!r}: must be >= 0")
        return self


def optimality(advantages, adv_clip: float) -> np.ndarray:
    """``p = 0.5 + 0.5 clip(A / A_max, -1, 1)``: how likely each sample is the better one."""
    a = np.asarray(advantages, np.float32)
    return (0.5 + 0.5 * np.clip(a / adv_clip, -1.0, 1.0)).astype(np.float32)


def eta(cfg: NFTConfig, k: int) -> float:
    """The sampling policy's lag after update ``k`` (0-based): ``min(rate (k - delay), max)``."""
    return float(min(max(cfg.eta_rate * (k - cfg.eta_delay), 0.0), cfg.eta_max))


def _per_sample_mean(a):
    return a.reshape(a.shape[0], -1).mean(-1)


def nft_loss(v, v_old, v_ref, x_t, x0, t, p, *, beta: float, kl_beta: float):
    """Per-sample forward-process loss ``[B]`` (float32), exactly

    ``(1/β)[p mean((x0+ - x0)^2) / w+ + (1 - p) mean((x0- - x0)^2) / w-]
    + kl_beta mean((v - v_ref)^2)``

    with ``x0± = x_t - t v±`` of the implicit policies ``v+ = β v + (1 - β) v_old``,
    ``v- = (1 + β) v_old - β v`` and ``w± = sg(max(mean|x0± - x0|, 1e-5))``. Arrays are
    ``[B, H, W, C]`` except ``t`` and ``p`` ``[B]``; ``v_old`` and ``v_ref`` are treated as
    constants (``v_ref`` may be None when ``kl_beta == 0``).
    """
    f32 = jnp.float32
    v, x_t, x0 = v.astype(f32), x_t.astype(f32), x0.astype(f32)
    v_old = jax.lax.stop_gradient(v_old.astype(f32))
    tb = jnp.asarray(t, f32).reshape((-1,) + (1,) * (v.ndim - 1))
    p = jnp.asarray(p, f32)
    v_pos = beta * v + (1.0 - beta) * v_old
    v_neg = (1.0 + beta) * v_old - beta * v
    err_pos = x_t - tb * v_pos - x0
    err_neg = x_t - tb * v_neg - x0
    w_pos = jax.lax.stop_gradient(jnp.maximum(_per_sample_mean(jnp.abs(err_pos)), 1e-5))
    w_neg = jax.lax.stop_gradient(jnp.maximum(_per_sample_mean(jnp.abs(err_neg)), 1e-5))
    loss = (p * _per_sample_mean(err_pos ** 2) / w_pos
            + (1.0 - p) * _per_sample_mean(err_neg ** 2) / w_neg) / beta
    if kl_beta:
        v_ref = jax.lax.stop_gradient(v_ref.astype(f32))
        loss = loss + kl_beta * _per_sample_mean((v - v_ref) ** 2)
    return loss.astype(f32)


def time_grid(sampler: SamplerConfig) -> np.ndarray:
    """The flow times an image may be trained at: the sampler's grid without t = 1 and t = 0."""
    s = np.asarray(sampler.sigmas, np.float32)
    return s[(s < 1.0) & (s > 0.0)]


def forward_noise(key, group_ids, x0, grid, times: int, shared: bool):
    """``(t [B, K], eps [B, K, ...])``: K stratified grid times and fresh noise per image.

    The grid is split into K contiguous strata and each slot draws one time from its stratum.
    ``shared``: every image of a group (same ``group_ids`` entry) gets the same (t, eps) per slot;
    else each image its own. Both are pure functions of ``(key, group id or image index)``.
    """
    grid = jnp.asarray(grid, jnp.float32)
    n, k = grid.shape[0], times
    if not 1 <= k <= n:
        raise ValueError(f"rl.nft.times={k} flow times per image do not fit the sampler's {n} "
                         "grid times in (0, 1); lower rl.nft.times or raise sampler.num_steps")
    edges = np.linspace(0, n, k + 1).round().astype(np.int32)
    lo, width = jnp.asarray(edges[:-1]), jnp.asarray(np.diff(edges))
    ids = (jnp.asarray(group_ids, jnp.int32) if shared
           else jnp.arange(x0.shape[0], dtype=jnp.int32) + (1 << 20))

    def draw(i):
        kk = jax.random.fold_in(key, i)
        u = jax.random.uniform(jax.random.fold_in(kk, 0), (k,))
        idx = lo + jnp.minimum((u * width).astype(jnp.int32), width - 1)
        eps = jax.random.normal(jax.random.fold_in(kk, 1), (k,) + x0.shape[1:])
        return grid[idx], eps

    return jax.vmap(draw)(ids)


class NFTTrainer(PolicyTrainer):
    """θ (LoRA or full), its optimizer and EMA, and the lagging sampling policy θ_old.

    ``sampling_state()`` is θ_old merged: what rollouts and exploration sample with.
    ``update(batch, key, step)`` is one optimizer step over the whole batch (one jitted, donated
    program; gradients accumulated over ``cfg.minibatches`` chunks), then the θ_old update.
    """

    batch_keys = ("latents", "tokens", "mask", "prompt_ids")
    state_parts = ("trainable", "opt_state", "ema", "old")

    def __init__(self, graphdef, base_state, cfg: NFTConfig, sampler: SamplerConfig, mesh=None,
                 attn=None, seed: int = 0):
        super().__init__(graphdef, base_state, cfg.validate(), mesh, attn, seed)
        self.sampler = sampler
        self.grid = time_grid(sampler)
        if not 1 <= cfg.times <= len(self.grid):
            raise ValueError(f"rl.nft.times={cfg.times} flow times per image do not fit the "
                             f"{len(self.grid)} grid times in (0, 1) of sampler.num_steps="
                             f"{sampler.num_steps}; lower rl.nft.times or raise the steps")
        self.old = jax.tree.map(jnp.copy, self.trainable)

    @staticmethod
    def update_rows(cfg: NFTConfig, sampler: SamplerConfig, batch: int) -> UpdateRows:
        """Each of the ``cfg.minibatches`` chunks trains its images at ``cfg.times`` flow times
        (no CFG); v_old (and v_ref with ``kl_beta``) are forwards of the same rows."""
        rows = batch // cfg.minibatches * cfg.times
        return UpdateRows(grad=rows, forward=rows * (2 if cfg.kl_beta else 1))

    @staticmethod
    def gradient_passes(cfg: NFTConfig) -> int:
        """One pass per minibatch chunk (their gradients accumulate into one step)."""
        return cfg.minibatches

    @staticmethod
    def shard_units(cfg: NFTConfig, batch: int) -> tuple[int, int]:
        """One optimizer step per update (the minibatches accumulate gradients), its shards
        dividing the batch's images."""
        return 1, batch

    @staticmethod
    def workload(cfg: NFTConfig, sampler: SamplerConfig, cfg_passes: int) -> dict:
        """The cost model's charges: ODE rollouts, ``cfg.times`` flow times per image each with
        the old policy's forward (and the reference's with ``kl_beta``), one optimizer step."""
        extra = int(cfg.kl_beta > 0)
        return dict(num_steps=sampler.num_steps, train_steps=cfg.times, inner_epochs=1,
                    kl=True, rescore=False, cfg_passes=cfg_passes, lora_rank=cfg.lora_rank,
                    extra_forwards=extra, notes=(
                        ("sampler_steps", sampler.num_steps, "steps",
                         "run config sampler.num_steps (ODE rollouts)"),
                        ("train_steps", cfg.times, "flow times/image",
                         "run config rl.nft.times (K)"),
                        ("inner_epochs", 1, "", "one step per iteration"),
                        ("kl_reference_forward", True, "",
                         "the old policy's velocity v_old (always)"),
                        ("extra_forwards", extra, "",
                         "the reference velocity (run config rl.nft.kl_beta > 0)")))

    @staticmethod
    def shard_program(graphdef, cfg: NFTConfig, sampler: SamplerConfig):
        """``program(base, weights, rows)``: a shard's gradient and metric sums from a
        :class:`~spotlight_jax.rl.shards.ShardedStep`'s ``inputs(i)``, in another process (a
        spot host) holding the same base; single-device attention."""
        progs = _nft_programs(graphdef, cfg, tuple(float(t) for t in time_grid(sampler)))

        def program(base, weights, rows):
            (trainable, sampled_by), (part, norm) = weights, rows
            return progs.shard(trainable, sampled_by, base, part, int(norm))

        return program

    def sampling_state(self):
        return self.merged(self.old)

    def sampling_trainable(self):
        return self.old

    def generator(self):
        """A copy of θ_old where the loss of a batch sampled now but trained on later uses the
        policy that sampled it as its v_old (``anchor='sampler'``); None with the current anchor,
        which needs nothing of it (no copy to keep or checkpoint)."""
        if self.cfg.anchor == "current":
            return None
        return jax.tree.map(jnp.copy, self.old)

    @property
    def _programs(self) -> _NFTPrograms:
        return _nft_programs(self.graphdef, self.cfg, tuple(float(t) for t in self.grid),
                             self.attn)

    @property
    def _step(self):
        return self._programs.step

    def update(self, batch: dict, key, step: int, generator=None) -> dict:
        """``batch``: ``latents [B, T+1, ...]`` (only the last, x0, is read), ``tokens``,
        ``mask``, ``prompt_ids [B]`` (the groups) and ``advantages [B]``. ``generator``: the
        sampling policy that drew the batch (:meth:`generator` when it sampled) when that is not
        the current θ_old; the loss's v_old is then its velocity, and θ_old still moves from its
        current value."""
        self.trainable, self.opt_state, self.ema, self.old, m = self._step(
            *self._step_args(batch, key, step, generator))
        out = {k: float(v) for k, v in jax.device_get(m).items()}
        self.check_finite(out, step, "nft", "lower rl.lr or raise rl.nft.eta_max / "
                          "rl.nft.kl_beta")
        return out

    def update_sharded(self, batch: dict, key, step: int, shards: int, run,
                       generator=None) -> dict:
        """:meth:`update` with the step's images cut into ``shards`` shards (each trained at
        its K flow times): ``run(ShardedStep)`` returns one result per shard, computed by whoever
        the caller chose; they are summed in shard order and the optimizer step taken. Equal to
        :meth:`update` to float rounding (:mod:`spotlight_jax.rl.shards`)."""
        (trainable, opt_state, ema, old, base, args, key, eta_k,
         generator) = self._step_args(batch, key, step, generator)
        progs = self._programs
        rows = progs.noise(args, key)
        n = rows["x0"].shape[0]
        per = shards_lib.check_shards(n, shards, "images")
        norm = n * self.cfg.times
        sampled_by = old if generator is None else generator

        def compute(i: int) -> shards_lib.ShardResult:
            part = shards_lib.slice_rows(rows, i * per, (i + 1) * per)
            grads, metrics = progs.shard(trainable, sampled_by, base, part, norm)
            return shards_lib.ShardResult(i, grads, metrics)

        def inputs(i: int) -> tuple:
            return (trainable, sampled_by), (shards_lib.slice_rows(rows, i * per, (i + 1) * per),
                                             norm)

        out = {}

        def apply(results) -> dict:
            grads, metrics = shards_lib.sum_results(results, shards)
            self.trainable, self.opt_state, self.ema, self.old, gnorm = progs.apply(
                trainable, opt_state, ema, old, grads, eta_k)
            out.update({k: float(v) for k, v in metrics.items()}, grad_norm=float(gnorm),
                       eta=float(eta_k))
            return out

        run(shards_lib.ShardedStep(shards=shards, rows=per * self.cfg.times,
                                   version=int(step), compute=compute, apply=apply,
                                   inputs=inputs))
        if not out:
            raise RuntimeError("the sharded nft step was never applied by its runner")
        self.check_finite(out, step, "nft", "lower rl.lr or raise rl.nft.eta_max / "
                          "rl.nft.kl_beta")
        return out

    def lower_update(self, batch: dict, generator=None):
        """The update's one program lowered for ``batch``'s shapes (``jax.stages.Lowered``:
        ``.compile().memory_analysis()`` is what it takes on the device)."""
        return self._step.lower(*self._step_args(batch, jax.random.key(0), 0, generator))

    def _step_args(self, batch: dict, key, step: int, generator):
        x0 = np.asarray(batch["latents"])[:, -1]
        n, mb = x0.shape[0], self.cfg.minibatches
        if n % mb:
            raise ValueError(f"batch of {n} images does not split into rl.nft.minibatches={mb}")
        p = optimality(batch["advantages"], self.cfg.adv_clip)
        if self.cfg.anchor == "current":
            generator = None            # v_old is the current θ_old's, whoever drew the batch
        args = {"x0": x0, "tokens": jax.tree.map(np.asarray, batch["tokens"]),
                "mask": np.asarray(batch["mask"]), "p": p,
                "group": np.asarray(batch["prompt_ids"], np.int32)}
        args = {k: self._place(v) for k, v in args.items()}
        return (self.trainable, self.opt_state, self.ema, self.old, self.base, args,
                fold_in(key, step), on_device(np.float32(eta(self.cfg, step))), generator)


@functools.lru_cache(maxsize=16)
def _nft_programs(graphdef, cfg: NFTConfig, grid: tuple[float, ...], attn=AttentionSpec()):
    tx = make_optimizer(cfg)
    lora = bool(cfg.lora_rank)

    def rows_loss(trainable, old, base, chunk, norm):
        """The chunk's summed per-row losses and metrics, divided by ``norm`` (its own rows, or
        a whole step's when the chunk is a shard of it)."""
        x0, tok, msk, p, t, eps = (chunk[k] for k in ("x0", "tokens", "mask", "p", "t", "eps"))
        b, kk = t.shape
        t = t.reshape(-1)
        x0r = jnp.repeat(x0, kk, axis=0)
        tb = t.reshape((-1,) + (1,) * (x0r.ndim - 1))
        x_t = (1.0 - tb) * x0r + tb * eps.reshape(x0r.shape)
        model = policy_model(graphdef, cfg, trainable, base)
        old_model = policy_model(graphdef, cfg, old, base)

        def rep(ctx):   # one prompt encoding per image, repeated for its K rows
            return jax.tree.map(lambda a: jnp.repeat(a, kk, axis=0), ctx)

        ctx = encode_prompt(model, tok, msk)
        # LoRA adapts only the blocks' attention: every policy shares the prompt encoding
        ctx_old = (jax.lax.stop_gradient(ctx) if lora
                   else jax.lax.stop_gradient(encode_prompt(old_model, tok, msk)))
        tok_r, msk_r = batches.repeat(tok, kk), jnp.repeat(msk, kk, axis=0)
        v = velocity(model, x_t, t, tok_r, msk_r, attn=attn, context=rep(ctx))
        v_old = velocity(old_model, x_t, t, tok_r, msk_r, attn=attn, context=rep(ctx_old))
        v_ref = None
        if cfg.kl_beta:
            ref = nnx.merge(graphdef, base)
            ctx_ref = (ctx_old if lora else
                       jax.lax.stop_gradient(encode_prompt(ref, tok, msk)))
            v_ref = velocity(ref, x_t, t, tok_r, msk_r, attn=attn, context=rep(ctx_ref))
        per = nft_loss(v, v_old, v_ref, x_t, x0r, t, jnp.repeat(p, kk), beta=cfg.beta,
                       kl_beta=cfg.kl_beta)
        v_sg = jax.lax.stop_gradient(v)
        shift = _per_sample_mean((v_sg - jax.lax.stop_gradient(v_old)) ** 2)
        metrics = {"policy_shift": shift.sum() / norm,
                   "kl": (_per_sample_mean((v_sg - v_ref) ** 2).sum() / norm
                          if v_ref is not None else jnp.zeros((), jnp.float32))}
        return per.sum() / norm, metrics

    def step(trainable, opt_state, ema, old, base, batch, key, eta_k, generator):
        m = cfg.minibatches
        sampled_by = old if generator is None else generator
        # (t, eps) for the whole batch first: the chunking never changes the draws
        batch = with_noise(batch, key)
        chunks = jax.tree.map(lambda a: a.reshape((m, a.shape[0] // m) + a.shape[1:]), batch)
        grad_fn = jax.value_and_grad(rows_loss, has_aux=True)
        norm = batch["x0"].shape[0] // m * cfg.times

        def body(acc, i):
            chunk = jax.tree.map(lambda a: a[i], chunks)
            (loss, met), g = grad_fn(trainable, sampled_by, base, chunk, norm)
            return jax.tree.map(jnp.add, acc, (loss, met, g)), None

        zero = (jnp.zeros(()), {"policy_shift": jnp.zeros(()), "kl": jnp.zeros(())},
                jax.tree.map(jnp.zeros_like, trainable))
        (loss, met, grads), _ = jax.lax.scan(body, zero, jnp.arange(m))
        loss, met, grads = jax.tree.map(lambda a: a / m, (loss, met, grads))
        return (*apply(trainable, opt_state, ema, old, grads, eta_k),
                {**met, "loss": loss, "grad_norm": optax.tree.norm(grads), "eta": eta_k})

    def with_noise(batch, key):
        t, eps = forward_noise(key, batch["group"], batch["x0"], np.asarray(grid), cfg.times,
                               cfg.shared_noise)
        return {**batch, "t": t, "eps": eps}

    def apply(trainable, opt_state, ema, old, grads, eta_k):
        updates, opt_state = tx.update(grads, opt_state, trainable)
        trainable = optax.apply_updates(trainable, updates)
        old = jax.tree.map(lambda o, p: eta_k * o + (1.0 - eta_k) * p, old, trainable)
        if ema is not None:
            ema = jax.tree.map(lambda e, p: cfg.ema * e + (1 - cfg.ema) * p, ema, trainable)
        return trainable, opt_state, ema, old

    def shard(trainable, sampled_by, base, rows, norm):
        (loss, met), g = jax.value_and_grad(rows_loss, has_aux=True)(
            trainable, sampled_by, base, rows, norm)
        return g, {**met, "loss": loss}

    def apply_summed(trainable, opt_state, ema, old, grads, eta_k):
        return (*apply(trainable, opt_state, ema, old, grads, eta_k), optax.tree.norm(grads))

    return _NFTPrograms(step=jax.jit(step, donate_argnums=(0, 1, 2, 3)),
                        noise=jax.jit(with_noise),
                        shard=jax.jit(shard, static_argnums=4),
                        apply=jax.jit(apply_summed, donate_argnums=(0, 1, 2, 3)))


@dataclasses.dataclass(frozen=True)
class _NFTPrograms:
    """The update as one program (``step``), and in the sharded form's pieces: the batch's
    forward noise, one shard's gradient, the optimizer step from summed gradients."""

    step: object
    noise: object
    shard: object
    apply: object
