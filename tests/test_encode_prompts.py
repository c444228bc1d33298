"""``python -m spotlight_jax.tools.encode_prompts`` writes what the pipeline's own ``encode_prompt``
returns: tiny random SD3 (CLIP-L, CLIP-G, T5), Flux (CLIP-L, T5), Qwen-Image (Qwen2.5-VL) and
Wan (UMT5) text encoders built
from configs, with tokenizers built in code (no downloads), saved as diffusers pipelines; the
tool encodes prompts with them in a fresh process and the file's rows equal ``encode_prompt`` of
the same batches. Needs torch, transformers and diffusers (the ``[encode]`` extra)."""
import string
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import child_env

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")

from spotlight_jax import prompt_embeddings as pe  # noqa: E402
from spotlight_jax import world  # noqa: E402
from spotlight_jax.prompt_embeddings import encoders  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHARS = sorted(set(string.ascii_lowercase + string.digits + '"'))
TOL = dict(rtol=1e-6, atol=1e-6)     # same weights, same batches, another process


def clip_tokenizer():
    """A character-level CLIP BPE (no merges) over the world's alphabet."""
    vocab = {}
    for c in CHARS:
        vocab.setdefault(c, len(vocab))
    for c in CHARS:
        vocab[c + "</w>"] = len(vocab)
    for t in ("<|startoftext|>", "<|endoftext|>"):
        vocab[t] = len(vocab)
    return transformers.CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def clip_encoder(tok, width, projection, seed):
    torch.manual_seed(seed)
    cfg = transformers.CLIPTextConfig(
        vocab_size=len(tok), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=77, projection_dim=projection,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)
    return transformers.CLIPTextModelWithProjection(cfg).eval()


def t5_tokenizer():
    """A T5 Unigram tokenizer over single characters (with and without the word marker)."""
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [(c, -1.0) for c in CHARS] + [("\u2581" + c, -1.0) for c in CHARS]
    return transformers.T5TokenizerFast(vocab=vocab, extra_ids=0)


def t5_encoder(tok, width, seed):
    torch.manual_seed(seed)
    return transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=len(tok), d_model=width, d_kv=8, d_ff=64, num_layers=2, num_heads=2,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1)).eval()


def sd3_pipeline():
    tok = clip_tokenizer()
    t5_tok = t5_tokenizer()
    t5 = t5_encoder(t5_tok, 48, seed=2)
    return diffusers.StableDiffusion3Pipeline(
        transformer=None, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=None,
        text_encoder=clip_encoder(tok, 16, 8, seed=0), tokenizer=tok,
        text_encoder_2=clip_encoder(tok, 24, 12, seed=1), tokenizer_2=clip_tokenizer(),
        text_encoder_3=t5, tokenizer_3=t5_tok)


def flux_pipeline():
    tok = clip_tokenizer()
    t5_tok = t5_tokenizer()
    t5 = t5_encoder(t5_tok, 40, seed=4)
    clip = clip_encoder(tok, 16, 8, seed=5)
    text_encoder = transformers.CLIPTextModel(clip.config).eval()     # Flux's: no projection
    text_encoder.load_state_dict(clip.state_dict(), strict=False)
    return diffusers.FluxPipeline(
        transformer=None, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=None,
        text_encoder=text_encoder, tokenizer=tok, text_encoder_2=t5, tokenizer_2=t5_tok)


def qwen_tokenizer():
    """A byte-level BPE over the 256 byte symbols, two merges and the chat-template tokens."""
    from tokenizers import pre_tokenizers
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [("e", "d"), ("\u0120", "a")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = transformers.Qwen2Tokenizer(vocab=vocab, merges=merges)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return tok


def qwen_pipeline():
    tok = qwen_tokenizer()
    torch.manual_seed(3)
    cfg = transformers.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=2048, bos_token_id=tok.pad_token_id,
                         eos_token_id=tok.pad_token_id, pad_token_id=tok.pad_token_id,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=32, fullatt_block_indexes=[0]))
    encoder = transformers.Qwen2_5_VLForConditionalGeneration(cfg).eval()
    return diffusers.QwenImagePipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=None, text_encoder=encoder,
        tokenizer=tok, transformer=None)


def run_tool(*args):
    out = subprocess.run([sys.executable, "-m", "spotlight_jax.tools.encode_prompts", *args],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def reference(encode_prompt, prompts, batch_size, length):
    """``encode_prompt`` of the tool's batches (the empty prompt first), rows padded to
    ``length``: ``(embeds, mask, pooled or None)`` as numpy."""
    rows, masks, pooled = [], [], []
    with torch.no_grad():
        for i in range(0, len(prompts), batch_size):
            e, m, p = encode_prompt(prompts[i:i + batch_size])
            rows += list(e.numpy())
            masks += list(np.ones(e.shape[:2], bool) if m is None else m.bool().numpy())
            pooled += [] if p is None else list(p.numpy())
    embeds, mask = pe.pad_rows(rows, masks, length)
    return embeds, mask, (np.stack(pooled) if pooled else None)


def test_sd3_file_equals_the_pipelines_encode_prompt(tmp_path):
    pipe = sd3_pipeline()
    pipe.save_pretrained(tmp_path / "sd3")
    prompts = world.train_prompts(world.WorldConfig(image_size=16))[:5]
    val = world.val_prompts(world.WorldConfig(image_size=16))[:2]
    (tmp_path / "train.txt").write_text("\n".join([*prompts, prompts[0], ""]) + "\n")
    (tmp_path / "val.txt").write_text("\n".join(val))
    path = tmp_path / "sd3.safetensors"
    out = run_tool(f"--pipeline={tmp_path / 'sd3'}", f"--output={path}",
                   f"--prompts={tmp_path / 'train.txt'}", f"--val_prompts={tmp_path / 'val.txt'}",
                   "--max_sequence_length=8", "--batch_size=3")
    assert "--config.model.text_embed_dim=48 --config.model.text_len=85" in out.stdout
    f = pe.read(path)
    assert f.family == "sd3" and f.prompts("train") == prompts and f.prompts("val") == val
    assert f.info["max_sequence_length"] == 8
    assert "CLIPTextModelWithProjection + CLIPTextModelWithProjection + T5EncoderModel" \
        in f.encoder
    every = ["", *prompts, *val]

    def encode(batch):
        e, _, p, _ = pipe.encode_prompt(batch, None, None, do_classifier_free_guidance=False,
                                        max_sequence_length=8)
        return e, None, p

    embeds, mask, pooled = reference(encode, every, 3, f.text_len)
    assert embeds.shape == (8, 77 + 8, 48) and pooled.shape == (8, 8 + 12)
    assert f.mask.all()                      # SD3 attends to every token
    np.testing.assert_allclose(f.embeds, embeds, **TOL)
    np.testing.assert_allclose(f.pooled, pooled, **TOL)
    e, m, p = f.lookup([val[1], prompts[2]])
    np.testing.assert_allclose(e, embeds[[7, 3]], **TOL)
    np.testing.assert_allclose(p, pooled[[7, 3]], **TOL)
    # the rows differ from prompt to prompt (a tool that wrote one row everywhere would fail)
    assert np.abs(f.embeds[1] - f.embeds[2]).max() > 1e-3


def test_flux_file_equals_the_pipelines_encode_prompt(tmp_path):
    pipe = flux_pipeline()
    pipe.save_pretrained(tmp_path / "flux")
    prompts = ["a red bar", 'two blue squares and the text "42"', "a green column"]
    path = tmp_path / "flux.safetensors"
    loaded = encoders.load_pipeline(tmp_path / "flux")
    assert loaded.transformer is None and loaded.vae is None
    encoders.encode_to_file(loaded, path, prompts, batch_size=2, max_sequence_length=12)
    f = pe.read(path)
    assert f.family == "flux" and f.prompts("train") == prompts
    assert "CLIPTextModel + T5EncoderModel" in f.encoder

    def encode(batch):
        e, p, _ = pipe.encode_prompt(batch, None, max_sequence_length=12)
        return e, None, p

    embeds, mask, pooled = reference(encode, ["", *prompts], 2, f.text_len)
    assert embeds.shape == (4, 12, 40) and pooled.shape == (4, 16)
    assert f.mask.all()                      # Flux attends to every T5 token
    np.testing.assert_allclose(f.embeds, embeds, **TOL)
    np.testing.assert_allclose(f.pooled, pooled, **TOL)
    assert np.abs(f.pooled[1] - f.pooled[2]).max() > 1e-3


def test_qwen_image_file_equals_the_pipelines_encode_prompt(tmp_path):
    pipe = qwen_pipeline()
    pipe.save_pretrained(tmp_path / "qwen")
    prompts = ["a red bar", 'two blue squares and the text "42"', "a green column"]
    path = tmp_path / "qwen.safetensors"
    # the tool's library path in this process (the SD3 test runs the command line)
    loaded = encoders.load_pipeline(tmp_path / "qwen")
    assert loaded.transformer is None and loaded.vae is None
    encoders.encode_to_file(loaded, path, prompts, batch_size=2)
    f = pe.read(path)
    assert f.family == "qwen_image" and f.pooled is None and f.prompts("train") == prompts
    assert f.prompts("val") == []

    def encode(batch):
        e, m = pipe.encode_prompt(batch, max_sequence_length=1024)
        return e, m, None

    embeds, mask, _ = reference(encode, ["", *prompts], 2, f.text_len)
    np.testing.assert_array_equal(f.mask, mask)
    np.testing.assert_allclose(f.embeds, embeds, **TOL)
    lengths = f.mask.sum(1)
    assert len(set(lengths.tolist())) > 1 and f.text_len == lengths.max()   # padded rows
    assert not f.embeds[~f.mask].any()
    # a run's prompt source serves them padded to the model's text_len
    source = pe.EmbeddingPrompts(f)
    tokens, m = source.tokenize([prompts[1]], f.text_len + 3)
    np.testing.assert_allclose(tokens["embeds"][0, :f.text_len], embeds[2], **TOL)
    assert not m[0, f.text_len:].any()


def test_the_tool_reports_a_bad_pipeline_folder_in_one_line(tmp_path):
    (tmp_path / "p.txt").write_text("a red bar\n")
    out = subprocess.run([sys.executable, "-m", "spotlight_jax.tools.encode_prompts",
                          f"--pipeline={tmp_path}", f"--output={tmp_path / 'x.safetensors'}",
                          f"--prompts={tmp_path / 'p.txt'}"], cwd=ROOT, env=child_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: pipeline={str(tmp_path)!r}: no model_index.json there; pass a diffusers "
        "pipeline folder (e.g. the SD3.5 or Qwen-Image snapshot)"]


def wan_pipeline():
    tok = t5_tokenizer()
    torch.manual_seed(6)
    encoder = transformers.UMT5EncoderModel(transformers.UMT5Config(
        vocab_size=len(tok), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1)).eval()
    return diffusers.WanPipeline(tokenizer=tok, text_encoder=encoder, vae=None,
                                 scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
                                 transformer=None)


def test_wan_file_equals_the_pipelines_encode_prompt(tmp_path):
    """UMT5 states of the video world's prompts, zero rows after each prompt's tokens (Wan
    attends to them all), through the command line."""
    pipe = wan_pipeline()
    pipe.save_pretrained(tmp_path / "wan")
    path = tmp_path / "wan.safetensors"
    out = run_tool(f"--pipeline={tmp_path / 'wan'}", f"--output={path}", "--world",
                   "--video_world", "--world_image_size=24", "--max_sequence_length=40",
                   "--batch_size=64")
    assert "--config.model.text_embed_dim=32 --config.model.text_len=40" in out.stdout
    f = pe.read(path)
    train = world.video.video_train_prompts(world.WorldConfig(image_size=24))
    val = world.video.video_val_prompts(world.WorldConfig(image_size=24))
    assert f.family == "wan" and f.pooled is None and "UMT5EncoderModel" in f.encoder
    assert f.prompts("train") == train and f.prompts("val") == val

    def encode(batch):
        e, _ = pipe.encode_prompt(batch, do_classifier_free_guidance=False,
                                  max_sequence_length=40)
        return e, None, None

    embeds, _, _ = reference(encode, ["", *train, *val], 64, f.text_len)
    assert f.mask.all() and embeds.shape == (1 + len(train) + len(val), 40, 32)
    np.testing.assert_allclose(f.embeds, embeds, **TOL)
    n = len(pipe.tokenizer(train[0]).input_ids)             # the prompt's tokens, then zeros
    assert (np.abs(f.embeds[1, :n]).max(axis=-1) > 0).all() and not f.embeds[1, n:].any()
    assert np.abs(f.embeds[1] - f.embeds[2]).max() > 1e-3
