"""Jitted, resumable rollouts: per-step latents and log-probs from (prompt, seed).

A *seed* fixes a rollout's whole noise sequence: the initial noise is
``normal(fold_in(key(seed), 0))`` and the noise of SDE step ``i`` is
``normal(fold_in(key(seed), i + 1))``. Nothing else is random, so a rollout that stops after step
``i`` (committing its latent) and later continues from ``(i, latent)`` — on another device group —
is bit-identical to one that never stopped.

With ``SamplerConfig.shared_init_bits = b > 0`` the initial noise comes from ``seed >> b``
instead (a separate stream), so seeds that differ only in their low ``b`` bits share ``x_T`` and
differ only in their SDE step noise (DanceGRPO's shared initial noise within a group; the
runner then gives each prompt slot's seeds one high part, see
``diffusion.engine.candidate_seeds``).

``denoise`` is the single primitive: a ``lax.scan`` over ``n`` steps from a *dynamic* start index,
so one compiled program serves a full rollout (start 0, n = T) and every resumed segment of the
same length. No Python runs per step.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spotlight_jax.diffusion import prompt
from spotlight_jax.diffusion.schedule import shifted_sigmas
from spotlight_jax.diffusion.sde import block_project, cps_step, ode_step, sde_step
from spotlight_jax.models import AttentionSpec
from spotlight_jax.parallel.mesh import on_device, place_batch


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """How trajectories are sampled.

    ``sde_window``: ``(start, end)`` step indices that are stochastic (and trained); the other
    steps are deterministic ODE steps with log-prob 0. ``None`` = every step is SDE. A negative
    index counts from ``num_steps`` as in a Python slice: ``(0, -2)`` = all but the last two.
    ``noise_level=0`` or ``sde_type='ode'`` gives the evaluation (ODE) sampler.
    ``shared_init_bits``: ``b > 0`` draws ``x_T`` from ``seed >> b`` (seeds equal above their low
    ``b`` bits share it); 0 = from the seed itself.
    """

    num_steps: int = 10
    shift: float = 1.0
    noise_level: float = 0.7
    sde_type: str = "sde"           # 'sde' | 'cps' | 'ode'
    guidance: float = 1.0           # classifier-free guidance scale (1 = off: one forward)
    sde_window: tuple[int, int] | None = None
    shared_init_bits: int = 0
    noise_patch: int = 1            # > 1: block noise on p x p pixel blocks (sde_step)
    # Per-step block sizes ([num_steps]; overrides noise_patch), e.g. coarse blocks on the early
    # steps, where the layout forms, and finer ones later, where strokes do.
    noise_patches: tuple[int, ...] | None = None

    def validate(self) -> SamplerConfig:
        """Returns self, or raises a one-line ValueError naming the bad field (``name=value``)."""
        if self.num_steps < 1:
            raise ValueError(f"num_steps={self.num_steps}: must be >= 1 (e.g. num_steps=10)")
        if not (math.isfinite(self.shift) and self.shift > 0):
            raise ValueError(f"shift={self.shift}: must be > 0 (1 = the plain schedule)")
        if not (math.isfinite(self.noise_level) and self.noise_level >= 0):
            raise ValueError(f"noise_level={self.noise_level}: must be >= 0 (0 = ODE sampling)")
        if not (math.isfinite(self.guidance) and self.guidance >= 0):
            raise ValueError(f"guidance={self.guidance}: must be >= 0 (1 = no classifier-free "
                             "guidance)")
        if not 0 <= self.shared_init_bits <= 16:
            raise ValueError(f"shared_init_bits={self.shared_init_bits} must be in 0..16")
        if self.sde_type not in ("sde", "cps", "ode"):
            raise ValueError(f"sde_type={self.sde_type!r}: unknown; choose 'sde', 'cps' or "
                             "'ode'")
        if self.noise_patch < 1:
            raise ValueError(f"noise_patch={self.noise_patch} must be >= 1 (1 = per-pixel noise)")
        if self.noise_patches is not None and (len(self.noise_patches) != self.num_steps
                                               or min(self.noise_patches) < 1):
            raise ValueError(f"noise_patches={tuple(self.noise_patches)} must give a block size "
                             f">= 1 for each of the num_steps={self.num_steps} steps")
        if self.patch_sizes().max() > 1 and self.sde_type == "cps":
            raise ValueError(f"noise_patch={self.noise_patch}: block noise has no "
                             f"coefficients-preserving form (sde_type={self.sde_type!r}); set "
                             "sampler.noise_patch=1 with it")
        if self.sde_window is not None:
            a, b = self.window
            if not 0 <= a < b <= self.num_steps:
                raise ValueError(f"sde_window={tuple(self.sde_window)} (steps {a}..{b - 1}): "
                                 "must satisfy 0 <= start < end <= "
                                 f"num_steps={self.num_steps} (None = every step)")
        return self

    def patch_sizes(self) -> np.ndarray:
        """int ``[num_steps]``: each step's noise block size (1 = per-pixel noise)."""
        if self.noise_patches is not None:
            return np.asarray(self.noise_patches, np.int32)
        return np.full(self.num_steps, self.noise_patch, np.int32)

    @property
    def window(self) -> tuple[int, int]:
        """The stochastic steps ``[start, end)`` with negative indices resolved."""
        return resolve_window(self.sde_window, self.num_steps)

    @property
    def sigmas(self) -> np.ndarray:
        return shifted_sigmas(self.num_steps, self.shift)

    def stochastic_steps(self) -> np.ndarray:
        """Boolean ``[num_steps]``: which steps sample with noise (and carry a log-prob)."""
        mask = np.zeros(self.num_steps, bool)
        if self.sde_type != "ode" and self.noise_level > 0:
            a, b = self.window
            mask[a:b] = True
            if self.sde_type == "cps":
                # CPS's noise is sigma_next * sin(a pi / 2): the step into sigma = 0 has none, so
                # it is deterministic and carries no log-prob gradient (nothing to train).
                mask &= self.sigmas[1:] > 0
        return mask


def resolve_window(window, num_steps: int) -> tuple[int, int]:
    """``sde_window`` (``None``, or ``(start, end)`` with slice-style negative indices) as
    ``(start, end)`` step indices of a ``num_steps`` schedule."""
    if window is None:
        return 0, num_steps
    a, b = (int(i) + num_steps if int(i) < 0 else int(i) for i in window)
    return a, b


def seed_key(seed):
    return jax.random.fold_in(jax.random.key(0), seed.astype(jnp.uint32))


def initial_noise(seeds, shape, shared_bits: int = 0):
    """``[B, *shape]`` initial latents, a pure function of each seed (of ``seed >> shared_bits``
    when ``shared_bits > 0``, from a stream no plain seed uses)."""
    seeds = jnp.asarray(seeds, jnp.uint32)
    if shared_bits:
        return jax.vmap(lambda s: jax.random.normal(
            jax.random.fold_in(seed_key(s >> shared_bits), _SHARED_STREAM), shape))(seeds)
    return jax.vmap(lambda s: jax.random.normal(jax.random.fold_in(seed_key(s), 0), shape))(seeds)


_SHARED_STREAM = 2**31 - 1      # fold-in index of shared initial noise (step noise uses 1..T)


def step_noise(seeds, step, shape):
    """``[B, *shape]`` standard-normal noise of SDE step ``step``: a function of (seed, step)."""
    return jax.vmap(lambda s: jax.random.normal(
        jax.random.fold_in(seed_key(s), step + 1), shape))(seeds)


def _distilled(model) -> bool:
    """Whether ``model`` takes the guidance scale as an input (FLUX.1 [dev]) rather than
    needing a second, unconditional pass."""
    return bool(getattr(getattr(model, "cfg", None), "guidance_embed", False))


def encode_prompt(model, tokens, mask, *, guidance: float = 1.0):
    """The prompt context `velocity` takes: the model's prompt encoding, of the conditional and
    the null prompt (stacked) when guidance is on. Loop-invariant: compute it once per rollout
    or train step, not per denoising step or flow time. ``tokens``: an array or the prompt
    pytree of ``diffusion.prompt`` (its pooled embedding and null prompt are used here). A
    guidance-distilled model needs no null prompt (:func:`velocity`)."""
    if guidance != 1.0 and not _distilled(model):
        tokens, mask = prompt.with_null(tokens, mask)
    embeds, pooled = prompt.model_inputs(tokens)
    return model.encode(embeds, mask, pooled)


def velocity(model, x, sigma, tokens, mask, *, guidance: float = 1.0, attn=AttentionSpec(),
             context=None):
    """Model velocity with classifier-free guidance against each row's null prompt
    (``diffusion.prompt.null_prompt``: a prompt-embedding file's empty prompt, else the
    all-masked zero prompt). A guidance-distilled model (``guidance_embed``, FLUX.1 [dev])
    takes ``guidance`` as its input instead, in one pass. ``context``: `encode_prompt` of the
    same prompts and guidance (None = encode here). The one place a model call unpacks
    ``tokens`` (an editing prompt's input image goes in as ``image_latents``)."""
    t = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), x.shape[:1])
    if _distilled(model):
        g = jnp.full(x.shape[:1], guidance, jnp.float32)
        return model(x, t, prompt.model_inputs(tokens)[0], mask, guidance=g, attn=attn,
                     context=context, **prompt.model_kwargs(tokens))
    if guidance == 1.0:
        return model(x, t, prompt.model_inputs(tokens)[0], mask, attn=attn, context=context,
                     **prompt.model_kwargs(tokens))
    tokens2, mask2 = prompt.with_null(tokens, mask)
    both = model(jnp.concatenate([x, x]), jnp.concatenate([t, t]),
                 prompt.model_inputs(tokens2)[0], mask2, attn=attn, context=context,
                 **prompt.model_kwargs(tokens2))
    cond, uncond = jnp.split(both, 2)
    return uncond + guidance * (cond - uncond)


def step_fn(cfg: SamplerConfig):
    """The stochastic step of a sampler whose steps all use ``cfg.noise_patch``."""
    if cfg.noise_patch > 1 and cfg.sde_type == "sde":
        return functools.partial(sde_step, noise_patch=cfg.noise_patch)
    return {"sde": sde_step, "cps": cps_step, "ode": sde_step}[cfg.sde_type]


def _per_sample(sel, a):
    """A scalar or ``[B]`` bool mask broadcastable against ``a`` ``[B, ...]``."""
    return sel if sel.ndim == 0 else sel.reshape(sel.shape + (1,) * (a.ndim - 1))


def step_at(cfg: SamplerConfig, i):
    """The stochastic step of step index ``i`` (scalar or per-sample ``[B]``, may be traced), with
    `step_fn`'s signature: with per-step block sizes (``cfg.noise_patches``) every size present
    is computed and each sample takes its step's (elementwise work next to a model forward)."""
    sizes = cfg.patch_sizes()
    distinct = sorted(set(sizes.tolist()))
    if cfg.sde_type != "sde" or len(distinct) == 1:
        return step_fn(dataclasses.replace(cfg, noise_patch=distinct[0], noise_patches=None))
    which = jnp.asarray(sizes)[i]

    def step(x, v, sigma, sigma_next, **kw):
        outs = [sde_step(x, v, sigma, sigma_next, noise_patch=p, **kw) for p in distinct]
        picked = list(outs[0])
        for p, out in zip(distinct[1:], outs[1:]):
            picked = [jnp.where(_per_sample(which == p, a), a, b) for a, b in zip(out, picked)]
        return tuple(picked)
    return step


def project_at(cfg: SamplerConfig, i, a):
    """``a`` ``[B, H, W, C]`` projected onto step ``i``'s noise subspace (block-constant images
    of its block size; identity for per-pixel noise). ``i`` as in `step_at`."""
    sizes = cfg.patch_sizes() if cfg.sde_type == "sde" else np.ones(cfg.num_steps, np.int32)
    which = jnp.asarray(sizes)[i]
    out = a
    for p in sorted(set(sizes.tolist()) - {1}):
        out = jnp.where(_per_sample(which == p, a), block_project(a, p), out)
    return out


def transition(cfg: SamplerConfig, x, v, i, *, noise=None, prev_sample=None):
    """Step ``i`` of the sampler: ``(x_next, log_prob, mean, std)`` — SDE inside the window,
    ODE (log-prob 0) outside. ``i`` may be traced."""
    sigmas = jnp.asarray(cfg.sigmas)
    stochastic = jnp.asarray(cfg.stochastic_steps())[i]
    sigma, sigma_next = sigmas[i], sigmas[i + 1]
    if cfg.sde_type == "ode" or cfg.noise_level == 0:
        x_next = ode_step(x, v, sigma, sigma_next)
        zeros = jnp.zeros(x.shape[:1], jnp.float32)
        return x_next, zeros, x_next, zeros
    sx, logp, mean, std = step_at(cfg, i)(x, v, sigma, sigma_next, noise_level=cfg.noise_level,
                                          noise=noise, prev_sample=prev_sample,
                                          sigma_max=sigmas[1])
    ox = ode_step(x, v, sigma, sigma_next)
    x_next = jnp.where(stochastic, sx, ox) if prev_sample is None else prev_sample
    return (x_next, jnp.where(stochastic, logp, 0.0), jnp.where(stochastic, mean, ox),
            jnp.where(stochastic, std, 0.0))


def denoise(model, x, start, num, seeds, tokens, mask, cfg: SamplerConfig,
            attn=AttentionSpec()):
    """Runs steps ``start .. start+num-1`` from latent ``x``. Returns ``(x_end, xs, logps)`` with
    ``xs [num, B, ...]`` the latent after each step and ``logps [num, B]``."""
    context = encode_prompt(model, tokens, mask, guidance=cfg.guidance)

    def body(x, j):
        i = start + j
        v = velocity(model, x, jnp.asarray(cfg.sigmas)[i], tokens, mask, guidance=cfg.guidance,
                     attn=attn, context=context)
        noise = step_noise(seeds, i, x.shape[1:])
        x_next, logp, _, _ = transition(cfg, x, v, i, noise=noise)
        return x_next, (x_next, logp)

    x_end, (xs, logps) = jax.lax.scan(body, x.astype(jnp.float32), jnp.arange(num))
    return x_end, xs, logps


def to_image(x):
    """Model space [-1, 1] -> image in [0, 1]."""
    return jnp.clip((x + 1.0) * 0.5, 0.0, 1.0)


def from_image(img):
    return img * 2.0 - 1.0


class Sampler:
    """Compiled rollouts for one model graph, sampler config and attention layout.

    ``rollout(state, tokens, mask, seeds)`` -> dict with ``latents [B, T+1, H, W, C]`` (x_T first),
    ``log_probs [B, T]``, ``images [B, H, W, 3]`` in [0, 1]. ``segment(state, x, start, tokens,
    mask, seeds, num)`` continues a committed trajectory for ``num`` steps. ``tokens``: an array
    or the prompt pytree of ``diffusion.prompt`` (pooled embedding, guidance null prompt).

    ``decoder``: for a latent model, the frozen VAE that turns the final latent into the image the
    reward sees, inside the same jitted program (an object with a pure
    ``decode_with(state, latents)`` and its ``state``, e.g. ``models.vae.LatentVAE``; its state is
    an argument of the program, not a constant baked into it). None: the model draws pixels in
    [-1, 1] (``to_image``).
    """

    def __init__(self, graphdef, image_shape, cfg: SamplerConfig, attn=AttentionSpec(),
                 mesh=None, decoder=None):
        self.graphdef = graphdef
        self.decoder = decoder
        self.image_shape = tuple(image_shape)
        self.cfg = cfg.validate()
        h, w = self.image_shape[-3:-1]          # a video latent's frames come first
        bad = [int(p) for p in cfg.patch_sizes() if h % p or w % p]
        if bad and cfg.sde_type == "sde":
            raise ValueError(f"noise_patch={bad[0]} does not divide the {h}x{w} image; "
                             "set sampler.noise_patch to a divisor of the image size (1 = "
                             "per-pixel noise)")
        self.attn = attn
        self.mesh = mesh if mesh is not None else attn.mesh

    def _place(self, x):
        return place_batch(x, self.mesh)

    @property
    def _rollout(self):
        decode = self.decoder.decode_with if self.decoder is not None else None
        return _rollout_program(self.graphdef, self.image_shape, self.cfg, self.attn, decode)

    @property
    def _segment(self):
        return _segment_program(self.graphdef, self.cfg, self.attn)

    def rollout(self, state, tokens, mask, seeds):
        p = self._place
        extra = () if self.decoder is None else (self.decoder.state,)
        return self._rollout(state, p(tokens), p(mask), p(np.asarray(seeds, np.uint32)),
                             *extra)

    def segment(self, state, x, start, tokens, mask, seeds, num: int):
        p = self._place
        return self._segment(state, p(x), on_device(np.int32(start)), p(tokens), p(mask),
                             p(np.asarray(seeds, np.uint32)), int(num))


def sampling_compiler_options() -> dict[str, str] | None:
    """XLA options for the forward-only sampling programs (rollouts, segments), or None.

    On CPU, XLA's YNNPACK fusions pass every scalar constant of a fused elementwise chain (the
    tanh GELU's four) to the fused dot as a materialised full-size array, rebuilt at every
    denoising step; without those fusions the constants stay inside ordinary loop fusions and a
    rollout of the tiny model runs ~1.2x faster. XLA:CPU's tree reduction rewriter turns each
    short reduction (a QK-norm's mean over a 32-wide head, a softmax's row) into a reduce-window
    that runs as its own unfused loop, ~9% of a rollout; without it they fuse (~1.1x faster;
    both in docs/performance.md). Training steps keep the default: their backward pass is
    faster with the YNNPACK fusions. The same options compile every
    copy of the rollout (the trainer's sampler and the spot groups' programs), so a seed's image
    does not depend on which of them drew it beyond what the device layout itself changes.
    """
    if jax.default_backend() != "cpu":
        return None
    return {"xla_cpu_experimental_ynn_fusion_type": "",
            "xla_disable_hlo_passes": "tree_reduction_rewriter"}


# Compiled programs are shared by every Sampler of the same (hashable) graph, shape, sampler
# config and attention layout: a new Sampler (another run, mode or test) reuses executables.
@functools.lru_cache(maxsize=64)
def _rollout_program(graphdef, image_shape, cfg: SamplerConfig, attn, decode=None):
    return jax.jit(rollout_body(graphdef, image_shape, cfg, attn, decode),
                   compiler_options=sampling_compiler_options())


def rollout_body(graphdef, image_shape, cfg: SamplerConfig, attn, decode=None) -> Callable:
    """The unjitted rollout ``(state, tokens, mask, seeds[, decoder_state]) -> {latents,
    log_probs, images}`` (``state``: an NNX state or its pure dict), for callers that lower it
    themselves. ``decode(decoder_state, x0) -> images in [0, 1]`` for a latent model (a VAE's
    ``decode_with``); None: pixels in [-1, 1] (``to_image``)."""
    def run(state, tokens, mask, seeds, decoder_state=None):
        model = nnx.merge(graphdef, state)
        x0 = initial_noise(seeds, image_shape, cfg.shared_init_bits)
        x_end, xs, logps = denoise(model, x0, 0, cfg.num_steps, seeds, tokens, mask, cfg, attn)
        latents = jnp.concatenate([x0[None], xs], axis=0).swapaxes(0, 1)
        images = to_image(x_end) if decode is None else decode(decoder_state, x_end)
        return {"latents": latents, "log_probs": logps.T, "images": images}
    return run


@functools.lru_cache(maxsize=64)
def _segment_program(graphdef, cfg: SamplerConfig, attn):
    def run(state, x, start, tokens, mask, seeds, num):
        model = nnx.merge(graphdef, state)
        x_end, xs, logps = denoise(model, x, start, num, seeds, tokens, mask, cfg, attn)
        return {"x": x_end, "latents": xs.swapaxes(0, 1), "log_probs": logps.T}
    return jax.jit(run, static_argnums=(6,), compiler_options=sampling_compiler_options())
