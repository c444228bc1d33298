"""Runs from Z-Image and FLUX.2 pipeline folders: stand-in folders made of the transformer
fixtures (``tests/fixtures/diffusers/transformer/z_image``, ``flux2_dev``, ``flux2_klein``) and
a VAE of their latent channels (the SD1-style ``AutoencoderKL`` for Z-Image, the
``AutoencoderKLFlux2`` fixture for FLUX.2), with stand-ins of the prompt files
``encode_prompts`` writes for their pipelines (``helpers.pipeline_prompt_file``). The run's
spec takes the transformer's architecture from the folder and the run's fields from the config,
picks the folder's VAE as the decoder and reads the prompts from the file at the transformer's
text width; a prompt file of another family, width or (FLUX.2) length is a one-line error
naming it and the fix. A one-iteration run from each family's folder (``-m e2e``) decodes with
the folder's VAE and exports the LoRA under diffusers' names."""
import numpy as np
import pytest
from helpers import (
    FLUX2_DIMS,
    Z_IMAGE_DIM,
    pipeline_prompt_file,
    stand_in_pipe,
    stand_in_pipe_config,
)

from spotlight_jax import prompt_embeddings as pe
from spotlight_jax.config import ConfigError, RunSpec, load_config
from spotlight_jax.diffusion import prompt
from spotlight_jax.io import safetensors_format
from spotlight_jax.models import Flux2Config, ZImageConfig
from spotlight_jax.train import train_and_evaluate

FIXTURES = ("z_image", "flux2_dev", "flux2_klein")


@pytest.mark.parametrize("fixture", FIXTURES)
def test_a_folder_and_its_prompt_file_build_the_run(tmp_path, fixture):
    spec = RunSpec.from_config(stand_in_pipe_config(tmp_path, fixture))
    m = spec.model
    if fixture == "z_image":     # the fixture's architecture, not the tiny config's MMDiT
        assert isinstance(m, ZImageConfig)
        assert (m.dim, m.n_layers, m.n_refiner_layers, m.cap_feat_dim) == (32, 2, 1, Z_IMAGE_DIM)
    else:
        assert isinstance(m, Flux2Config)
        assert (m.num_layers, m.num_single_layers, m.joint_attention_dim) == \
            (2, 2, FLUX2_DIMS[fixture])
        assert m.guidance_embeds == (fixture == "flux2_dev") and not m.use_text_mask
    assert (m.image_size, m.text_len, m.channels) == (8, 12, 4)       # the run's choices
    vae = spec.image_decoder()
    assert vae.family == ("AutoencoderKL" if fixture == "z_image" else "AutoencoderKLFlux2")
    assert vae.latent_channels == 4 and not vae.video
    source = spec.prompt_source()
    assert isinstance(source, pe.EmbeddingPrompts) and len(source.val_prompts) > 0
    tokens, mask = source.tokenize(source.train_prompts[:3], m.text_len)
    assert tokens[prompt.EMBEDS].shape == (3, 12, m.text_embed_dim)
    null = tokens[prompt.NULL]
    # the guidance null is the file's empty prompt: Z-Image's real tokens masked in, FLUX.2's
    # every token attended
    assert null[prompt.MASK].any() and (mask.all() == (fixture != "z_image"))
    np.testing.assert_array_equal(null[prompt.EMBEDS][0], source.file.empty(12)[0])


@pytest.mark.parametrize("name, fixture, text_len", [
    ("z_image", "z_image", 512), ("flux2_dev", "flux2_dev", 512),
    ("flux2_klein_4b", "flux2_klein", 512)])
def test_the_paper_scale_configs_run_from_a_folder(tmp_path, name, fixture, text_len):
    """``configs/<name>.py`` with ``base_checkpoint=<folder>`` and the folder's prompt file: the
    architecture from the folder, the config's run fields (1024 px: 128 latent cells, bf16,
    remat, scanned blocks), the prompts at the file's length."""
    folder = stand_in_pipe(tmp_path / "folder", fixture)
    path = tmp_path / "prompts.safetensors"
    pipeline_prompt_file(path, fixture, text_len=text_len)
    spec = RunSpec.from_config(load_config(name, {
        "base_checkpoint": str(folder), "prompts.embeddings_file": str(path),
        "model.text_len": text_len}))
    m = spec.model
    assert (m.width, m.image_size, m.text_len) == (32, 128, text_len)
    assert (m.dtype, m.remat, m.scan_blocks) == ("bfloat16", True, True)
    assert spec.prompt_source().file.family == pe.read(path).family
    assert spec.image_decoder().latent_channels == m.channels


def _bad(tmp_path, fixture, file_fixture, **overrides):
    """The one-line ConfigError of a run on ``fixture``'s folder whose prompt file is the
    stand-in of ``file_fixture``'s pipeline (``overrides``: of the file: ``text_len``,
    ``dim``)."""
    path = tmp_path / "other.safetensors"
    pipeline_prompt_file(path, file_fixture, **overrides)
    config = stand_in_pipe_config(tmp_path, fixture, **{"prompts.embeddings_file": str(path)})
    with pytest.raises(ConfigError) as e:
        RunSpec.from_config(config).prompt_source()
    message = str(e.value)
    assert "\n" not in message and message.startswith(
        ("prompts.embeddings_file=", "model.text_len=")), message
    return message


def test_a_prompt_file_of_another_family_is_refused_in_one_line(tmp_path):
    msg = _bad(tmp_path, "flux2_klein", "z_image", dim=FLUX2_DIMS["flux2_klein"])
    assert ("written by a ZImagePipeline (family 'z_image'), whose embeddings condition "
            "model.family='z_image', and this run's model is 'flux2'; encode the prompts with "
            "the base's own pipeline folder (python -m spotlight_jax.tools.encode_prompts "
            "--pipeline=<the base_checkpoint folder>)") in msg
    # FLUX.2 [dev]'s Mistral states for a [klein] transformer (same width here)
    msg = _bad(tmp_path, "flux2_klein", "flux2_dev", dim=FLUX2_DIMS["flux2_klein"])
    assert "family 'flux2': Mistral states, FLUX.2 [dev]), and the base's transformer is " \
           "FLUX.2 [klein]'s" in msg
    # an SD3 file (a known family of another model) for Z-Image
    path = tmp_path / "sd3.safetensors"
    f = pipeline_prompt_file(path, "z_image")
    pe.write(path, f.all_prompts, f.embeds, f.mask, np.zeros((len(f.all_prompts), 4)),
             splits=f.splits, family="sd3", encoder="StableDiffusion3Pipeline: x")
    config = stand_in_pipe_config(tmp_path, "z_image", **{"prompts.embeddings_file": str(path)})
    with pytest.raises(ConfigError, match="family 'sd3'.*condition model.family='mmdit', and "
                                          "this run's model is 'z_image'"):
        RunSpec.from_config(config).prompt_source()


def test_a_prompt_file_of_another_width_or_length_is_refused_in_one_line(tmp_path):
    msg = _bad(tmp_path, "z_image", "z_image", dim=24)
    assert msg.endswith("embeddings of width 24, the transformer takes 16 (its cap_feat_dim); "
                        "encode the prompts with the base's own pipeline folder (python -m "
                        "spotlight_jax.tools.encode_prompts --pipeline=<the base_checkpoint "
                        "folder>)"), msg
    # FLUX.2 attends to every token of the file's rows: text_len is exactly theirs
    msg = _bad(tmp_path, "flux2_klein", "flux2_klein", text_len=16)
    assert msg.startswith("model.text_len=12: the flux2_klein transformer attends to every "
                          "text token") and msg.endswith("holds the pipeline's 16 per prompt "
                                                         "(its max_sequence_length, pad tokens "
                                                         "included); set "
                                                         "--config.model.text_len=16"), msg
    # Z-Image takes a row's real tokens: a longer text_len is fine, a shorter one is not
    path = tmp_path / "z.safetensors"
    f = pipeline_prompt_file(path, "z_image")
    config = stand_in_pipe_config(tmp_path, "z_image", **{
        "prompts.embeddings_file": str(path), "model.text_len": f.text_len - 1})
    with pytest.raises(ConfigError, match=rf"{f.text_len} tokens per prompt, more than "
                                          rf"model.text_len={f.text_len - 1}; set "
                                          rf"--config.model.text_len={f.text_len}"):
        RunSpec.from_config(config).prompt_source()


@pytest.mark.e2e
@pytest.mark.parametrize("fixture, objective, lora_key", [
    ("z_image", "nft", "transformer.layers.0.attention.to_q.lora_A.weight"),
    ("flux2_klein", "flow_grpo",
     "transformer.single_transformer_blocks.0.attn.to_qkv_mlp_proj.lora_A.weight")])
def test_post_training_from_a_z_image_or_flux2_folder(tmp_path, fixture, objective, lora_key):
    """One iteration from the folder with classifier-free guidance (2 passes against the
    file's empty prompt): rollouts decoded by the folder's VAE before the reward, the held-out
    grid its pixels, the LoRA exported under diffusers' names."""
    config = stand_in_pipe_config(tmp_path, fixture, objective, **{
        "sampler.guidance": 2.0, "sampler.eval_guidance": 2.0})
    history = train_and_evaluate(config, str(tmp_path / "run"))
    rows = [h for h in history if "reward_mean" in h]
    assert len(rows) == 1 and np.isfinite(rows[0]["loss"]) and rows[0]["grad_norm"] > 0
    assert all(np.isfinite(h["val_reward"]) for h in history if "val_reward" in h)
    if objective == "flow_grpo":         # the rollout's guided log-probs, recomputed
        assert rows[0]["rollout_logp_dev"] < 1e-3
    assert list((tmp_path / "run" / "samples").glob("val_*.png"))
    lora = safetensors_format.load(tmp_path / "run" / "lora_diffusers.safetensors")
    assert lora_key in lora
    assert any(np.abs(v).max() > 0 for k, v in lora.items() if "lora_B" in k)
