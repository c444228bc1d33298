"""Prompt-embedding files: the format round-trips, lookup returns the asked prompts' rows in
order (padded, never truncated), every bad file or request is one clear error, the run's prompt
source is the world's tokenizer unchanged for a model with a prompt encoder, and a whole run
(pretraining + post-training) of a model without one takes its prompts from a file."""
import json
import sys

import jax
import ml_dtypes
import numpy as np
import pytest
from helpers import micro_config, world_prompt_file

from spotlight_jax import prompt_embeddings as pe
from spotlight_jax import world
from spotlight_jax.config import ConfigError, prompt_source, validate
from spotlight_jax.io import safetensors_format
from spotlight_jax.train import train_and_evaluate

DIM, TEXT_LEN = 8, 12
WORLD16 = world.WorldConfig(image_size=16)


def world_file(path):
    """Every world prompt (16 px) with its world split, plus the empty prompt, fake-encoded."""
    return world_prompt_file(path, DIM, WORLD16.image_size)


def small_file(path, pooled=True, dtype=np.float32):
    prompts = ["", "a red bar", "two blue squares", "a green column"]
    rng = np.random.default_rng(0)
    embeds = rng.normal(size=(4, 5, DIM)).astype(dtype)
    mask = np.array([[1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool)
    pool = rng.normal(size=(4, 6)).astype(dtype) if pooled else None
    pe.write(path, prompts, embeds, mask, pool, splits=["", "train", "train", "val"],
             family="sd3", encoder="tiny", info={"max_sequence_length": 5})
    return prompts, embeds, mask, pool


# -- the format -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_round_trip_keeps_every_tensor_and_the_metadata(tmp_path, dtype):
    path = tmp_path / "p.safetensors"
    prompts, embeds, mask, pooled = small_file(path, dtype=dtype)
    f = pe.read(path)
    assert f.all_prompts == prompts and f.prompts() == prompts[1:]
    assert f.prompts("train") == ["a red bar", "two blue squares"]
    assert f.prompts("val") == ["a green column"]
    assert (f.family, f.encoder, f.info) == ("sd3", "tiny", {"max_sequence_length": 5})
    assert (f.text_len, f.dim, f.pooled_dim) == (5, DIM, 6)
    assert f.embeds.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(f.embeds, embeds)
    np.testing.assert_array_equal(f.mask, mask)
    np.testing.assert_array_equal(f.pooled, pooled)
    meta = safetensors_format.metadata(path)
    assert meta["format"] == pe.FORMAT and meta["version"] == str(pe.VERSION)
    assert json.loads(meta["prompts"])[pe.EMPTY_INDEX] == ""


def test_lookup_returns_the_asked_rows_in_order_padded_to_text_len(tmp_path):
    path = tmp_path / "p.safetensors"
    prompts, embeds, mask, pooled = small_file(path, dtype=ml_dtypes.bfloat16)
    f = pe.read(path)
    ask = ["a green column", "a red bar", "a green column", "two blue squares"]
    rows = [prompts.index(p) for p in ask]
    e, m, p = f.lookup(ask, text_len=7)
    assert e.dtype == np.float32 and e.shape == (4, 7, DIM) and m.shape == (4, 7)
    np.testing.assert_array_equal(e[:, :5], embeds[rows].astype(np.float32))
    np.testing.assert_array_equal(m[:, :5], mask[rows])
    assert not e[:, 5:].any() and not m[:, 5:].any()
    np.testing.assert_array_equal(p, pooled[rows].astype(np.float32))
    e0, m0, p0 = f.empty()
    np.testing.assert_array_equal(e0, embeds[0].astype(np.float32))
    np.testing.assert_array_equal(m0, mask[0])
    np.testing.assert_array_equal(p0, pooled[0].astype(np.float32))


def test_pad_rows_pads_ragged_rows_with_zeros_and_false():
    e, m = pe.pad_rows([np.ones((2, 3)), np.full((0, 3), 2.0), np.full((3, 3), 3.0)])
    assert e.shape == (3, 3, 3)
    np.testing.assert_array_equal(m, [[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    assert e[0, 2].sum() == 0 and (e[2] == 3).all()
    with pytest.raises(pe.PromptEmbeddingError, match=r"length=2: shorter than the longest"):
        pe.pad_rows([np.ones((3, 3))], length=2)


# -- errors -----------------------------------------------------------------------------------

def test_a_missing_file_names_it_and_the_tool(tmp_path):
    with pytest.raises(pe.PromptEmbeddingError,
                       match=r"nope\.safetensors: no such prompt-embedding file; write one with "
                             r"python -m spotlight_jax\.tools\.encode_prompts"):
        pe.read(tmp_path / "nope.safetensors")


def test_a_prompt_not_in_the_file_is_named_with_how_to_add_it(tmp_path):
    path = tmp_path / "p.safetensors"
    small_file(path)
    with pytest.raises(pe.PromptEmbeddingError,
                       match=r"prompt 'three red bars' is not in .*p\.safetensors \(3 prompts\); "
                             r"add it: re-run python -m spotlight_jax\.tools\.encode_prompts"):
        pe.read(path).lookup(["a red bar", "three red bars"])


def test_a_text_len_shorter_than_the_file_is_refused(tmp_path):
    path = tmp_path / "p.safetensors"
    small_file(path)
    with pytest.raises(pe.PromptEmbeddingError, match=r"text_len=4: shorter than the 5 tokens"):
        pe.read(path).lookup(["a red bar"], text_len=4)


@pytest.mark.parametrize("change, message", [
    (dict(mask=np.ones((4, 4), bool)), r"mask is bool \[4, 4\]; it must be bool \[4, 5\]"),
    (dict(mask=np.ones((4, 5), np.int32)), r"mask is int32 \[4, 5\]; it must be bool"),
    (dict(embeds=np.zeros((4, 5), np.float32)), r"embeds has shape \[4, 5\]; it must be "
                                                r"\[prompts \+ 1 = 4, L, D\]"),
    (dict(pooled=np.zeros((3, 6), np.float32)), r"pooled has shape \[3, 6\]"),
    (dict(prompts=["a red bar", "", "x", "y"]), r"row 0 must be the empty prompt \"\""),
    (dict(prompts=["", "a red bar", "a red bar", "y"]), r"prompt 'a red bar' appears twice"),
    (dict(splits=["", "train", "test", "val"]), r"split 'test': each prompt's split must be"),
], ids=["mask_shape", "mask_dtype", "embeds_rank", "pooled_rows", "empty_not_first",
        "duplicate", "split"])
def test_a_malformed_file_is_refused_at_write(tmp_path, change, message):
    args = dict(prompts=["", "a", "b", "c"], embeds=np.zeros((4, 5, DIM), np.float32),
                mask=np.ones((4, 5), bool), pooled=None, splits=None)
    args.update(change)
    with pytest.raises(pe.PromptEmbeddingError, match=message):
        pe.write(tmp_path / "bad.safetensors", args["prompts"], args["embeds"], args["mask"],
                 args["pooled"], splits=args["splits"], family="x", encoder="y")
    assert not (tmp_path / "bad.safetensors").exists()


def test_a_foreign_or_malformed_file_is_refused_at_read(tmp_path):
    other = tmp_path / "other.safetensors"
    safetensors_format.save(other, {"w": np.zeros(3, np.float32)})
    with pytest.raises(pe.PromptEmbeddingError, match=r"not a prompt-embedding file"):
        pe.read(other)
    # a file written by something else with our metadata but a bad mask
    meta = {"format": pe.FORMAT, "version": "1", "prompts": json.dumps(["", "a"]),
            "splits": json.dumps(["", "train"])}
    bad = tmp_path / "bad.safetensors"
    safetensors_format.save(bad, {"embeds": np.zeros((2, 3, 4), np.float32),
                                  "mask": np.ones((2, 2), bool)}, meta)
    with pytest.raises(pe.PromptEmbeddingError, match=r"mask is bool \[2, 2\]"):
        pe.read(bad)
    future = tmp_path / "future.safetensors"
    safetensors_format.save(future, {"w": np.zeros(1, np.float32)}, {**meta, "version": "9"})
    with pytest.raises(pe.PromptEmbeddingError, match=r"format version '9'"):
        pe.read(future)


def test_a_pooled_file_serves_each_prompt_with_its_pooled_vector_and_the_empty_prompt(tmp_path):
    path = tmp_path / "p.safetensors"
    _, embeds, mask, pooled = small_file(path, pooled=True)
    tokens, m = pe.EmbeddingPrompts(pe.read(path)).tokenize(["a green column", "a red bar"], 7)
    np.testing.assert_array_equal(tokens["embeds"][:, :5], embeds[[3, 1]])
    np.testing.assert_array_equal(m[:, :5], mask[[3, 1]])
    np.testing.assert_array_equal(tokens["pooled"], pooled[[3, 1]])
    null = tokens["null"]                 # row 0, the empty prompt, for every row
    np.testing.assert_array_equal(null["embeds"][:, :5], embeds[[0, 0]])
    np.testing.assert_array_equal(null["mask"][:, :5], mask[[0, 0]])
    np.testing.assert_array_equal(null["pooled"], pooled[[0, 0]])
    assert not null["mask"][:, 5:].any() and not null["embeds"][:, 5:].any()


# -- the run's prompt source ------------------------------------------------------------------

def test_a_model_with_a_prompt_encoder_tokenizes_with_the_world_unchanged():
    source = prompt_source(micro_config(1))
    assert isinstance(source, pe.WorldPrompts)
    assert source.train_prompts == world.train_prompts(WORLD16)
    assert source.val_prompts == world.val_prompts(WORLD16)
    ps = world.train_prompts(WORLD16)[:5]
    for got, want in zip(source.tokenize(ps, TEXT_LEN), world.tokenize(ps, TEXT_LEN)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_train_kinds_restrict_the_training_pool_only(tmp_path):
    source = prompt_source(micro_config(1, **{"prompts.train_kinds": "two_object, position"}))
    want = [p for p in world.train_prompts(WORLD16)
            if world.parse(p, WORLD16).kind in ("two_object", "position")]
    assert source.train_prompts == want and 0 < len(want) < len(world.train_prompts(WORLD16))
    assert source.val_prompts == world.val_prompts(WORLD16)       # evaluation keeps every kind
    config = micro_config(1, **{"prompts.train_kinds": "position,shapes"})
    message = r"^prompts\.train_kinds='position,shapes': unknown kind\(s\) \['shapes'\]"
    with pytest.raises(ConfigError, match=message):
        prompt_source(config)
    with pytest.raises(ConfigError, match=message):
        validate(config, jax.devices())
    # a prompt-embedding file has no task kinds: its train split is the pool
    path = tmp_path / "world.safetensors"
    world_file(path)
    with pytest.raises(ConfigError, match=r"^prompts\.train_kinds='position': task kinds are "
                                          r"the synthetic world's"):
        prompt_source(embedding_config(path, **{"prompts.train_kinds": "position"}))


def embedding_config(path, iterations=1, **overrides):
    return micro_config(iterations, **{"model.text_width": 0, "model.text_embed_dim": DIM,
                                       "prompts.embeddings_file": str(path), **overrides})


def test_the_source_of_a_model_without_an_encoder_reads_the_file(tmp_path):
    path = tmp_path / "world.safetensors"
    prompts, embeds, mask = world_file(path)
    source = prompt_source(embedding_config(path))
    assert source.train_prompts == world.train_prompts(WORLD16)
    assert source.val_prompts == world.val_prompts(WORLD16)
    ask = [source.val_prompts[3], source.train_prompts[0]]
    tokens, m = source.tokenize(ask, TEXT_LEN)
    e = tokens["embeds"]
    assert set(tokens) == {"embeds", "null"}             # no pooled vector in this file
    rows = [prompts.index(p) for p in ask]
    assert e.shape == (2, TEXT_LEN, DIM) and e.dtype == np.float32
    np.testing.assert_array_equal(e[:, :embeds.shape[1]], embeds[rows])
    np.testing.assert_array_equal(m[:, :embeds.shape[1]], mask[rows])
    null_e, null_m = source.null_prompt(TEXT_LEN)
    assert not null_e.any() and not null_m.any()          # the fake encoder's empty prompt
    np.testing.assert_array_equal(tokens["null"]["embeds"], np.broadcast_to(null_e, e.shape))
    np.testing.assert_array_equal(tokens["null"]["mask"], np.broadcast_to(null_m, m.shape))


@pytest.mark.parametrize("overrides, message", [
    ({"model.text_width": 16}, r"the model has its own prompt encoder \(model.text_width=16\)"),
    ({"model.text_embed_dim": 4}, r"embeddings of width 8, the model takes "
                                  r"model.text_embed_dim=4; set --config.model.text_embed_dim=8"),
    ({"model.text_len": 5}, r"10 tokens per prompt, more than model.text_len=5; set "
                            r"--config.model.text_len=10"),
    ({"prompts.embeddings_file": ""}, r"model.text_width=0 feeds precomputed prompt "
                                      r"embeddings; give a file"),
    ({"prompts.embeddings_file": "/no/such.safetensors"}, r"no such prompt-embedding file"),
], ids=["has_encoder", "width", "text_len", "no_file", "missing"])
def test_a_file_the_model_cannot_use_is_a_config_error_naming_the_field(tmp_path, overrides,
                                                                       message):
    path = tmp_path / "world.safetensors"
    world_file(path)
    config = embedding_config(path, **overrides)
    with pytest.raises(ConfigError, match=r"^prompts\.embeddings_file='[^']*': " + message):
        prompt_source(config)
    if overrides.get("prompts.embeddings_file") != "":
        with pytest.raises(ConfigError, match=r"^prompts\.embeddings_file="):
            validate(config, jax.devices())


@pytest.mark.e2e
def test_a_run_without_a_prompt_encoder_pretrains_and_trains_from_the_file(tmp_path):
    """Pretraining (a few steps), the held-out evaluation and one post-training iteration,
    every prompt from the file: a model without a prompt encoder cannot read token ids, so the
    run only gets through with the file's embeddings."""
    path = tmp_path / "world.safetensors"
    world_file(path)
    config = embedding_config(path, **{
        "base_checkpoint": "none", "pretrain.steps": 3, "pretrain.batch_size": 4,
        "pretrain.eval_every": 0, "pretrain.warmup": 1})
    validate(config, jax.devices())
    history = train_and_evaluate(config, str(tmp_path / "run"))
    rows = [h for h in history if "reward_mean" in h]
    evals = [h for h in history if "val_reward" in h]
    assert len(rows) == 1 and len(evals) == 1         # the held-out evaluation at 0
    assert all(np.isfinite(h["reward_mean"]) for h in rows)
    assert all(np.isfinite(h["val_reward"]) for h in evals)


def test_the_encoder_tool_imports_without_torch_and_says_how_to_install_it(monkeypatch):
    import spotlight_jax.tools.encode_prompts  # noqa: F401 - no torch needed to import the tool
    from spotlight_jax.prompt_embeddings import encoders
    monkeypatch.setitem(sys.modules, "torch", None)        # as if torch were not installed
    with pytest.raises(ImportError, match=r"needs torch, transformers and diffusers \(torch is "
                                          r"missing\): pip install -e \"\.\[encode\]\""):
        encoders.require_encode_extra()


def test_the_tool_reads_prompt_files_or_the_worlds_prompts(tmp_path):
    from spotlight_jax.tools.encode_prompts import prompt_lists
    prompts, splits = prompt_lists(world_image_size=16)
    train, val = world.train_prompts(WORLD16), world.val_prompts(WORLD16)
    assert prompts == train + val and splits == ["train"] * len(train) + ["val"] * len(val)
    (tmp_path / "t.txt").write_text("a red bar\n\n  a blue bar \na red bar\n")
    (tmp_path / "v.txt").write_text("a green bar\n")
    assert prompt_lists(tmp_path / "t.txt", tmp_path / "v.txt") == (
        ["a red bar", "a blue bar", "a green bar"], ["train", "train", "val"])
    with pytest.raises(ValueError, match=r"prompt 'a blue bar' is both a training and a held-out"):
        prompt_lists(tmp_path / "t.txt", tmp_path / "t.txt")
    with pytest.raises(ValueError, match=r"--world: encodes the world's prompts; drop --prompts"):
        prompt_lists(tmp_path / "t.txt", world_image_size=16)
    with pytest.raises(ValueError, match=r"no prompts: give --prompts=<file>"):
        prompt_lists()
    with pytest.raises(ValueError, match=r"prompts file '.*nope.txt' does not exist"):
        prompt_lists(tmp_path / "nope.txt")
