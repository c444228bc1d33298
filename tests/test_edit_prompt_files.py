"""Edit files (prompt-embedding files keyed by (instruction, input image), holding each image's
VAE latents): the format round-trips and a text-only file of the earlier format still loads;
lookup gives each row its image's latents and its image's null prompt; a run of an editing model
from a Qwen-Image-Edit folder (configs/qwen_image_edit.py with the folder and the file) gets
its prompts from one, as the prompt pytree an editing model takes, and the mismatches (an edit
file for a text-to-image model, a text-only file or none for an editing model, latents the
model cannot take, a bad file) are one-line errors naming the value and the fix. No torch: the
files here are fake-encoded (tests/helpers.py); tests/test_encode_edit_prompts.py writes real
ones with a tiny Qwen-Image-Edit pipeline."""
import json

import numpy as np
import pytest
from flax import nnx
from helpers import QWEN_DIM, edit_prompt_file, qwen_edit_pipe, world_prompt_file

from spotlight_jax import prompt_embeddings as pe
from spotlight_jax.config import ConfigError, load_config, model_config, prompt_source
from spotlight_jax.diffusion import prompt
from spotlight_jax.io import safetensors_format

IMAGES = ("beach.png", "room.png")


@pytest.fixture
def edit_file(tmp_path):
    return edit_prompt_file(tmp_path / "edits.safetensors", QWEN_DIM, images=IMAGES)


def edit_config(tmp_path, path, **overrides):
    """configs/qwen_image_edit.py on the stand-in Qwen-Image-Edit folder (the tiny Qwen-Image
    fixture's transformer and VAE beside an edit pipeline's model_index.json) with ``path``."""
    pipe = qwen_edit_pipe(tmp_path / "Qwen-Image-Edit")
    return load_config("qwen_image_edit", {
        "base_checkpoint": str(pipe), "prompts.embeddings_file": str(path),
        "model.image_size": 8, "model.text_len": 24, **overrides})


# -- the format -------------------------------------------------------------------------------

def test_an_edit_file_round_trips_its_pairs_images_and_null_prompts(tmp_path, edit_file):
    f = pe.read(edit_file.path)
    assert f.is_edit and f.images == list(IMAGES) and f.latent_shape == (8, 8, 16)
    assert f.all_prompts[:2] == [" | beach.png", " | room.png"]      # the null rows first
    assert f.splits[:2] == ["", ""] and len(f.prompts("train")) == 6
    assert len(f.prompts("val")) == 4 and len(f.prompts()) == 10
    row = f.prompts("val")[-1]
    assert row == pe.edit_key(f.instructions[-1], "room.png") and row.endswith(" | room.png")
    assert f.null_prompts([f.prompts("train")[0], row]) == [" | beach.png", " | room.png"]
    lat = f.input_latents([row, f.prompts("train")[0], row])
    assert lat.dtype == np.float32 and lat.shape == (3, 8, 8, 16)
    np.testing.assert_array_equal(lat[0], f.image_latents[1])
    np.testing.assert_array_equal(lat[1], f.image_latents[0])
    meta = safetensors_format.metadata(f.path)
    assert json.loads(meta["images"]) == list(IMAGES) and meta["version"] == str(pe.VERSION)


def test_a_text_only_file_of_the_earlier_format_still_loads(tmp_path):
    """Exactly what the writer stored before edit files: no edit tensor, no edit metadata."""
    path = tmp_path / "old.safetensors"
    embeds = np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)
    mask = np.array([[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], bool)
    safetensors_format.save(path, {"embeds": embeds, "mask": mask}, {
        "format": pe.FORMAT, "version": "1", "family": "qwen_image", "encoder": "old",
        "prompts": json.dumps(["", "a red bar", "a blue bar"]),
        "splits": json.dumps(["", "train", "val"]), "info": "{}"})
    f = pe.read(path)
    assert not f.is_edit and f.latent_shape is None and f.images is None
    assert f.prompts("train") == ["a red bar"] and f.prompts() == ["a red bar", "a blue bar"]
    assert f.null_prompts(["a blue bar", "a red bar"]) == ["", ""]
    tokens, m = pe.EmbeddingPrompts(f).tokenize(["a blue bar"], 6)
    np.testing.assert_array_equal(tokens["embeds"][0, :4], embeds[2])
    assert prompt.IMAGE not in tokens and m[0].sum() == 4
    with pytest.raises(pe.PromptEmbeddingError, match=r"old.safetensors is text-only \(family "
                                                      r"'qwen_image'\): no input images"):
        f.input_latents(["a red bar"])
    # a text-only file written now is byte-for-byte that format: no edit keys
    pe.write(tmp_path / "new.safetensors", f.all_prompts, embeds, mask,
             splits=f.splits, family="qwen_image", encoder="old")
    assert set(safetensors_format.metadata(tmp_path / "new.safetensors")) == {
        "format", "version", "family", "encoder", "prompts", "splits", "info"}
    assert set(safetensors_format.load(tmp_path / "new.safetensors")) == {"embeds", "mask"}


def _edit_args():
    return dict(instructions=["", "make it red", "add a cat"], index=[0, 0, 0],
                images=["a.png"], latents=np.zeros((1, 4, 4, 16), np.float32),
                embeds=np.zeros((3, 5, 8), np.float32), mask=np.ones((3, 5), bool),
                splits=["", "train", "val"])


@pytest.mark.parametrize("change, message", [
    (dict(instructions=["make it red", "", "add a cat"]),
     r"the first 1 rows must be the null prompts of the 1 images in order"),
    (dict(instructions=["", "make it red", ""]),
     r"row 2 has an empty instruction for image 'a.png', whose null prompt is row 0"),
    (dict(index=[0, 0, 1]), r"image_index must give each of the 3 rows one of the 1 images"),
    (dict(latents=np.zeros((2, 4, 4, 16), np.float32)),
     r"image_latents has shape \[2, 4, 4, 16\]; it must be \[images = 1"),
    (dict(latents=np.zeros((1, 4, 4, 16), np.int32)), r"image_latents has dtype int32"),
    (dict(splits=["train", "train", "val"]), r"split 'train': each prompt's split must be one "
                                             r"of \('train', 'val'\) \(the null prompts' \"\"\)"),
    (dict(instructions=["", "make it red", "make it red"]),
     r"prompt 'make it red \| a.png' appears twice"),
], ids=["null_not_first", "empty_instruction", "index", "latent_rows", "latent_dtype",
        "null_split", "duplicate"])
def test_a_malformed_edit_file_is_refused_at_write(tmp_path, change, message):
    a = {**_edit_args(), **change}
    with pytest.raises(pe.PromptEmbeddingError, match=message):
        pe.write_edits(tmp_path / "bad.safetensors", a["instructions"], a["index"], a["images"],
                       a["latents"], a["embeds"], a["mask"], splits=a["splits"],
                       family="qwen_image_edit", encoder="x")
    assert not (tmp_path / "bad.safetensors").exists()


def test_edit_tensors_without_their_metadata_are_refused_at_read(tmp_path):
    a = _edit_args()
    path = tmp_path / "half.safetensors"
    safetensors_format.save(path, {"embeds": a["embeds"], "mask": a["mask"],
                                   "image_latents": a["latents"]},
                            {"format": pe.FORMAT, "version": "1",
                             "prompts": json.dumps(["", "b", "c"]),
                             "splits": json.dumps(a["splits"])})
    with pytest.raises(pe.PromptEmbeddingError, match=r"half.safetensors: an edit file needs "
                                                      r"both tensors .* this one has "
                                                      r"\['image_latents'\] and no metadata"):
        pe.read(path)


# -- the run's prompt source ------------------------------------------------------------------

def test_a_qwen_image_edit_run_gets_the_pairs_and_their_images_from_the_file(tmp_path,
                                                                             edit_file):
    config = edit_config(tmp_path, edit_file.path)
    m = model_config(config)
    assert m.reference_images == 1 and m.text_width == 0 and m.channels == 16
    source = prompt_source(config)
    assert isinstance(source, pe.EditEmbeddingPrompts)
    assert source.train_prompts == edit_file.prompts("train")
    assert source.val_prompts == edit_file.prompts("val")
    asked = [source.val_prompts[-1], source.train_prompts[0]]          # room, beach
    tokens, mask = source.tokenize(asked, m.text_len)
    assert tokens[prompt.EMBEDS].shape == (2, 24, QWEN_DIM) and mask.shape == (2, 24)
    assert tokens[prompt.IMAGE].shape == (2, 8, 8, 16)
    np.testing.assert_array_equal(tokens[prompt.IMAGE], edit_file.image_latents[[1, 0]])
    e, mk, _ = edit_file.lookup(asked, 24)
    np.testing.assert_array_equal(tokens[prompt.EMBEDS], e)
    np.testing.assert_array_equal(mask, mk)
    # the null prompt: each row's own image with the empty instruction, the image kept
    null_e, null_m, _ = edit_file.lookup([" | room.png", " | beach.png"], 24)
    null_tokens, null_mask = prompt.null_prompt(tokens, mask)
    np.testing.assert_array_equal(null_tokens[prompt.EMBEDS], null_e)
    np.testing.assert_array_equal(null_mask, null_m)
    np.testing.assert_array_equal(null_tokens[prompt.IMAGE], tokens[prompt.IMAGE])
    assert not np.array_equal(null_e[0], null_e[1])                  # per image, not row 0's
    # the converted editing transformer takes them as they are
    from spotlight_jax.models.convert import from_diffusers

    model, _ = from_diffusers(f"{config.base_checkpoint}/transformer", image_size=8,
                              text_len=24)
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 16)).astype(np.float32)
    t = np.full(2, 0.5, np.float32)
    v = nnx.jit(lambda mdl: mdl(x, t, tokens[prompt.EMBEDS], mask,
                                image_latents=prompt.image_latents(tokens)))(model)
    assert v.shape == x.shape and np.isfinite(np.asarray(v)).all()


def test_a_text_only_file_or_none_for_an_editing_model_says_how_to_write_one(tmp_path):
    text = tmp_path / "text.safetensors"
    world_prompt_file(text, QWEN_DIM, image_size=32)
    with pytest.raises(ConfigError, match=r"^model.reference_images=1: an editing model without a "
                                          r"prompt encoder needs prompt files holding each "
                                          r"instruction's input image; prompts.embeddings_file="
                                          r"'.*text.safetensors' is text-only \(family "
                                          r"'synthetic'\): write one with python -m "
                                          r"spotlight_jax.tools.encode_prompts "
                                          r"--pipeline=<the Qwen-Image-Edit folder> "
                                          r"--prompts=<edits.jsonl>$"):
        prompt_source(edit_config(tmp_path, text))
    with pytest.raises(ConfigError, match=r"^model.reference_images=1: an editing model without a "
                                          r"prompt encoder needs prompt files .* --prompts="
                                          r"<edits.jsonl> and pass "
                                          r"--config.prompts.embeddings_file$"):
        prompt_source(load_config("qwen_image_edit"))


def test_an_edit_file_for_a_text_to_image_model_is_refused(tmp_path, edit_file):
    from helpers import qwen_fixture_config
    config = qwen_fixture_config(tmp_path, "nft", **{"prompts.embeddings_file":
                                                     str(edit_file.path)})
    with pytest.raises(ConfigError, match=r"^prompts.embeddings_file='.*edits.safetensors': holds "
                                          r"input-image latents \(an edit file, family "
                                          r"'qwen_image_edit'\) for an editing model, and this "
                                          r"model is text-to-image \(model.reference_images=0\); "
                                          r"use the editing pipeline's folder as "
                                          r"base_checkpoint, or a text-only file$"):
        prompt_source(config)


@pytest.mark.parametrize("cells, channels, message", [
    ((8, 8), 4, r"input-image latents of 4 channels, the model takes model.channels=16; encode "
                r"the images with the base's own VAE"),
    ((8, 7), 16, r"input-image latents of 8x7 cells, not a multiple of the model's "
                 r"patch_size=2; re-encode with another --image_area"),
])
def test_latents_the_model_cannot_take_are_refused(tmp_path, cells, channels, message):
    path = tmp_path / "e.safetensors"
    edit_prompt_file(path, QWEN_DIM, channels=channels, cells=cells)
    with pytest.raises(ConfigError, match=r"^prompts.embeddings_file='.*e.safetensors': "
                                          + message):
        prompt_source(edit_config(tmp_path, path))


def test_an_edit_file_longer_than_text_len_names_the_length_to_set(tmp_path, edit_file):
    with pytest.raises(ConfigError, match=rf"{edit_file.text_len} tokens per prompt, more than "
                                          rf"model.text_len=4; set --config.model.text_len="
                                          rf"{edit_file.text_len}"):
        prompt_source(edit_config(tmp_path, edit_file.path, **{"model.text_len": 4}))


# -- the encoder tool's input (no torch needed to read it) ------------------------------------

def test_the_tool_reads_pairs_from_json_lines_and_names_a_bad_line(tmp_path):
    from spotlight_jax.tools.encode_prompts import edit_lists, edit_rows_in, read_edit_rows
    (tmp_path / "photos").mkdir()
    for name in ("a.png", "photos/b.png"):
        (tmp_path / name).write_bytes(b"")          # only their existence is checked here
    lines = [{"prompt": " make it red ", "image": "a.png"}, {"prompt": "add a cat",
                                                             "image": "photos/b.png"},
             {"prompt": "make it red", "image": "a.png"}]             # a repeat: skipped
    train = tmp_path / "edits.jsonl"
    train.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    (tmp_path / "val.jsonl").write_text(json.dumps({"prompt": "add a dog", "image": "a.png"}))
    rows, splits = edit_lists(train, tmp_path / "val.jsonl")
    assert [(r.instruction, r.image) for r in rows] == [
        ("make it red", "a.png"), ("add a cat", "photos/b.png"), ("add a dog", "a.png")]
    assert rows[1].path == tmp_path / "photos" / "b.png" and splits == ["train", "train", "val"]
    assert edit_rows_in(train) and not edit_rows_in(tmp_path / "photos" / "b.png")
    with pytest.raises(ValueError, match=r"pair \('add a cat', 'photos/b.png'\) is both a "
                                         r"training and a held-out edit"):
        edit_lists(train, train)
    (tmp_path / "missing.jsonl").write_text(json.dumps({"prompt": "x", "image": "nope.png"}))
    with pytest.raises(ValueError, match=r"missing.jsonl line 1: image 'nope.png' does not exist "
                                         r"\(looked for .*nope.png\); image paths are relative "
                                         r"to the JSON Lines file's folder, or absolute$"):
        read_edit_rows(tmp_path / "missing.jsonl")
    (tmp_path / "prompts.txt").write_text("make it red\n")
    with pytest.raises(ValueError, match=r"prompts.txt line 1: 'make it red' is not \{\"prompt\": "
                                         r"\"<instruction>\", \"image\": \"<path>\"\} \(a "
                                         r"non-empty instruction and an image path\); write one "
                                         r"such JSON object per line$"):
        read_edit_rows(tmp_path / "prompts.txt")
    with pytest.raises(ValueError, match=r"no edits: an editing pipeline encodes \(instruction, "
                                         r"image\) pairs; give --prompts=<file.jsonl>"):
        edit_lists()
