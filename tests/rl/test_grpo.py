"""GRPO: advantages, on-policy ratio exactly 1, loss gradient vs finite differences, LoRA."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import micro_model

from spotlight_jax import world
from spotlight_jax.diffusion import Sampler, SamplerConfig
from spotlight_jax.rl import (
    GRPOConfig,
    GRPOTrainer,
    advantages,
    decoupled_advantages,
    group_stats,
    grpo_loss,
)
from spotlight_jax.rl import lora as lora_lib


def test_advantages_constant_group_is_zero_and_others_normalised():
    r = np.array([1.0, 1.0, 1.0, 0.0, 0.5, 1.0])
    ids = np.array([0, 0, 0, 1, 1, 1])
    a = advantages(r, ids)
    np.testing.assert_array_equal(a[:3], 0.0)
    g = r[3:]
    np.testing.assert_allclose(a[3:], (g - g.mean()) / (g.std() + 1e-4), rtol=1e-6)
    ag = advantages(r, ids, global_std=True)
    np.testing.assert_allclose(ag[3:], (g - g.mean()) / (r.std() + 1e-4), rtol=1e-6)
    assert np.abs(advantages(np.array([0, 0, 0, 100.0]), np.zeros(4), clip=5.0)).max() <= 5.0
    st = group_stats(r, ids)
    assert st["zero_var_groups"] == 0.5
    np.testing.assert_allclose(st["group_std"], (0.0 + g.std()) / 2)


def test_decoupled_advantages_normalise_each_part_then_the_group():
    nan = np.nan
    # group 0: two parts; part 0 spreads widely, part 1 a little (and opposite); group 1: one
    # part applies (NaN column), constant part 0 in group 2 -> only part 1 matters there
    parts = np.array([[0.0, 0.6], [1.0, 0.5], [0.0, 0.5], [1.0, 0.4],
                      [0.2, nan], [0.8, nan], [0.5, nan], [0.5, nan],
                      [1.0, 0.0], [1.0, 0.5], [1.0, 1.0], [1.0, 0.5]])
    ids = np.repeat(np.arange(3), 4)
    a = decoupled_advantages(parts, ids)

    def z(x):
        return (x - x.mean()) / (x.std() + 1e-4)

    want0 = z((z(parts[:4, 0]) + z(parts[:4, 1])) / 2)
    np.testing.assert_allclose(a[:4], want0, rtol=1e-5)
    # the scalar reward (mean of parts) ranks row 3 above row 0 (its wide part 0 wins);
    # decoupled, part 1's small spread counts as much, and row 0 comes first
    assert parts[3].mean() > parts[0].mean() and a[0] > a[3]
    # one part (up to the twice-applied eps): the plain advantage; a constant part counts 0
    np.testing.assert_allclose(a[4:8], z(z(parts[4:8, 0])), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a[8:], z(z(parts[8:, 1]) / 2), rtol=1e-5, atol=1e-6)
    # every group normalised: mean 0, std 1
    for g in range(3):
        np.testing.assert_allclose(a[ids == g].mean(), 0.0, atol=1e-6)
        np.testing.assert_allclose(a[ids == g].std(), 1.0, atol=1e-3)
    # all parts constant: no signal
    np.testing.assert_array_equal(decoupled_advantages(np.ones((4, 2)), np.zeros(4)), 0.0)
    with pytest.raises(ValueError, match=r"\[B, K\]"):
        decoupled_advantages(np.ones(4), np.zeros(4))


from conftest import SAMPLER  # noqa: E402  (tests/rl/conftest.py: the rollout_batch fixture)


def test_first_on_policy_ratio_is_exactly_one(rollout_batch):
    graphdef, state, batch = rollout_batch
    trainer = GRPOTrainer(graphdef, state, GRPOConfig(train_steps=2, minibatches=2, lr=1e-3,
                                                      beta=0.0, rescore=True), SAMPLER)
    m = trainer.update(batch, jax.random.key(0), step=0)
    assert m["first_ratio_dev"] == 0.0
    # the numerics under the hood: the sampler's log-probs and the re-scored ones agree with the
    # training forward's to float rounding (a formula or batch-shape bug would show here)
    assert m["rollout_logp_dev"] < 1e-5 and m["rescore_dev"] < 1e-5
    assert m["ratio_dev"] > 0.0  # the second minibatch ran on updated weights


def test_log_prob_gap_is_reported_per_sampler_step(rollout_batch):
    """A gap planted in the rollout's log-probs (step t off by (t + 1) 1e-3) is read back at the
    steps the first minibatch trained, each at its own size."""
    graphdef, state, batch = rollout_batch
    planted = dict(batch, log_probs=batch["log_probs"]
                   + 1e-3 * (np.arange(batch["log_probs"].shape[1]) + 1)[None, :])
    # the config of the test above (its compiled step is reused)
    trainer = GRPOTrainer(graphdef, state, GRPOConfig(train_steps=2, minibatches=2, lr=1e-3,
                                                      beta=0.0, rescore=True), SAMPLER)
    m = trainer.update(planted, jax.random.key(0), step=0)
    gap = m["rollout_logp_gap_by_step"]
    stochastic = set(np.flatnonzero(SAMPLER.stochastic_steps()).tolist())
    assert gap and {int(t) for t in gap} <= stochastic
    for t, g in gap.items():
        assert g == pytest.approx(1e-3 * (int(t) + 1), abs=1e-5), (t, g)
    assert max(gap.values()) == pytest.approx(m["rollout_logp_dev"], rel=1e-6)
    assert m["first_ratio_dev"] == 0.0        # the first minibatch's ratio is still exactly 1


def test_rollout_old_logprobs_give_the_same_update_as_rescoring(rollout_batch):
    # rescore=False (default) takes old log-probs of later minibatches from the rollout; they
    # differ from re-scored ones by float rounding only, so both updates must agree closely
    graphdef, state, batch = rollout_batch
    params = []
    for rescore in (False, True):
        cfg = GRPOConfig(train_steps=2, minibatches=2, lr=1e-3, beta=0.0, rescore=rescore)
        trainer = GRPOTrainer(graphdef, state, cfg, SAMPLER)
        m = trainer.update(batch, jax.random.key(0), step=0)
        assert ("rescore_dev" in m) == rescore
        params.append(trainer.policy_state())
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                zip(jax.tree.leaves(params[0]), jax.tree.leaves(state)))
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree.leaves(params[0]), jax.tree.leaves(params[1])))
    assert moved > 1e-4 and diff < 1e-3 * moved


def test_loss_gradient_matches_finite_differences(rollout_batch):
    graphdef, state, batch = rollout_batch
    cfg = GRPOConfig(clip_eps=10.0, beta=0.1)  # no clipping: the loss is smooth
    idx = jnp.array([[0, 2]] * 8, jnp.int32)
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    ref = nnx.merge(graphdef, jax.tree.map(lambda x: x + 0.01, state))

    # direction: perturb the final projection kernel (reaches the loss through every step)
    direction = jax.random.normal(jax.random.key(7), state["final"]["kernel"].get_value().shape)
    # one program for the loss and its gradient (the finite differences reuse it)
    loss_and_grad = jax.jit(jax.value_and_grad(
        lambda s: grpo_loss(nnx.merge(graphdef, s), b, idx, SAMPLER, cfg, ref)[0]))

    def loss_at(eps):
        s = jax.tree.map(lambda x: x, state)
        k = s["final"]["kernel"]
        k.set_value(k.get_value() + eps * direction)
        return loss_and_grad(s)[0]

    grads = loss_and_grad(state)[1]
    analytic = float(jnp.sum(grads["final"]["kernel"].get_value() * direction))
    h = 1e-3
    numeric = float((loss_at(h) - loss_at(-h)) / (2 * h))
    assert abs(analytic - numeric) <= 2e-2 * abs(numeric) + 1e-4, (analytic, numeric)


def test_lora_starts_at_base_and_trains_only_adapters(rollout_batch):
    graphdef, state, batch = rollout_batch
    cfg = GRPOConfig(lora_rank=4, lora_alpha=8.0, train_steps=2, minibatches=1, lr=1e-2,
                     beta=0.04)
    trainer = GRPOTrainer(graphdef, state, cfg, SAMPLER)
    merged = trainer.policy_state()
    for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(state)):
        np.testing.assert_array_equal(a, b)
    n_lora = sum(x.size for x in jax.tree.leaves(trainer.trainable))
    n_full = sum(x.size for x in jax.tree.leaves(state))
    assert 0 < n_lora < n_full / 4
    trainer.update(batch, jax.random.key(1), step=0)
    changed = [not np.array_equal(a, b) for a, b in
               zip(jax.tree.leaves(trainer.policy_state()), jax.tree.leaves(state))]
    assert any(changed)
    # only attention projections moved
    paths = [jax.tree_util.keystr(p) for p, _ in
             jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(state))]
    moved = {p for p, c in zip(paths, changed) if c}
    assert moved and all(("qkv" in p or "out" in p) for p in moved)


def test_lora_factors_are_drawn_from_the_run_seed(rollout_batch):
    """The A factors come from the run's seed (the seeds of a grid start apart; the same seed
    starts alike), and every seed still starts exactly at the base (B = 0)."""
    graphdef, state, _ = rollout_batch
    cfg = GRPOConfig(lora_rank=4, lora_alpha=8.0)

    def factors(seed):
        return jax.tree.leaves(GRPOTrainer(graphdef, state, cfg, SAMPLER, seed=seed).trainable)
    s0, s0_again, s1 = factors(0), factors(0), factors(1)
    assert all(np.array_equal(a, b) for a, b in zip(s0, s0_again))
    assert not all(np.array_equal(a, b) for a, b in zip(s0, s1))
    merged = GRPOTrainer(graphdef, state, cfg, SAMPLER, seed=1).policy_state()
    for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(state)):
        np.testing.assert_array_equal(a, b)


def test_nan_loss_stops_with_iteration_in_message(rollout_batch):
    graphdef, state, batch = rollout_batch
    bad = dict(batch, latents=np.full_like(batch["latents"], np.nan))
    # the first tests' program (same shapes and options): no compile of its own
    cfg = GRPOConfig(train_steps=2, minibatches=2, lr=1e-3, beta=0.0)
    trainer = GRPOTrainer(graphdef, state, cfg, SAMPLER)
    with pytest.raises(FloatingPointError, match="iteration 7"):
        trainer.update(bad, jax.random.key(0), step=7)


def test_lora_merge_is_w_plus_scaled_ab():
    _, _, state = micro_model()
    lora = lora_lib.init_lora(state, 2, jax.random.key(0))
    key = next(iter(lora))
    lora[key]["b"] = jnp.ones_like(lora[key]["b"])
    merged = nnx.to_pure_dict(lora_lib.merge(state, lora, 0.5))
    base = nnx.to_pure_dict(state)
    def flat(tree):
        return {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(tree)}

    flat_m, flat_b = flat(merged), flat(base)
    np.testing.assert_allclose(flat_m[key], flat_b[key] + 0.5 * lora[key]["a"] @ lora[key]["b"],
                               rtol=1e-5, atol=1e-6)


def test_cps_last_step_is_deterministic_and_its_kl_is_zero_not_nan():
    # CPS's noise is sigma_next * sin(a pi / 2): the step into sigma = 0 has none. It is not a
    # stochastic (trained) step, and a KL term over it must be 0, not 0 / 0.
    cps = SamplerConfig(num_steps=4, shift=3.0, noise_level=0.7, sde_type="cps")
    np.testing.assert_array_equal(cps.stochastic_steps(), [1, 1, 1, 0])
    cfg, graphdef, state = micro_model(seed=3)
    prompts = ["a red bar"] * 4 + ["two blue squares"] * 4
    tokens, mask = world.tokenize(prompts, cfg.text_len)
    out = Sampler(graphdef, (16, 16, 3), cps).rollout(state, tokens, mask, np.arange(8))
    lp = np.asarray(out["log_probs"])
    assert (lp[:, 3] == 0).all() and (lp[:, :3] != 0).all()
    r = np.array([0.1, 0.5, 0.9, 0.3, 0.2, 0.2, 0.8, 0.4], np.float32)
    batch = {k: jnp.asarray(v) for k, v in
             {"latents": out["latents"], "log_probs": out["log_probs"], "tokens": tokens,
              "mask": mask, "advantages": advantages(r, np.repeat([0, 1], 4))}.items()}
    ref_state = jax.tree.map(lambda x: x + 0.01, state)

    @jax.jit        # one compilation for both step indices (eager, each op compiles alone)
    def kl(steps):
        _, m = grpo_loss(nnx.merge(graphdef, state), batch, steps, cps, GRPOConfig(beta=0.1),
                         nnx.merge(graphdef, ref_state))
        return m["kl"]

    assert float(kl(jnp.full((8, 1), 3, jnp.int32))) == 0.0
    first = float(kl(jnp.zeros((8, 1), jnp.int32)))
    assert np.isfinite(first) and first > 0.0


@pytest.mark.e2e   # ~15 s: a Flow-GRPO ablation option, kept out of the 10-minute default suite
def test_block_noise_kl_splits_into_subspace_and_detail_terms(rollout_batch):
    """With block noise the KL term splits orthogonally: its on-subspace and within-block
    (detail) parts add up to the whole mean difference's term, detail_beta weighs the second
    alone, and per-pixel noise has no detail part."""
    graphdef, state, batch = rollout_batch
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    ref = nnx.merge(graphdef, jax.tree.map(lambda x: x + 0.01, state))
    pol = nnx.merge(graphdef, state)
    idx = jnp.array([[0, 2]] * 8, jnp.int32)
    block = SamplerConfig(num_steps=4, shift=3.0, noise_level=0.7, noise_patch=4)
    loss, m = grpo_loss(pol, b, idx, block, GRPOConfig(beta=0.1), ref)
    _, m_pix = grpo_loss(pol, b, idx, SAMPLER, GRPOConfig(beta=0.1), ref)
    # the detail term equals a direct computation from the two policies' step means
    from spotlight_jax.diffusion import velocity
    from spotlight_jax.diffusion.rollout import step_fn
    from spotlight_jax.diffusion.sde import block_project
    sig = jnp.asarray(block.sigmas)
    x, xn = b["latents"][:, 2], b["latents"][:, 3]
    step = step_fn(block)
    means, std = [], None
    for model in (pol, ref):
        v = velocity(model, x, sig[2], b["tokens"], b["mask"], guidance=1.0)
        _, _, mu, std = step(x, v, sig[2], sig[3], noise_level=0.7, prev_sample=xn,
                             sigma_max=sig[1])
        means.append(mu)
    d = means[0] - means[1]
    det = d - block_project(d, 4)
    per = jnp.mean(det.reshape(8, -1) ** 2, -1) / (2 * std.reshape(8, -1)[:, 0] ** 2)
    used = b["advantages"] != 0               # the loss skips zero-advantage samples
    want_detail = float(per[used].mean())
    # idx trains steps 0 and 2 of each trajectory: the metric averages both
    assert float(m["kl_detail"]) > 0 and float(m["kl"]) > float(m["kl_detail"])
    _, m2 = grpo_loss(pol, b, jnp.array([[2]] * 8, jnp.int32), block, GRPOConfig(beta=0.1), ref)
    np.testing.assert_allclose(float(m2["kl_detail"]), want_detail, rtol=1e-4)
    assert float(m_pix["kl_detail"]) == 0.0
    # detail_beta: the loss moves by (detail_beta - beta) * kl_detail, nothing else changes
    loss2, m3 = grpo_loss(pol, b, idx, block, GRPOConfig(beta=0.1, detail_beta=2.0), ref)
    np.testing.assert_allclose(float(loss2 - loss), (2.0 - 0.1) * float(m["kl_detail"]),
                               rtol=1e-4)
    assert float(m3["kl"]) == float(m["kl"])


def test_gradient_bench_summary_shares_and_cosines():
    """studies.grpo_gradient's per-step table: energy shares sum to 1, cosines of agreeing and
    opposing batch gradients are +1 and -1."""
    from spotlight_jax.studies.grpo_gradient import summarize
    grads = {0: [np.array([1.0, 0.0]), np.array([1.0, 0.0])],
             1: [np.array([0.0, 3.0]), np.array([0.0, -3.0])]}
    (j0, share0, cos0), (j1, share1, cos1) = summarize(grads)
    assert (j0, j1) == (0, 1)
    np.testing.assert_allclose([share0, share1, cos0, cos1], [0.1, 0.9, 1.0, -1.0], atol=1e-12)
    from spotlight_jax.studies.grpo_gradient import update_cosine
    # whole update: step 1 dominates the plain sum (cos -1); weighing it down to step 0's
    # scale leaves the agreeing step 0 in charge
    assert update_cosine(grads, {0: 1.0, 1: 1.0}) == pytest.approx((1 - 9) / 10)
    assert update_cosine(grads, {0: 1.0, 1: 0.0}) == pytest.approx(1.0)


def test_score_scales_are_the_sde_steps_score_factor():
    """c_j from the formula = |d mean / d v| / noise scale measured through sde_step itself."""
    from spotlight_jax.diffusion import sde_step
    from spotlight_jax.rl.grpo import score_scales, step_weights
    smp = SamplerConfig(num_steps=6, shift=3.0, noise_level=0.7, sde_window=(0, -1))
    sig = smp.sigmas
    c = score_scales(smp)
    x = jnp.zeros((1, 4, 4, 3))
    for j in range(smp.num_steps):
        if not smp.stochastic_steps()[j]:
            assert c[j] == 0.0
            continue
        kw = dict(noise_level=smp.noise_level, prev_sample=x, sigma_max=sig[1])
        _, _, m0, std = sde_step(x, jnp.zeros_like(x), sig[j], sig[j + 1], **kw)
        _, _, m1, _ = sde_step(x, jnp.ones_like(x), sig[j], sig[j + 1], **kw)
        scale = float(std.ravel()[0]) * np.sqrt(sig[j] - sig[j + 1])
        np.testing.assert_allclose(c[j], abs(float((m1 - m0).ravel()[0])) / scale, rtol=1e-5)
    w = step_weights(smp, "score")
    on = c > 0
    # equal weighted score factor on every SDE step, total energy unchanged
    np.testing.assert_allclose(w[on] * c[on], (w[on] * c[on])[0], rtol=1e-12)
    np.testing.assert_allclose(np.sum((w * c)[on] ** 2), np.sum(c[on] ** 2), rtol=1e-12)
    np.testing.assert_array_equal(step_weights(smp, "uniform"), 1.0)
    with pytest.raises(ValueError, match="use one of"):
        step_weights(smp, "snr")
    with pytest.raises(ValueError, match="sde_type='sde'"):
        step_weights(SamplerConfig(num_steps=4, sde_type="cps", noise_level=0.7), "score")


@pytest.mark.e2e   # ~20 s: a Flow-GRPO ablation option, kept out of the 10-minute default suite
def test_score_step_weight_scales_each_steps_gradient(rollout_batch):
    """The loss over all steps with step_weight='score' has the gradient of the weighted mean
    of the single-step losses' gradients (no KL: the loss is linear in the steps' terms)."""
    from spotlight_jax.rl.grpo import step_weights
    graphdef, state, batch = rollout_batch
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    n = b["latents"].shape[0]
    w = step_weights(SAMPLER, "score")
    assert w.max() / w.min() > 2      # the test has something to tell apart

    @functools.partial(jax.jit, static_argnums=0)
    def grad_of(cfg, idx):
        return jax.grad(lambda s: grpo_loss(nnx.merge(graphdef, s), b, idx, SAMPLER, cfg,
                                            None, True)[0])(state)

    def grad(cfg, idx):
        return np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(grad_of(cfg, idx))])

    uniform, score = GRPOConfig(beta=0.0), GRPOConfig(beta=0.0, step_weight="score")
    steps = range(SAMPLER.num_steps)
    singles = [grad(uniform, jnp.full((n, 1), j, jnp.int32)) for j in steps]
    both = jnp.broadcast_to(jnp.arange(SAMPLER.num_steps, dtype=jnp.int32), (n, 4))
    want = sum(w[j] * singles[j] for j in steps) / SAMPLER.num_steps
    got = grad(score, both)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
    # and it is not the uniform gradient
    assert np.abs(grad(uniform, both) - got).max() > 0.1 * np.abs(got).max()
