"""The forward-process objective: its loss against an independent float64 reference, the
on-policy gradient's closed form, shared noise, the sampling policy's update, and the builders."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import nft_batch
from helpers import micro_config, micro_model

from spotlight_jax import world
from spotlight_jax.config import make_trainer, rl_config, sampler_config
from spotlight_jax.diffusion import SamplerConfig, encode_prompt
from spotlight_jax.rl.nft import (
    NFTConfig,
    NFTTrainer,
    eta,
    forward_noise,
    nft_loss,
    optimality,
    time_grid,
)

SHAPE = (3, 4, 4, 2)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    x0, eps, v_old, v_ref = (rng.normal(size=SHAPE).astype(np.float32) for _ in range(4))
    t = np.array([0.2, 0.5, 0.9], np.float32)
    x_t = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * eps
    p = np.array([0.9, 0.5, 0.2], np.float32)
    return x0, eps, v_old, v_ref, t, x_t, p


def _reference(v, v_old, v_ref, x_t, x0, t, p, beta, kl_beta, w=None):
    """The loss written out in float64 numpy; ``w`` = (w+, w-) held fixed if given."""
    v, v_old, v_ref, x_t, x0 = (np.asarray(a, np.float64) for a in (v, v_old, v_ref, x_t, x0))
    out, ws = [], []
    for i in range(v.shape[0]):
        vp = beta * v[i] + (1 - beta) * v_old[i]
        vn = (1 + beta) * v_old[i] - beta * v[i]
        ep, en = x_t[i] - t[i] * vp - x0[i], x_t[i] - t[i] * vn - x0[i]
        wp, wn = (max(np.abs(ep).mean(), 1e-5), max(np.abs(en).mean(), 1e-5)) if w is None \
            else w[i]
        ws.append((wp, wn))
        out.append((p[i] * (ep ** 2).mean() / wp + (1 - p[i]) * (en ** 2).mean() / wn) / beta
                   + kl_beta * ((v[i] - v_ref[i]) ** 2).mean())
    return np.array(out), ws


@pytest.mark.parametrize("beta,kl_beta", [(1.0, 0.0), (0.1, 1e-2)])
def test_loss_equals_float64_reference_and_its_gradient_finite_differences(beta, kl_beta):
    x0, eps, v_old, v_ref, t, x_t, p = _inputs()
    v = v_old + 0.3 * np.random.default_rng(1).normal(size=SHAPE).astype(np.float32)
    got = nft_loss(jnp.asarray(v), v_old, v_ref, x_t, x0, t, p, beta=beta, kl_beta=kl_beta)
    assert got.dtype == jnp.float32 and got.shape == (3,)
    want, ws = _reference(v, v_old, v_ref, x_t, x0, t, p, beta, kl_beta)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5)
    # the gradient treats w± as constants: central differences of the reference at fixed w
    grad = np.asarray(jax.grad(lambda vv: nft_loss(vv, v_old, v_ref, x_t, x0, t, p, beta=beta,
                                                   kl_beta=kl_beta).sum())(jnp.asarray(v)))
    rng = np.random.default_rng(2)
    for _ in range(3):
        d = rng.normal(size=SHAPE)
        h = 1e-4
        fd = (_reference(v + h * d, v_old, v_ref, x_t, x0, t, p, beta, kl_beta, ws)[0].sum()
              - _reference(v - h * d, v_old, v_ref, x_t, x0, t, p, beta, kl_beta, ws)[0].sum()
              ) / (2 * h)
        np.testing.assert_allclose((grad * d).sum(), fd, rtol=1e-3)


@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_on_policy_gradient_is_advantage_weighted_flow_matching(beta):
    x0, eps, v_old, v_ref, t, x_t, p = _inputs()
    kl_beta = 1e-2
    v = v_old + 0.1                          # v_ref != v: the KL term's gradient shows too
    v_ref = v_old - 0.2
    n = np.prod(SHAPE[1:])

    def loss(vv, vo):
        return nft_loss(vv, vo, v_ref, x_t, x0, t, p, beta=beta, kl_beta=kl_beta).sum()

    # at v = v_old (on-policy) for the policy part, KL at v: compare both separately
    g_policy = np.asarray(jax.grad(loss)(jnp.asarray(v_old), jnp.asarray(v_old)))
    u = eps - x0
    tb = t[:, None, None, None]
    a = (2 * p - 1)[:, None, None, None]
    w = np.maximum(np.abs(tb * (u - v_old)).reshape(3, -1).mean(-1), 1e-5)[:, None, None, None]
    want = -(2 / n) * (tb ** 2 / w) * a * (u - v_old) + (2 * kl_beta / n) * (v_old - v_ref)
    np.testing.assert_allclose(g_policy, want, rtol=1e-4, atol=1e-9)
    # p = 0.5 everywhere and no KL: no policy gradient on-policy
    g0 = jax.grad(lambda vv: nft_loss(vv, v_old, None, x_t, x0, t, np.full(3, 0.5, np.float32),
                                      beta=beta, kl_beta=0.0).sum())(jnp.asarray(v_old))
    np.testing.assert_allclose(np.asarray(g0), 0.0, atol=1e-7)
    del v


def test_optimality_and_eta_schedule():
    np.testing.assert_allclose(optimality([-10.0, -2.5, 0.0, 5.0], 5.0), [0.0, 0.25, 0.5, 1.0])
    cfg = NFTConfig(eta_rate=0.1, eta_max=0.5, eta_delay=2)
    assert [eta(cfg, k) for k in range(9)] == pytest.approx(
        [0, 0, 0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.5])


def test_forward_noise_shared_within_groups_independent_across():
    grid = time_grid(SamplerConfig(num_steps=10, shift=3.0, noise_level=0.0, sde_type="ode"))
    assert len(grid) == 9 and grid.max() < 1 and grid.min() > 0
    x0 = jnp.zeros((6, 4, 4, 2))
    groups = jnp.array([0, 0, 0, 1, 1, 1])
    t, eps = forward_noise(jax.random.key(0), groups, x0, grid, 4, shared=True)
    assert t.shape == (6, 4) and eps.shape == (6, 4, 4, 4, 2)
    for i in (1, 2):
        np.testing.assert_array_equal(t[i], t[0])
        np.testing.assert_array_equal(eps[i], eps[0])
        np.testing.assert_array_equal(eps[3 + i], eps[3])
    assert not np.allclose(eps[0], eps[3])
    # stratified: slot j's time lies in the j-th quarter of the grid
    edges = np.linspace(0, 9, 5).round().astype(int)
    for j in range(4):
        assert set(np.asarray(t[:, j]).tolist()) <= set(grid[edges[j]:edges[j + 1]].tolist())
    ti, ei = forward_noise(jax.random.key(0), groups, x0, grid, 4, shared=False)
    for i in range(6):
        for k in range(i + 1, 6):
            assert not np.allclose(ei[i], ei[k])
    # noise is a fresh standard normal per slot
    assert abs(float(ei.std()) - 1) < 0.15
    with pytest.raises(ValueError, match="rl.nft.times=10"):
        forward_noise(jax.random.key(0), groups, x0, grid, 10, shared=True)


def _trainer(**kw):
    cfg, graphdef, state = micro_model()
    sampler = SamplerConfig(num_steps=4, shift=3.0, noise_level=0.0, sde_type="ode")
    ncfg = NFTConfig(**{"lora_rank": 2, "lora_alpha": 4.0, "lr": 1e-3, "times": 2, **kw})
    return cfg, NFTTrainer(graphdef, state, ncfg, sampler)


_batch = nft_batch


def test_sampling_policy_update_and_zero_advantage_batch():
    cfg, tr = _trainer(eta_rate=0.25, eta_max=0.5)
    batch = _batch(cfg)
    m0 = tr.update(batch, jax.random.key(0), 0)              # eta 0: θ_old <- θ
    for x, y in zip(jax.tree.leaves(tr.old), jax.tree.leaves(tr.trainable)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert m0["grad_norm"] > 0 and m0["policy_shift"] == 0.0   # first step is on-policy
    old_before = jax.tree.map(np.asarray, tr.old)
    m = tr.update(batch, jax.random.key(0), 3)               # eta = min(0.75, 0.5)
    assert m["eta"] == pytest.approx(0.5)
    for o, b, p in zip(jax.tree.leaves(tr.old), jax.tree.leaves(old_before),
                       jax.tree.leaves(tr.trainable)):
        np.testing.assert_allclose(np.asarray(o), 0.5 * b + 0.5 * np.asarray(p), rtol=1e-6,
                                   atol=1e-7)
    # sampling_state is θ_old merged, policy_state θ: they differ once η > 0
    diff = [float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(
        jax.tree.leaves(tr.sampling_state()), jax.tree.leaves(tr.policy_state()))]
    assert max(diff) > 0
    # every advantage 0 (p = 0.5) with θ = θ_old: no gradient (v+ and v- round differently in
    # float32, so the two halves cancel to rounding, ~1e-9 of a real step's gradient)
    _, tr2 = _trainer()
    m2 = tr2.update(_batch(cfg, adv=np.zeros(4, np.float32)), jax.random.key(0), 0)
    assert m2["grad_norm"] < 1e-6 * m0["grad_norm"], (m2["grad_norm"], m0["grad_norm"])


def test_a_batch_from_an_earlier_sampling_policy_trains_against_that_policy():
    """update(..., generator=g) takes g's velocity as v_old (the gradient step equals that of a
    trainer whose θ_old is g) while θ_old keeps moving from its own value (anchor='sampler')."""
    cfg, a = _trainer(eta_rate=0.25, eta_max=0.5, anchor="sampler")
    batch = _batch(cfg)
    a.update(batch, jax.random.key(0), 0)
    a.update(batch, jax.random.key(1), 1)                    # θ_old now lags θ
    g = a.generator()                                        # the policy that samples now
    for x, y in zip(jax.tree.leaves(g), jax.tree.leaves(a.old)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    a.update(batch, jax.random.key(2), 2)                    # θ_old moves on
    assert max(float(np.abs(np.asarray(x) - np.asarray(y)).max())
               for x, y in zip(jax.tree.leaves(g), jax.tree.leaves(a.old))) > 0
    # b: the same θ and optimizer state, with θ_old = g
    _, b = _trainer(eta_rate=0.25, eta_max=0.5, anchor="sampler")
    b.trainable, b.opt_state = (jax.tree.map(jnp.copy, x) for x in (a.trainable, a.opt_state))
    b.old = jax.tree.map(jnp.copy, g)
    old_a = jax.tree.map(np.asarray, a.old)
    ma = a.update(batch, jax.random.key(3), 3, generator=g)
    mb = b.update(batch, jax.random.key(3), 3)
    assert ma["loss"] == mb["loss"] and ma["policy_shift"] == mb["policy_shift"]
    for x, y in zip(jax.tree.leaves(a.trainable), jax.tree.leaves(b.trainable)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    for o, before, t in zip(jax.tree.leaves(a.old), jax.tree.leaves(old_a),
                            jax.tree.leaves(a.trainable)):      # η = 0.5 from a's own θ_old
        np.testing.assert_allclose(np.asarray(o), 0.5 * before + 0.5 * np.asarray(t),
                                   rtol=1e-6, atol=1e-7)


def test_the_current_anchor_trains_a_stale_batch_against_the_current_sampling_policy():
    """anchor='current': a batch drawn by an earlier policy g trains with the current θ_old's
    velocity as v_old (the step equals the same trainer's without g), where 'sampler' takes g's
    (a different step: the knob changes the loss)."""
    def lagging(anchor):
        cfg, t = _trainer(eta_rate=0.25, eta_max=0.5, anchor=anchor)
        t.update(_batch(cfg), jax.random.key(0), 0)
        t.update(_batch(cfg), jax.random.key(1), 1)
        g = t.generator()
        t.update(_batch(cfg), jax.random.key(2), 2)          # θ_old moves on from g
        return cfg, t, g

    cfg, a, none = lagging("current")
    assert none is None                   # the current anchor keeps no copy of the sampler
    _, c, g = lagging("sampler")          # g: θ_old before update 2, given to both anyway
    _, b, _ = lagging("current")
    batch = _batch(cfg)
    ma = a.update(batch, jax.random.key(3), 3, generator=g)
    mb = b.update(batch, jax.random.key(3), 3)
    mc = c.update(batch, jax.random.key(3), 3, generator=g)
    assert ma["loss"] == mb["loss"] and ma["policy_shift"] == mb["policy_shift"]
    for x, y in zip(jax.tree.leaves(a.trainable), jax.tree.leaves(b.trainable)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert ma["policy_shift"] != mc["policy_shift"]
    assert max(float(np.abs(np.asarray(x) - np.asarray(y)).max())
               for x, y in zip(jax.tree.leaves(a.trainable), jax.tree.leaves(c.trainable))) > 0


# per-image noise among the longer checks (the default suite's 8-minute budget): -m e2e
@pytest.mark.parametrize("shared", [True, pytest.param(False, marks=pytest.mark.e2e)])
def test_minibatches_do_not_change_the_update(shared):
    cfg, a = _trainer(minibatches=1, shared_noise=shared)
    _, b = _trainer(minibatches=2, shared_noise=shared)
    batch = _batch(cfg)
    ma, mb = a.update(batch, jax.random.key(3), 0), b.update(batch, jax.random.key(3), 0)
    np.testing.assert_allclose(ma["loss"], mb["loss"], rtol=1e-5)
    np.testing.assert_allclose(ma["grad_norm"], mb["grad_norm"], rtol=1e-4)
    for x, y in zip(jax.tree.leaves(a.trainable), jax.tree.leaves(b.trainable)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)


def test_prompt_context_computed_once_equals_encoding_inside():
    cfg, graphdef, state = micro_model()
    from flax import nnx
    model = nnx.merge(graphdef, state)
    tokens, mask = world.tokenize(["two red circles", 'the text "37"'], cfg.text_len)
    x = jax.random.normal(jax.random.key(0), (2, cfg.image_size, cfg.image_size, cfg.channels))
    t = jnp.array([0.3, 0.8])
    np.testing.assert_array_equal(
        np.asarray(model(x, t, tokens, mask)),
        np.asarray(model(x, t, tokens, mask, context=encode_prompt(model, tokens, mask))))


def test_builders_objective_sampler_and_errors():
    c = micro_config(1, **{"rl.objective": "nft"})
    s = sampler_config(c)
    assert s.sde_type == "ode" and s.noise_level == 0.0 and s.num_steps == 3
    r = rl_config(c)
    assert isinstance(r, NFTConfig) and r.global_std is True and r.beta == 1.0
    assert rl_config(micro_config(1)).global_std is False      # flow_grpo's default
    from spotlight_jax.config import GRPO_LR, NFT_LR, load_config
    assert rl_config(load_config("tiny")).lr == NFT_LR          # rl.lr None: per objective
    assert rl_config(load_config("tiny", {"rl.objective": "flow_grpo"})).lr == GRPO_LR
    assert rl_config(load_config("tiny", {"rl.lr": 3e-4})).lr == 3e-4
    # rl.reward None: the objective's training reward; held-out stays geneval_lite
    from spotlight_jax.config import run_settings
    for over, train in (({}, "geneval_lite_aspect"),
                        ({"rl.objective": "flow_grpo"}, "geneval_lite"),
                        ({"rl.reward": "geneval_lite_shaped"}, "geneval_lite_shaped")):
        st = run_settings(load_config("tiny", over))
        assert (st.reward, st.eval_reward) == (train, "geneval_lite"), over
    c.rl.global_std = False
    assert rl_config(c).global_std is False
    # decoupled advantages normalise within groups: nft's default batch std steps aside, and
    # asking for both fails naming the field (it was silently ignored)
    assert rl_config(micro_config(1, **{"rl.objective": "nft", "rl.advantage": "decoupled"})
                     ).global_std is False
    for objective in ("nft", "flow_grpo"):
        with pytest.raises(ValueError,
                           match=r"rl.global_std=True: rl.advantage='decoupled' normalises"):
            rl_config(micro_config(1, **{"rl.objective": objective, "rl.advantage": "decoupled",
                                         "rl.global_std": True}))
    with pytest.raises(ValueError, match="rl.objective='ppo'"):
        rl_config(micro_config(1, **{"rl.objective": "ppo"}))
    with pytest.raises(ValueError, match="shared_initial_noise"):
        sampler_config(micro_config(1, **{"rl.objective": "nft",
                                          "sampler.shared_initial_noise": True}))
    with pytest.raises(ValueError, match="rl.nft.beta"):
        rl_config(micro_config(1, **{"rl.objective": "nft", "rl.nft.beta": 0.0}))
    with pytest.raises(ValueError, match=r"rl.nft.anchor='latest': use 'current' or 'sampler'"):
        rl_config(micro_config(1, **{"rl.objective": "nft", "rl.nft.anchor": "latest"}))
    with pytest.raises(ValueError, match="rl.nft.times=9"):
        from spotlight_jax.config import model_config
        from spotlight_jax.models.factory import create_model
        graphdef, base = create_model(model_config(c))
        make_trainer(micro_config(1, **{"rl.objective": "nft", "rl.nft.times": 9}),
                     graphdef, base)
