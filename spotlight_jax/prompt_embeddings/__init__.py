"""Real prompts without downloads at run time: prompt-embedding files and the run's prompt
source.

``file``: the format (safetensors: per-prompt token embeddings, mask, optional pooled embedding,
the empty prompt in row 0, prompts and splits in the metadata; an edit file's rows are
(instruction, input image) pairs with the images' VAE latents), its writers and its reader with
batched lookup. ``source``: the object a run takes its prompts and model inputs from (the
synthetic world's tokenizer, or a file's embeddings when the model has no prompt encoder).
``encoders``: the real text encoders of a diffusers pipeline (torch, the ``[encode]`` extra),
used by ``python -m spotlight_jax.tools.encode_prompts``.
"""
from spotlight_jax.prompt_embeddings.file import (
    EMPTY_INDEX,
    FORMAT,
    SPLITS,
    VERSION,
    PromptEmbeddingError,
    PromptEmbeddings,
    edit_key,
    pad_rows,
    read,
    write,
    write_edits,
)
from spotlight_jax.prompt_embeddings.source import (
    EditEmbeddingPrompts,
    EditPrompts,
    EmbeddingPrompts,
    PromptSource,
    VideoPrompts,
    WorldPrompts,
)

__all__ = [
    "EMPTY_INDEX",
    "FORMAT",
    "SPLITS",
    "VERSION",
    "EditEmbeddingPrompts",
    "EditPrompts",
    "EmbeddingPrompts",
    "PromptEmbeddingError",
    "PromptEmbeddings",
    "PromptSource",
    "VideoPrompts",
    "WorldPrompts",
    "edit_key",
    "pad_rows",
    "read",
    "write",
    "write_edits",
]
