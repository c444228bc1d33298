"""Sampler steps against an independent float64 numpy transcription of Flow-GRPO's formulas, and
bit-identical resumption of rollouts."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import micro_model

from spotlight_jax import world
from spotlight_jax.diffusion import (
    Sampler,
    SamplerConfig,
    cps_step,
    initial_noise,
    ode_step,
    sde_step,
    shifted_sigmas,
    step_noise,
)
from spotlight_jax.diffusion.rollout import rollout_body, sampling_compiler_options


def ref_sde(x, v, sigma, sigma_next, a, eps, sigma_max):
    x, v = x.astype(np.float64), v.astype(np.float64)
    dt = sigma_next - sigma
    s_safe = sigma_max if sigma == 1 else sigma
    std_t = a * math.sqrt(sigma / (1 - s_safe))
    mean = (x * (1 + std_t**2 / (2 * sigma) * dt)
            + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt)
    scale = std_t * math.sqrt(-dt)
    nxt = mean + scale * eps
    lp = -((nxt - mean) ** 2) / (2 * scale**2) - math.log(scale) - math.log(math.sqrt(2 * math.pi))
    return nxt, lp.reshape(len(x), -1).mean(1), mean, std_t


@pytest.mark.parametrize("i", [0, 3, 9])
def test_sde_step_matches_reference(i):
    rng = np.random.default_rng(i)
    sig = shifted_sigmas(10, 3.0)
    x = rng.normal(size=(3, 4, 4, 3)).astype(np.float32)
    v = rng.normal(size=x.shape).astype(np.float32)
    eps = rng.normal(size=x.shape).astype(np.float32)
    nxt, lp, mean, std = sde_step(x, v, sig[i], sig[i + 1], noise_level=0.7, noise=eps,
                                  sigma_max=sig[1])
    rn, rlp, rmean, rstd = ref_sde(x, v, float(sig[i]), float(sig[i + 1]), 0.7, eps, float(sig[1]))
    np.testing.assert_allclose(nxt, rn, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, rmean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lp, rlp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(std), rstd, rtol=1e-6)
    # scoring the sample it drew gives the same log-prob
    _, lp2, _, _ = sde_step(x, v, sig[i], sig[i + 1], noise_level=0.7, prev_sample=nxt,
                            sigma_max=sig[1])
    np.testing.assert_array_equal(lp, lp2)


def _block_basis(h, w, c, p):
    """Orthonormal basis ``[h*w*c, (h/p)*(w/p)*c]`` of images constant on p x p blocks."""
    cols = []
    for bi in range(h // p):
        for bj in range(w // p):
            for ch in range(c):
                e = np.zeros((h, w, c))
                e[bi * p:(bi + 1) * p, bj * p:(bj + 1) * p, ch] = 1.0 / p
                cols.append(e.ravel())
    return np.stack(cols, 1)


@pytest.mark.parametrize("i", [0, 5])
def test_block_noise_step_matches_an_explicit_subspace_gaussian(i):
    """noise_patch=p: the step is the per-pixel step's ODE part plus the projection (with an
    explicit orthonormal basis U) of its score correction and noise; the log-prob is the
    Gaussian density of the sample's block coordinates U^T (x_next - mean)."""
    rng = np.random.default_rng(i)
    sig = shifted_sigmas(10, 3.0)
    p = 2
    x = rng.normal(size=(3, 4, 4, 3)).astype(np.float32)
    v = rng.normal(size=x.shape).astype(np.float32)
    eps = rng.normal(size=x.shape).astype(np.float32)
    nxt, lp, mean, std = sde_step(x, v, sig[i], sig[i + 1], noise_level=0.7, noise=eps,
                                  sigma_max=sig[1], noise_patch=p)
    _, _, full_mean, std_t = ref_sde(x, v, float(sig[i]), float(sig[i + 1]), 0.7, eps,
                                     float(sig[1]))
    U = _block_basis(4, 4, 3, p)
    proj = U @ U.T
    ode = (x + (sig[i + 1] - sig[i]) * v).astype(np.float64).reshape(3, -1)
    want_mean = ode + (full_mean.reshape(3, -1) - ode) @ proj
    scale = std_t * math.sqrt(sig[i] - sig[i + 1])
    want_next = want_mean + scale * eps.reshape(3, -1).astype(np.float64) @ proj
    y = (want_next - want_mean) @ U
    want_lp = (-(y**2) / (2 * scale**2) - math.log(scale) - 0.5 * math.log(2 * math.pi)).mean(1)
    np.testing.assert_allclose(np.asarray(mean).reshape(3, -1), want_mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(nxt).reshape(3, -1), want_next, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lp, want_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(std), std_t, rtol=1e-6)
    # off the subspace the step is deterministic: the sample equals the mean there
    off = (np.asarray(nxt) - np.asarray(mean)).reshape(3, -1) @ (np.eye(48) - proj)
    np.testing.assert_allclose(off, 0.0, atol=1e-5)
    _, lp2, _, _ = sde_step(x, v, sig[i], sig[i + 1], noise_level=0.7, prev_sample=nxt,
                            sigma_max=sig[1], noise_patch=p)
    np.testing.assert_allclose(lp, lp2, rtol=1e-6, atol=1e-6)


def test_block_noise_sde_keeps_the_marginals():
    """Closed form: for data x0 ~ N(m, s2) per pixel the rectified-flow velocity is analytic, so
    an SDE that keeps the ODE's marginals must end at mean m, variance s2, uncorrelated pixels.
    Projecting only the noise (not the score correction) would shrink the variance to ~0.02."""
    m, s2 = 0.3, 0.25

    def vel(x, sig):
        var = (1 - sig) ** 2 * s2 + sig**2
        x0 = m + (1 - sig) * s2 / var * (x - (1 - sig) * m)
        return (x - (1 - sig) * x0) / sig - x0

    sig = np.linspace(1.0, 0.0, 201)
    step = jax.jit(lambda x, a, b, k: sde_step(x, vel(x, a), a, b, noise_level=0.7, key=k,
                                               sigma_max=sig[1], noise_patch=4)[0])
    key = jax.random.key(0)
    x = jax.random.normal(key, (4000, 8, 8, 1))
    for i in range(200):
        x = step(x, sig[i], sig[i + 1], jax.random.fold_in(key, i + 1))
    x = np.asarray(x)
    assert abs(x.mean() - m) < 0.01
    assert abs(x.var() - s2) < 0.015
    # 2x2 block means of uncorrelated pixels have variance s2 / 4
    assert abs(x.reshape(4000, 4, 2, 4, 2).mean((2, 4)).var() - s2 / 4) < 0.005


def test_sigma_one_guard_is_finite_and_uses_sigma_max():
    x = jnp.ones((2, 2, 2, 1))
    _, lp, _, std = sde_step(x, x, 1.0, 0.9, noise_level=0.7, key=jax.random.key(0),
                             sigma_max=0.9)
    assert np.isfinite(np.asarray(lp)).all()
    np.testing.assert_allclose(np.asarray(std), 0.7 * math.sqrt(1 / 0.1), rtol=1e-6)


def test_cps_and_ode_steps():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 4, 4, 3)).astype(np.float32)
    v = rng.normal(size=x.shape).astype(np.float32)
    eps = rng.normal(size=x.shape).astype(np.float32)
    s, sn, a = 0.8, 0.6, 0.7
    std = sn * math.sin(a * math.pi / 2)
    x0, x1 = x - s * v, x + (1 - s) * v
    mean = x0 * (1 - sn) + x1 * math.sqrt(sn**2 - std**2)
    nxt, lp, m, st = cps_step(x, v, s, sn, noise_level=a, noise=eps)
    np.testing.assert_allclose(m, mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nxt, mean + std * eps, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lp, (-(std * eps) ** 2).reshape(2, -1).mean(1), rtol=1e-4)
    np.testing.assert_allclose(ode_step(x, v, s, sn), x + (sn - s) * v, rtol=1e-6, atol=1e-7)


def test_bfloat16_inputs_compute_in_float32():
    x = jnp.ones((2, 4), jnp.bfloat16)
    out, lp, mean, _ = sde_step(x, x, 0.5, 0.4, noise_level=0.7, key=jax.random.key(0))
    assert out.dtype == lp.dtype == mean.dtype == jnp.float32


def test_noise_is_a_pure_function_of_seed_and_step():
    seeds = jnp.array([1, 2, 1], jnp.uint32)
    n = step_noise(seeds, 3, (4,))
    np.testing.assert_array_equal(n[0], n[2])
    assert not np.array_equal(n[0], n[1])
    assert not np.array_equal(step_noise(seeds, 4, (4,))[0], n[0])
    assert not np.array_equal(initial_noise(seeds, (4,))[0], n[0])


@pytest.fixture(scope="module")
def micro_sampler():
    cfg, graphdef, state = micro_model()
    sampler = Sampler(graphdef, (16, 16, 3), SamplerConfig(num_steps=6, shift=3.0, guidance=1.5))
    prompts = ["a red bar", "two blue squares", 'the text "37"', "a green square"]
    tokens, mask = world.tokenize(prompts, cfg.text_len)
    return sampler, state, tokens, mask, np.array([5, 6, 7, 8], np.uint32)


def test_rollout_shapes_and_logprobs(micro_sampler):
    sampler, state, tokens, mask, seeds = micro_sampler
    out = sampler.rollout(state, tokens, mask, seeds)
    assert out["latents"].shape == (4, 7, 16, 16, 3)
    assert out["log_probs"].shape == (4, 6)
    assert out["images"].shape == (4, 16, 16, 3)
    assert np.isfinite(np.asarray(out["log_probs"])).all()
    x_t = initial_noise(jnp.asarray(seeds), (16, 16, 3))
    np.testing.assert_array_equal(out["latents"][:, 0], x_t)


def test_sampling_options_compile_the_models_short_reductions_without_reduce_windows():
    """XLA:CPU's tree reduction rewriter turns some of a block's short reductions (the
    QK-norm's per-head mean here) into reduce-windows, unfused loops of their own; the sampling
    programs' options keep them fused reductions."""
    from flax import nnx

    from spotlight_jax.models import MMDiT, MMDiTConfig
    if jax.default_backend() != "cpu":
        pytest.skip("XLA:CPU's options")
    cfg = MMDiTConfig(image_size=16, patch_size=4, width=64, depth=1, num_heads=2, text_len=8,
                      text_width=32, text_layers=1, text_heads=2)
    graphdef, state = nnx.split(MMDiT(cfg, rngs=nnx.Rngs(0)))
    b = 4
    args = (jnp.ones((b, 16, 16, 3)), jnp.ones((b,)), jnp.ones((b, 8), jnp.int32),
            jnp.ones((b, 8), bool))

    def windows(options):
        fn = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a), compiler_options=options)
        return fn.lower(state, *args).compile().as_text().count("reduce-window(")

    assert windows(None) > 0
    assert windows(sampling_compiler_options()) == 0


def test_sampling_options_keep_the_rollout_of_the_default_compilation(micro_sampler):
    """The sampler's own XLA options (CPU) change only float rounding: the same rollout
    compiled with the defaults agrees to float32 noise."""
    sampler, state, tokens, mask, seeds = micro_sampler
    assert sampling_compiler_options() == {"xla_cpu_experimental_ynn_fusion_type": "",
                                           "xla_disable_hlo_passes": "tree_reduction_rewriter"}
    plain = jax.jit(rollout_body(sampler.graphdef, sampler.image_shape, sampler.cfg,
                                 sampler.attn))(state, tokens, mask, seeds)
    out = sampler.rollout(state, tokens, mask, seeds)
    np.testing.assert_allclose(out["latents"], plain["latents"], atol=1e-4)
    np.testing.assert_allclose(out["log_probs"], plain["log_probs"], atol=1e-4)


@pytest.mark.parametrize("cut", [1, 3, 5])
def test_resumed_rollout_is_bit_identical(micro_sampler, cut):
    sampler, state, tokens, mask, seeds = micro_sampler
    full = sampler.rollout(state, tokens, mask, seeds)
    # stop after `cut` steps, continue from the committed latent in two more segments
    first = sampler.segment(state, full["latents"][:, 0], 0, tokens, mask, seeds, cut)
    np.testing.assert_array_equal(first["x"], full["latents"][:, cut])
    rest = sampler.segment(state, first["x"], cut, tokens, mask, seeds, 6 - cut)
    np.testing.assert_array_equal(rest["x"], full["latents"][:, -1])
    np.testing.assert_array_equal(
        np.concatenate([first["log_probs"], rest["log_probs"]], 1), full["log_probs"])


def test_sde_window_steps_outside_are_ode(micro_sampler):
    _, state, tokens, mask, seeds = micro_sampler
    cfg = SamplerConfig(num_steps=6, sde_window=(1, 3))
    np.testing.assert_array_equal(cfg.stochastic_steps(), [0, 1, 1, 0, 0, 0])
    s = Sampler(micro_sampler[0].graphdef, (16, 16, 3), cfg)
    out = s.rollout(state, tokens, mask, seeds)
    lp = np.asarray(out["log_probs"])
    assert (lp[:, [0, 3, 4, 5]] == 0).all() and (lp[:, 1:3] != 0).all()
    with pytest.raises(ValueError, match="sde_window"):
        SamplerConfig(num_steps=6, sde_window=(4, 9)).validate()
    # slice-style negative end: all but the last two steps
    np.testing.assert_array_equal(SamplerConfig(num_steps=6, sde_window=(0, -2))
                                  .stochastic_steps(), [1, 1, 1, 1, 0, 0])
    with pytest.raises(ValueError, match="sde_window"):
        SamplerConfig(num_steps=6, sde_window=(0, -6)).validate()
    with pytest.raises(ValueError, match="noise_patch"):
        SamplerConfig(noise_patch=2, sde_type="cps").validate()
    with pytest.raises(ValueError, match="noise_patch=3 does not divide the 16x16"):
        Sampler(micro_sampler[0].graphdef, (16, 16, 3), SamplerConfig(noise_patch=3))


def test_per_step_block_sizes_take_each_steps_own_block_step(micro_sampler):
    """noise_patches: each sample's step is sde_step with its step's block size (4 on steps
    0-1, 2 later), the KL projection likewise; a rollout's log-probs are those of its steps."""
    from spotlight_jax.diffusion.rollout import project_at, step_at
    from spotlight_jax.diffusion.sde import block_project
    cfg = SamplerConfig(num_steps=6, shift=3.0, noise_patches=(4, 4, 2, 2, 2, 2)).validate()
    assert cfg.patch_sizes().tolist() == [4, 4, 2, 2, 2, 2]
    rng = np.random.default_rng(0)
    x, v, eps = (jnp.asarray(rng.normal(size=(3, 8, 8, 3)), jnp.float32) for _ in range(3))
    steps = jnp.array([0, 3, 1])
    sig = jnp.asarray(cfg.sigmas)
    got = step_at(cfg, steps)(x, v, sig[steps], sig[steps + 1], noise_level=0.7, noise=eps,
                              sigma_max=sig[1])
    for b, p in enumerate([4, 2, 4]):
        want = sde_step(x[b:b + 1], v[b:b + 1], sig[steps[b]], sig[steps[b] + 1],
                        noise_level=0.7, noise=eps[b:b + 1], sigma_max=sig[1], noise_patch=p)
        for g, w in zip(got, want):
            w = np.asarray(w)        # std: [1] for a scalar sigma, [1, 1, 1, 1] per sample
            np.testing.assert_allclose(np.asarray(g)[b:b + 1].reshape(w.shape), w, rtol=1e-6,
                                       atol=1e-6)
        np.testing.assert_allclose(project_at(cfg, steps, x)[b], block_project(x, p)[b],
                                   rtol=1e-6)
    sampler, state, tokens, mask, seeds = micro_sampler
    mixed = Sampler(sampler.graphdef, (16, 16, 3), dataclasses.replace(sampler.cfg,
                                                                       noise_patches=cfg.noise_patches))
    out = mixed.rollout(state, tokens, mask, seeds)
    lat = out["latents"]
    for i, p in ((1, 4), (4, 2)):
        uniform = Sampler(sampler.graphdef, (16, 16, 3), dataclasses.replace(sampler.cfg,
                                                                             noise_patch=p))
        seg = uniform.segment(state, lat[:, i], i, tokens, mask, seeds, 1)
        np.testing.assert_allclose(seg["x"], lat[:, i + 1], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(seg["log_probs"][:, 0], out["log_probs"][:, i], rtol=1e-5,
                                   atol=1e-5)
    with pytest.raises(ValueError, match="noise_patches=.*each of the num_steps=6"):
        SamplerConfig(num_steps=6, noise_patches=(4, 2)).validate()
    with pytest.raises(ValueError, match="noise_patch=3 does not divide"):
        Sampler(sampler.graphdef, (16, 16, 3), SamplerConfig(num_steps=2, noise_patches=(2, 3)))


def test_shared_initial_noise_within_a_slot(micro_sampler):
    # shared_init_bits: seeds equal above their low bits start from one x_T (a stream no plain
    # seed uses) and differ from the first SDE step on; the scheduler's stepper starts a
    # request from the same x_T; candidate seeds of a slot are laid out to share it
    from spotlight_jax.diffusion.engine import candidate_seeds
    from spotlight_jax.sched import SamplerStepper

    sampler, state, tokens, mask, _ = micro_sampler
    cfg = SamplerConfig(num_steps=6, shift=3.0, shared_init_bits=8)
    s = Sampler(sampler.graphdef, (16, 16, 3), cfg)
    slot = candidate_seeds(0, 3, 1, 4, shared_bits=8)
    assert len(set(slot >> 8)) == 1 and list(slot & 255) == [0, 1, 2, 3]
    other = candidate_seeds(0, 3, 2, 4, shared_bits=8)
    assert (other >> 8)[0] != (slot >> 8)[0]
    out = s.rollout(state, tokens, mask, slot)
    x_t = np.asarray(out["latents"][:, 0])
    for j in range(1, 4):
        np.testing.assert_array_equal(x_t[j], x_t[0])
        assert not np.array_equal(out["latents"][j, 1], out["latents"][0, 1])
    assert not np.array_equal(x_t[0], initial_noise(jnp.asarray(slot[:1]), (16, 16, 3))[0])
    np.testing.assert_array_equal(SamplerStepper(s, 8).initial(int(slot[2])), x_t[2])
    # the plain layout is untouched
    np.testing.assert_array_equal(candidate_seeds(0, 3, 1, 4),
                                  candidate_seeds(0, 3, 1, 4, shared_bits=0))
    with pytest.raises(ValueError, match="300 candidate seeds"):
        candidate_seeds(0, 3, 1, 300, shared_bits=8)
    with pytest.raises(ValueError, match="shared_init_bits"):
        SamplerConfig(shared_init_bits=20).validate()


def test_shared_initial_noise_config_reaches_training_sampler_only():
    from spotlight_jax.config import SHARED_INIT_BITS, load_config, sampler_config
    c = load_config("tiny", {"sampler.shared_initial_noise": True,
                             "rl.objective": "flow_grpo"})
    assert sampler_config(c).shared_init_bits == SHARED_INIT_BITS
    assert sampler_config(c, evaluation=True).shared_init_bits == 0      # fixed eval seeds
    assert sampler_config(load_config("tiny")).shared_init_bits == 0


def test_a_guidance_distilled_model_takes_the_scale_in_one_pass():
    """FLUX.1 [dev]'s structure (guidance_embed, single-stream blocks): ``velocity`` at guidance
    3.5 is one model call with the scale as input, not a CFG pair; ``encode_prompt`` stacks no
    null prompt; the scale changes the velocity."""
    from flax import nnx
    from helpers import built_model

    from spotlight_jax.diffusion.rollout import encode_prompt, velocity
    from spotlight_jax.models import MMDiTConfig
    cfg = MMDiTConfig(image_size=8, channels=4, patch_size=2, width=32, depth=1, num_heads=2,
                      text_len=5, text_width=0, text_embed_dim=12, single_blocks=2,
                      guidance_embed=True, pooled="input", pooled_dim=6,
                      pos_embed="rope3d_flux", rope_axes=(4, 6, 6), use_text_mask=False)
    graphdef, state = built_model(cfg)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 8, 8, 4)), jnp.float32)
    tokens = {"embeds": jnp.asarray(rng.normal(size=(2, 5, 12)), jnp.float32),
              "pooled": jnp.asarray(rng.normal(size=(2, 6)), jnp.float32)}
    mask = jnp.ones((2, 5), bool)

    @jax.jit
    def calls(state):       # one program (eager calls compile every op on its own)
        model = nnx.merge(graphdef, state)
        ctx = encode_prompt(model, tokens, mask, guidance=3.5)
        v = velocity(model, x, 0.5, tokens, mask, guidance=3.5, context=ctx)
        direct = model(x, jnp.full((2,), 0.5), tokens["embeds"], mask, tokens["pooled"],
                       jnp.full((2,), 3.5))
        other = velocity(model, x, 0.5, tokens, mask, guidance=1.0, context=ctx)
        return ctx[0].shape[0], v, direct, other

    rows, v, direct, other = calls(state)
    assert rows == 2                                    # no null prompt stacked
    np.testing.assert_allclose(v, direct, rtol=1e-6, atol=1e-6)
    assert float(jnp.abs(other - v).max()) > 1e-4
    assert cfg.passes(3.5) == 1 and dataclasses.replace(cfg, guidance_embed=False).passes(3.5) == 2
