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


@pytest.mark.parametrize("name", ["qwen_image", "qwen_image_edit"])
def test_qwen_image_configs_have_qwen_images_parameters(name):
    """diffusers' ``QwenImageTransformer2DModel()`` (Qwen-Image's sizes; Qwen-Image-Edit's
    transformer is the same) has 20,430,401,088 parameters (torch's meta device, diffusers
    0.42.1); both configs' models have exactly as many."""
    cfg = model_config(load(ROOT / "configs" / f"{name}.py"))
    assert flops.param_count(cfg) == 20_430_401_088
    assert cfg.reference_images == (name == "qwen_image_edit")


# parameters of diffusers' model at each config's sizes, counted on torch's meta device
# (diffusers 0.42.1): ZImageTransformer2DModel() and Flux2Transformer2DModel() are Z-Image's and
# FLUX.2 [dev]'s defaults; [klein] 4B / 9B change layers, heads, text width and guidance
META_PARAMS = {"z_image": 6_154_908_736, "flux2_dev": 32_223_281_152,
               "flux2_klein_4b": 3_875_544_576, "flux2_klein_9b": 9_078_581_248}


@pytest.mark.parametrize("name", sorted(META_PARAMS))
def test_z_image_and_flux2_configs_have_diffusers_parameter_counts(name):
    cfg = model_config(load(ROOT / "configs" / f"{name}.py"))
    assert flops.param_count(cfg) == META_PARAMS[name]       # the abstract model's, traced


def _diffusers_meta(cfg, torch, diffusers):
    """diffusers' model of ``cfg``'s family and sizes on the meta device, and a call of it with
    one sample of the config's size as its pipeline calls it."""
    h, w, c = cfg.latent_shape
    with torch.device("meta"):
        if hasattr(cfg, "reference_images"):           # Qwen-Image(-Edit), as (Edit)Pipeline
            model = diffusers.QwenImageTransformer2DModel()
            g = cfg.image_size // cfg.patch_size
            grids = [(1, g, g)] * (1 + cfg.reference_images)
            args = dict(hidden_states=torch.empty(1, g * g * len(grids), 4 * c),
                        encoder_hidden_states=torch.empty(1, cfg.text_len, cfg.text_embed_dim),
                        timestep=torch.ones(1), img_shapes=[grids])
            return lambda: model(**args, return_dict=False)
        if hasattr(cfg, "cap_feat_dim"):                                # Z-Image
            model = diffusers.ZImageTransformer2DModel()
            x, t = [torch.empty(c, 1, h, w)], torch.ones(1)
            caps = [torch.empty(cfg.text_len, cfg.cap_feat_dim)]
            return lambda: model(x, t, caps, return_dict=False)
        model = diffusers.Flux2Transformer2DModel(
            num_layers=cfg.num_layers, num_single_layers=cfg.num_single_layers,
            num_attention_heads=cfg.num_attention_heads,
            joint_attention_dim=cfg.joint_attention_dim, guidance_embeds=cfg.guidance_embeds)
        pipe = diffusers.Flux2Pipeline
        patched = torch.empty(1, 4 * c, h // 2, w // 2)
        text = torch.empty(1, cfg.text_len, cfg.joint_attention_dim)
        args = dict(hidden_states=pipe._pack_latents(patched), encoder_hidden_states=text,
                    timestep=torch.ones(1), img_ids=pipe._prepare_latent_ids(patched),
                    txt_ids=pipe._prepare_text_ids(text),
                    guidance=torch.ones(1) if cfg.guidance_embeds else None)
        return lambda: model(**args, return_dict=False)


@pytest.mark.parametrize("name", ["qwen_image", "qwen_image_edit", "z_image", "flux2_klein_4b"])
def test_flop_count_equals_torchs_count_of_diffusers(name):
    """Our FLOP count (Qwen-Image's formula; Z-Image's and FLUX.2's read off the traced model)
    equals torch's FLOP counter over diffusers' model on the meta device (nothing allocated)
    at the config's size, called as its pipeline calls it (one sample), plus the output
    projection of tokens diffusers computes and its pipeline discards, which ours never
    computes: Qwen-Image-Edit's reference tokens, Z-Image's caption tokens."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    from torch.utils.flop_counter import FlopCounterMode

    cfg = model_config(load(ROOT / "configs" / f"{name}.py"))
    call = _diffusers_meta(cfg, torch, diffusers)
    with FlopCounterMode(display=False) as counter:
        call()
    out = cfg.patch_size ** 2 * cfg.channels
    discarded = {"qwen_image_edit": cfg.num_patches * getattr(cfg, "reference_images", 0),
                 "z_image": -(-cfg.text_len // 32) * 32}.get(name, 0) * 2 * cfg.width * out
    assert counter.get_total_flops() == flops.forward_flops(cfg) + discarded
