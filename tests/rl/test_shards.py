"""The sharded update equals the single-program update: nft and Flow-GRPO, LoRA and full
fine-tuning, whoever computes which shard (scrambled order, a shard recomputed after a loss);
a shard is never summed twice and none may be missing."""
import jax
import numpy as np
import pytest
from conftest import SAMPLER as GRPO_SAMPLER
from conftest import nft_batch
from helpers import micro_model

from spotlight_jax.diffusion import SamplerConfig
from spotlight_jax.rl import GRPOConfig, GRPOTrainer, NFTConfig, NFTTrainer
from spotlight_jax.rl import shards as shards_lib

NFT_SAMPLER = SamplerConfig(num_steps=4, shift=3.0, noise_level=0.0, sde_type="ode")


def _trainers(objective, lora, request):
    """Two trainers in the same state, and the batch they train on."""
    rank = {"lora_rank": 2, "lora_alpha": 4.0} if lora else {"lora_rank": 0}
    if objective == "nft":
        cfg, graphdef, state = micro_model()
        ncfg = NFTConfig(lr=LR, times=2, minibatches=2, eta_rate=0.3, kl_beta=0.01, **rank)
        make = lambda: NFTTrainer(graphdef, state, ncfg, NFT_SAMPLER)  # noqa: E731
        return make(), make(), nft_batch(cfg, n=8)
    graphdef, state, batch = request.getfixturevalue("rollout_batch")
    gcfg = GRPOConfig(train_steps=2, minibatches=2, lr=LR, beta=0.02, **rank)
    make = lambda: GRPOTrainer(graphdef, state, gcfg, GRPO_SAMPLER)  # noqa: E731
    return make(), make(), batch


def _scrambled(lost=()):
    """A runner that computes the shards out of order; a shard in ``lost`` is computed once by
    a group that is then lost (its result never arrives) and again by another."""
    seen = []

    def run(step: shards_lib.ShardedStep):
        order = list(range(step.shards))[::-1]
        results = []
        for i in order:
            if i in lost:
                step.compute(i)               # the lost group's work: thrown away
            results.append(step.compute(i))
        seen.append(step.version)
        return step.apply(results)

    return run, seen


def _close(a, b, rtol, atol=0.0):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        scale = max(float(np.abs(y).max()), 1e-12)
        err = float(np.abs(x - y).max())
        assert err <= rtol * scale + atol, (err, scale)


def _close_weights(a, b, rtol, atol, step):
    """Weights after Adam steps: every element within ``rtol``/``atol`` but at most 1 in 10^4 of
    them (never more than the two runs' ``step`` s apart: each moved at most that far). Adam
    divides each gradient element by its own running magnitude, so an element whose gradient
    is ~0 turns the summation order's float rounding into a visible fraction of a step: on
    one machine 2 of 159,304 full-fine-tuning weights of Flow-GRPO's two updates landed 1.4%
    of a step apart, on others none. The gradients themselves are held to 1e-5 relative (the
    grad norm here; the test below), which a missing or doubled shard breaks by 25% or more."""
    total = far = 0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        err = np.abs(x - y)
        assert float(err.max()) <= 2 * step, (float(err.max()), step)
        far += int((err > rtol * max(float(np.abs(y).max()), 1e-12) + atol).sum())
        total += err.size
    assert far <= total // 10_000, (far, total)


LR = 1e-3
# weights: 1% of a step (lr) per optimizer step taken, for all but 1 in 10^4 of them
# (_close_weights); the gradients themselves (test below) to 1e-5 relative.
STEP_TOL = 1e-2 * LR


# two updates of both kinds compile four programs (~20-45 s a case on 2 cores): these run with
# -m e2e; the default suite keeps the gradient checks below and the run-level check
# (tests/runner/test_shared_update.py)
@pytest.mark.e2e
@pytest.mark.parametrize("objective,lora", [("nft", True), ("nft", False),
                                            ("flow_grpo", True), ("flow_grpo", False)])
def test_sharded_update_equals_the_single_program_update(objective, lora, request):
    a, b, batch = _trainers(objective, lora, request)
    taken = 0                              # optimizer steps so far
    for step in range(2):                  # the second update starts from Adam's moments
        ma = a.update(batch, jax.random.key(step), step)
        run, versions = _scrambled(lost={1})
        mb = b.update_sharded(batch, jax.random.key(step), step, shards=4, run=run)
        assert versions == ([step] if objective == "nft" else [2 * step, 2 * step + 1])
        taken += len(versions)
        for key in ("loss", "grad_norm"):
            np.testing.assert_allclose(mb[key], ma[key], rtol=1e-5)
        _close_weights(b.trainable, a.trainable, 1e-5, STEP_TOL * taken, LR * taken)
        for x, y in zip(jax.tree.leaves(b.opt_state), jax.tree.leaves(a.opt_state)):
            if np.issubdtype(np.asarray(x).dtype, np.integer):        # Adam's step counts
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        if objective == "nft":
            _close_weights(b.old, a.old, 1e-5, STEP_TOL * taken, LR * taken)
            np.testing.assert_allclose(mb["policy_shift"], ma["policy_shift"], rtol=1e-4,
                                       atol=1e-9)
        else:
            assert mb["first_ratio_dev"] == ma["first_ratio_dev"] == 0.0
            for key in ("kl", "clip_frac", "approx_kl", "policy_loss"):
                np.testing.assert_allclose(mb[key], ma[key], rtol=1e-4, atol=1e-9)
            assert mb["rollout_logp_gap_by_step"].keys() == ma["rollout_logp_gap_by_step"].keys()


# nft LoRA in the default suite; the other three with -m e2e (~20 s each on 2 cores)
@pytest.mark.parametrize("objective,lora", [
    ("nft", True), pytest.param("nft", False, marks=pytest.mark.e2e),
    pytest.param("flow_grpo", True, marks=pytest.mark.e2e),
    pytest.param("flow_grpo", False, marks=pytest.mark.e2e)])
def test_gradients_of_shards_sum_to_the_whole_steps(objective, lora, request):
    """One shard (the whole step's rows in one program) against four: the summed gradient
    agrees to 1e-5 relative."""
    a, _, batch = _trainers(objective, lora, request)
    grads = {}
    for shards in (1, 4):
        def run(step, shards=shards):
            grads[shards] = shards_lib.sum_results(shards_lib.run_locally(step), shards)[0]
            raise StopIteration       # keep the trainer's state: only the gradient is wanted
        with pytest.raises(StopIteration):
            a.update_sharded(batch, jax.random.key(0), 0, shards=shards, run=run)
    _close(grads[4], grads[1], 1e-5)
    assert max(float(np.abs(np.asarray(g)).max()) for g in jax.tree.leaves(grads[1])) > 0


def test_a_shard_is_summed_once_and_none_is_missing():
    r = [shards_lib.ShardResult(i, {"w": np.ones(2) * i}, {"loss": 1.0}) for i in range(3)]
    grads, metrics = shards_lib.sum_results(r[::-1], 3)
    np.testing.assert_array_equal(grads["w"], [3.0, 3.0])
    assert metrics["loss"] == 3.0
    with pytest.raises(ValueError, match="shard 1 was given twice"):
        shards_lib.sum_results(r + [r[1]], 3)
    with pytest.raises(ValueError, match=r"shards \[2\] have no result"):
        shards_lib.sum_results(r[:2], 3)
    with pytest.raises(ValueError, match=r"3 shards must be >= 1 and divide the 8 images"):
        shards_lib.check_shards(8, 3, "images")
    assert [shards_lib.shard_count(n, 8) for n in (64, 12, 4, 7, 1)] == [8, 6, 4, 7, 1]


# nft LoRA in the default suite; Flow-GRPO with -m e2e (its shard program compiles ~20 s)
@pytest.mark.parametrize("objective", ["nft", pytest.param("flow_grpo", marks=pytest.mark.e2e)])
def test_a_shard_computed_from_its_inputs_elsewhere_equals_the_trainers_own(objective, request):
    """What a spot host does with ``ShardedStep.inputs(i)`` (host arrays, as the object store
    delivers them) and the trainer class's ``shard_program`` over its own copy of the base: the
    gradient and metrics of the trainer's ``compute(i)``."""
    a, _, batch = _trainers(objective, True, request)
    cfg, sampler = a.cfg, (NFT_SAMPLER if objective == "nft" else GRPO_SAMPLER)
    program = type(a).shard_program(a.graphdef, cfg, sampler)
    base = jax.tree.map(np.array, a.base)              # the host's own copy

    def run(step):
        for i in (0, step.shards - 1):
            weights, rows = jax.tree.map(np.asarray, step.inputs(i))
            grads, metrics = program(base, weights, rows)
            want = step.compute(i)
            _close(grads, want.grads, 1e-6)
            assert max(float(np.abs(np.asarray(g)).max()) for g in jax.tree.leaves(grads)) > 0
            for key, v in want.metrics.items():
                np.testing.assert_allclose(np.asarray(metrics[key]), np.asarray(v),
                                           rtol=1e-6, atol=1e-9, err_msg=key)
        raise StopIteration
    with pytest.raises(StopIteration):
        a.update_sharded(batch, jax.random.key(0), 0, shards=4, run=run)
