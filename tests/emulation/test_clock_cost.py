"""Clocks (composition, busy/alive accounting, exact state round-trip, events) and cost models
(FLOP formula vs the real model's jaxpr, profile scaling, prices, calibration, bad inputs)."""
import dataclasses
import json
import math
import pathlib
import runpy
import time

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from helpers import dot_flops

from spotlight_jax import config as conf
from spotlight_jax.emulation import calibration, cost_models, datasheets, flops
from spotlight_jax.emulation import clock as clock_lib
from spotlight_jax.emulation.clock import DeviceGroup, EventCursor, VirtualClock, WallClock
from spotlight_jax.emulation.cost_models import CostConfig, Workload
from spotlight_jax.models import MMDiT, MMDiTConfig

OD = DeviceGroup("od0", "on_demand", 4)
SPOT = DeviceGroup("spot0", "spot", 2)
CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
# The cost section of configs/base.py: the paper deployment, its profile model loaded from
# configs/qwen_image.py.
PAPER = conf.cost_config(conf.load_config("base"))


def paper(**fields) -> CostConfig:
    return dataclasses.replace(PAPER, **fields)


# ----------------------------------------------------------------------------------- clocks

def test_concurrent_is_max_sequential_is_sum_and_nesting():
    c = VirtualClock()
    with c.concurrent() as ph:
        ph.run("train", OD, 3.0)
        ph.run("explore", SPOT, 2.5)
    assert c.now() == 3.0
    with c.sequential() as ph:
        ph.run("rollout", OD, 1.0)
        ph.run("broadcast", SPOT, 0.25)
    assert c.now() == 4.25
    # concurrent of (train 2.0) and (explore 1.5 + explore 1.0): the explore chain is longer
    with c.concurrent() as ph:
        ph.run("train", OD, 2.0)
        with ph.sequential() as s:
            s.run("explore", SPOT, 1.5)
            s.run("explore", SPOT, 1.0)
    assert c.now() == 6.75
    c.charge(OD, 0.25, "select")        # outside phases: advances directly
    assert c.now() == 7.0
    assert c.busy_device_seconds("on_demand", "train") == 4 * 5.0
    assert c.busy_device_seconds("spot", "explore") == 2 * 5.0
    assert c.busy_device_seconds(label="rollout") == 4.0
    bd = c.breakdown()
    # critical path: 3.0 train, 1.0 rollout, 0.25 broadcast, 2.5 explore, 0.25 select
    assert bd["train"]["critical_s"] == 3.0 and bd["explore"]["critical_s"] == 2.5
    assert sum(v["critical_s"] for v in bd.values()) == c.now()
    assert bd["explore"]["charged_s"] == 5.0


def test_run_calls_fn_and_returns_its_result():
    c = VirtualClock()
    with c.concurrent() as ph:
        out = ph.run("train", OD, 2.0, lambda a, b=0: a + b, 1, b=2)
        with ph.timed("explore", SPOT, 1.0):
            pass
    assert out == 3 and c.now() == 2.0


def test_busy_alive_and_utilisation():
    c = VirtualClock()
    c.set_alive("on_demand", 4, at=0.0)
    c.set_alive("spot", 8, at=0.0)
    c.set_alive("spot", 6, at=5.0)          # a scheduled preemption at t=5
    with c.concurrent() as ph:
        ph.run("train", OD, 10.0)
        ph.run("explore", SPOT, 4.0)
    assert c.alive("spot") == 6 and c.alive("spot", at=4.9) == 8
    assert c.alive_device_seconds("spot") == 8 * 5 + 6 * 5
    assert c.alive_device_seconds("on_demand") == 40.0
    c.set_alive("spot", 8, at=12.0)         # a join in the future
    c.wait(4.0)
    assert c.alive_device_seconds("spot") == 70 + 6 * 2 + 8 * 2
    assert c.utilisation("spot") == pytest.approx(2 * 4.0 / 98)
    assert c.utilisation("on_demand") == pytest.approx(40 / 56)
    s = c.summary()
    assert s["busy_spot_device_s"] == 8.0 and s["time_s"] == 14.0
    with pytest.raises(ValueError, match="time order"):
        c.set_alive("spot", 2, at=11.0)
    assert VirtualClock().utilisation("spot") == 0.0


def test_state_round_trip_is_exact_through_json():
    a = VirtualClock()
    a.set_alive("on_demand", 4, at=0.0)
    a.set_alive("spot", 8, at=0.0)
    with a.concurrent() as ph:
        ph.run("train", OD, 1 / 3)
        ph.run("explore", SPOT, math.pi / 10)
    a.set_alive("spot", 5, at=0.1)
    a.charge(SPOT, 0.7, "rollout")
    state = a.state_dict()
    b = VirtualClock()
    b.load_state_dict(json.loads(json.dumps(state)))
    assert b.state_dict() == state
    for clk in (a, b):                       # and both continue identically
        with clk.concurrent() as ph:
            ph.run("train", OD, 0.1)
            ph.run("explore", SPOT, 0.2)
        clk.set_alive("spot", 7)
    assert a.state_dict() == b.state_dict() and a.now() == b.now()
    with pytest.raises(ValueError, match="kind"):
        WallClock().load_state_dict(state)
    with a.sequential(), pytest.raises(RuntimeError, match="open"):
        a.state_dict()


def test_wall_clock_measures_real_time():
    c = WallClock(start=100.0)
    with c.concurrent() as ph:
        ph.run("train", OD, None, time.sleep, 0.05)
        ph.run("explore", SPOT, 0.01)        # a duration the caller measured itself
    t = c.busy_device_seconds("on_demand", "train") / 4
    assert 0.045 <= t < 0.5
    assert c.busy_device_seconds("spot") == pytest.approx(0.02)
    assert 100.045 <= c.now() < 101.0
    state = json.loads(json.dumps(c.state_dict()))
    d = WallClock()
    d.load_state_dict(state)
    assert d.now() >= state["now"]


def test_events_until_and_cursor_state():
    @dataclasses.dataclass(frozen=True)
    class E:
        time: float
        kind: str

    events = [E(1.0, "notice"), E(3.0, "loss"), E(3.0, "join"), E(7.5, "loss")]
    due, nxt = clock_lib.events_until(events, 3.0)
    assert [e.kind for e in due] == ["notice", "loss", "join"] and nxt == 3
    cur = EventCursor(events)
    assert cur.events_until(0.5) == [] and cur.next_time() == 1.0
    assert len(cur.events_until(3.0)) == 3
    resumed = EventCursor(events)
    resumed.load_state_dict(json.loads(json.dumps(cur.state_dict())))
    assert resumed.events_until(100.0) == [events[3]] and resumed.next_time() is None
    with pytest.raises(ValueError, match="sorted"):
        EventCursor([E(2.0, "a"), E(1.0, "b")])


def test_roles_match_the_device_pool():
    from spotlight_jax.elastic.pool import ROLES
    assert clock_lib.ROLES == ROLES


# ------------------------------------------------------------------------------ FLOP count

TINY = [
    MMDiTConfig(image_size=8, channels=3, patch_size=2, width=32, depth=2, num_heads=2,
                mlp_ratio=3.0, vocab_size=11, text_len=5, text_width=16, text_layers=1,
                text_heads=2, conv_stem=4, conv_head=True),
    MMDiTConfig(image_size=8, channels=4, patch_size=2, width=32, depth=3, num_heads=4,
                mlp_ratio=4.0, text_len=6, text_width=0, text_embed_dim=12, remat=True,
                scan_blocks=True),
    # Flux's structure: single-stream blocks after the dual ones, the guidance MLP, its RoPE
    MMDiTConfig(image_size=8, channels=4, patch_size=2, width=32, depth=2, num_heads=2,
                text_len=6, text_width=0, text_embed_dim=12, single_blocks=3,
                guidance_embed=True, pos_embed="rope3d_flux", rope_axes=(4, 6, 6),
                use_text_mask=False),
    # Qwen-Image-Edit-2511's structure: two reference images, reference tokens at t = 0
    MMDiTConfig(image_size=8, channels=4, patch_size=2, width=32, depth=2, num_heads=2,
                text_len=6, text_width=0, text_embed_dim=12, pos_embed="rope3d",
                rope_axes=(4, 6, 6), pooled="none", reference_images=2, reference_zero_t=True),
    # our editing model: a conv stem over the references too, a learned slot embedding
    MMDiTConfig(image_size=8, channels=3, patch_size=2, width=32, depth=1, num_heads=2,
                vocab_size=11, text_len=5, text_width=16, text_layers=1, text_heads=2,
                conv_stem=4, reference_images=1),
]


@pytest.mark.parametrize("cfg", TINY, ids=["encoder+conv", "embeddings+scan+remat",
                                           "single_blocks+guidance", "edit+zero_t",
                                           "edit+stem"])
def test_flop_formula_matches_the_model_jaxpr(cfg):
    """The formula counts exactly the matmul/conv FLOPs of the real model (relative error 0:
    both are integers and must agree); params too."""
    # Abstract parameters (eval_shape): nothing is initialised or run, only traced.
    graphdef, state = nnx.split(nnx.eval_shape(lambda: MMDiT(cfg, rngs=nnx.Rngs(0))))
    b, f32 = 2, jnp.float32
    x = jax.ShapeDtypeStruct((b, cfg.image_size, cfg.image_size, cfg.channels), f32)
    t = jax.ShapeDtypeStruct((b,), f32)
    tok = (jax.ShapeDtypeStruct((b, cfg.text_len), jnp.int32) if cfg.text_width
           else jax.ShapeDtypeStruct((b, cfg.text_len, cfg.text_embed_dim), f32))
    mask = jax.ShapeDtypeStruct((b, cfg.text_len), jnp.bool_)
    args = (x, t, tok, mask) + ((None, t) if cfg.guidance_embed else ())   # pooled, guidance
    refs = [x] * cfg.reference_images or None       # every slot at the target's size
    jaxpr = jax.make_jaxpr(lambda st, r, *a: nnx.merge(graphdef, st)(*a, image_latents=r))(
        state, refs, *args)
    ref = dot_flops(jaxpr.jaxpr)
    assert flops.forward_flops(cfg, batch=b) == ref
    n_params = sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(state, nnx.Param)))
    assert flops.param_count(cfg) == n_params


def test_paper_profile_tokens_params_and_flops():
    p = cost_models.profile_for(PAPER.profile_model, 512)
    assert p.tokens == (256, 1024)                       # 512 / 8 / 2 = 32 -> 1024 patches
    assert 20.0e9 < p.params < 21.0e9                    # "20B"
    m, s = p.model, 1280
    per_block = 2 * s * 3072 * (4 * 3072 + 2 * 12288) + 4 * s * s * 3072
    assert p.flops == pytest.approx(60 * per_block, rel=2e-3)   # embeddings/adaLN: 0.11%
    assert m.image_size == 64


def test_profile_model_matches_the_qwen_config():
    from spotlight_jax.config import model_config
    cfg = runpy.run_path(str(CONFIGS / "qwen_image.py"))["get_config"]()
    assert model_config(cfg) == PAPER.profile_model


# ---------------------------------------------------------------------------- profile model

def test_profile_scales_with_batch_and_sp_degree():
    p = cost_models.make_cost_model(paper(), Workload(lora_rank=32))
    # compute-bound at batch 8: doubling the batch doubles the step (no comm at SP 1)
    assert p.rollout_step(16, 1) == pytest.approx(2 * p.rollout_step(8, 1), rel=1e-12)
    # SP k splits the compute; communication is added on top
    for k in (2, 4):
        comp = p.rollout_step(8, 1) / k
        assert p.rollout_step(8, k) == pytest.approx(comp + p.sp_comm(8, k), rel=1e-12)
        assert p.rollout_step(8, k) < p.rollout_step(8, k // 2)
        assert 0 < p.sp_comm(8, k) < 0.1 * comp
    assert p.sp_strategy(4) == "ulysses" and p.sp_strategy(5) == "ring"   # 24 heads
    # the weight-streaming floor binds at tiny per-device work
    floor = p.weight_bytes / (3350e9 * 0.7)
    assert p.rollout_step(1, 8) == pytest.approx(floor + p.sp_comm(1, 8))
    assert p.rollout(4, 2) == 10 * p.rollout_step(4, 2)
    assert p.rollout(4, 2, num_steps=3) == 3 * p.rollout_step(4, 2)
    # training: 4 steps x (1 fwd + 1 bwd(LoRA) + remat + KL) x CFG 2 = 32 forwards
    assert p.train_passes() == 8.0
    assert p.train_sample(1) == pytest.approx(32 * p.flops / (989e12 * 0.4))
    rescored = cost_models.make_cost_model(paper(), Workload(lora_rank=32, rescore=True))
    assert rescored.train_passes() == 10.0     # + one re-score forward per step, x CFG 2
    assert p.train_sample(4) == pytest.approx(p.train_sample(1) / 4)
    assert p.train(6, 4) == pytest.approx(6 * p.train_sample(4))
    full = cost_models.make_cost_model(paper(lora_rank=0), Workload(kl=False))
    assert full.train_passes() == 2 * (1 + 2 + 1 + 0 + 0)   # fwd, bwd, remat, no KL, no re-score
    assert full.broadcast() == pytest.approx(full.weight_bytes * 8 / 100e9)
    h = cost_models.make_cost_model(paper(device="a100_sxm"), Workload())
    assert h.rollout_step(8) == pytest.approx(p.rollout_step(8) * 989 / 312)
    assert p.regroup("shrink") < p.regroup("grow") < 1.0 < p.regroup("cold")
    names = {a.name for a in p.describe()}
    assert {"mfu", "peak_bf16", "spot_price", "forward_flops", "cfg_passes"} <= names
    assert all(a.source for a in p.describe())


def test_cost_config_section_round_trip_and_workload():
    base = runpy.run_path(str(CONFIGS / "base.py"))["get_config"]()
    qwen = runpy.run_path(str(CONFIGS / "qwen_image.py"))["get_config"]()
    assert conf.cost_config(base) == CostConfig(profile_model=conf.model_config(qwen))
    base.cost.mfu = 0.5
    assert conf.cost_config(base).mfu == 0.5
    # the forward-process objective (base.py's default) trains K flow times per image, each with
    # the old policy's forward; its KL weight adds the reference's
    assert conf.workload(base) == Workload(
        num_steps=10, train_steps=base.rl.nft.times, inner_epochs=1, kl=True, cfg_passes=1,
        lora_rank=16, extra_forwards=0)
    # the objective's own account of its numbers, which the report prints as they are
    rows = cost_models.make_cost_model(conf.cost_config(base), conf.workload(base)).describe()
    assert ("train_steps", base.rl.nft.times, "flow times/image") in {
        (a.name, a.value, a.unit) for a in rows}
    base.rl.nft.kl_beta = 1e-4
    assert conf.workload(base).extra_forwards == 1
    nft_cost = cost_models.make_cost_model(conf.cost_config(base), conf.workload(base))
    base.rl.objective = "flow_grpo"
    w = conf.workload(base)
    # Flow-GRPO on base.py trains every SDE step (train_steps = 0; its window is steps 0-7)
    # with LoRA rank 16 and the KL reference forward
    grpo_cost = cost_models.make_cost_model(conf.cost_config(base), w)
    # per trained pair nft runs v_old and the reference: one forward (per CFG pass of the
    # profile) more than Flow-GRPO's KL reference; per image it trains K = 4 pairs against
    # Flow-GRPO's 8 SDE steps
    p, q = grpo_cost.train_passes(), nft_cost.train_passes()
    assert q == pytest.approx(p + nft_cost.cfg_passes)
    assert nft_cost.train_sample() / grpo_cost.train_sample() == pytest.approx(4 * q / (8 * p))
    assert w == Workload(num_steps=10, train_steps=8, inner_epochs=1, kl=True, cfg_passes=1,
                         lora_rank=16)
    assert ("train_steps", 8, "steps/trajectory") in {
        (a.name, a.value, a.unit) for a in grpo_cost.describe()}
    base.sampler.sde_window = None
    assert conf.workload(base).train_steps == 10
    base.rl.train_steps, base.rl.lora_rank = 4, 0
    assert conf.workload(base) == Workload(
        num_steps=10, train_steps=4, inner_epochs=1, kl=True, cfg_passes=1, lora_rank=0)


# ------------------------------------------------------------------------------------ prices

def test_prices_and_dollars_from_alive_time():
    p = cost_models.make_cost_model(paper(), Workload())
    assert p.price_per_hour("on_demand") == 3.90
    assert p.price_per_hour("spot") == pytest.approx(3.90 * 0.27)       # $1.053
    assert p.dollars_per_hour({"on_demand": 4, "spot": 8}) == pytest.approx(15.6 + 8 * 1.053)
    c = VirtualClock()
    c.set_alive("on_demand", 4, at=0.0)
    c.set_alive("spot", 8, at=0.0)
    c.set_alive("spot", 4, at=1800.0)
    c.run("train", OD, 3600.0)          # spot idle all the time: still paid while alive
    assert p.dollars(c) == pytest.approx(4 * 3.90 + (8 * 0.5 + 4 * 0.5) * 1.053)
    cheap = CostConfig(spot_discount=0.77).prices
    assert cheap.spot_per_hour == pytest.approx(3.90 * 0.23)


# ----------------------------------------------------------------------------------- measured

def test_calibrate_fits_rollout_and_round_trips():
    def rollout(b):
        time.sleep(0.004 + 0.004 * b)

    m = calibration.calibrate(rollout, lambda: time.sleep(0.01), rollout_batches=(1, 3),
                           train_batch=2, repeats=2, warmup=0,
                           workload=Workload(num_steps=5))
    assert m.rollout_step(2) >= 0.008 and m.rollout_step(3) > m.rollout_step(1)
    assert m.rollout_step(4, 2) == pytest.approx(m.rollout_fixed_s + 2 * m.rollout_per_sample_s)
    assert m.rollout(1) == 5 * m.rollout_step(1)
    assert 0.005 <= m.train_sample() < 0.5 and m.train_sample(2) == m.train_sample() / 2
    assert m.reward(3) == pytest.approx(0.3) and m.broadcast() == 0.0
    back = cost_models.MeasuredCost.from_state_dict(json.loads(json.dumps(m.state_dict())))
    assert back.state_dict() == m.state_dict()
    assert cost_models.make_cost_model(CostConfig(model="measured"), measured=m) is m
    assert {a.name for a in m.describe()} >= {"rollout_per_sample", "sp_scaling", "spot_price"}
    assert calibration.fit_line([1, 2], [2.0, 1.0]) == (1.5, 0.0)   # noise: no negative slope


# --------------------------------------------------------------------------------- bad inputs

def _with_cost_field(name, value):
    c = conf.load_config("base")
    c.cost[name] = value
    return c


@pytest.mark.parametrize("make, match", [
    (lambda: VirtualClock().charge(OD, -1.0, "train"), ">= 0"),
    (lambda: VirtualClock().run("train", OD, float("nan")), ">= 0"),
    (lambda: VirtualClock().run("train", OD), "needs the modelled duration"),
    (lambda: VirtualClock().charge(object(), 1.0, "x"), "on_demand"),
    (lambda: DeviceGroup("g", "preemptible", 2), r"roles are \('on_demand', 'spot'\)"),
    (lambda: VirtualClock().set_alive("spot", -1), ">= 0"),
    (lambda: clock_lib.make_clock("fast"), r"\('virtual', 'wall'\)"),
    (lambda: CostConfig(device="tpu_v9"), "a100_sxm.*h100_sxm.*h200_sxm"),
    (lambda: datasheets.device_spec("b200"), "h100_sxm"),
    (lambda: CostConfig(model="guess"), r"\('profile', 'measured'\)"),
    (lambda: conf.cost_config(_with_cost_field("mfuu", 0.3)), "valid fields"),
    (lambda: cost_models.make_cost_model(CostConfig(model="measured")), "calibrat"),
    (lambda: cost_models.make_cost_model(paper()).rollout_step(0), "positive integer"),
    (lambda: cost_models.make_cost_model(paper()).regroup("warm"), "shrink"),
    (lambda: cost_models.Prices().per_hour("reserved"), "on_demand"),
])
def test_bad_inputs_raise_value_error_naming_choices(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("name", ["qwen_image_edit", "z_image", "flux2_dev", "flux2_klein_4b"])
def test_every_paper_scale_family_is_a_cost_profile(name):
    """``cost.profile_model`` may name any paper-scale config: its model times the emulated
    deployment (its FLOPs at ``cost.image_pixels``, its parameters for the broadcast), and the
    assumptions table names it."""
    base = conf.load_config("base", {"cost.profile_model": name})
    cost = conf.cost_config(base)
    model = cost.profile_model
    profile = cost_models.profile_for(model, 512, cost)
    assert profile.flops == flops.forward_flops(dataclasses.replace(model, image_size=64))
    assert profile.params == flops.param_count(model)
    assert profile.rollout_step(8, sp=2) > 0 and profile.train_sample() > 0
    assert profile.broadcast() > 0
    rows = {a.name: a for a in profile.describe()}
    assert type(model).__name__.removesuffix("Config") in rows["model"].value
