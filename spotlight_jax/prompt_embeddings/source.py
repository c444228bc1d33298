"""Where a run's prompts and their model inputs come from: one object, chosen once.

A prompt source has ``train_prompts`` and ``val_prompts`` (the run's training pool and the
held-out pool its evaluation draws from) and ``tokenize(prompts, max_len) -> (tokens, mask)``,
the model input of a batch of prompts. ``spotlight_jax.builders.prompt_source`` picks it from
the config and the runner, the explorers, the rollout workers, the evaluation and pretraining
take its ``tokenize``, so no call site decides between the two kinds:

* :class:`WorldPrompts` (the model has a prompt encoder, ``model.text_width > 0``): the
  synthetic world's prompts and its word tokenizer, exactly ``world.tokenize``;
* :class:`EmbeddingPrompts` (``model.text_width == 0``): a prompt-embedding file's prompts
  (its ``train`` and ``val`` splits) and their precomputed embeddings ``[B, max_len, D]``.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from spotlight_jax import world
from spotlight_jax.prompt_embeddings.file import PromptEmbeddingError, PromptEmbeddings


class PromptSource(Protocol):
    """The prompts of a run and the model input of a batch of them."""

    @property
    def train_prompts(self) -> list[str]: ...

    @property
    def val_prompts(self) -> list[str]: ...

    def tokenize(self, prompts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens [B, max_len] int or embeddings [B, max_len, D] float32, mask bool
        [B, max_len])``."""


class WorldPrompts:
    """The synthetic world's train/val prompts and word tokenizer (``world.tokenize``)."""

    def __init__(self, world_cfg: world.WorldConfig):
        self.world_cfg = world_cfg

    @functools.cached_property
    def train_prompts(self) -> list[str]:
        return world.train_prompts(self.world_cfg)

    @functools.cached_property
    def val_prompts(self) -> list[str]:
        return world.val_prompts(self.world_cfg)

    @staticmethod
    def tokenize(prompts, max_len):
        return world.tokenize(prompts, max_len)


class EmbeddingPrompts:
    """A prompt-embedding file's prompts and their precomputed embeddings, for a model without
    a prompt encoder (``text_width == 0``).

    The training pool is the file's ``train`` split, the held-out pool its ``val`` split. Files
    with a pooled embedding (SD3) are refused until the model takes one: passing only the
    per-token embeddings would silently drop part of the conditioning.
    """

    def __init__(self, file: PromptEmbeddings):
        if file.pooled is not None:
            raise PromptEmbeddingError(
                f"{file.path}: holds pooled embeddings (family {file.family!r}, width "
                f"{file.pooled_dim}), which the MMDiT does not take as an input yet; use a "
                "family without a pooled embedding (e.g. qwen_image)")
        self.file = file

    @property
    def train_prompts(self) -> list[str]:
        return self.file.prompts("train")

    @property
    def val_prompts(self) -> list[str]:
        return self.file.prompts("val")

    def tokenize(self, prompts, max_len):
        embeds, mask, _ = self.file.lookup(prompts, max_len)
        return embeds, mask

    def null_prompt(self, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """The empty prompt's ``(embeds [max_len, D], mask [max_len])``: a real model's null
        prompt for classifier-free guidance."""
        embeds, mask, _ = self.file.empty(max_len)
        return embeds, mask
