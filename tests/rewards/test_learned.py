"""Learned rewards in JAX (CLIP score, PickScore, the LAION aesthetic predictor) against
transformers: tiny random ``CLIPModel`` s (OpenAI's quick_gelu with the legacy end-of-text rule,
and LAION's gelu with the id rule) and transformers' own embeddings, logits and token ids of fixed
inputs are committed fixtures (tests/fixtures/transformers/, made by make_clip_fixtures.py), so
no torch is needed; the image preprocessing against transformers' ``CLIPImageProcessorPil`` on
real-size images of several aspect ratios (live where transformers is installed, and bit for
bit against the stored checksums of its output everywhere); the rewards' formulas; the registry
and config wiring."""
import dataclasses
import hashlib
import importlib.util
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from spotlight_jax import rewards
from spotlight_jax.config import ConfigError, RunSpec
from spotlight_jax.rewards import clip_model, learned

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "transformers"
NAMES = ("clip_quick_gelu", "clip_gelu")
ATOL = 1e-5
# (height, width) of real-size test images, and the sha256 of transformers'
# CLIPImageProcessorPil output for each (float32 bytes), as the generator computed them
SIZES = {
    (512, 512): "e0b33a0e767480909fe45be2f1f106662f28845a164c16c54f0658152ba68b94",
    (384, 640): "bedad2dfc81a86276b806ebfdb93f52bb0f5e5f120a99d8b6edd57640e3084c4",
    (1024, 576): "1b261fc7f7a2b649c6d51b8ce348a3e52f0afd9f854969a98982a058526b08dc",
    (300, 301): "102e084e8e6953b1cb0d19a85d917ac194e911115f02ee0d2e9e993e65ccd9e2",
    (64, 96): "db91c144cb3e318e608354503994d1e41a322b66c251481e2672450f9c4e7f53",
}   # transformers 5.25.0, Pillow's bicubic; regenerated live below where transformers is found


@pytest.fixture(autouse=True)
def highest_precision():
    with jax.default_matmul_precision("highest"):
        yield


def _generator():
    spec = importlib.util.spec_from_file_location("make_clip_fixtures",
                                                  FIXTURES / "make_clip_fixtures.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def _loaded(name):
    model, cfg = clip_model.from_transformers(FIXTURES / name)
    return model, cfg, np.load(FIXTURES / f"{name}.npz")


@pytest.mark.parametrize("name", NAMES)
def test_embeddings_and_logits_equal_transformers(name):
    model, cfg, ref = _loaded(name)
    img = np.asarray(model.image_embeds(ref["pixels"]))
    txt = np.asarray(model.text_embeds(ref["ids"]))
    np.testing.assert_allclose(img, ref["image_embeds"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(txt, ref["text_embeds"], rtol=0, atol=ATOL)
    cos = (img / np.linalg.norm(img, axis=-1, keepdims=True)) @ (
        txt / np.linalg.norm(txt, axis=-1, keepdims=True)).T
    np.testing.assert_allclose(np.exp(float(model.logit_scale[...])) * cos,
                               ref["logits_per_image"], rtol=0, atol=1e-4)
    assert np.abs(txt[0] - txt[1]).max() > 1e-2          # the prompt matters


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_equals_transformers_on_the_fixture_prompts(name):
    """Empty, short, quoted and over-long (truncated, end-of-text kept) prompts."""
    gen = _generator()
    _, cfg, ref = _loaded(name)
    ids = clip_model.load_tokenizer(FIXTURES / name, cfg)(gen.PROMPTS)
    np.testing.assert_array_equal(ids, ref["ids"])
    assert (ids == ref["ids"][0, 0]).sum(axis=1).tolist() == [1] * len(gen.PROMPTS)   # one BOS


def test_tokenizer_equals_transformers_on_hundreds_of_prompts():
    transformers = pytest.importorskip("transformers")
    from spotlight_jax import world
    gen = _generator()
    tok = gen.tokenizer()
    _, cfg, _ = _loaded("clip_gelu")
    prompts = world.train_prompts(world.WorldConfig(image_size=16))[:300]
    prompts += ["", "   ", "ÉCOLE à Zürich", "emoji 🙂 text", "A  Mixed\tCase\nPrompt",
                "x" * 200, '"quoted" 7, 8.']
    ours = clip_model.load_tokenizer(FIXTURES / "clip_gelu", cfg)(prompts)
    want = tok(prompts, padding="max_length", truncation=True, max_length=cfg.max_len,
               return_tensors="np")["input_ids"]
    assert isinstance(tok, transformers.CLIPTokenizer)
    np.testing.assert_array_equal(ours, want)


def _image(h, w, seed):
    return np.random.default_rng(seed).random((h, w, 3)).astype(np.float32)


def test_preprocessing_equals_transformers_clip_image_processor():
    transformers = pytest.importorskip("transformers")
    processor = transformers.CLIPImageProcessorPil()
    cfg = clip_model.CLIPConfig(vision=None, text=None)        # 224, OpenAI's mean and std
    for i, (h, w) in enumerate(SIZES):
        img = _image(h, w, i)
        u8 = np.clip(np.round(img * 255), 0, 255).astype(np.uint8)
        want = processor(images=[u8], return_tensors="np")["pixel_values"][0].transpose(1, 2, 0)
        np.testing.assert_array_equal(clip_model.preprocess(img[None], cfg)[0], want)


def test_preprocessing_equals_the_stored_transformers_output_and_crops_the_centre():
    """Bit for bit: the sha256 of transformers' output for each image (no transformers needed);
    and a wide image keeps its middle."""
    cfg = clip_model.CLIPConfig(vision=None, text=None)
    for i, ((h, w), digest) in enumerate(SIZES.items()):
        x = clip_model.preprocess(_image(h, w, i)[None], cfg)
        assert x.shape == (1, 224, 224, 3) and x.dtype == np.float32
        assert hashlib.sha256(x[0].tobytes()).hexdigest() == digest, (h, w)
    # a wide image keeps its middle: a left third of black and a right third of white crop away
    img = np.full((224, 672, 3), 0.5, np.float32)
    img[:, :224], img[:, -224:] = 0.0, 1.0
    x = clip_model.preprocess(img[None], cfg)[0] * np.asarray(cfg.std) + np.asarray(cfg.mean)
    np.testing.assert_allclose(x, 128 / 255, atol=1e-6)


@pytest.mark.parametrize("kind", ["clip_score", "pickscore"])
def test_clip_score_and_pickscore_formulas(kind):
    model, cfg, ref = _loaded("clip_gelu")
    graphdef, state = nnx.split(model)
    n = len(ref["pixels"])
    got = np.asarray(learned.score(graphdef, kind, state, ref["pixels"], ref["ids"][:n], None))
    img, txt = ref["image_embeds"], ref["text_embeds"][:n]
    cos = np.sum(img * txt, -1) / np.linalg.norm(img, axis=-1) / np.linalg.norm(txt, axis=-1)
    want = (np.maximum(100 * cos, 0) if kind == "clip_score"
            else np.exp(float(model.logit_scale[...])) * cos)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_aesthetic_head_on_the_normalised_image_embedding(tmp_path):
    from spotlight_jax.io import safetensors_format
    model, cfg, ref = _loaded("clip_quick_gelu")
    rng = np.random.default_rng(0)
    dims = (cfg.projection, 1024, 128, 64, 16, 1)
    tensors = {}
    for i, (a, b) in zip(learned.AESTHETIC_LAYERS, zip(dims, dims[1:])):
        tensors[f"layers.{i}.weight"] = (rng.normal(size=(b, a)) / a ** 0.5).astype(np.float32)
        tensors[f"layers.{i}.bias"] = rng.normal(size=(b,)).astype(np.float32) * 0.1
    safetensors_format.save(tmp_path / "head.safetensors", tensors)
    head = learned.load_aesthetic_head(tmp_path / "head.safetensors")
    graphdef, state = nnx.split(model)
    got = np.asarray(learned.score(graphdef, "aesthetic", state, ref["pixels"], None, head))
    x = ref["image_embeds"] / np.linalg.norm(ref["image_embeds"], axis=-1, keepdims=True)
    for i in learned.AESTHETIC_LAYERS:                    # torch Linear: x W^T + b, no activation
        x = x @ tensors[f"layers.{i}.weight"].T + tensors[f"layers.{i}.bias"]
    np.testing.assert_allclose(got, x[:, 0], rtol=1e-5, atol=1e-5)
    with pytest.raises(FileNotFoundError, match="convert the published"):
        learned.load_aesthetic_head(tmp_path / "nope.safetensors")


def test_host_and_device_paths_score_alike():
    """The registry contract (host images in, float32 [B] out) and the device path, whose JAX
    resize is close to PIL's, not equal."""
    fn = learned.LearnedReward("clip_score", FIXTURES / "clip_gelu", batch_size=2)
    images = np.stack([_image(40, 56, i) for i in range(3)])
    prompts = ["a red bar", "two blue squares", "a green column"]
    host = fn(images, prompts)
    assert host.shape == (3,) and host.dtype == np.float32
    device = np.asarray(fn.score_device(jax.numpy.asarray(images), prompts))
    np.testing.assert_allclose(device, host, atol=2.0)        # CLIP-score units (0-100)
    one = fn(images[:1], prompts[:1])                         # batching changes nothing
    np.testing.assert_allclose(one, host[:1], rtol=1e-6)


def test_a_built_run_registers_a_learned_reward_and_the_config_names_a_missing_folder():
    from helpers import micro_config
    c = micro_config(1)
    c.rl.eval_reward = "geneval_lite:1.0,clip_score:0.01"
    with pytest.raises(ConfigError, match=r"^learned_rewards.clip_dir='': rl.reward or "):
        RunSpec.from_config(c)
    c.learned_rewards.clip_dir = str(FIXTURES / "clip_quick_gelu")
    RunSpec.from_config(c).register_rewards()
    assert "clip_score" in rewards.names()
    got = rewards.get("clip_score")(np.zeros((2, 32, 32, 3), np.float32), ["a", "b"])
    assert got.shape == (2,) and np.isfinite(got).all()
    c.learned_rewards.clip_dir = str(FIXTURES)               # not a CLIP folder
    with pytest.raises(ConfigError, match="learned_rewards.clip_dir="):
        RunSpec.from_config(c).register_rewards()
    c.rl.eval_reward = "hpsv2"                               # its weights, then their file
    with pytest.raises(ConfigError, match=r"^learned_rewards.hpsv2_weights='': "):
        RunSpec.from_config(c)
    c.learned_rewards.hpsv2_weights = str(FIXTURES / "nope.safetensors")
    with pytest.raises(ConfigError, match=r"learned_rewards.hpsv2_weights=.*no such file"):
        RunSpec.from_config(c).register_rewards()


def test_open_clip_model_equals_open_clips_own_features():
    """HPSv2.1's model family from an open_clip state dict (fused in_proj q/k/v, projections
    stored [width, embed]): image and text features equal open_clip's (fixture made with
    open_clip 3.3.0); HPSv2's score is their cosine."""
    ref = np.load(FIXTURES / "open_clip_vit.npz")
    model, cfg = clip_model.from_open_clip(FIXTURES / "open_clip_vit.safetensors", heads=(3, 2))
    assert (cfg.eos_id, cfg.crop, cfg.vision.act) == (2, "round", "gelu")
    img = np.asarray(model.image_embeds(ref["pixels"]))
    txt = np.asarray(model.text_embeds(ref["ids"]))
    np.testing.assert_allclose(img, ref["image_features"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(txt, ref["text_features"], rtol=0, atol=ATOL)
    graphdef, state = nnx.split(model)
    n = len(ref["pixels"])
    got = np.asarray(learned.score(graphdef, "hpsv2", state, ref["pixels"], ref["ids"][:n],
                                    None))
    a, b = ref["image_features"], ref["text_features"][:n]
    want = np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(clip_model.CLIPLoadError, match="arch='ViT-Z': choose one of"):
        clip_model.from_open_clip(FIXTURES / "open_clip_vit.safetensors", arch="ViT-Z")


def test_torchvisions_centre_crop_rounds_half_to_even():
    """open_clip's preprocessing crops where torchvision's CenterCrop does: offset
    round((h - s) / 2) with Python's rounding, where transformers floors; the two differ by a
    row when the overhang is odd and its half rounds up (7 -> 4, not 3)."""
    import dataclasses
    base = clip_model.CLIPConfig(vision=None, text=None, image_size=4)
    img = np.zeros((1, 4, 11, 3), np.float32)
    img[0, :, :, 0] = np.arange(11) / 10.0              # columns tell the offset
    floor = clip_model.preprocess(img, base)[0, 0, :, 0]
    rnd = clip_model.preprocess(img, dataclasses.replace(base, crop="round"))[0, 0, :, 0]
    unnorm = lambda x: np.round((x * base.std[0] + base.mean[0]) * 255)    # noqa: E731
    assert unnorm(floor)[0] == np.round(0.3 * 255) and unnorm(rnd)[0] == np.round(0.4 * 255)


def _byte_symbols() -> dict[int, str]:
    """Byte-level BPE's printable symbol for each byte (the printable Latin-1 bytes stand for
    themselves, the others take the code points from 256 on, in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
            *range(ord("\xae"), ord("\xff") + 1)]
    extra = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


_OPEN_CLIP_TOKENS = """
import json, sys
import open_clip
prompts = json.loads(sys.stdin.read())
print(json.dumps(open_clip.tokenize(prompts, context_length=77).tolist()))
"""


def test_tokenizer_on_clips_real_vocabulary_equals_open_clips(tmp_path):
    """CLIP's real 49408-token BPE (the vocabulary open_clip ships), turned into a
    tokenizer.json through transformers, read by our loader: the same ids as open_clip's own
    tokenizer (the original HPSv2 uses) on 300+ prompts, up to each row's end of text (the
    padding after it differs: 0 there, the end-of-text id here; neither is attended to). Runs
    where open_clip_torch and transformers are installed (open_clip in a subprocess, with a
    torchvision stand-in: its wheel does not load with a CPU-only torch)."""
    import gzip
    import json
    import subprocess
    import sys
    spec = importlib.util.find_spec("open_clip")
    transformers = pytest.importorskip("transformers")
    if spec is None:
        pytest.skip("open_clip_torch is not installed")
    bpe = pathlib.Path(spec.submodule_search_locations[0]) / "bpe_simple_vocab_16e6.txt.gz"
    merges = gzip.open(bpe).read().decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    chars = list(_byte_symbols().values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    folder = tmp_path / "tok"
    folder.mkdir()
    transformers.CLIPTokenizer(vocab={t: i for i, t in enumerate(vocab)},
                               merges=[tuple(m.split()) for m in merges],
                               model_max_length=77).save_pretrained(folder)
    stub = _generator().write_torchvision_stub(tmp_path / "stub")
    from spotlight_jax import world
    prompts = world.train_prompts(world.WorldConfig(image_size=16))[:300]
    prompts += ["", "ÉCOLE à Zürich", "a photo of a cat, 4k, highly detailed",
                "A  Mixed\tCase\nPrompt", "don't stop: it's 3.14!", "x" * 300]
    out = subprocess.run([sys.executable, "-c", _OPEN_CLIP_TOKENS], input=json.dumps(prompts),
                         capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(stub)})
    assert out.returncode == 0, out.stderr[-2000:]
    want = np.asarray(json.loads(out.stdout))
    cfg = clip_model.CLIPConfig(vision=None, text=None, vocab=len(vocab))
    ours = clip_model.load_tokenizer(folder, cfg)(prompts)
    assert ours.shape == want.shape
    for row, (a, b) in enumerate(zip(ours, want)):
        end = int(np.argmax(b == cfg.eos_id))
        np.testing.assert_array_equal(a[:end + 1], b[:end + 1], err_msg=prompts[row][:40])


def test_a_reward_mesh_splits_the_batch_and_scores_alike():
    """The weights replicated on 4 devices, a batch of 5 (padded to 8) split over them: the
    scores of one device, row for row."""
    images = np.stack([_image(40, 56, i) for i in range(5)])
    prompts = ["a red bar", "two blue squares", "a green column", "a dot", "x"]
    one = learned.LearnedReward("pickscore", FIXTURES / "clip_gelu")(images, prompts)
    mesh = learned.LearnedReward("pickscore", FIXTURES / "clip_gelu", devices=jax.devices()[:4])
    got = mesh(images, prompts)
    assert got.shape == (5,)
    assert len(jax.tree.leaves(mesh.state)[0].sharding.device_set) == 4    # replicated on 4
    np.testing.assert_allclose(got, one, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_writing_back_gives_transformers_own_tensors(name):
    from spotlight_jax.io import safetensors_format
    model, cfg = clip_model.from_transformers(FIXTURES / name)
    theirs = safetensors_format.load(FIXTURES / name / "model.safetensors")
    ours = clip_model.transformers_tensors(model)
    assert set(ours) == set(theirs) - {"text_model.embeddings.position_ids",
                                       "vision_model.embeddings.position_ids"}
    for key, value in ours.items():
        np.testing.assert_array_equal(value, np.asarray(theirs[key], np.float32), err_msg=key)
    assert clip_model.config_of(clip_model.transformers_config(cfg)) == dataclasses.replace(
        cfg, mean=clip_model.CLIP_MEAN, std=clip_model.CLIP_STD)
