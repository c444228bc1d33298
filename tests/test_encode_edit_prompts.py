"""``encode_prompts`` for Qwen-Image-Edit writes what the pipeline itself computes: a tiny random
``QwenImageEditPipeline`` (a Qwen2.5-VL text encoder with its vision tower and processor, built
from configs with a tokenizer made in code; the tiny Qwen-Image VAE fixture; no downloads)
encodes (instruction, input image) pairs, and each row of the edit file equals the pipeline's
``encode_prompt(prompt, image)`` of that image resized as its ``__call__`` resizes it, and the
image's latents equal its ``prepare_latents`` (VAE mode, normalised by the VAE's
``latents_mean`` / ``latents_std``, packed as the transformer takes them); Edit Plus likewise.
Bad inputs (a missing image, a file that is no image, an image the VAE cannot take, images of
two aspect ratios, edit rows for a text-only pipeline and the reverse) are one-line errors. The
end-to-end run post-trains the converted editing transformer from such a file. Needs torch,
transformers and diffusers (the ``[encode]`` extra)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from helpers import QWEN_DIM, QWEN_PIPE, child_env, micro_config, qwen_edit_pipe

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")
PIL = pytest.importorskip("PIL.Image")

from spotlight_jax import prompt_embeddings as pe  # noqa: E402
from spotlight_jax.prompt_embeddings import encoders  # noqa: E402
from spotlight_jax.tools.encode_prompts import edit_lists, read_edit_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AREA = 64 * 64                  # the VAE's input: 64 x 64 pixels for a square image
ATOL = 1e-5
VISION = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def qwen_vl_tokenizer():
    """A byte-level BPE over the 256 byte symbols with the chat-template and vision tokens (the
    approach of tests/test_encode_prompts.py's Qwen tokenizer)."""
    from tokenizers import pre_tokenizers
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [("e", "d"), ("\u0120", "a")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = transformers.Qwen2Tokenizer(vocab=vocab, merges=merges)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>",
                                                          *VISION]})
    return tok


def qwen_vl_processor(tok):
    """Qwen2.5-VL's processor over ``tok``: its image processor resizing to at most 56 x 56
    pixels (4 patches of 14 per side, merged 2 x 2: 4 vision tokens). transformers checks the
    processor's video part by a class it only has with torchvision; without torchvision that
    check is skipped for the unused video part (edits are images)."""
    image_processor = transformers.Qwen2VLImageProcessor(min_pixels=28 * 28,
                                                         max_pixels=56 * 56)
    if importlib.util.find_spec("torchvision") is not None:
        return transformers.Qwen2VLProcessor(image_processor=image_processor, tokenizer=tok,
                                             video_processor=transformers.Qwen2VLVideoProcessor())
    from transformers.processing_utils import ProcessorMixin
    check = ProcessorMixin.check_argument_for_proper_class

    def no_video_check(self, name, arg):
        return None if name == "video_processor" else check(self, name, arg)

    with mock.patch.object(ProcessorMixin, "check_argument_for_proper_class", no_video_check):
        return transformers.Qwen2VLProcessor(image_processor=image_processor, tokenizer=tok,
                                             video_processor=None)


def edit_pipeline(plus=False, width=QWEN_DIM):
    """A tiny random Qwen-Image-Edit (Plus) pipeline: Qwen2.5-VL of width ``width`` (the tiny
    Qwen-Image transformer fixture's text width by default) with a 1-block vision tower, the
    Qwen-Image VAE fixture (16 latent channels, 4x down), no transformer (encoding needs none)."""
    tok = qwen_vl_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION}
    torch.manual_seed(11)
    cfg = transformers.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=width, intermediate_size=2 * width,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=2048, bos_token_id=tok.pad_token_id,
                         eos_token_id=tok.pad_token_id, pad_token_id=tok.pad_token_id,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 2, 2]}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=width, fullatt_block_indexes=[0]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    cls = diffusers.QwenImageEditPlusPipeline if plus else diffusers.QwenImageEditPipeline
    return cls(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
               vae=diffusers.AutoencoderKLQwenImage.from_pretrained(QWEN_PIPE / "vae").eval(),
               text_encoder=transformers.Qwen2_5_VLForConditionalGeneration(cfg).eval(),
               tokenizer=tok, processor=qwen_vl_processor(tok), transformer=None)


@pytest.fixture(scope="module")
def pipe():
    return edit_pipeline()


def write_image(path, size, seed):
    """A PNG of ``size`` (w, h): a colour gradient with noise, different per ``seed``."""
    w, h = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(w, h)
    img = np.stack([x, y, (x + y) / 2], -1) * rng.uniform(0.3, 1.0, 3) + 0.2 * rng.random((h, w,
                                                                                           3))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    PIL.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8)).save(path)
    return Path(path)


def write_edits(folder, rows, name="edits.jsonl"):
    path = Path(folder) / name
    path.write_text("\n".join(json.dumps({"prompt": p, "image": i}) for p, i in rows) + "\n")
    return path


TRAIN = [("make the red square blue", "a.png"), ("add a cat on the left", "photos/b.png"),
         ("remove the bar", "a.png"), ("make it night", "c.png")]
VAL = [("make the sky red", "photos/b.png"), ("make it night", "a.png")]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The JSONL rows and images (all square, so their latents share one shape; the sizes
    differ, so the resize matters)."""
    d = tmp_path_factory.mktemp("edits")
    for name, size, seed in (("a.png", (40, 40), 1), ("photos/b.png", (96, 96), 2),
                             ("c.png", (64, 64), 3)):
        write_image(d / name, size, seed)
    return write_edits(d, TRAIN), write_edits(d, VAL, "val.jsonl")


def pipeline_reference(pipe, instruction, image_path, area=AREA):
    """What the pipeline's ``__call__`` computes for one (instruction, image): ``(embeds [L, D],
    packed image latents [tokens, 4 C])``, through its own resize, ``encode_prompt`` and
    ``prepare_latents``."""
    module = sys.modules[type(pipe).__module__]
    image = PIL.open(image_path).convert("RGB")
    w, h = image.size
    vw, vh = module.calculate_dimensions(area, w / h)[:2]
    proc = pipe.image_processor
    with torch.no_grad():
        if isinstance(pipe, diffusers.QwenImageEditPlusPipeline):
            cw, ch = module.calculate_dimensions(module.CONDITION_IMAGE_SIZE, w / h)
            seen = [proc.resize(image, ch, cw)]                     # a list, as __call__ does
            vae_in = [proc.preprocess(image, vh, vw).unsqueeze(2)]
        else:
            seen = proc.resize(image, vh, vw)
            vae_in = proc.preprocess(seen, vh, vw).unsqueeze(2)
        embeds, mask = pipe.encode_prompt(instruction, image=seen)
        _, packed = pipe.prepare_latents(vae_in, 1, pipe.latent_channels, vh, vw,
                                         embeds.dtype, "cpu", None)
    assert mask is None or mask.all()                      # one prompt: no padding
    return embeds[0].numpy(), packed[0].numpy()


def packed(pipe, latents):
    """The file's channels-last latents ``[H', W', C]`` packed as the pipeline packs its own."""
    h, w, c = latents.shape
    t = torch.from_numpy(np.ascontiguousarray(latents.transpose(2, 0, 1)))[None, :, None]
    return pipe._pack_latents(t, 1, c, h, w)[0].numpy()


def check_rows_equal_the_pipeline(pipe, f, folder):
    for i, (instruction, k) in enumerate(zip(f.instructions, f.image_index)):
        want_e, want_lat = pipeline_reference(pipe, instruction, folder / f.images[k])
        n = int(f.mask[i].sum())
        assert n == len(want_e) and f.mask[i, :n].all()
        np.testing.assert_allclose(f.embeds[i, :n], want_e, rtol=0, atol=ATOL)
        assert not f.embeds[i, n:].any()
        np.testing.assert_allclose(packed(pipe, f.image_latents[k]), want_lat, rtol=0, atol=ATOL)


def test_the_edit_file_equals_the_pipelines_encode_prompt_and_latents(tmp_path, pipe, inputs):
    train, val = inputs
    rows, splits = edit_lists(train, val)
    path = tmp_path / "edits.safetensors"
    encoders.encode_edits_to_file(pipe, path, rows, splits, image_area=AREA, batch_size=3)
    f = pe.read(path)
    assert f.family == "qwen_image_edit" and f.is_edit and f.pooled is None
    assert f.images == ["a.png", "photos/b.png", "c.png"] and f.latent_shape == (16, 16, 16)
    assert f.prompts("train") == [pe.edit_key(p, i) for p, i in TRAIN]
    assert f.prompts("val") == [pe.edit_key(p, i) for p, i in VAL]
    assert f.info["image_area"] == AREA and "Qwen2_5_VLForConditionalGeneration" in f.encoder
    # every row (the images' null prompts too), batched 3 at a time, equals the pipeline's
    # own one-prompt call; rows of one image differ, and so do one instruction's on two images
    check_rows_equal_the_pipeline(pipe, f, train.parent)
    lengths = f.mask.sum(1)
    assert len(set(lengths.tolist())) > 1 and f.text_len == lengths.max()
    assert np.abs(f.embeds[3] - f.embeds[5]).max() > 1e-3
    assert np.abs(f.image_latents[0] - f.image_latents[1]).max() > 1e-3
    # the vision tokens are part of the prompt: the null row (no words) has them all
    assert lengths[0] > 4


def test_edit_plus_rows_equal_its_pipeline_one_image_each(tmp_path, pipe, inputs):
    plus = diffusers.QwenImageEditPlusPipeline(**pipe.components)
    rows, splits = edit_lists(inputs[0])
    path = tmp_path / "plus.safetensors"
    encoders.encode_edits_to_file(plus, path, rows[:2], splits[:2], image_area=AREA,
                                  batch_size=4)
    f = pe.read(path)
    assert f.family == "qwen_image_edit_plus" and len(f.prompts("train")) == 2
    check_rows_equal_the_pipeline(plus, f, inputs[0].parent)


def test_the_command_line_writes_the_file_and_prints_how_to_run_it(tmp_path, pipe, inputs,
                                                                   monkeypatch, capsys):
    """The tool's main with its own flags, the pipeline folder's loading stood in by the
    in-memory pipeline (loading Qwen2.5-VL's processor from a folder needs torchvision)."""
    from absl import flags

    from spotlight_jax.tools import encode_prompts as tool
    folder = tmp_path / "Qwen-Image-Edit"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name":
                                                         "QwenImageEditPipeline"}))
    loaded = []
    monkeypatch.setattr(encoders, "load_pipeline",
                        lambda path, **kw: loaded.append((Path(path), kw)) or pipe)
    fv = flags.FlagValues()
    tool.define_flags(fv)
    out = tmp_path / "edits.safetensors"
    fv(["encode_prompts", f"--pipeline={folder}", f"--prompts={inputs[0]}",
        f"--val_prompts={inputs[1]}", f"--output={out}", f"--image_area={AREA}",
        "--batch_size=2"])
    monkeypatch.setattr(flags, "FLAGS", fv)
    tool.main(["encode_prompts"])
    f = pe.read(out)
    assert loaded == [(folder, {"device": "cpu", "dtype": "float32"})]
    assert f.prompts("val") == [pe.edit_key(p, i) for p, i in VAL]
    assert f.info["pipeline"] == "Qwen-Image-Edit" and f.info["image_area"] == AREA
    assert capsys.readouterr().out.splitlines() == [
        f"{out}: 4 train + 2 val (instruction, image) pairs + 3 images' null prompts, family "
        f"qwen_image_edit, L={f.text_len} tokens of width D={QWEN_DIM}, input latents 16x16x16",
        f"use it with --config.base_checkpoint={folder} --config.model.text_len={f.text_len} "
        f"--config.prompts.embeddings_file={out}"]


def test_images_the_pipeline_cannot_take_are_one_line_errors_naming_them(tmp_path, pipe):
    write_image(tmp_path / "a.png", (32, 32), 1)
    (tmp_path / "notes.png").write_text("not an image")
    write_image(tmp_path / "strip.png", (400, 4), 2)
    write_image(tmp_path / "wide.png", (64, 32), 3)

    def encode(*rows):
        rows = read_edit_rows(write_edits(tmp_path, rows, "bad.jsonl"))
        encoders.encode_edits_to_file(pipe, tmp_path / "x.safetensors", rows, image_area=AREA)

    with pytest.raises(pe.PromptEmbeddingError, match=r"^image 'notes.png' \(.*notes.png\): "
                                                      r"cannot be read as an image "
                                                      r"\(UnidentifiedImageError\); give a PNG"):
        encode(("make it red", "notes.png"))
    with pytest.raises(pe.PromptEmbeddingError, match=r"^image 'strip.png' \(.*\): 400x4 pixels "
                                                      r"resize to 640x0 at image_area=4096 .* "
                                                      r"which the VAE cannot encode; crop it"):
        encode(("make it red", "strip.png"))
    with pytest.raises(pe.PromptEmbeddingError, match=r"^image 'wide.png': its latents are 8x24 "
                                                      r"cells, those of 'a.png' \(the first "
                                                      r"image\) 16x16; a run batches input "
                                                      r"images, so give images of one aspect "
                                                      r"ratio \(crop them\)$"):
        encode(("make it red", "a.png"), ("add a cat", "wide.png"))
    with pytest.raises(pe.PromptEmbeddingError, match=r"pipeline QwenImagePipeline: a text-only "
                                                      r"pipeline; \(instruction, image\) pairs "
                                                      r"need an editing one"):
        encoders.encode_edit_batch(diffusers.QwenImagePipeline(
            scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=None),
            ["a"], [None])


def test_loading_an_edit_pipeline_without_torchvision_says_to_install_it(tmp_path):
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: the processor loads")
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name":
                                                           "QwenImageEditPipeline"}))
    with pytest.raises(ImportError, match=r"a QwenImageEditPipeline loads Qwen2.5-VL's processor, "
                                          r"which transformers builds only with torchvision: "
                                          r"pip install torchvision"):
        encoders.load_pipeline(tmp_path)


def _tool(*args):
    return subprocess.run([sys.executable, "-m", "spotlight_jax.tools.encode_prompts", *args],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)


def test_the_tool_says_in_one_line_what_is_wrong_with_its_input(tmp_path):
    """Before any weight is loaded: a missing image for an editing pipeline, and edit rows
    given to a text-only one (only each folder's model_index.json is read)."""
    edit_dir, text_dir = tmp_path / "edit", tmp_path / "text"
    for d, cls in ((edit_dir, "QwenImageEditPipeline"), (text_dir, "QwenImagePipeline")):
        d.mkdir()
        (d / "model_index.json").write_text(json.dumps({"_class_name": cls}))
    rows = write_edits(tmp_path, [("make it red", "gone.png")])
    out = _tool(f"--pipeline={edit_dir}", f"--prompts={rows}", f"--output={tmp_path / 'o'}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: {rows} line 1: image 'gone.png' does not exist (looked for "
        f"{tmp_path / 'gone.png'}); image paths are relative to the JSON Lines file's folder, "
        "or absolute"]
    out = _tool(f"--pipeline={text_dir}", f"--prompts={rows}", f"--output={tmp_path / 'o'}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: {rows}: (instruction, image) rows, which only an editing pipeline encodes; "
        f"pipeline {str(text_dir)!r} is a QwenImagePipeline (text only): give one prompt per "
        "line, or a QwenImageEditPipeline folder"]


@pytest.mark.e2e
def test_post_training_a_qwen_image_edit_folder_from_its_edit_file(tmp_path, pipe, inputs):
    """encode_prompts' file, then a run of the Qwen-Image-Edit folder (the tiny transformer and
    VAE fixtures beside an edit pipeline's model_index.json) with it: the converted editing
    transformer samples with each pair's input latents (guidance keeping the image), nft
    updates it, the held-out images are the VAE's pixels, the LoRA is exported."""
    from spotlight_jax.config import prompt_source
    from spotlight_jax.io import safetensors_format
    from spotlight_jax.train import train_and_evaluate

    rows, splits = edit_lists(*inputs)
    path = tmp_path / "edits.safetensors"
    encoders.encode_edits_to_file(pipe, path, rows, splits, image_area=AREA)
    f = pe.read(path)
    folder = qwen_edit_pipe(tmp_path / "Qwen-Image-Edit")
    config = micro_config(1, **{
        "base_checkpoint": str(folder), "model.image_size": 8, "model.text_len": f.text_len,
        "model.text_width": 0, "model.text_embed_dim": QWEN_DIM,
        "prompts.embeddings_file": str(path), "rl.objective": "nft",
        "rl.reward": "jpeg_compressibility", "rl.eval_reward": "jpeg_compressibility",
        "rl.eval_prompts": 2, "sampler.guidance": 2.0, "sampler.eval_guidance": 2.0})
    assert isinstance(prompt_source(config), pe.EditEmbeddingPrompts)
    history = train_and_evaluate(config, str(tmp_path / "run"))
    rows = [h for h in history if "reward_mean" in h]
    assert len(rows) == 1 and np.isfinite(rows[0]["loss"]) and rows[0]["grad_norm"] > 0
    assert all(np.isfinite(h["val_reward"]) for h in history if "val_reward" in h)
    assert list((tmp_path / "run" / "samples").glob("*.png"))
    lora = safetensors_format.load(tmp_path / "run" / "lora_diffusers.safetensors")
    assert "transformer.transformer_blocks.0.attn.to_q.lora_A.weight" in lora
