"""Optional W&B logging (``logging.wandb=offline``): the run folder holds the same scalars as
rl.jsonl and the sample grids, read back from the offline run file; bad settings are refused."""
import json

import numpy as np
import pytest
from helpers import micro_config, wandb_history

from spotlight_jax.config import ConfigError, RunSpec, load_config
from spotlight_jax.io.metrics import MetricWriter


def test_offline_writer_logs_scalars_and_pictures(tmp_path):
    w = MetricWriter(str(tmp_path), "rl", wandb="offline", run_config={"seed": 3})
    w.write(0, val_reward=0.6, note="text", gaps={"2": 1e-7})
    w.image(1, "samples/val", np.full((6, 8, 3), 0.5, np.float32), caption="grid")
    w.write(1, reward_mean=0.25, loss=float("nan"), n=4)
    w.close()
    rows = wandb_history(str(tmp_path))
    assert rows[0]["_step"] == 0 and rows[0]["val_reward"] == 0.6
    assert "note" not in rows[0] and "gaps" not in rows[0]       # numbers only, as TensorBoard
    at1 = {k: v for r in rows if r["_step"] == 1 for k, v in r.items()}
    assert at1["reward_mean"] == 0.25 and at1["n"] == 4 and "loss" not in at1   # NaN skipped
    assert at1["samples/val/_type"] == "image-file"
    assert (at1["samples/val/width"], at1["samples/val/height"]) == (8, 6)


@pytest.mark.parametrize("value,match", [("bogus", "choose one of off, offline, online")])
def test_bad_wandb_setting_is_refused(value, match):
    with pytest.raises(ConfigError, match=f"logging.wandb='{value}': {match}"):
        RunSpec.from_config(load_config("tiny", {"logging.wandb": value}))


@pytest.mark.e2e      # a micro run plus W&B's service start (the default suite's budget)
def test_micro_run_logs_every_scalar_of_rl_jsonl_to_wandb(tmp_path):
    from spotlight_jax import runner
    from spotlight_jax.models.factory import create_model

    spec = RunSpec.from_config(micro_config(2, **{"logging.wandb": "offline", "rl.eval_every": 2,
                                         "checkpoint.every": 2}))
    graphdef, state = create_model(spec.model)
    runner.build_and_run(spec, str(tmp_path), graphdef, state, progress=False)
    jsonl = [json.loads(x) for x in open(tmp_path / "rl.jsonl")]
    logged = {}
    for r in wandb_history(str(tmp_path)):
        logged.setdefault(r["_step"], {}).update(r)
    for row in jsonl:
        numbers = {k: v for k, v in row.items() if k not in ("step", "time")
                   and isinstance(v, (int, float)) and np.isfinite(v)}
        assert numbers and {k: logged[row["step"]][k] for k in numbers} == pytest.approx(numbers)
    assert all(logged[s]["samples/val/_type"] == "image-file" for s in (0, 2))
