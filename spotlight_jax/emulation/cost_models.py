"""Cost models: how long each operation takes, and what the devices cost.

The runner charges every operation to a clock (``emulation.clock``); in emulation the durations
come from a cost model, so the time and dollar axes of the report are those of a real deployment
while the learning runs on a tiny model on the CPU. Two models share one interface
(:class:`CostModel`):

* ``profile`` (:class:`ProfileCost`): durations from the MMDiT's FLOP count (``emulation.flops``)
  divided by an assumed achieved throughput of a named accelerator (``emulation.datasheets``:
  peak bf16 x MFU), with a roofline floor for reading the weights from HBM and a communication
  term per sequence-parallel (SP) degree over the device's interconnect (NVLink on a GPU, ICI
  within a TPU slice). The default deployment is the paper's: Qwen-Image's 20B MMDiT at
  512x512 on H100 SXM.
* ``measured`` (:class:`MeasuredCost`): durations calibrated from this machine's real timings
  (``emulation.calibration.calibrate`` times the real rollout step / training step callables).

Prices per device-hour (on-demand and spot) turn the clock's *alive* device-seconds into dollars
(:meth:`CostModel.dollars`): a spot device is paid while it is alive, busy or idle; on-demand
devices are paid all the time. They are the config's (``cost.on_demand_per_hour`` and
``cost.spot_discount``), or with ``cost.price_source='datasheet'`` the device's list prices
(``datasheets.DeviceSpec``: a TPU's on-demand and spot prices per chip-hour).

Every number that is not derived is an assumption with a source: the config section
(``configs/base.py``, ``cost``) has a comment per field, and :meth:`CostModel.describe` returns
``(name, value, unit, source)`` rows that the report prints.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from spotlight_jax.emulation.clock import ROLES, Clock
from spotlight_jax.emulation.datasheets import DEVICES, device_spec
from spotlight_jax.emulation.flops import (
    forward_flops,
    lora_param_count,
    param_count,
    remat_recompute_fraction,
    vae_decode_flops,
)
from spotlight_jax.emulation.profile_file import DeviceProfile
from spotlight_jax.models.factory import is_video
from spotlight_jax.models.mmdit import MMDiTConfig
from spotlight_jax.models.vae.wan_vae import released_vae

COST_MODELS = ("profile", "measured")
REGROUP_KINDS = ("shrink", "grow", "cold")
PRICE_SOURCES = ("config", "datasheet")


@dataclasses.dataclass(frozen=True)
class CostConfig:
    """The ``cost`` config section (``configs/base.py`` documents each field and its source).

    ``profile_model`` is the paper-scale model whose FLOPs time the ``profile`` cost model; the
    config names it by config file (``cost.profile_model = "qwen_image"``) and
    ``config.cost_config`` loads that file's model section, so its shapes live in one place.
    """

    model: str = "profile"
    device: str = "h100_sxm"
    mfu: float = 0.4
    rollout_mfu: float = 0.0
    update_mfu: float = 0.0
    profile_file: str = ""
    mbu: float = 0.7
    nvlink_one_way: float = 0.5
    collective_latency_s: float = 20e-6
    image_pixels: int = 512
    vae_factor: int = 8
    cfg_passes: int = 2
    lora_rank: int = 32
    backward_factor_full: float = 2.0
    backward_factor_lora: float = 1.0
    param_bytes: int = 2
    adapter_bytes: int = 4
    act_bytes: int = 2
    reward_s_per_image: float = 0.1
    network_gbit_s: float = 100.0
    regroup_shrink_s: float = 7.6e-3
    regroup_grow_measured_s: float = 0.644
    regroup_cold_s: float = 120.0
    on_demand_per_hour: float = 3.90
    spot_discount: float = 0.73
    price_source: str = "config"
    profile_model: MMDiTConfig | None = None
    profile: DeviceProfile | None = None

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"{name}={getattr(self, name)!r}: {why}")

        if self.model not in COST_MODELS:
            bad("model", f"choose one of {COST_MODELS}")
        if self.device not in DEVICES:
            bad("device", f"unknown accelerator; choose one of {sorted(DEVICES)}")
        for name in ("mfu", "mbu", "nvlink_one_way"):
            if not 0 < getattr(self, name) <= 1:
                bad(name, "must be in (0, 1] (a fraction of the datasheet peak)")
        for name in ("rollout_mfu", "update_mfu"):
            if not 0 <= getattr(self, name) <= 1:
                bad(name, "must be in [0, 1] (0 = cost.mfu)")
        if not 0 <= self.spot_discount < 1:
            bad("spot_discount", "must be in [0, 1) (e.g. spot_discount=0.73)")
        if self.cfg_passes not in (0, 1, 2):
            bad("cfg_passes", "must be 0 (follow the run's sampler.guidance), 1 or 2")
        if self.lora_rank < -1:
            bad("lora_rank", "must be >= 0, or -1 to follow the run's rl.lora_rank")
        for name in ("collective_latency_s", "reward_s_per_image", "regroup_shrink_s",
                     "regroup_grow_measured_s", "regroup_cold_s", "on_demand_per_hour",
                     "backward_factor_full", "backward_factor_lora"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                bad(name, "must be a finite number >= 0")
        for name in ("image_pixels", "vae_factor", "param_bytes", "adapter_bytes", "act_bytes"):
            if getattr(self, name) < 1:
                bad(name, "must be >= 1")
        if self.image_pixels % self.vae_factor:
            bad("image_pixels", f"must be a multiple of vae_factor={self.vae_factor}")
        if not (math.isfinite(self.network_gbit_s) and self.network_gbit_s > 0):
            bad("network_gbit_s", "must be > 0 (e.g. network_gbit_s=100.0)")
        if self.price_source not in PRICE_SOURCES:
            bad("price_source", f"choose one of {PRICE_SOURCES} (the config's prices, or the "
                                "device's list prices)")
        if self.price_source == "datasheet" and not device_spec(self.device).has_prices:
            bad("price_source", f"device={self.device!r} has no list prices in "
                                "emulation.datasheets; use price_source='config' "
                                "(on_demand_per_hour, spot_discount)")

    @property
    def prices(self) -> Prices:
        """$ per device-hour: the config's, or the device's list prices."""
        if self.price_source == "datasheet":
            d = device_spec(self.device)
            return Prices(d.on_demand_per_hour, 1.0 - d.spot_per_hour / d.on_demand_per_hour,
                          spot_price=d.spot_per_hour, source=f"{d.label}: {d.price_source}")
        return Prices(self.on_demand_per_hour, self.spot_discount)


@dataclasses.dataclass(frozen=True)
class Prices:
    """$ per device-hour: on-demand, and spot = on-demand x (1 - discount), or ``spot_price``
    itself when a list gives it (``source``: where both prices come from; '' = the config's
    assumptions)."""

    on_demand_per_hour: float = 3.90
    spot_discount: float = 0.73
    spot_price: float | None = None
    source: str = ""

    @property
    def spot_per_hour(self) -> float:
        if self.spot_price is not None:
            return self.spot_price
        return self.on_demand_per_hour * (1.0 - self.spot_discount)

    def per_hour(self, role: str) -> float:
        if role == "on_demand":
            return self.on_demand_per_hour
        if role == "spot":
            return self.spot_per_hour
        raise ValueError(f"unknown role {role!r}; roles are {ROLES}")


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one run does per rollout and per trained trajectory (``config.workload`` makes it
    from the run's sampler and rl sections).

    ``train_steps``: trained timesteps per trajectory (already resolved: 0 in the rl config means
    every stochastic step; the forward-process objective: its K flow times per image).
    ``kl``: one frozen-policy forward per trained pair (Flow-GRPO's KL reference; the
    forward-process objective's v_old). ``extra_forwards``: more of them (the forward-process
    objective's reference velocity when its KL weight is > 0). ``cfg_passes``: forwards per step
    of the run (2 with CFG). ``notes``: the report's rows about these numbers, ``(name, value,
    unit, source)`` each, written by the objective that set them (``rl.ObjectiveWork.workload``;
    empty: the fields are listed by name).
    """

    num_steps: int = 10
    train_steps: int = 4
    inner_epochs: int = 1
    kl: bool = True
    rescore: bool = False
    cfg_passes: int = 1
    lora_rank: int = 0
    extra_forwards: int = 0
    notes: tuple = dataclasses.field(default=(), compare=False)   # a description, not a charge

    def __post_init__(self):      # a saved model's notes come back as lists
        object.__setattr__(self, "notes", tuple(tuple(n) for n in self.notes))


@dataclasses.dataclass(frozen=True)
class Assumption:
    """One row of the report's assumptions table."""

    name: str
    value: Any
    unit: str
    source: str


# ----------------------------------------------------------------------------- cost models

def check_count(value, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


class CostModel:
    """Interface shared by :class:`ProfileCost` and :class:`MeasuredCost` (all in seconds).

    ``batch`` counts trajectories (CFG's unconditional pass is inside the step);
    ``sp`` is the SP degree of the group running it; ``num_devices`` the training mesh size.
    """

    name = ""

    def __init__(self, prices: Prices, workload: Workload):
        self.prices, self.workload = prices, workload

    def rollout_step(self, batch: int, sp: int = 1) -> float:
        """One denoising step (all CFG passes) for ``batch`` trajectories on an SP group."""
        raise NotImplementedError

    def rollout(self, batch: int, sp: int = 1, num_steps: int | None = None) -> float:
        """A whole rollout (or ``num_steps`` of one, e.g. a resumed remainder)."""
        steps = self.workload.num_steps if num_steps is None else num_steps
        if not isinstance(steps, int) or steps < 0:
            raise ValueError(f"num_steps must be an integer >= 0, got {steps!r}")
        return steps * self.rollout_step(batch, sp)

    def train_sample(self, num_devices: int = 1) -> float:
        """GRPO training of one trajectory (all its trained steps and inner epochs)."""
        raise NotImplementedError

    def train(self, num_samples: int, num_devices: int = 1) -> float:
        check_count(num_samples, "num_samples")
        return num_samples * self.train_sample(num_devices)

    def reward(self, num_images: int) -> float:
        raise NotImplementedError

    def broadcast(self) -> float:
        """Sending the new policy weights to a spot node."""
        raise NotImplementedError

    def gradient(self) -> float:
        """Sending one gradient shard's gradient from a spot group to the trainer (the shared
        update): here as long as a broadcast of the trainable weights."""
        return self.broadcast()

    def regroup(self, kind: str = "shrink") -> float:
        """SP regroup latency: 'shrink' (survivors re-wrap), 'grow' (a joined device gets a
        device-to-device copy), 'cold' (reload from storage + compile, the baseline path)."""
        raise NotImplementedError

    def describe(self) -> list[Assumption]:
        raise NotImplementedError

    # ---- prices --------------------------------------------------------------------------
    def price_per_hour(self, role: str) -> float:
        return self.prices.per_hour(role)

    def dollars_per_hour(self, alive: dict[str, int]) -> float:
        """$ per hour with ``alive[role]`` devices of each role alive."""
        return sum(self.prices.per_hour(r) * n for r, n in alive.items())

    def dollars(self, clock: Clock, until: float | None = None) -> float:
        """Cost so far: alive device-hours of each role x its price (busy or idle alike)."""
        return sum(clock.alive_device_seconds(r, until) / 3600.0 * self.prices.per_hour(r)
                   for r in ROLES)

    def _price_rows(self) -> list[Assumption]:
        p = self.prices
        if p.source:               # a device's list prices
            return [Assumption("on_demand_price", p.on_demand_per_hour, "$/device-h", p.source),
                    Assumption("spot_price", p.spot_per_hour, "$/device-h", p.source),
                    Assumption("spot_discount", p.spot_discount, "fraction",
                               "derived: 1 - spot / on-demand")]
        return [Assumption("on_demand_price", self.prices.on_demand_per_hour, "$/device-h",
                           "public H100 on-demand list prices, ~$3.90/GPU-h"),
                Assumption("spot_discount", self.prices.spot_discount, "fraction",
                           "the Spotlight paper: spot 69-77% cheaper"),
                Assumption("spot_price", self.prices.spot_per_hour, "$/device-h",
                           "derived: on-demand x (1 - discount); public spot $0.8-2.5")]

    def _workload_rows(self) -> list[Assumption]:
        w = self.workload
        if w.notes:                 # the objective's own account of its numbers
            return [Assumption(*note) for note in w.notes]
        return [Assumption(name, getattr(w, name), "", "workload") for name in
                ("num_steps", "train_steps", "inner_epochs", "kl", "extra_forwards")]


class ProfileCost(CostModel):
    """Durations of a deployment profile: a model config's FLOPs on a named accelerator.

    * rollout step (batch b, SP degree k): ``max(cfg b F / (k peak mfu), W / (hbm mbu)) +
      comm(k)`` -- compute split over the group, but every device streams the full weights W
      (SP replicates weights), which bounds small batches at high SP;
    * comm (per block): Ulysses (heads % k == 0) moves q, k, v and o through all-to-alls,
      ``4 b_cfg (S/k) D bytes (k-1)/k`` per device; ring (otherwise) passes K and V around,
      ``2 b_cfg (S/k) D bytes (k-1)``; over one direction of the device's interconnect (NVLink;
      ICI within a TPU slice, whose SP groups never leave it), plus a fixed latency per
      collective, not overlapped with compute (conservative);
    * training one trajectory on ``n`` devices: ``train_steps x inner_epochs x cfg x
      (1 + backward + remat + KL reference + re-score) x F / (n peak mfu)``;
    * reward: a constant per image; broadcast: LoRA factors (or all weights) over the network;
    * regroup: shrink measured, grow = weights over the interconnect, cold an assumption.
    """

    name = "profile"

    def __init__(self, cost: CostConfig, model: MMDiTConfig, workload: Workload = Workload()):
        super().__init__(cost.prices, workload)
        self.cost, self.model = cost, model.validate()
        self.device = device_spec(cost.device)
        self.cfg_passes = cost.cfg_passes or workload.cfg_passes
        self.lora_rank = workload.lora_rank if cost.lora_rank < 0 else cost.lora_rank
        self.flops = forward_flops(self.model)
        self.params = param_count(self.model)
        self.weight_bytes = self.params * cost.param_bytes
        self.peak = self.device.bf16_tflops * 1e12
        self.profile = cost.profile
        if self.profile is not None:
            self.profile.check_model(self.model)

    @property
    def tokens(self) -> tuple[int, int]:
        """(text tokens, image tokens) of one sample; an editing model's image tokens hold its
        reference images' (each at the target's size)."""
        m = self.model
        return m.text_len, m.num_patches * (1 + getattr(m, "reference_images", 0))

    def sp_strategy(self, sp: int) -> str:
        if sp == 1:
            return "dense"
        return "ulysses" if self.model.num_heads % sp == 0 else "ring"

    def sp_comm(self, batch: int, sp: int) -> float:
        """Seconds of SP communication of one step (all blocks, all CFG passes)."""
        check_count(batch, "batch")
        check_count(sp, "sp")
        if sp == 1:
            return 0.0
        m, c = self.model, self.cost
        s = sum(self.tokens)
        local = batch * self.cfg_passes * (s / sp) * m.width * c.act_bytes
        if self.sp_strategy(sp) == "ulysses":
            nbytes, ncoll = 4 * local * (sp - 1) / sp, 2
        else:
            nbytes, ncoll = 2 * local * (sp - 1), sp - 1
        bw = self.device.interconnect_gb_s * 1e9 * c.nvlink_one_way
        layers = m.depth + getattr(m, "single_blocks", 0)     # every joint attention
        return layers * (nbytes / bw + ncoll * c.collective_latency_s)

    def rollout_mfu(self, batch: int, sp: int) -> tuple[float, bool]:
        """``(mfu, includes_sp)`` of a rollout step: measured (the profile), set
        (``cost.rollout_mfu``) or assumed (``cost.mfu``); ``includes_sp``: the measured time
        already holds the SP collectives."""
        if self.profile is not None:
            return self.profile.rollout_mfu(batch, sp)
        return self.cost.rollout_mfu or self.cost.mfu, False

    @property
    def update_mfu(self) -> float:
        """The update's MFU: ``cost.update_mfu`` (the profile's for the run's objective, set
        by ``config.cost_config``) or the assumed ``cost.mfu``."""
        return self.cost.update_mfu or self.cost.mfu

    def rollout_step(self, batch: int, sp: int = 1) -> float:
        check_count(batch, "batch")
        check_count(sp, "sp")
        mfu, measured_sp = self.rollout_mfu(batch, sp)
        compute = self.cfg_passes * batch * self.flops / (sp * self.peak * mfu)
        weights = self.weight_bytes / (self.device.hbm_gb_s * 1e9 * self.cost.mbu)
        return max(compute, weights) + (0.0 if measured_sp else self.sp_comm(batch, sp))

    def train_passes(self) -> float:
        """Forward-equivalents per trained (trajectory, step) pair."""
        c = self.cost
        backward = c.backward_factor_lora if self.lora_rank > 0 else c.backward_factor_full
        return self.cfg_passes * (1.0 + backward + remat_recompute_fraction(self.model)
                                  + float(self.workload.kl) + float(self.workload.rescore)
                                  + float(self.workload.extra_forwards))

    def train_flops_per_sample(self) -> float:
        """Model FLOPs of training one trajectory (all its trained steps and inner epochs)."""
        w = self.workload
        return w.train_steps * w.inner_epochs * self.train_passes() * self.flops

    def train_sample(self, num_devices: int = 1) -> float:
        check_count(num_devices, "num_devices")
        return self.train_flops_per_sample() / (num_devices * self.peak * self.update_mfu)

    @property
    def clip_decode_s(self) -> float:
        """A video model's clip decode, from its released Wan VAE's FLOPs
        (``emulation.flops.vae_decode_flops``) at the assumed MFU; 0 for an image model, whose
        decode ``cost.reward_s_per_image`` includes (an image's decode is a small share)."""
        if not is_video(self.model):
            return 0.0
        vae = released_vae(self.model.latent_shape[-1])
        flops = vae_decode_flops(vae, tuple(self.model.latent_shape))
        return flops / (self.peak * self.cost.mfu)

    @property
    def reward_s_per_image(self) -> float:
        """Decoding and scoring one sample: the profile's measured decode, else a clip's
        derived decode (:attr:`clip_decode_s`), plus the profile's measured reward, else
        ``cost.reward_s_per_image``."""
        p = self.profile
        decode = p.decode_s_per_image if p is not None else None
        reward = p.reward_s_per_image if p is not None else None
        return ((self.clip_decode_s if decode is None else decode)
                + (self.cost.reward_s_per_image if reward is None else reward))

    def reward(self, num_images: int) -> float:
        if not isinstance(num_images, int) or num_images < 0:
            raise ValueError(f"num_images must be an integer >= 0, got {num_images!r}")
        return num_images * self.reward_s_per_image

    def broadcast_bytes(self) -> int:
        if self.lora_rank > 0:
            return lora_param_count(self.model, self.lora_rank) * self.cost.adapter_bytes
        return self.weight_bytes

    def broadcast(self) -> float:
        return self.broadcast_bytes() / (self.cost.network_gbit_s * 1e9 / 8)

    def gradient_bytes(self) -> int:
        """Float32 gradient of the trainable weights (the LoRA factors, or all of them)."""
        if self.lora_rank > 0:
            return lora_param_count(self.model, self.lora_rank) * 4
        return self.weight_bytes // self.cost.param_bytes * 4

    def gradient(self) -> float:
        return (self.gradient_bytes() / (self.cost.network_gbit_s * 1e9 / 8)
                + self.cost.collective_latency_s)

    def regroup(self, kind: str = "shrink") -> float:
        c = self.cost
        shrink = c.regroup_shrink_s
        if self.profile is not None and self.profile.regroup_shrink_s is not None:
            shrink = self.profile.regroup_shrink_s
        if kind == "shrink":
            return shrink
        if kind == "grow":
            bw = self.device.interconnect_gb_s * 1e9 * c.nvlink_one_way
            return shrink + self.weight_bytes / bw
        if kind == "cold":
            return c.regroup_cold_s
        raise ValueError(f"unknown regroup kind {kind!r}; choose one of {REGROUP_KINDS}")

    def describe(self) -> list[Assumption]:
        c, d, m = self.cost, self.device, self.model
        lt, n = self.tokens
        shape, video = m.latent_shape[:-1], is_video(m)
        rows = [
            Assumption("cost_model", self.name, "", "config cost.model"),
            Assumption("device", c.device, "", d.label),
            Assumption("peak_bf16", d.bf16_tflops, "TFLOP/s dense", d.source),
            Assumption("hbm_bandwidth", d.hbm_gb_s, "GB/s", d.source),
            Assumption(f"{d.interconnect.lower()}_bandwidth", d.interconnect_gb_s,
                       "GB/s both directions",
                       d.source + f"; one direction = x{c.nvlink_one_way} (cost.nvlink_one_way)"),
            *self._mfu_rows(),
            Assumption("mbu", c.mbu, "fraction of HBM peak", "assumption"),
            Assumption("collective_latency", c.collective_latency_s, "s",
                       "assumption: NCCL small-message latency order"),
            Assumption("model", f"{type(m).__name__.removesuffix('Config')} d={m.width} "
                       f"depth={m.depth} heads={m.num_heads}", "",
                       "config cost.profile_model (e.g. configs/qwen_image.py, "
                       "configs/wan21_14b.py)"),
            Assumption("params", self.params, "parameters", "derived: emulation.flops.param_count"),
            (Assumption("video", f"{c.image_pixels}px rows -> {'x'.join(map(str, shape))} "
                        f"latent, patch {m.patch_size}", "",
                        f"Wan 2.1: 480 x 832 x 81 frames; VAE /{c.vae_factor}, frames /4")
             if video else
             Assumption("image", f"{c.image_pixels}px -> {m.image_size}^2 latent, "
                        f"patch {m.patch_size}", "",
                        f"paper: 512^2 and 1280^2; VAE /{c.vae_factor}")),
            Assumption("tokens", f"{n} {'video' if video else 'image'} + {lt} text", "tokens",
                       "derived"),
            Assumption("forward_flops", self.flops, "FLOP/sample",
                       "derived: emulation.flops.forward_flops (matmuls, 2 per MAC)"),
            Assumption("cfg_passes", self.cfg_passes, "forwards/step",
                       "Flow-GRPO presets: CFG 4.5 in rollouts and training"),
            Assumption("lora_rank", self.lora_rank, "",
                       "configs/qwen_image.py; 0 = full fine-tuning"),
            Assumption("train_passes", self.train_passes(), "forwards per trained step",
                       "1 fwd + backward (2x full / 1x LoRA, Kaplan et al. 2020) + the share "
                       "of a fwd remat recomputes (model.remat_policy) "
                       "+ KL reference fwd (beta > 0) + old-log-prob re-score fwd (rl.rescore)"),
            *([Assumption("clip_decode", self.clip_decode_s, "s",
                          "derived: the released Wan VAE's decode FLOPs "
                          "(emulation.flops.vae_decode_flops) at the assumed MFU")]
              if video and (self.profile is None or self.profile.decode_s_per_image is None)
              else []),
            Assumption("reward_per_image", self.reward_s_per_image, "s",
                       "assumption" if self.reward_s_per_image == c.reward_s_per_image
                       else "derived: clip decode + cost.reward_s_per_image "
                       f"({c.reward_s_per_image} s)" if self.profile is None
                       else f"measured: decode + reward, {self.profile.path}"),
            Assumption("network", c.network_gbit_s, "Gbit/s", "assumption: cloud NIC tier"),
            Assumption("broadcast_bytes", self.broadcast_bytes(), "bytes",
                       "derived: LoRA factors (float32) or all weights (bf16)"),
            Assumption("regroup_shrink", self.regroup("shrink"), "s",
                       "measured: bench.reconfig --stand_in warm re-wrap, 50M params"
                       if self.regroup("shrink") == c.regroup_shrink_s
                       else f"measured: {self.profile.path}"),
            Assumption("regroup_grow", self.regroup("grow"), "s",
                       f"derived: weights over one {d.interconnect} direction + shrink"),
            Assumption("regroup_cold", c.regroup_cold_s, "s",
                       "assumption: paper abstract 'minutes'"),
        ]
        return rows + self._workload_rows() + self._price_rows()

    def _mfu_rows(self) -> list[Assumption]:
        """The MFU rows: one assumption, per-phase settings, or a measured profile's."""
        c, p = self.cost, self.profile
        if p is not None:
            table = ", ".join(f"b{b} sp{k}: {m:.1%}" for b, k, m in p.rollout)
            return [Assumption("profile", p.path, "", f"measured on {p.device} "
                               f"({p.peak_tflops:g} TFLOP/s peak) at depth "
                               f"{p.model.get('depth')}, scaled by FLOPs"),
                    Assumption("rollout_mfu", table, "fraction of peak",
                               "measured: bench.device_profile (the nearest batch and SP "
                               "degree)"),
                    Assumption("update_mfu", self.update_mfu, "fraction of peak",
                               "measured: bench.device_profile, the run's objective")]
        rows = [Assumption("mfu", c.mfu, "fraction of peak",
                           "assumption: typical of tuned large-transformer training "
                           "(PaLM 46%, MegaScale 55%)")]
        for name in ("rollout_mfu", "update_mfu"):
            if getattr(c, name):
                rows.append(Assumption(name, getattr(c, name), "fraction of peak",
                                       f"config cost.{name}"))
        return rows

    def table(self, batches: Sequence[int], sps: Sequence[int] = (1, 2, 4),
              train_devices: Sequence[int] = (1, 4)) -> dict[str, Any]:
        """Derived per-operation seconds for the report."""
        return {
            "rollout_step_s": {f"b{b}": {f"sp{k}": self.rollout_step(b, k) for k in sps}
                               for b in batches},
            "train_sample_s": {f"n{n}": self.train_sample(n) for n in train_devices},
            "reward_s_per_image": self.reward(1),
            "broadcast_s": self.broadcast(),
        }


def profile_for(model_cfg: MMDiTConfig, image_pixels: int | None = 512,
                cost: CostConfig | None = None, workload: Workload = Workload()) -> ProfileCost:
    """A :class:`ProfileCost` for ``model_cfg`` at ``image_pixels`` (a latent model: image_size
    becomes ``image_pixels / cost.vae_factor`` latent cells; None keeps the config's size).

    E.g. the paper's deployment: ``profile_for(qwen_model_cfg, 512)`` -> 64x64 latent, patch 2,
    1024 image tokens, whatever tiny model the learning runs on.
    """
    cost = cost or CostConfig()
    if image_pixels is not None:
        if image_pixels % cost.vae_factor:
            raise ValueError(f"image_pixels {image_pixels} is not divisible by the VAE factor "
                             f"{cost.vae_factor}")
        rows = image_pixels // cost.vae_factor
        if getattr(model_cfg, "image_width", 0):      # a non-square video keeps its aspect
            cols = model_cfg.image_width * rows // model_cfg.image_size
            model_cfg = dataclasses.replace(model_cfg, image_size=rows, image_width=cols)
        else:
            model_cfg = dataclasses.replace(model_cfg, image_size=rows)
    return ProfileCost(cost, model_cfg.validate(), workload)


# ------------------------------------------------------------------------------ measured

class MeasuredCost(CostModel):
    """Durations calibrated on this machine (see ``calibration.calibrate``).

    Rollout step: ``fixed + per_sample x batch / sp``. The SP split of the batch-proportional
    term is an *assumption* (ideal scaling): emulated CPU devices share the host's cores, so an
    SP group's speed-up cannot be measured here. Training on ``n`` devices: ``per_sample / n``
    (ideal data parallelism, same caveat). Keep the calibration in the checkpoint
    (:meth:`state_dict`): a resumed run must reuse it, not re-measure, to charge the same times.
    """

    name = "measured"

    def __init__(self, *, rollout_fixed_s: float, rollout_per_sample_s: float,
                 train_per_sample_s: float, reward_per_image_s: float, broadcast_s: float,
                 prices: Prices = Prices(), workload: Workload = Workload(),
                 regroup_shrink_s: float = 7.6e-3, regroup_grow_s: float = 0.644,
                 regroup_cold_s: float = 120.0, timings: dict | None = None):
        super().__init__(prices, workload)
        self.rollout_fixed_s = float(rollout_fixed_s)
        self.rollout_per_sample_s = float(rollout_per_sample_s)
        self.train_per_sample_s = float(train_per_sample_s)
        self.reward_per_image_s = float(reward_per_image_s)
        self.broadcast_s = float(broadcast_s)
        self.regroup_s = {"shrink": float(regroup_shrink_s), "grow": float(regroup_grow_s),
                          "cold": float(regroup_cold_s)}
        self.timings = dict(timings or {})
        for k, v in self._numbers().items():
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"MeasuredCost.{k} must be finite and >= 0, got {v!r}")

    def _numbers(self) -> dict[str, float]:
        return {"rollout_fixed_s": self.rollout_fixed_s,
                "rollout_per_sample_s": self.rollout_per_sample_s,
                "train_per_sample_s": self.train_per_sample_s,
                "reward_per_image_s": self.reward_per_image_s, "broadcast_s": self.broadcast_s,
                **{f"regroup_{k}_s": v for k, v in self.regroup_s.items()}}

    def rollout_step(self, batch: int, sp: int = 1) -> float:
        check_count(batch, "batch")
        check_count(sp, "sp")
        return self.rollout_fixed_s + self.rollout_per_sample_s * batch / sp

    def train_sample(self, num_devices: int = 1) -> float:
        check_count(num_devices, "num_devices")
        return self.train_per_sample_s / num_devices

    def reward(self, num_images: int) -> float:
        if not isinstance(num_images, int) or num_images < 0:
            raise ValueError(f"num_images must be an integer >= 0, got {num_images!r}")
        return num_images * self.reward_per_image_s

    def broadcast(self) -> float:
        return self.broadcast_s

    def regroup(self, kind: str = "shrink") -> float:
        if kind not in self.regroup_s:
            raise ValueError(f"unknown regroup kind {kind!r}; choose one of {REGROUP_KINDS}")
        return self.regroup_s[kind]

    def describe(self) -> list[Assumption]:
        rows = [Assumption("cost_model", self.name, "", "config cost.model"),
                Assumption("rollout_fixed", self.rollout_fixed_s, "s/step",
                           "measured: intercept of a fit over batch sizes (median timings)"),
                Assumption("rollout_per_sample", self.rollout_per_sample_s, "s/step/sample",
                           "measured: slope of the same fit"),
                Assumption("sp_scaling", "ideal (per-sample term / SP degree)", "",
                           "assumption: CPU-emulated devices share cores, so not measurable"),
                Assumption("train_per_sample", self.train_per_sample_s, "s/trajectory",
                           "measured: median GRPO update time / trajectories"),
                Assumption("reward_per_image", self.reward_per_image_s, "s",
                           "measured" if "reward" in self.timings else "config cost"),
                Assumption("broadcast", self.broadcast_s, "s",
                           "measured" if "broadcast" in self.timings else "assumption: 0"),
                Assumption("regroup_shrink", self.regroup_s["shrink"], "s",
                           "measured: bench.reconfig --stand_in (CPU)"),
                Assumption("regroup_grow", self.regroup_s["grow"], "s",
                           "measured: bench.reconfig --stand_in (CPU)"),
                Assumption("regroup_cold", self.regroup_s["cold"], "s", "assumption")]
        return rows + self._workload_rows() + self._price_rows()

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON types; :meth:`from_state_dict` rebuilds an identical model."""
        return {"numbers": self._numbers(), "timings": json.loads(json.dumps(self.timings)),
                "prices": dataclasses.asdict(self.prices),
                "workload": dataclasses.asdict(self.workload)}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> MeasuredCost:
        n = state["numbers"]
        return cls(rollout_fixed_s=n["rollout_fixed_s"],
                   rollout_per_sample_s=n["rollout_per_sample_s"],
                   train_per_sample_s=n["train_per_sample_s"],
                   reward_per_image_s=n["reward_per_image_s"], broadcast_s=n["broadcast_s"],
                   regroup_shrink_s=n["regroup_shrink_s"], regroup_grow_s=n["regroup_grow_s"],
                   regroup_cold_s=n["regroup_cold_s"], prices=Prices(**state["prices"]),
                   workload=Workload(**state["workload"]), timings=state["timings"])


def make_cost_model(cost: CostConfig, workload: Workload = Workload(), *,
                    model_cfg: MMDiTConfig | None = None,
                    measured: MeasuredCost | None = None) -> CostModel:
    """The cost model named by ``cost.model``.

    ``profile``: ``model_cfg`` (default ``cost.profile_model``, the paper-scale model) at
    ``cost.image_pixels``. ``measured``: the calibration ``measured`` from
    ``calibration.calibrate`` (or restored with :meth:`MeasuredCost.from_state_dict`).
    """
    if cost.model == "profile":
        model_cfg = model_cfg or cost.profile_model
        if model_cfg is None:
            raise ValueError("profile_model=None: the profile cost model needs the paper-scale "
                             "model's config (config.cost_config loads the config that "
                             "cost.profile_model names)")
        return profile_for(model_cfg, cost.image_pixels, cost, workload)
    if cost.model == "measured":
        if measured is None:
            raise ValueError("model='measured' needs a calibration: pass "
                             "measured=calibration.calibrate(...) (or "
                             "MeasuredCost.from_state_dict)")
        return measured
    raise ValueError(f"unknown cost model {cost.model!r}; choose one of {COST_MODELS}")
