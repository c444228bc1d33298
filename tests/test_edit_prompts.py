"""An editing run's prompts: configs/tiny_edit.py reads the editing world (``EditPrompts``),
whose model input is the instruction's word ids and the source scene the prompt names, rendered
at its seed; the pretraining stream shows edited scenes of fresh layouts; the held-out and
training pools share no task; a sample grid shows source | before | after; an editing model
without a prompt encoder and without an edit file (tests/test_edit_prompt_files.py) is a
one-line error saying how to write one."""
import types

import numpy as np
import pytest

from spotlight_jax import config as conf
from spotlight_jax.config import ConfigError, prompt_source
from spotlight_jax.diffusion import prompt
from spotlight_jax.prompt_embeddings import EditPrompts
from spotlight_jax.runner import outputs
from spotlight_jax.world import WorldConfig, edit


@pytest.fixture(scope="module")
def source():
    src = prompt_source(conf.load_config("tiny_edit"))
    assert isinstance(src, EditPrompts)
    return src


def test_tokenize_gives_the_instruction_and_the_source_it_names(source):
    prompts = source.train_prompts[:3] + source.val_prompts[:2]
    tokens, mask = source.tokenize(prompts, 16)
    cfg = WorldConfig(image_size=32)
    for i, p in enumerate(prompts):
        task, seed = edit.parse_edit_prompt(p, cfg)
        want_src, _ = edit.render_pair(task, seed, cfg)
        np.testing.assert_allclose(tokens[prompt.IMAGE][i], want_src * 2 - 1, atol=1e-6)
        ids, m = edit.tokenize_instructions([task], 16)
        np.testing.assert_array_equal(tokens[prompt.EMBEDS][i], ids[0])
        np.testing.assert_array_equal(mask[i], m[0])
    assert tokens[prompt.IMAGE].shape == (5, 32, 32, 3)


def test_held_out_tasks_are_not_trained_on(source):
    def pairs(prompts):
        return {tuple(p.split(" | ")[:2]) for p in prompts}

    train, val = pairs(source.train_prompts), pairs(source.val_prompts)
    assert train and val and not train & val
    kinds = {edit.parse_edit_prompt(p)[0].kind for p in source.val_prompts}
    assert kinds == set(edit.EDIT_KINDS)


def test_the_pretraining_stream_shows_each_prompts_edited_scene():
    cfg = WorldConfig(image_size=32)
    stream = edit.edit_stream(edit.train_tasks(cfg), 6, seed=3, cfg=cfg)
    prompts, targets = next(stream)
    again, _ = next(edit.edit_stream(edit.train_tasks(cfg), 6, seed=3, cfg=cfg))
    assert prompts == again and targets.shape == (6, 32, 32, 3)
    for p, target in zip(prompts, targets):
        task, seed = edit.parse_edit_prompt(p, cfg)
        np.testing.assert_array_equal(target, edit.render_pair(task, seed, cfg)[1])
    assert len({p.rsplit(" | ", 1)[1] for p in prompts}) == 6      # fresh layout seeds


def test_an_editing_runs_before_after_grid_shows_the_source(tmp_path, source):
    prompts = source.val_prompts[:4]
    run = types.SimpleNamespace(workdir=str(tmp_path), prompt_source=source,
                                mcfg=types.SimpleNamespace(text_len=16),
                                eval_reward=lambda images, prompts: np.full(len(prompts), 0.5),
                                writer=types.SimpleNamespace(image=lambda *a, **k: None))
    images = np.random.default_rng(0).uniform(size=(4, 32, 32, 3)).astype(np.float32)
    outputs.save_samples(run, 0, images, prompts)
    outputs.save_samples(run, 5, images, prompts)
    grid = tmp_path / "samples" / "before_after_00005.png"
    assert grid.exists()
    sources = outputs._input_images(run, prompts)
    np.testing.assert_allclose(sources, (source.tokenize(prompts, 16)[0][prompt.IMAGE] + 1) / 2,
                               atol=1e-6)


def test_an_editing_model_without_a_prompt_encoder_says_what_is_missing():
    config = conf.load_config("qwen_image_edit")
    with pytest.raises(ConfigError, match=r"^model.reference_images=1: an editing model without "
                                          r"a prompt encoder needs prompt files holding each "
                                          r"instruction's input image .*: write one with python "
                                          r"-m spotlight_jax.tools.encode_prompts"):
        prompt_source(config)


def test_the_held_out_summary_splits_the_reward_by_factor_and_kind(source):
    from spotlight_jax.rewards.edit import edit_summary

    by_kind = {}
    for p in source.val_prompts:
        by_kind.setdefault(edit.parse_edit_prompt(p)[0].kind, p)
    prompts = list(by_kind.values())
    cfg = WorldConfig(image_size=32)
    pairs = [edit.render_pair(*edit.parse_edit_prompt(p, cfg), cfg) for p in prompts]
    done = edit_summary(np.stack([t for _, t in pairs]), prompts)
    assert done == pytest.approx({"part_applied": 1.0, "part_preserved": 1.0,
                                  **{f"kind_{k}": 1.0 for k in edit.EDIT_KINDS}})
    undone = edit_summary(np.stack([s for s, _ in pairs]), prompts)
    assert undone["part_applied"] < 0.3 and max(
        undone[f"kind_{k}"] for k in edit.EDIT_KINDS) < 0.3


def test_a_sample_grid_shows_every_edit_kind(source):
    shown = source.shown(source.val_prompts, 8)
    kinds = [edit.parse_edit_prompt(source.val_prompts[i])[0].kind for i in shown]
    assert len(shown) == 8 and kinds[:4] == list(edit.EDIT_KINDS) == kinds[4:]


def test_train_kinds_narrow_the_training_pool_not_the_held_out_one(source):
    every = prompt_source(conf.load_config("tiny_edit", {"prompts.train_kinds": ""}))
    assert {edit.parse_edit_prompt(p)[0].kind for p in every.train_prompts} == set(edit.EDIT_KINDS)
    narrow = prompt_source(conf.load_config("tiny_edit", {"prompts.train_kinds": "move,add"}))
    kinds = {edit.parse_edit_prompt(p)[0].kind for p in narrow.train_prompts}
    assert kinds == {"move", "add"} and set(narrow.train_prompts) < set(every.train_prompts)
    assert narrow.val_prompts == every.val_prompts == source.val_prompts
    with pytest.raises(ConfigError, match=r"^prompts.train_kinds='color': unknown edit kind "
                                          r"'color'; choose from"):
        prompt_source(conf.load_config("tiny_edit", {"prompts.train_kinds": "color"}))
