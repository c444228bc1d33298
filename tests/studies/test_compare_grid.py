"""The comparison grid: modes that use no spot device do not depend on the trace (so the grid
stores them once per seed), finished runs archive and rebuild their history, and the grid's
ratios are each trace's mean and spread over seeds."""
import json
import os

import pytest
from helpers import mode_config

from spotlight_jax import runner
from spotlight_jax.config import RunSpec
from spotlight_jax.emulation.deployment import PRICING_RULE
from spotlight_jax.io.metrics import MetricWriter, read_jsonl
from spotlight_jax.studies import compare_grid

CLOCK = ("iteration", "val_reward", "vtime_s", "dollars", "reward_mean")


# among the longer checks (~15 s each; the default suite's 10-minute budget)
@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["baseline", "explore_sync"])
def test_trace_free_modes_learn_and_charge_the_same_on_any_trace(tmp_path, base, mode):
    graphdef, state = base
    busy = tmp_path / "trace.json"      # SkyPilot format: nodes lost and back within the run
    busy.write_text(json.dumps({"metadata": {"gap_seconds": 30}, "data": [4, 1, 0, 3, 4, 2]}))
    out = {}
    for name, path in (("synthetic", ""), ("skypilot", str(busy))):
        c = mode_config(mode)
        c.rl.eval_every = 1
        c.trace.path = path
        c.trace.rate_per_node_hour = 60.0
        h = runner.build_and_run(RunSpec.from_config(c), str(tmp_path / name), graphdef, state,
                                 progress=False)
        out[name] = h
    assert len(out["synthetic"]) == 3 and out["synthetic"][-1]["vtime_s"] > 0
    for k in CLOCK:
        assert [r.get(k) for r in out["synthetic"]] == [r.get(k) for r in out["skypilot"]], k
    # what the grid archives of the mode is the same whichever trace it ran on
    assert ([compare_grid.compact(r, mode) for r in out["synthetic"]]
            == [compare_grid.compact(r, mode) for r in out["skypilot"]])


def _history(rewards, s_per_it, dollars_per_it, start=0.5, shared=None):
    """``shared``: a shared update's (split, shards on the spot groups) per iteration of 8
    shards, 60 s windows against 90 s on the trainer alone."""
    h = [{"iteration": 0, "vtime_s": 0.0, "dollars": 0.0, "val_reward": start}]
    for i, r in enumerate(rewards, 1):
        h.append({"iteration": i, "vtime_s": i * s_per_it, "dollars": i * dollars_per_it,
                  "val_reward": r, "reward_mean": r, "explore_candidates": 3,
                  "spot_util": 0.5, "preemptions": 1, "loss": 0.25})
        if shared:
            h[-1].update(update_s=60.0, update_trainer_s=90.0, update_split=shared[i - 1][0],
                         update_shards=8, update_shards_spot=shared[i - 1][1],
                         update_lost=0)
    return h


def _fake_run(workdir, mode, hist, code=None, pricing=PRICING_RULE, phases=None):
    """A finished mode run as the runner leaves it: rl.jsonl rows and phases.json (``code``:
    the commit it records, as ``provenance.code_version`` gives it; ``pricing``: the rule it
    records, None for none, as runs before rules were recorded)."""
    d = os.path.join(workdir, mode)
    w = MetricWriter(d, "rl", tensorboard=False)
    for row in hist:
        w.write(row["iteration"], **{k: v for k, v in row.items()
                                     if k != "iteration" and (row["iteration"] or
                                                              k.startswith("val_"))})
    with open(os.path.join(d, "phases.json"), "w") as f:
        json.dump({"phases": phases or {"train": {"critical_s": 10.0 * len(hist)}},
                   "assumptions": [{"name": "x", "value": 1, "unit": "s", "source": "test"}],
                   **({"code": code} if code else {}),
                   **({"pricing": pricing} if pricing else {})}, f)


def test_archive_rebuilds_the_history_and_the_grid_gives_mean_and_spread(tmp_path):
    grid = str(tmp_path / "grid")
    # target = 0.5 + 0.1; baseline reaches it at iteration 3 (300 s), the fast mode at
    # iteration 1 on seed 0 (100 s: 3x) and 2 on seed 1 (1.5x): mean 2.25x [1.5, 3]
    runs = {0: {"baseline": _history([0.55, 0.58, 0.61], 100, 1.0),
                "spotlight": _history([0.62, 0.63, 0.64], 100, 0.5)},
            1: {"baseline": _history([0.55, 0.58, 0.61], 100, 1.0),
                "spotlight": _history([0.58, 0.65, 0.66], 100, 0.5,
                                      shared=[(0.25, 2), (0.5, 4), (0.0, 0)])}}
    for seed, by_mode in runs.items():
        work = str(tmp_path / f"run_{seed}")
        for mode, hist in by_mode.items():
            _fake_run(work, mode, hist)
        assert compare_grid.archive(work, grid, "aws", seed, 3) == ["baseline", "spotlight"]
    # the history the report reads is the run's, with only the report's columns
    kept = read_jsonl(os.path.join(grid, "on_demand", "seed_0", "baseline", "history.jsonl"))
    assert kept == [{k: v for k, v in r.items() if k not in ("loss", "preemptions")}
                    for r in runs[0]["baseline"]]
    spot = read_jsonl(os.path.join(grid, "aws", "seed_0", "spotlight", "history.jsonl"))
    assert spot[1]["preemptions"] == 1 and "loss" not in spot[1]
    shared = read_jsonl(os.path.join(grid, "aws", "seed_1", "spotlight", "history.jsonl"))
    assert shared[2]["update_split"] == 0.5 and shared[2]["update_shards_spot"] == 4
    assert "update_lost" not in shared[2]
    assert os.path.exists(os.path.join(grid, "aws", "seed_1", "spotlight", "phases.json"))

    os.makedirs(os.path.join(grid, "cost_sweep"))          # a folder of notes, not a trace
    text = open(compare_grid.write_grid(grid, target_gain=0.1)).read()
    assert "cost_sweep" not in text
    assert "| spotlight | 2.25x [1.50, 3.00] (n=2/2) | 4.50x [3.00, 6.00] (n=2/2) | " \
           "2.25x [1.50, 3.00] (n=2/2) | 1.00x [1.00, 1.00] (n=2/2) |" in text
    assert "## Runs not archived yet\n\nnone\n" in text     # only the modes the grid runs
    # baseline re-priced at $18/h (recorded at $36/h): the cost ratios halve, the time ones stay
    text = open(compare_grid.write_grid(grid, target_gain=0.1,
                                        baseline_dollars_per_hour=18.0)).read()
    assert "| spotlight | 2.25x [1.50, 3.00] (n=2/2) | 2.25x [1.50, 3.00] (n=2/2) | " in text
    assert "re-priced at $18/h" in text and "re-priced at $18/h" in open(
        os.path.join(grid, "headline.md")).read()
    compare_grid.write_grid(grid, target_gain=0.1)
    # a seed that has the baseline but not a mode the grid runs elsewhere is listed
    gcp = str(tmp_path / "run_gcp")
    _fake_run(gcp, "spotlight", runs[1]["spotlight"])
    compare_grid.archive(gcp, grid, "gcp", 1, 3)
    text = open(compare_grid.write_grid(grid, target_gain=0.1)).read()
    assert "## Runs not archived yet\n\n- gcp seed 0: spotlight\n\n" in text
    report = open(os.path.join(grid, "aws", "seed_1", "report.md")).read()
    assert "Target validation reward: **0.600**" in report
    # the shared update: its windows against the trainer alone, the mean split, where the
    # shards ran (3 iterations: 180 s against 270 s, splits 0.25 / 0.5 / 0, 6 of 24 shards)
    assert "| spotlight | 180 | 270 | 0.25 | 6 of 24 (25%) |" in report
    assert "The shared update" not in open(os.path.join(grid, "aws", "seed_0",
                                                         "report.md")).read()


def test_archive_refuses_unfinished_runs_and_a_trace_free_run_that_differs(tmp_path):
    grid, work = str(tmp_path / "grid"), str(tmp_path / "run")
    _fake_run(work, "baseline", _history([0.55, 0.58], 100, 1.0))
    with pytest.raises(ValueError, match="at iteration 2 of 3"):
        compare_grid.archive(work, grid, "aws", 0, 3)
    _fake_run(work, "spotlight", _history([0.55], 100, 1.0))     # still running
    assert compare_grid.archive(work, grid, "aws", 0, 2, only=("baseline",)) == ["baseline"]
    with pytest.raises(ValueError, match="unknown \\['nope'\\]"):
        compare_grid.archive(work, grid, "aws", 0, 2, only=("nope",))
    other = str(tmp_path / "other")
    _fake_run(other, "baseline", _history([0.55, 0.59], 100, 1.0))
    with pytest.raises(ValueError, match="never uses a spot device"):
        compare_grid.archive(other, grid, "gcp", 0, 2)
    with pytest.raises(ValueError, match="--trace='on_demand'"):
        compare_grid.archive(work, grid, "on_demand", 0, 2)


def test_the_report_refuses_runs_of_different_commits_unless_told(tmp_path):
    grid = str(tmp_path / "grid")
    one, two = {"commit": "a" * 40, "dirty": False}, {"commit": "b" * 40, "dirty": False}
    for seed, spot_code in ((0, one), (1, two)):
        work = str(tmp_path / f"run_{seed}")
        _fake_run(work, "baseline", _history([0.55, 0.61], 100, 1.0), code=one)
        _fake_run(work, "spotlight", _history([0.62, 0.63], 100, 0.5), code=spot_code)
        compare_grid.archive(work, grid, "aws", seed, 2)
    with pytest.raises(ValueError, match="not all made by one clean commit .*aaaaaaaaaaaa: 3 "
                                         "run.*bbbbbbbbbbbb: 1 run.*--allow_mixed_commits"):
        compare_grid.write_grid(grid, target_gain=0.1)
    text = open(compare_grid.write_grid(grid, target_gain=0.1,
                                        allow_mixed_commits=True)).read()
    assert "**mixed commits**" in text and "| spotlight | " in text
    # the same commit everywhere: stated; a checkout with local changes is refused too
    _fake_run(str(tmp_path / "run_1"), "spotlight", _history([0.62, 0.63], 100, 0.5), code=one)
    compare_grid.archive(str(tmp_path / "run_1"), grid, "aws", 1, 2, only=("spotlight",))
    assert "Code: every run made by commit aaaaaaaaaaaa." in open(
        compare_grid.write_grid(grid, target_gain=0.1)).read()
    _fake_run(str(tmp_path / "run_1"), "spotlight", _history([0.62, 0.63], 100, 0.5),
              code={**one, "dirty": True})
    compare_grid.archive(str(tmp_path / "run_1"), grid, "aws", 1, 2, only=("spotlight",))
    with pytest.raises(ValueError, match="aaaaaaaaaaaa with local changes: 1 run"):
        compare_grid.write_grid(grid, target_gain=0.1)


def test_a_run_records_the_commit_it_was_made_by():
    from spotlight_jax.io import provenance
    code = provenance.code_version()
    head = provenance._git("rev-parse", "HEAD")
    assert code["commit"] == head and (head is None or len(head) == 40)
    assert code["dirty"] in (True, False) or head is None


def _overrides(cmd: list[str]) -> dict:
    import yaml
    return {a.split("=", 1)[0][len("--config."):]: yaml.safe_load(a.split("=", 1)[1])
            for a in cmd if a.startswith("--config.")}


@pytest.mark.parametrize("trace", sorted(compare_grid.TRACES))
def test_a_grid_runs_command_is_the_grids_settings_on_its_trace(tmp_path, trace, monkeypatch):
    from helpers import write_stand_in_trace

    from spotlight_jax.config import load_config
    from spotlight_jax.emulation.traces import default_trace_dir
    # the grid's trace files as stand-ins in a trace folder of the test's own (the real
    # SkyPilot traces are not part of a clone)
    monkeypatch.setenv("SPOTLIGHT_TRACES", str(tmp_path / "traces"))
    for path in compare_grid.TRACES[trace].get("trace.path", "").split(","):
        if path:
            write_stand_in_trace(tmp_path / "traces" / path)
    cmd = compare_grid.run_command(str(tmp_path), trace, 4, "spotlight_pipelined", 160,
                                   ["deployment.spot_nodes=8", "rl.eval_every=10"])
    assert cmd[1:4] == ["-m", "spotlight_jax.main", "--config=configs/tiny.py"]
    assert cmd[4] == f"--workdir={tmp_path}/spotlight_pipelined"
    keys = _overrides(cmd)
    spec = RunSpec.from_config(load_config("tiny", keys))
    assert spec.settings.mode == "spotlight_pipelined" and keys["seed"] == 4
    assert keys["rl.iterations"] == 160 and keys["rl.eval_seeds"] == 8
    assert keys["rl.eval_every"] == 10 and keys["deployment.spot_nodes"] == 8  # --set wins
    files = keys.get("trace.path", "").split(",") if trace != "synthetic" else []
    assert len(files) == {"synthetic": 0, "aws": 1, "gcp": 4}[trace]
    assert all(f.startswith(str(default_trace_dir())) and f.endswith(".json") for f in files)
    # config seed 4: its own draw of the synthetic trace, its own window of a recorded one
    assert keys["trace.seed"] == 4
    assert keys.get("trace.start_s", 0) == {"synthetic": 0, "aws": 529800 + 4 * 4 * 3600,
                                            "gcp": 2730 + 4 * 4 * 3600}[trace]
    with pytest.raises(ValueError, match="the grid's traces are synthetic, aws, gcp"):
        compare_grid.run_command(str(tmp_path), "azure", 0, "baseline", 1)
    with pytest.raises(ValueError, match="unknown 'nope'"):
        compare_grid.run_command(str(tmp_path), trace, 0, "nope", 1)


@pytest.mark.e2e
def test_run_makes_and_archives_a_grid_run(tmp_path):
    from helpers import MICRO_RUN_OVERRIDES, config_flags
    micro = [f[len("--config."):] for f in config_flags(
        {k: v for k, v in MICRO_RUN_OVERRIDES.items() if k != "mode"})]
    grid, work = str(tmp_path / "grid"), str(tmp_path / "runs")
    done = compare_grid.run(work, grid, "synthetic", 0, ("baseline",), 2,
                            [*micro, "rl.eval_every=1", "rl.eval_prompts=2",
                             "base_checkpoint=none", "pretrain.steps=2", "pretrain.batch_size=4"])
    assert done == ["baseline"]
    kept = read_jsonl(os.path.join(grid, "on_demand", "seed_0", "baseline", "history.jsonl"))
    assert [r["iteration"] for r in kept] == [0, 1, 2] and "val_reward" in kept[-1]
    with pytest.raises(RuntimeError, match="baseline .* failed; .*baseline.log ends"):
        compare_grid.run(work, grid, "synthetic", 0, ("baseline",), 2, ["rl.lr=-1"])


def test_baseline_priced_by_the_serial_reward_rule_is_re_priced_and_a_spot_run_refused(
        tmp_path):
    """A rule-1 baseline: 10 s iterations of which 4 s were its rewards, one image after
    another on its 4 on-demand devices; by the current rule they take 1 s, so 7 s iterations.
    Its learning stays; a rule-1 spot run must be re-run."""
    grid = str(tmp_path / "grid")
    phases = {"reward": {"critical_s": 12.0, "charged_s": 12.0,
                         "busy_on_demand_device_s": 48.0, "busy_spot_device_s": 0.0},
              "train": {"critical_s": 18.0}}
    base = _history([0.55, 0.58, 0.61], 10, 1.0)
    _fake_run(str(tmp_path / "w"), "baseline", base, code={"commit": "a" * 40},
              pricing=None, phases=phases)
    _fake_run(str(tmp_path / "w"), "spotlight", _history([0.58, 0.61, 0.64], 5, 1.0),
              code={"commit": "b" * 40})
    compare_grid.archive(str(tmp_path / "w"), grid, "aws", 0, 3)
    hist, info = compare_grid._load(os.path.join(grid, "on_demand", "seed_0", "baseline"))
    again, info2 = compare_grid.repriced_rewards(hist, info)
    assert [h["vtime_s"] for h in again] == pytest.approx([0.0, 7.0, 14.0, 21.0])
    assert [h["dollars"] for h in again] == pytest.approx([0.0, 0.7, 1.4, 2.1])
    assert [h["val_reward"] for h in again] == [h["val_reward"] for h in hist]
    assert info2["phases"]["reward"]["critical_s"] == pytest.approx(3.0)
    assert info2["phases"]["reward"]["busy_on_demand_device_s"] == pytest.approx(12.0)
    assert info2["pricing"] == PRICING_RULE and info2["repriced_from"] == 1
    # target 0.5 + 0.1: baseline at iteration 3 (21 s re-priced), spotlight at 2 (10 s)
    text = open(compare_grid.write_grid(grid, target_gain=0.1)).read()
    assert "| spotlight | 2.10x [2.10, 2.10] (n=1/1) |" in text
    assert f"made by commit {'b' * 12}; baseline made by commit {'a' * 12} under " \
           "pricing rule 1 and re-priced" in text
    with pytest.raises(ValueError, match="differ in length"):
        compare_grid.repriced_rewards([{**h, "vtime_s": h["vtime_s"] * h["iteration"]}
                                       for h in hist], info)
    # a spot run priced by the old rule: refused, not re-priced
    _fake_run(str(tmp_path / "w2"), "spotlight", _history([0.58, 0.61, 0.64], 5, 1.0),
              code={"commit": "b" * 40}, pricing=None)
    compare_grid.archive(str(tmp_path / "w2"), grid, "gcp", 0, 3)
    with pytest.raises(ValueError, match="only baseline runs can be re-priced"):
        compare_grid.write_grid(grid, target_gain=0.1)
