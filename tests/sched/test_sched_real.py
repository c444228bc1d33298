"""The real model path of the scheduler: the micro MMDiT through ``Sampler.segment`` on SP groups
of emulated devices, under a preemption notice, an abrupt loss, rejoins and a corrupted commit.
The trajectories (latents, log-probs, final images) equal an undisturbed run bit for bit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import MICRO

from spotlight_jax.diffusion import SamplerConfig, initial_noise
from spotlight_jax.elastic import GroupConfig, PoolConfig
from spotlight_jax.models import MMDiT
from spotlight_jax.sched import (
    RequestQueue,
    SamplerCache,
    SamplerStepper,
    SimConfig,
    SimEvent,
    Simulation,
    WorkerConfig,
    make_requests,
    results_equal,
)

PROMPTS = ["a red bar", "two blue squares", 'the text "37"', "a green square"]
T = 4


def random_params(cfg, seed=0):
    """The micro model's graph with random parameters filled from numpy: no init program to
    compile (``helpers.micro_model`` runs the initialisers eagerly, ~30 s on a loaded 2-core
    machine). Kernels ~ N(0, 1/fan_in), norm scales ~ 1, biases and the rest small."""
    abstract = nnx.eval_shape(lambda: MMDiT(cfg, rngs=nnx.Rngs(0)))
    graphdef, shapes = nnx.split(abstract)
    rng = np.random.default_rng(seed)

    def fill(path, a):
        name = jax.tree_util.keystr(path)
        x = rng.standard_normal(a.shape)
        if "scale" in name:
            x = 1.0 + 0.05 * x
        elif a.ndim > 1:
            x = x / np.sqrt(np.prod(a.shape[:-1]))
        else:
            x = 0.05 * x
        return jnp.asarray(x.astype(a.dtype))
    return graphdef, jax.tree_util.tree_map_with_path(fill, shapes)


@pytest.fixture(scope="module")
def micro():
    graphdef, state = random_params(MICRO)
    return MICRO, SamplerCache(graphdef, (16, 16, 3), SamplerConfig(num_steps=T, shift=3.0)), state


def run(micro, pool, events, n=10, sp=0, microbatch=2):
    cfg, cache, state = micro
    q = RequestQueue((16, 16, 3))
    q.submit(make_requests(n - 2, num_steps=T, prompts=PROMPTS)
             + make_requests(2, num_steps=T, prompts=PROMPTS, kind="explore", prefix="e",
                             seed0=100))
    sim = Simulation(q, lambda g: SamplerStepper(cache.get(g), cfg.text_len, g), events,
                     SimConfig(pool=pool, groups=GroupConfig(heads=cfg.num_heads, sp_degree=sp),
                               worker=WorkerConfig(commit_every=2, microbatch=microbatch)),
                     policy=lambda node: (state, 0))
    rep = sim.run()
    assert q.all_done, q.summary()
    q.check_invariants()
    rep.check_accounting()
    return q, rep


def test_real_model_resumes_bit_identically_across_groups(micro):
    # two single-device nodes: programs compile once per device tuple (shared by the
    # undisturbed and the disturbed run, and by a node that rejoins with the same device)
    # one row per call: on some CPUs (AMD EPYC seen) XLA:CPU rounds a row differently by its
    # position in the batch, and a moved request may land in another slot (worker.py)
    pool = PoolConfig(nodes=(("od0", "on_demand", 1), ("spot0", "spot", 1)))
    ref, ref_rep = run(micro, pool, [], microbatch=1)
    events = [SimEvent(2.0, "notice", "spot0", deadline=12.0),   # mid-chunk: commit, stop
              SimEvent(12.0, "loss", "spot0"),
              SimEvent(13.0, "join", "spot0"),
              SimEvent(14.0, "corrupt", "od0", fault="dtype"),
              SimEvent(17.0, "loss", "spot0", abrupt=True),          # lease expires later
              SimEvent(18.0, "join", "spot0")]
    q, rep = run(micro, pool, events, microbatch=1)
    assert rep.num_events == 6 and q.stats["rejected"] == 1 and q.stats["expired_leases"] >= 1
    assert [n["ok"] and n["lost_steps"] == 0 for n in rep.notices] == [True]
    assert rep.losses and all(x["max_lost_per_request"] <= 2 for x in rep.losses)
    assert rep.wasted_steps > 0                        # the abrupt loss and the rejection
    # moved between groups, and still the same bits as the undisturbed run
    assert {c.group_id.split("[")[0] for c in q.completed().values()} == {"od0", "spot0"}
    assert results_equal(ref.results(), q.results()) == []
    for r in q.results().values():
        assert r.state.layouts == ("b1/sp1/dense",)
        if r.kind == "rollout":
            tr = r.trajectory()
            assert tr["latents"].shape == (T + 1, 16, 16, 3) and tr["log_probs"].shape == (T,)
            np.testing.assert_array_equal(
                tr["latents"][0], np.asarray(initial_noise(np.array([r.seed], np.uint32),
                                                           (16, 16, 3))[0]))
            assert np.isfinite(tr["log_probs"]).all()
            np.testing.assert_array_equal(tr["images"], ref.request(r.rid).image())


@pytest.mark.slow
def test_real_model_on_sp2_ulysses_groups(micro):
    """Groups of 2 devices (Ulysses over the 4 heads): a request moved between two groups with
    the same signature is bit-identical (slow: two SP compiles)."""
    pool = PoolConfig(nodes=(("od0", "on_demand", 2), ("spot0", "spot", 2)))
    ref, _ = run(micro, pool, [], n=6)
    events = [SimEvent(2.0, "notice", "spot0", deadline=12.0), SimEvent(12.0, "loss", "spot0"),
              SimEvent(13.0, "join", "spot0")]
    q, rep = run(micro, pool, events, n=6)
    assert results_equal(ref.results(), q.results()) == []
    assert {lay for r in q.results().values() for lay in r.state.layouts} == {"b2/sp2/ulysses"}
