"""Where a run's prompts and their model inputs come from: one object, chosen once.

A prompt source has ``train_prompts`` and ``val_prompts`` (the run's training pool and the
held-out pool its evaluation draws from) and ``tokenize(prompts, max_len) -> (tokens, mask)``,
the model input of a batch of prompts. ``spotlight_jax.config.prompt_source`` picks it from
the config and the runner, the explorers, the rollout workers, the evaluation and pretraining
take its ``tokenize``, so no call site decides between the two kinds:

* :class:`WorldPrompts` (the model has a prompt encoder, ``model.text_width > 0``): the
  synthetic world's prompts and its word tokenizer, exactly ``world.tokenize``;
* :class:`VideoPrompts` (a video model with a prompt encoder): the video world's moving-shape
  prompts and the same tokenizer;
* :class:`EditPrompts` (an editing model with a prompt encoder, ``model.reference_images > 0``):
  the editing world's tasks as prompts ``"<instruction> | <source scene> | <seed>"``, whose
  model input is the instruction's word ids and the source scene rendered at its seed, as the
  prompt pytree ``{"embeds": ids, "image": source [B, H, W, 3] in [-1, 1]}``;
* :class:`EmbeddingPrompts` (``model.text_width == 0``): a prompt-embedding file's prompts
  (its ``train`` and ``val`` splits) and their precomputed embeddings, as the prompt pytree of
  ``spotlight_jax.diffusion.prompt``: ``{"embeds": [B, max_len, D], "pooled": [B, P] (SD3),
  "null": the file's empty prompt for each row}``, so classifier-free guidance and prompt
  dropout use the real encoder's empty prompt, not zeros;
* :class:`EditEmbeddingPrompts` (an editing model without a prompt encoder): an edit file's
  (instruction, input image) pairs (``prompt_embeddings.file.edit_key``), as the same pytree
  plus ``"image"``: the input image's VAE latents ``[B, H', W', C]``, with each row's ``null``
  the empty instruction encoded with that row's image (the text encoder sees the image).
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from spotlight_jax import world
from spotlight_jax.diffusion import prompt
from spotlight_jax.prompt_embeddings.file import PromptEmbeddings
from spotlight_jax.world import edit, video


def in_turns(keys: Sequence[str], n: int) -> list[int]:
    """Indices of up to ``n`` items whose ``keys`` (a kind per item) take turns: the first of
    each kind, then the second of each, ... (pools list their prompts kind by kind, so a
    prefix of one would show a single kind)."""
    by_kind: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        by_kind.setdefault(k, []).append(i)
    turns = [i for group in itertools.zip_longest(*by_kind.values()) for i in group
             if i is not None]
    return turns[:n]


class PromptSource(Protocol):
    """The prompts of a run and the model input of a batch of them."""

    @property
    def train_prompts(self) -> list[str]: ...

    @property
    def val_prompts(self) -> list[str]: ...

    def tokenize(self, prompts: Sequence[str], max_len: int) -> tuple[object, np.ndarray]:
        """``(tokens, mask bool [B, max_len])``: tokens are ids ``[B, max_len]`` int, or the
        prompt pytree of ``spotlight_jax.diffusion.prompt`` (embeddings ``[B, max_len, D]``
        float32, a pooled embedding, the guidance null prompt)."""


class WorldPrompts:
    """The synthetic world's train/val prompts and word tokenizer (``world.tokenize``).

    ``train_kinds``: the training pool keeps only prompts of these task kinds (``world.KINDS``;
    empty = all); the held-out pool always covers every kind."""

    def __init__(self, world_cfg: world.WorldConfig, train_kinds: Sequence[str] = ()):
        self.world_cfg = world_cfg
        self.train_kinds = world.parse_kinds(",".join(train_kinds))

    @functools.cached_property
    def train_prompts(self) -> list[str]:
        prompts = world.train_prompts(self.world_cfg)
        if not self.train_kinds:
            return prompts
        return [p for p in prompts if world.parse(p, self.world_cfg).kind in self.train_kinds]

    @functools.cached_property
    def val_prompts(self) -> list[str]:
        return world.val_prompts(self.world_cfg)

    @staticmethod
    def tokenize(prompts, max_len):
        return world.tokenize(prompts, max_len)


class VideoPrompts:
    """The synthetic video world's train/val prompts (``world.video``: moving shapes) and the
    world's word tokenizer, for a video model with a prompt encoder."""

    def __init__(self, world_cfg: world.WorldConfig):
        self.world_cfg = world_cfg

    @functools.cached_property
    def train_prompts(self) -> list[str]:
        return video.video_train_prompts(self.world_cfg)

    @functools.cached_property
    def val_prompts(self) -> list[str]:
        return video.video_val_prompts(self.world_cfg)

    def shown(self, prompts, n: int) -> list[int]:
        """Indices of up to ``n`` of ``prompts`` for a sample grid, the motions in turn."""
        return in_turns([video.parse_video(p, self.world_cfg).direction for p in prompts], n)

    @staticmethod
    def tokenize(prompts, max_len):
        return world.tokenize(prompts, max_len)


class EditPrompts:
    """The editing world's train/held-out tasks (``world.edit``: recolour, move, add, remove),
    one prompt per task; ``train_kinds``: the training pool keeps only tasks of these edit kinds
    (empty = all; the held-out pool always covers every kind). ``tokenize`` gives the
    instruction's word ids under ``embeds`` and the source scene the prompt names (rendered at
    its seed, model space [-1, 1]) under ``image``: the image an editing model edits, which
    travels with its prompt everywhere (a guidance null prompt keeps it,
    ``diffusion.prompt``)."""

    def __init__(self, world_cfg: world.WorldConfig, train_kinds: Sequence[str] = ()):
        self.world_cfg = world_cfg
        self.train_kinds = tuple(train_kinds)

    @functools.cached_property
    def train_prompts(self) -> list[str]:
        prompts = edit.edit_prompts(edit.train_tasks(self.world_cfg))
        if not self.train_kinds:
            return prompts
        return [p for p in prompts
                if edit.parse_edit_prompt(p, self.world_cfg)[0].kind in self.train_kinds]

    @functools.cached_property
    def val_prompts(self) -> list[str]:
        return edit.edit_prompts(edit.val_tasks(self.world_cfg))

    def shown(self, prompts, n: int) -> list[int]:
        """Indices of up to ``n`` of ``prompts`` for a sample grid, the edit kinds in turn."""
        return in_turns([edit.parse_edit_prompt(p, self.world_cfg)[0].kind for p in prompts], n)

    def tokenize(self, prompts, max_len):
        parsed = [edit.parse_edit_prompt(p, self.world_cfg) for p in prompts]
        tasks, seeds = [t for t, _ in parsed], [s for _, s in parsed]
        sources, _ = edit.render_pairs(tasks, seeds, self.world_cfg)
        ids, mask = edit.tokenize_instructions(tasks, max_len)
        return {prompt.EMBEDS: ids, prompt.IMAGE: sources * 2.0 - 1.0}, mask


class EmbeddingPrompts:
    """A prompt-embedding file's prompts and their precomputed embeddings, for a model without
    a prompt encoder (``text_width == 0``).

    The training pool is the file's ``train`` split, the held-out pool its ``val`` split.
    ``tokenize`` returns the prompt pytree ``{"embeds", "pooled" (files that have it), "null"}``
    of ``spotlight_jax.diffusion.prompt``, whose ``null`` is the file's empty prompt (row 0:
    embeds, mask and pooled) repeated for every row: the guidance null prompt and the
    pretraining dropout's, carried with each prompt wherever it goes.
    """

    def __init__(self, file: PromptEmbeddings):
        self.file = file

    @property
    def train_prompts(self) -> list[str]:
        return self.file.prompts("train")

    @property
    def val_prompts(self) -> list[str]:
        return self.file.prompts("val")

    def tokenize(self, prompts, max_len):
        embeds, mask, pooled = self.file.lookup(prompts, max_len)
        e0, m0, p0 = self.file.empty(max_len)
        # the empty prompt broadcast to every row (a view: no copy until a batch is sliced)
        null = {prompt.EMBEDS: np.broadcast_to(e0, embeds.shape),
                prompt.MASK: np.broadcast_to(m0, mask.shape)}
        tokens = {prompt.EMBEDS: embeds, prompt.NULL: null}
        if pooled is not None:
            tokens[prompt.POOLED] = pooled
            null[prompt.POOLED] = np.broadcast_to(p0, pooled.shape)
        return tokens, mask

    def null_prompt(self, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """The empty prompt's ``(embeds [max_len, D], mask [max_len])``: a real model's null
        prompt for classifier-free guidance."""
        embeds, mask, _ = self.file.empty(max_len)
        return embeds, mask


class EditEmbeddingPrompts(EmbeddingPrompts):
    """An edit file's (instruction, input image) pairs and their precomputed model inputs, for
    an editing model without a prompt encoder (Qwen-Image-Edit from its diffusers folder).

    The pools are the file's ``train`` and ``val`` rows, each prompt the pair's key
    (``"<instruction> | <image>"``). ``tokenize`` returns ``{"embeds": the text encoder's
    embeddings of the pair [B, max_len, D], "image": the image's latents [B, H', W', C],
    "null": {"embeds", "mask"} of the empty instruction with the same image}``: guidance and
    prompt dropout drop the words and keep the image (``diffusion.prompt``), the words' null
    being what the encoder gives the image alone, as the pipeline's negative prompt is encoded
    with the input image."""

    def tokenize(self, prompts, max_len):
        embeds, mask, pooled = self.file.lookup(prompts, max_len)
        null_embeds, null_mask, null_pooled = self.file.lookup(self.file.null_prompts(prompts),
                                                               max_len)
        null = {prompt.EMBEDS: null_embeds, prompt.MASK: null_mask}
        tokens = {prompt.EMBEDS: embeds, prompt.IMAGE: self.file.input_latents(prompts),
                  prompt.NULL: null}
        if pooled is not None:
            tokens[prompt.POOLED], null[prompt.POOLED] = pooled, null_pooled
        return tokens, mask
