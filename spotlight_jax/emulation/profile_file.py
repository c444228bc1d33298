"""A measured device profile: what the ``profile`` cost model charges, timed on a real device.

``bench.device_profile`` times the phases at reduced depth (the real width, heads and text
length) and writes a JSON file; :func:`load` reads it back as a :class:`DeviceProfile`. Each
timed phase keeps its model FLOPs in the cost model's own count (``ProfileCost``), so its
achieved MFU (FLOPs / seconds / the device's peak) carries to the full-depth model: the same
MFU at the full depth's FLOPs is the FLOP model's scaling. The cost model then charges a
rollout step at the MFU measured for its batch and SP degree, an update at the MFU measured for
the run's objective, and the per-image decode and reward as measured, instead of one assumed
MFU for everything.

Refused with one line each: a missing or malformed file, a profile of another model (any shape
but the depth differs from the cost model's ``profile_model``), a profiled depth the full model
does not have (deeper than it, or zero), an objective the profile did not time.
"""
from __future__ import annotations

import dataclasses
import json
import os

KIND = "spotlight_jax.device_profile"
VERSION = 1
# model fields a reduced-depth profile may differ in (its depth is what it scales over)
SCALED = ("depth", "single_blocks", "scan_blocks", "remat")


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """The measured phases of one profile file (``bench.device_profile``'s JSON)."""

    path: str
    device: str
    peak_tflops: float
    model: dict
    rollout: tuple          # ((batch, sp, mfu), ...)
    update: dict            # objective -> mfu
    decode_s_per_image: float | None = None
    reward_s_per_image: float | None = None
    regroup_shrink_s: float | None = None

    def check_model(self, model) -> None:
        """ValueError unless ``model`` (an ``MMDiTConfig``) is the profiled one up to depth."""
        want = dataclasses.asdict(model)
        for name, value in sorted(self.model.items()):
            if name in SCALED or name not in want:
                continue
            mine = list(want[name]) if isinstance(want[name], tuple) else want[name]
            if value != mine:
                raise ValueError(f"profile_file={self.path!r} was recorded for another model: "
                                 f"its {name} is {value!r}, the cost model's is {mine!r}; "
                                 "record one for this config (python -m "
                                 "spotlight_jax.bench.device_profile --config=...)")
        depth = int(self.model.get("depth", 0))
        if not 1 <= depth <= model.depth:
            raise ValueError(f"profile_file={self.path!r}: profiled at depth {depth}, which "
                             f"the {model.depth}-block model cannot be scaled from (record it "
                             f"at a depth of 1 to {model.depth})")

    def rollout_mfu(self, batch: int, sp: int) -> tuple[float, bool]:
        """``(mfu, includes_sp)``: the MFU measured at SP degree ``sp`` if the profile has it
        (its time then includes the SP collectives), else at degree 1; at the largest measured
        batch not above ``batch`` (the smallest measured one below them all)."""
        rows = [r for r in self.rollout if r[1] == sp] or [r for r in self.rollout if r[1] == 1]
        below = [r for r in rows if r[0] <= batch]
        row = max(below, key=lambda r: r[0]) if below else min(rows, key=lambda r: r[0])
        return row[2], row[1] == sp and sp > 1

    def update_mfu(self, objective: str) -> float:
        if objective not in self.update:
            raise ValueError(f"profile_file={self.path!r} timed the update of "
                             f"{sorted(self.update)}, not {objective!r}; record it with "
                             f"--objectives={objective}")
        return self.update[objective]


def load(path: str) -> DeviceProfile:
    """The profile in ``path``; a one-line ValueError for a missing or malformed file."""
    if not os.path.isfile(path):
        raise ValueError(f"profile_file={path!r}: no such file; record one with python -m "
                         "spotlight_jax.bench.device_profile --out=FILE")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"profile_file={path!r}: not readable as JSON ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ValueError(f"profile_file={path!r}: not a device profile (no kind={KIND!r}); "
                         "record one with python -m spotlight_jax.bench.device_profile")
    if data.get("version") != VERSION:
        raise ValueError(f"profile_file={path!r}: version {data.get('version')!r}, this code "
                         f"reads version {VERSION}; record it again")
    try:
        rollout = tuple((int(r["batch"]), int(r["sp"]), _fraction(r["mfu"]))
                        for r in data["rollout"])
        update = {name: _fraction(u["mfu"]) for name, u in data["update"].items()}
        return DeviceProfile(
            path=path, device=str(data["device"]), peak_tflops=float(data["peak_tflops"]),
            model=dict(data["model"]), rollout=rollout, update=update,
            decode_s_per_image=_seconds(data.get("decode"), "s_per_image"),
            reward_s_per_image=_seconds(data.get("reward"), "s_per_image"),
            regroup_shrink_s=_seconds(data.get("regroup"), "shrink_s"))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"profile_file={path!r}: malformed device profile ({type(e).__name__}: "
                         f"{e}); record it again") from None


def _fraction(x) -> float:
    x = float(x)
    if not 0 < x <= 1:
        raise ValueError(f"an MFU of {x!r} is not in (0, 1]")
    return x


def _seconds(section, key) -> float | None:
    """A measured number of seconds, or None where the profile skipped the phase."""
    if not isinstance(section, dict) or key not in section:
        return None
    x = float(section[key])
    if not x >= 0:
        raise ValueError(f"{key}={x!r} is not a number of seconds >= 0")
    return x
