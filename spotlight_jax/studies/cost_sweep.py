"""How the cost model's assumptions move each mode's emulated time per iteration.

  python -m spotlight_jax.studies.cost_sweep [--config=configs/tiny.py] [--config.x=y ...]
      [--sweep rl.nft.times=1,2,4,8 --sweep cost.cfg_passes=1,2] [--out DIR]

A mode's speed-up over ``baseline`` is (iterations to the target, measured by a run) x (emulated
seconds per iteration, set by the cost model). This benchmark computes the second factor from the
deployment and cost model alone, with no training: the critical-path seconds of one iteration's
phases for ``baseline`` (rollout, reward, update), ``spot_rollout`` (rollouts on the trainer and
the spot groups, reward, update, broadcast), ``spotlight`` (the same with exploration alongside
the update) and
``spotlight_pipelined`` (update with the next batch sampled and rewarded alongside, broadcast), with
every spot node alive. The phases are the ones the modes charge (``runner.modes``); the update
and the spot groups' sampling run concurrently, so a phase lasts as long as the slower of them:
when the spot groups cannot sample a batch (prompts x G) within one update, the pipelined
iteration waits for them.

Each ``--sweep KEY=V1,V2,...`` varies one assumption around the config (one at a time), then the
two that move the pipelined ratio most are crossed into a table. With a measured profile
(``--config.cost.profile_file=FILE``, ``bench.device_profile``) the config's row is given twice:
at the one assumed ``cost.mfu`` and on the profile. Prints markdown; with ``--out``
also writes ``cost_sweep.json``. ``iteration_phases`` and ``sweep`` are the same as functions.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os

from absl import app, flags

from spotlight_jax import programs, registry

FLAGS = flags.FLAGS
MODES = ("baseline", "spot_rollout", "spotlight", "spotlight_pipelined")
DEFAULT_SWEEPS = ("deployment.shared_update=off,auto",
                  "deployment.update_spot_share=0,0.25,0.5,0.75,1",
                  "rl.nft.times=1,2,4,8", "cost.cfg_passes=1,2", "sampler.num_steps=10,20,40",
                  "cost.lora_rank=0,32", "cost.reward_s_per_image=0.02,0.1,0.5",
                  "deployment.spot_nodes=2,4,8")
SPLIT_KEY = "deployment.update_spot_share"     # swept with deployment.shared_update='fixed'


@dataclasses.dataclass(frozen=True)
class IterationCost:
    """One mode's emulated critical path per iteration, by phase (seconds), and its dollars."""

    mode: str
    phases: dict
    dollars: float

    @property
    def seconds(self) -> float:
        return sum(self.phases.values())


def iteration_phases(config) -> dict[str, IterationCost]:
    """Each of :data:`MODES`' critical-path seconds per iteration under ``config``'s deployment
    and cost model, every spot node alive. Dollars: the devices each mode rents held for that
    long, as the runs pay them (``baseline`` its on-demand devices, the spot modes every spot
    node too)."""
    from spotlight_jax import config as conf  # noqa: PLC0415 - programs import JAX late
    from spotlight_jax.rl import work_of  # noqa: PLC0415
    from spotlight_jax.runner.shared_update import SharedUpdate  # noqa: PLC0415

    d = conf.make_deployment(config)
    n = int(config.rl.prompts_per_iter) * int(config.rl.group_size)
    d.alive_nodes = {f"spot{i}" for i in range(d.cfg.spot_nodes)}
    d.events.position = len(d.events.events)      # every node alive: no event in the window
    spot = d.cfg.spot_nodes * d.cfg.spot_devices_per_node
    od = d.cfg.on_demand_devices
    train, broadcast = d.train_s(n), d.cost.broadcast()
    # the spot groups sample and reward the next batch's candidates (prompts x G at least)
    # during the update
    sample_next_s = n * d.spot_seconds_per_candidate()            # device-seconds
    update, spot_shards_s = train, 0.0
    if d.cfg.shared_update != "off":      # the spot groups compute some of the update too
        rl = conf.rl_config(config)
        plan = SharedUpdate(d, work_of(rl, conf.sampler_config(config)).shard_units).plan(
            n, version=0, spot_work_s=sample_next_s)
        update, spot_shards_s = plan.seconds, plan.spot_device_s
    window = max(update, (sample_next_s + spot_shards_s) / max(spot, 1))
    on_demand_rate = d.cfg.on_demand_devices * d.cost.price_per_hour("on_demand") / 3600.0
    rate = on_demand_rate + spot * d.cost.price_per_hour("spot") / 3600.0
    phases = {
        "baseline": {"rollout": d.rollout_s(n, use_spot=False), "reward": d.reward_s(n, od),
                      "train": train},
        "spot_rollout": {"rollout": d.rollout_s(n, use_spot=True),
                         "reward": d.reward_s(n, od + spot), "train": train,
                         "broadcast": broadcast},
        "spotlight": {"rollout": d.rollout_s(n, use_spot=True),
                      "reward": d.reward_s(n, od + spot), "train": window,
                      "broadcast": broadcast},
        "spotlight_pipelined": {"rollout": 0.0, "reward": 0.0,   # rewarded on the spot groups
                                "train": window, "broadcast": broadcast},
    }
    return {m: IterationCost(m, p, sum(p.values()) * (
        rate if registry.mode_spec(m).uses_spot else on_demand_rate)) for m, p in phases.items()}


def _parse(spec: str) -> tuple[str, list]:
    key, _, values = spec.partition("=")
    if not key or not values:
        raise app.UsageError(f"--sweep {spec!r}: write KEY=V1,V2,... (e.g. rl.nft.times=1,2,4)")
    return key, [_number(v) for v in values.split(",")]


def _number(v: str):
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def sweep(config, sweeps: list[tuple[str, list]]) -> dict:
    """One-at-a-time sweeps of ``sweeps`` around ``config``, then the two keys whose range
    moves the pipelined ratio most, crossed. Returns a JSON-able dict."""
    from spotlight_jax import config as conf  # noqa: PLC0415

    def at(extra):
        if SPLIT_KEY in extra:                     # the split only means something when fixed
            extra = {"deployment.shared_update": "fixed", **extra}
        cfg = config.copy_and_resolve_references()
        with cfg.unlocked():
            it = iteration_phases(conf.apply_overrides(cfg, extra))
        base = it["baseline"].seconds
        return {m: {"seconds": c.seconds, "ratio": base / c.seconds, "dollars": c.dollars,
                    "phases": c.phases} for m, c in it.items()}

    out = {"base": at({}), "one_at_a_time": {}, "crossed": None}
    if config.cost.get("profile_file"):      # the same deployment at the one assumed MFU
        out["assumed"] = at({"cost.profile_file": "", "cost.rollout_mfu": 0.0,
                             "cost.update_mfu": 0.0})
    spread = {}
    for key, values in sweeps:
        rows = {str(v): at({key: v}) for v in values}
        out["one_at_a_time"][key] = rows
        r = [row["spotlight_pipelined"]["ratio"] for row in rows.values()]
        spread[key] = max(r) - min(r)
    top = sorted(spread, key=spread.get, reverse=True)[:2]
    out["spread"] = spread
    if len(top) == 2:
        (k1, v1), (k2, v2) = [(k, dict(sweeps)[k]) for k in top]
        out["crossed"] = {"keys": top, "rows": {
            f"{a}|{b}": at({k1: a, k2: b}) for a, b in itertools.product(v1, v2)}}
    return out


def markdown(result: dict) -> str:
    """The sweep as markdown tables."""
    lines = ["| assumption | value | baseline s / it | spot_rollout s / it | spotlight s / it | "
             "pipelined s / it | spot_rollout ratio | spotlight ratio | pipelined ratio | "
             "pipelined / spot_rollout |", "|---|---|---|---|---|---|---|---|---|---|"]

    def row(name, value, r):
        same_hw = r["spot_rollout"]["seconds"] / r["spotlight_pipelined"]["seconds"]
        lines.append(f"| {name} | {value} | {r['baseline']['seconds']:.1f} | "
                     f"{r['spot_rollout']['seconds']:.1f} | "
                     f"{r['spotlight']['seconds']:.1f} | "
                     f"{r['spotlight_pipelined']['seconds']:.1f} | "
                     f"{r['spot_rollout']['ratio']:.2f}x | "
                     f"{r['spotlight']['ratio']:.2f}x | {r['spotlight_pipelined']['ratio']:.2f}x | "
                     f"{same_hw:.2f}x |")

    if "assumed" in result:
        row("(config, assumed `cost.mfu`)", "", result["assumed"])
        row("(config, measured `cost.profile_file`)", "", result["base"])
    else:
        row("(config)", "", result["base"])
    for key, rows in result["one_at_a_time"].items():
        for value, r in rows.items():
            row(f"`{key}`", value, r)
    if result["crossed"]:
        k1, k2 = result["crossed"]["keys"]
        rows = result["crossed"]["rows"]
        v1 = list(dict.fromkeys(k.split("|")[0] for k in rows))
        v2 = list(dict.fromkeys(k.split("|")[1] for k in rows))
        lines += ["", f"Pipelined per-iteration ratio, `{k1}` (rows) x `{k2}` (columns):", "",
                  "| | " + " | ".join(v2) + " |", "|---" * (len(v2) + 1) + "|"]
        for a in v1:
            cells = [f"{rows[f'{a}|{b}']['spotlight_pipelined']['ratio']:.2f}x" for b in v2]
            lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This study's flags (defined only when it runs as the program; see ``programs``)."""
    programs.define_config_flag(flag_values)
    flags.DEFINE_multi_string("sweep", list(DEFAULT_SWEEPS),
                              "KEY=V1,V2,...: an assumption and its values (repeatable).",
                              flag_values=flag_values)
    flags.DEFINE_string("out", None, "Directory for cost_sweep.json (optional).",
                        flag_values=flag_values)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    result = sweep(FLAGS.config, [_parse(s) for s in FLAGS.sweep])
    print(markdown(result))
    if FLAGS.out:
        os.makedirs(FLAGS.out, exist_ok=True)
        with open(os.path.join(FLAGS.out, "cost_sweep.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    define_flags()
    app.run(main)
