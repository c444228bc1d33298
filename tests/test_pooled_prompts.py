"""SD3/SD3.5's pooled text embedding and a prompt-embedding file's empty prompt (the guidance
null) through the RL loop.

The model is the converted tiny SD3.5 fixture (stored 2-D position table, pooled input, no text
mask, pre-only last block, a dual-attention block); the prompts come from a file with pooled
vectors whose empty prompt is neither zero nor masked, as a real encoder's is. References are
written out by hand here: the denoising loop step by step with the model called on the file's
rows (``initial_noise``, ``step_noise`` and ``transition`` are the contracts the diffusion tests
pin down), and guidance as ``uncond + g (cond - uncond)`` with the empty prompt's rows.
"""
import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import micro_config

from spotlight_jax import prompt_embeddings as pe
from spotlight_jax import world
from spotlight_jax.config import ConfigError, prompt_source, validate
from spotlight_jax.diffusion import (
    Sampler,
    SamplerConfig,
    batches,
    initial_noise,
    prompt,
    step_noise,
    transition,
    velocity,
)
from spotlight_jax.elastic import DevicePool, PoolConfig
from spotlight_jax.elastic.node import SpotNode
from spotlight_jax.models.convert import from_diffusers
from spotlight_jax.rl import GRPOConfig, GRPOTrainer, advantages
from spotlight_jax.rl.nft import NFTConfig, NFTTrainer
from spotlight_jax.train import train_and_evaluate

SD35 = pathlib.Path(__file__).resolve().parent / "fixtures" / "diffusers" / "transformer" / "sd35"
L = 5                                    # tokens per prompt in the file
PROMPTS = ["", "a red bar", "two blue squares", "a green column"]
SDE = SamplerConfig(num_steps=3, shift=3.0, noise_level=0.7)


def fake_file(path, prompts, dim, pooled_dim, text_len=L, seed=0):
    """Random per-token and pooled embeddings; the empty prompt (row 0) has real, non-zero
    tokens like CLIP's/T5's BOS/EOS, so it differs from the all-masked zero prompt."""
    rng = np.random.default_rng(seed)
    n = len(prompts)
    embeds = rng.normal(size=(n, text_len, dim)).astype(np.float32)
    mask = np.ones((n, text_len), bool)
    mask[1:, text_len - 1] = False       # padding on the prompts (SD3 attends to it anyway)
    pooled = rng.normal(size=(n, pooled_dim)).astype(np.float32)
    pe.write(path, prompts, embeds, mask, pooled, family="sd3", encoder="tests.fake_file",
             splits=["", *(["train"] * (n - 2)), "val"])
    return pe.read(path)


@pytest.fixture(scope="module")
def sd35(tmp_path_factory):
    model, cfg = from_diffusers(SD35)
    graphdef, state = nnx.split(model)
    f = fake_file(tmp_path_factory.mktemp("p") / "p.safetensors", PROMPTS, cfg.text_embed_dim,
                  cfg.pooled_dim)
    source = pe.EmbeddingPrompts(f)
    ps = [PROMPTS[1], PROMPTS[2], PROMPTS[1], PROMPTS[2]]     # 2 prompts x 2 seeds
    tokens, mask = source.tokenize(ps, L)
    seeds = np.array([3, 4, 5, 6], np.uint32)
    return dict(model=model, cfg=cfg, graphdef=graphdef, state=state, file=f, source=source,
                tokens=tokens, mask=mask, seeds=seeds, shape=(cfg.image_size,) * 2 +
                (cfg.channels,), ps=ps)


def by_hand(w, sampler: SamplerConfig, embeds, mask, pooled, null=None):
    """The rollout written out: the model called step by step on the given rows; with
    ``null = (embeds, mask, pooled)`` guided as ``uncond + g (cond - uncond)``."""
    model, seeds, shape = w["model"], jnp.asarray(w["seeds"]), w["shape"]
    x = initial_noise(seeds, shape)
    latents, logps = [x], []
    for i in range(sampler.num_steps):
        t = jnp.full((len(seeds),), sampler.sigmas[i], jnp.float32)
        v = model(x, t, embeds, mask, pooled=pooled)
        if null is not None:
            uncond = model(x, t, null[0], null[1], pooled=null[2])
            v = uncond + sampler.guidance * (v - uncond)
        x, logp, _, _ = transition(sampler, x, v, i, noise=step_noise(seeds, i, shape))
        latents.append(x)
        logps.append(logp)
    return np.stack(latents, 1), np.stack(logps, 1)


def file_rows(w):
    """The file's own rows of the batch's prompts and of its empty prompt (not via tokenize)."""
    e, m, p = w["file"].lookup(w["ps"], L)
    e0, m0, p0 = w["file"].empty(L)
    b = len(w["ps"])
    return (e, m, p), (np.repeat(e0[None], b, 0), np.repeat(m0[None], b, 0),
                       np.repeat(p0[None], b, 0))


def test_a_batch_with_prompt_pytrees_slices_joins_and_round_trips_through_flat_names(sd35):
    """What the explorers, the trainers, the pipelined mode's npz checkpoint and the cluster
    trainer's broadcast do to a batch whose tokens are a pytree."""
    w = sd35
    batch = {"tokens": w["tokens"], "mask": w["mask"], "seeds": w["seeds"]}
    flat = batches.flatten(batch)
    assert sorted(flat) == ["mask", "seeds", "tokens/embeds", "tokens/null/embeds",
                            "tokens/null/mask", "tokens/null/pooled", "tokens/pooled"]
    back = batches.unflatten(flat)
    assert jax.tree.structure(back) == jax.tree.structure(batch)
    rows = np.array([2, 0])
    two = batches.concat([batches.take(batch, rows), batches.take(batch, slice(0, 1))])
    for got, full in zip(jax.tree.leaves(two), jax.tree.leaves(batch)):
        np.testing.assert_array_equal(got, np.asarray(full)[[2, 0, 0]])
    assert batches.batch_size(two) == 3
    with pytest.raises(ValueError, match=r"key 'a/b': contains '/'"):
        batches.flatten({"a/b": np.zeros(1)})


def test_a_rollout_is_conditioned_on_the_files_pooled_embedding(sd35):
    w = sd35
    (e, m, p), _ = file_rows(w)
    sampler = Sampler(w["graphdef"], w["shape"], SDE)
    out = jax.tree.map(np.asarray, sampler.rollout(w["state"], w["tokens"], w["mask"],
                                                   w["seeds"]))
    latents, logps = by_hand(w, SDE, e, m, p)
    np.testing.assert_allclose(out["latents"], latents, rtol=0, atol=1e-5)
    np.testing.assert_allclose(out["log_probs"], logps, rtol=0, atol=1e-5)
    other = {**w["tokens"], prompt.POOLED: w["tokens"][prompt.POOLED] + 1.0}
    moved = np.asarray(sampler.rollout(w["state"], other, w["mask"], w["seeds"])["images"])
    assert np.abs(moved - out["images"]).max() > 1e-2          # the pooled vector conditions


def test_guidance_uses_the_files_empty_prompt_as_its_null(sd35):
    w = sd35
    (e, m, p), null = file_rows(w)
    guided = SamplerConfig(num_steps=3, shift=3.0, noise_level=0.7, guidance=3.0)
    # one velocity: the empty prompt's rows, by hand
    x = initial_noise(jnp.asarray(w["seeds"]), w["shape"])
    t = jnp.full((4,), 0.6, jnp.float32)
    cond = w["model"](x, t, e, m, pooled=p)
    uncond = w["model"](x, t, *null[:2], pooled=null[2])
    got = velocity(w["model"], x, 0.6, w["tokens"], w["mask"], guidance=3.0)
    np.testing.assert_allclose(got, uncond + 3.0 * (cond - uncond), rtol=0, atol=1e-5)
    # the whole guided rollout
    out = Sampler(w["graphdef"], w["shape"], guided).rollout(w["state"], w["tokens"],
                                                             w["mask"], w["seeds"])
    latents, logps = by_hand(w, guided, e, m, p, null)
    np.testing.assert_allclose(np.asarray(out["latents"]), latents, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out["log_probs"]), logps, rtol=0, atol=1e-5)
    # the synthetic world's null (zeros, nothing attended) would sample something else
    zeros = (np.zeros_like(e), np.zeros_like(m), np.zeros_like(p))
    other, _ = by_hand(w, guided, e, m, p, zeros)
    assert np.abs(other - latents).max() > 1e-2


def test_a_spot_nodes_precompiled_rollout_takes_the_sources_prompt_structure(sd35):
    w = sd35
    pool = DevicePool(PoolConfig(nodes=(("spot0", "spot", 1),)), jax.devices()[:1])
    like = w["source"].tokenize([], L)[0]
    node = SpotNode("spot0", pool, w["graphdef"], w["state"],
                    dataclasses.replace(w["cfg"], text_len=L), SDE, batch_sizes=(4,),
                    tokens_like=like)
    got = node.rollout(w["tokens"], w["mask"], w["seeds"])
    want = Sampler(w["graphdef"], w["shape"], SDE).rollout(w["state"], w["tokens"], w["mask"],
                                                            w["seeds"])
    np.testing.assert_allclose(np.asarray(got["latents"]), np.asarray(want["latents"]),
                               rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"build the node with tokens_like="):
        node.rollout(w["tokens"][prompt.EMBEDS], w["mask"], w["seeds"])


def rollout_batch(w, sampler_cfg):
    out = Sampler(w["graphdef"], w["shape"], sampler_cfg).rollout(
        w["state"], w["tokens"], w["mask"], w["seeds"])
    batch = {**jax.tree.map(np.asarray, out), "tokens": w["tokens"], "mask": w["mask"],
             "prompt_ids": np.array([0, 1, 0, 1])}
    batch["advantages"] = advantages(np.array([0.1, 0.5, 0.9, 0.2], np.float32),
                                     batch["prompt_ids"])
    return batch


def changed(before, after) -> float:
    return max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
               for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))


@pytest.mark.e2e
def test_one_grpo_update_with_guidance_recomputes_the_rollouts_log_probs(sd35):
    """The trainer's forward equals the rollout's (its log-probs to 1e-5, so the same pooled
    vector and null prompt), on minibatches sliced from the prompt pytree."""
    w = sd35
    guided = SamplerConfig(num_steps=3, shift=3.0, noise_level=0.7, guidance=2.0)
    batch = rollout_batch(w, guided)
    trainer = GRPOTrainer(w["graphdef"], w["state"], GRPOConfig(
        train_steps=2, minibatches=2, lr=1e-3, beta=0.0, lora_rank=0), guided)
    before = jax.tree.map(np.asarray, trainer.trainable)
    m = trainer.update({k: batch[k] for k in (*trainer.batch_keys, "advantages")},
                       jax.random.key(0), 0)
    assert m["first_ratio_dev"] == 0.0 and m["rollout_logp_dev"] < 1e-5
    assert np.isfinite(m["loss"]) and changed(before, trainer.trainable) > 0


@pytest.mark.e2e
def test_one_nft_update_trains_on_the_pooled_conditioning(sd35):
    w = sd35
    batch = rollout_batch(w, SDE)         # only x0 is read: the first test's program
    results = []
    for shift in (0.0, 1.0):     # the same update with another pooled vector moves elsewhere
        tokens = {**w["tokens"], prompt.POOLED: w["tokens"][prompt.POOLED] + shift}
        trainer = NFTTrainer(w["graphdef"], w["state"], NFTConfig(
            group_size=2, times=2, minibatches=2, lr=1e-3, lora_rank=0), SDE)
        m = trainer.update({**{k: batch[k] for k in trainer.batch_keys}, "tokens": tokens,
                            "advantages": batch["advantages"]}, jax.random.key(0), 0)
        assert np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])
        results.append(jax.tree.map(np.asarray, trainer.trainable))
    assert changed(results[0], results[1]) > 1e-6


# -- a whole run -----------------------------------------------------------------------------

WORLD16 = world.WorldConfig(image_size=16)
DIM, POOLED_DIM = 8, 6
SD35_MODEL = {"model.text_width": 0, "model.text_embed_dim": DIM, "model.pooled": "input",
              "model.pooled_dim": POOLED_DIM, "model.pos_embed": "sd3_table",
              "model.pos_embed_max_size": 8, "model.pos_embed_base_size": 4,
              "model.use_text_mask": False, "model.context_pre_only_last": True,
              "model.dual_attention_layers": (0,)}


def world_file(path):
    train, val = world.train_prompts(WORLD16), world.val_prompts(WORLD16)
    prompts = ["", *train, *val]
    rng = np.random.default_rng(1)
    n = len(prompts)
    pe.write(path, prompts, rng.normal(size=(n, 4, DIM)).astype(np.float32),
             np.ones((n, 4), bool), rng.normal(size=(n, POOLED_DIM)).astype(np.float32),
             splits=["", *["train"] * len(train), *["val"] * len(val)], family="sd3",
             encoder="tests.world_file")


def pooled_config(path, **overrides):
    return micro_config(1, **{**SD35_MODEL, "prompts.embeddings_file": str(path), **overrides})


@pytest.mark.parametrize("overrides, message", [
    ({"model.pooled": "text_mean"}, r"holds pooled embeddings of width 6 \(family 'sd3'\), "
                                    r"which model.pooled='text_mean' would drop"),
    ({"model.pooled_dim": 5}, r"pooled embeddings of width 6, the model takes "
                              r"model.pooled_dim=5; set --config.model.pooled_dim=6"),
], ids=["dropped", "width"])
def test_a_pooled_file_the_model_cannot_take_is_a_config_error(tmp_path, overrides, message):
    path = tmp_path / "w.safetensors"
    world_file(path)
    with pytest.raises(ConfigError, match=r"^prompts\.embeddings_file='[^']*': " + message):
        prompt_source(pooled_config(path, **overrides))


@pytest.mark.e2e      # ~40 s: pretraining, evaluation and one iteration compile their programs
def test_a_run_of_an_sd35_architecture_model_trains_from_a_pooled_file(tmp_path):
    """Pretraining (dropout to the file's empty prompt), the held-out evaluation and one
    guided Flow-GRPO iteration, every prompt with its pooled vector: a pooled='input' model
    refuses a call without one, so the run only gets through if every path carries it."""
    path = tmp_path / "w.safetensors"
    world_file(path)
    config = pooled_config(path, **{
        "base_checkpoint": "none", "pretrain.steps": 2, "pretrain.batch_size": 4,
        "pretrain.eval_every": 0, "pretrain.warmup": 1, "sampler.guidance": 2.0})
    validate(config, jax.devices())
    history = train_and_evaluate(config, str(tmp_path / "run"))
    rows = [h for h in history if "reward_mean" in h]
    assert len(rows) == 1 and np.isfinite(rows[0]["reward_mean"])
    assert all(np.isfinite(h["val_reward"]) for h in history if "val_reward" in h)
