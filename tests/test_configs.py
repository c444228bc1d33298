"""Every config in configs/ builds, validates, and dry-runs without allocating parameters."""
import functools
import pathlib
import runpy
import subprocess
import sys

import pytest

from spotlight_jax.config import mesh_config, model_config, sampler_config
from spotlight_jax.emulation import flops
from spotlight_jax.runner.dry_run import dry_run

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.py") if p.name != "__init__.py")


def load(path):
    return runpy.run_path(str(path))["get_config"]()


@functools.cache
def report(path) -> str:
    """The dry run's report of a config file (made once per file: several checks read it)."""
    return dry_run(load(path))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_builds_and_documents_its_command(path):
    cfg = load(path)
    model_config(cfg)
    mesh_config(cfg).resolve(8)
    sampler_config(cfg)
    sampler_config(cfg, evaluation=True)
    doc = runpy.run_path(str(path)).get("__doc__") or ""
    assert "python -m spotlight_jax.main" in doc, f"{path.name} docstring lacks its command"


# sd35_medium's dry run (~40 s: its 24 blocks, which differ, traced unscanned, for XLA's
# attention and a fused kernel's) among the longer checks, with the smaller Wan configs' (the
# same path as wan21_14b's, ~3 s each with scanned blocks)
LONGER = ("sd35_medium", "wan21_1_3b", "wan22_ti2v_5b")


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.e2e)
                                  if p.stem in LONGER else p for p in CONFIGS],
                         ids=lambda p: p.stem)
def test_dry_run_every_config(path):
    text = report(path)
    assert "parameters:" in text and "PartitionSpec" in text


def test_paper_scale_config_is_about_20b_and_sharded():
    text = report(ROOT / "configs" / "qwen_image.py")
    n = int(text.split("parameters: ")[1].split(" ")[0].replace(",", ""))
    assert 15e9 < n < 25e9, n
    assert "'fsdp'" in text  # large weights are sharded over fsdp


def test_flux_dev_config_has_flux1_devs_parameters():
    """diffusers' ``FluxTransformer2DModel(guidance_embeds=True)`` with its default (FLUX.1
    [dev]) sizes has 11,901,408,320 parameters (counted on torch's meta device, diffusers
    0.42.1); the config's model has exactly as many, sharded over fsdp, one pass per velocity."""
    text = report(ROOT / "configs" / "flux_dev.py")
    n = int(text.split("parameters: ")[1].split(" ")[0].replace(",", ""))
    assert n == 11_901_408_320
    assert "(+38 single-stream)" in text and "'fsdp'" in text and "at CFG" not in text


def test_wan21_14b_config_has_wan_14bs_parameters():
    """diffusers' ``WanTransformer3DModel`` with Wan 2.1 T2V 14B's config has 14,288,491,584
    parameters (counted on torch's meta device, diffusers 0.42.1); the config's model has
    exactly as many, and 480 x 832 x 81 frames make 32,760 video tokens."""
    cfg = model_config(load(ROOT / "configs" / "wan21_14b.py"))
    assert flops.param_count(cfg) == 14_288_491_584     # the abstract model's, no allocation
    assert cfg.latent_shape == (21, 60, 104, 16) and cfg.num_patches == 32_760


def test_wan21_1_3b_config_has_wan_1_3bs_parameters():
    """diffusers' ``WanTransformer3DModel`` with Wan 2.1 T2V 1.3B's config (12 heads of 128, FFN
    8960, 30 layers) has 1,418,996,800 parameters (torch's meta device, diffusers 0.42.1)."""
    cfg = model_config(load(ROOT / "configs" / "wan21_1_3b.py"))
    assert flops.param_count(cfg) == 1_418_996_800
    assert cfg.latent_shape == (21, 60, 104, 16) and cfg.num_patches == 32_760


def test_wan22_ti2v_5b_config_has_wan_5bs_parameters():
    """diffusers' ``WanTransformer3DModel`` with Wan 2.2 TI2V 5B's config (24 heads of 128, FFN
    14336, 30 layers, 48 latent channels) has 4,999,787,712 parameters (torch's meta device,
    diffusers 0.42.1); 704 x 1280 x 121 frames through the 4 x 16 x 16 VAE make 27,280 tokens."""
    cfg = model_config(load(ROOT / "configs" / "wan22_ti2v_5b.py"))
    assert flops.param_count(cfg) == 4_999_787_712
    assert cfg.latent_shape == (31, 44, 80, 48) and cfg.num_patches == 27_280


def test_tiny_config_size():
    n = int(report(ROOT / "configs" / "tiny.py").split("parameters: ")[1].split(" ")[0]
            .replace(",", ""))
    assert 1e6 < n < 3e6, n


def test_cli_dry_run_and_flag_errors(tmp_path):
    cmd = [sys.executable, "-m", "spotlight_jax.main", "--config=configs/qwen_image.py",
           f"--workdir={tmp_path}", "--dry_run"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "parameters:" in out.stdout
    bad = subprocess.run(cmd + ["--config.rl.lrr=1"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode != 0 and "lr" in bad.stderr


def test_command_line_shows_info_from_this_project_only():
    import logging as pylogging

    from absl import logging

    from spotlight_jax.main import _ProjectInfoOnly

    def rec(level, path):
        return pylogging.LogRecord("absl", level, path, 1, "m", None, None)

    f = _ProjectInfoOnly()
    old = logging.get_verbosity()
    try:
        logging.set_verbosity(logging.INFO)
        assert f.filter(rec(pylogging.INFO, "/x/spotlight_jax/controller.py"))
        assert not f.filter(rec(pylogging.INFO, "/x/orbax/checkpoint/checkpoint_manager.py"))
        assert f.filter(rec(pylogging.WARNING, "/x/orbax/checkpoint/checkpoint_manager.py"))
        logging.set_verbosity(logging.DEBUG)
        assert f.filter(rec(pylogging.INFO, "/x/orbax/checkpoint/checkpoint_manager.py"))
    finally:
        logging.set_verbosity(old)
