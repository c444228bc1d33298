"""Bad config values stop at the boundary: every field of configs/base.py, set out of range,
raises a ConfigError naming its dotted path; device counts and meshes are checked against the
devices present; the command line prints one line and exits 2."""
import pathlib
import re
import subprocess
import sys

import jax
import pytest

from spotlight_jax.config import ConfigError, cpu_device_count, load_config, validate

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.py") if p.name != "__init__.py")

# Fields with no invalid value (bools are skipped by type: True and False are both valid).
EXEMPT = {
    "compilation_cache_dir": "any directory; created on first use ('' = off)",
    "deployment.ray_spot_resource": "a free-form Ray resource name ('' = any node)",
    "pretrain.init_from": "a checkpoint path, read only if pretraining runs",
    "rl.global_std": "a bool (None = the objective's default)",
}

# Out-of-range values where the type's default bad value below is valid.
BAD = {
    "mesh.data": -2, "mesh.fsdp": -2, "mesh.sp": -2,     # -1 = the devices left
    "cost.lora_rank": -2,                                # -1 = follow rl.lora_rank
    "rl.lr": -1.0, "rl.detail_beta": -1.0,               # float placeholders (None = default)
    "sampler.sde_window": (5, 2),
    "compare.seeds": (1, 1),                             # () = config.seed alone
    "rl.reward": "no_such_reward",                       # str placeholder (None = default)
    "sampler.noise_patches": (0,) * 10,
    "model.rope_axes": (16, 56, 55),                     # must sum to head_dim, all even
    "model.dual_attention_layers": (99,),                # a block the model does not have
    "logging.wandb_project": "team/project",             # W&B names forbid / \ # ? % :
}


def leaves(section, prefix=""):
    for key, value in section.items():
        if hasattr(value, "items"):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def bad_value(path, value):
    if path in BAD:
        return BAD[path]
    if isinstance(value, str):
        return "no_such_value"
    if isinstance(value, float):
        return -1.0
    if isinstance(value, int):
        return -1
    raise AssertionError(f"{path}={value!r}: give it a bad value in BAD or a reason in EXEMPT")


FIELDS = [(p, v) for p, v in leaves(load_config("base"))
          if p not in EXEMPT and not isinstance(v, bool)]


def names(message: str, path: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(path)}=", message) is not None


@pytest.mark.parametrize("path, value", FIELDS, ids=[p for p, _ in FIELDS])
def test_every_field_out_of_range_is_a_config_error_naming_it(path, value):
    bad = bad_value(path, value)
    config = load_config("base", {path: bad})
    with pytest.raises(ConfigError) as e:
        validate(config, jax.devices())
    message = str(e.value)
    assert names(message, path), f"{path}={bad!r} raised {message!r}"
    assert "\n" not in message


def test_the_exemptions_are_real_fields():
    all_fields = dict(leaves(load_config("base")))
    assert set(EXEMPT) <= set(all_fields) and set(BAD) <= set(all_fields)
    assert not any(isinstance(all_fields[p], bool) for p in EXEMPT)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_validates_on_the_test_devices(path):
    validate(load_config(path), jax.devices())


def test_negative_learning_rate_is_rejected_with_the_fix():
    with pytest.raises(ConfigError, match=r"^rl\.lr=-1\.0: must be > 0 .*--config\.rl\.lr="):
        validate(load_config("tiny", {"rl.lr": -1.0}))


@pytest.mark.parametrize("overrides, match", [
    ({"rl.nft.minibatches": 7}, r"^rl\.nft\.minibatches=7: the batch of 64 samples .* does not "
                                r"split into it; choose a divisor of 64 \(e\.g\. 4\)$"),
    ({"rl.objective": "flow_grpo", "rl.minibatches": 128},
     r"^rl\.minibatches=128: the batch of 64 samples .*\(e\.g\. 64\)$"),
])
def test_a_batch_that_does_not_split_into_the_minibatches_is_named(overrides, match):
    """The update would fail at its first step; the config boundary says so first."""
    with pytest.raises(ConfigError, match=match):
        validate(load_config("tiny", overrides))


def test_more_trainer_devices_than_present_names_the_device_count():
    config = load_config("tiny", {"trainer_devices": 64})
    validate(config)                    # nothing wrong without the devices
    with pytest.raises(ConfigError, match=r"trainer_devices=64: only 8 devices are present"):
        validate(config, jax.devices())


@pytest.mark.parametrize("mode,trainer_devices,want", [
    ("baseline", 1, 0), ("baseline", 0, 0), ("baseline", 2, 2), ("explore_sync", 4, 4),
    ("spotlight", 2, 12), ("spot_rollout", 1, 12)])
def test_emulated_cpu_devices_follow_the_mode_and_the_trainer(mode, trainer_devices, want):
    # trace-free modes get exactly the trainer's devices (none for one); spot modes the fleet's
    config = load_config("tiny", {"mode": mode, "trainer_devices": trainer_devices})
    assert cpu_device_count(config) == want


@pytest.mark.parametrize("overrides", [
    {"trainer_devices": 0, "mesh.sp": 3},                           # 8 is not a multiple of 3
    {"trainer_devices": 2, "mesh.data": 2, "mesh.fsdp": 2},          # 4 devices on 2
], ids=["not_a_divisor", "too_many"])
def test_a_mesh_the_trainers_devices_cannot_form_is_rejected(overrides):
    config = load_config("tiny", overrides)
    validate(config)
    with pytest.raises(ConfigError, match=r"mesh\.data=.*cannot be formed from the trainer's"):
        validate(config, jax.devices())


def test_missing_trace_file_names_the_path_and_the_fix(tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(ConfigError, match=rf"trace\.path=.*{missing.name}.*does not exist"):
        validate(load_config("tiny", {"trace.path": str(missing)}))


def test_command_line_prints_one_line_and_exits_2(tmp_path):
    cmd = [sys.executable, "-m", "spotlight_jax.main", "--config=configs/tiny.py",
           f"--workdir={tmp_path}", "--config.rl.lr=-1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: rl.lr=-1.0"), out.stderr
    assert "Traceback" not in out.stderr
    debug = subprocess.run(cmd + ["--debug"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    assert not (tmp_path / "base").exists()        # no work started


@pytest.mark.parametrize("args, names_it", [
    (["--config=configs/tiny.py", "--config.rl.lrr=1"], "--config.rl.lrr"),
    (["--config=configs/nope.py"], "configs/nope.py"),
], ids=["unknown_field", "missing_file"])
def test_command_line_config_file_and_override_errors_are_one_line(tmp_path, args, names_it):
    out = subprocess.run([sys.executable, "-m", "spotlight_jax.main", f"--workdir={tmp_path}",
                          *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith("error: ") and names_it in lines[0]
