"""The synthetic world: prompts, tokenizer, renderer and detector for CPU-scale Flow-GRPO.

Real text-to-image rewards (GenEval's detector, an OCR model) need downloaded weights; this world
needs none and keeps the same structure (docs/world.md). A finite prompt grammar
(`grammar`), a word tokenizer (`tokenizer`), a renderer that draws matching images for pretraining
the base model (`render`, with the digit font in `font`), and a deterministic detector that reads
the same palette, shapes and font back (`detect`), which the rewards in `spotlight_jax.rewards`
build on. Everything is plain numpy; `WorldConfig` (`config`) holds every knob.
"""

from spotlight_jax.world import (
    edit,  # the editing world (world.edit)
    video,  # the video world (world.video)
)
from spotlight_jax.world.config import (
    COMPACT_SHAPES,
    COUNT_WORDS,
    DEFAULT,
    ELONGATED_SHAPES,
    KINDS,
    KNOWN_SHAPES,
    PALETTE,
    RELATIONS,
    WorldConfig,
)
from spotlight_jax.world.detect import Detections, detect, glyph_cells, read_text, segment
from spotlight_jax.world.grammar import (
    Group,
    PromptSpec,
    all_prompts,
    format_prompt,
    parse,
    parse_kinds,
    prompts_by_kind,
    train_prompts,
    val_prompts,
)
from spotlight_jax.world.render import data_stream, object_mask, render, sample_batch, shape_mask
from spotlight_jax.world.tokenizer import (
    DEFAULT_MAX_LEN,
    PAD_ID,
    VOCAB,
    VOCAB_SIZE,
    decode,
    encode,
    tokenize,
)

__all__ = [
    "COUNT_WORDS",
    "DEFAULT",
    "DEFAULT_MAX_LEN",
    "KINDS",
    "COMPACT_SHAPES",
    "ELONGATED_SHAPES",
    "KNOWN_SHAPES",
    "PALETTE",
    "PAD_ID",
    "RELATIONS",
    "VOCAB",
    "VOCAB_SIZE",
    "Detections",
    "Group",
    "PromptSpec",
    "WorldConfig",
    "all_prompts",
    "data_stream",
    "decode",
    "detect",
    "encode",
    "format_prompt",
    "object_mask",
    "parse",
    "parse_kinds",
    "prompts_by_kind",
    "glyph_cells",
    "read_text",
    "render",
    "sample_batch",
    "segment",
    "shape_mask",
    "tokenize",
    "train_prompts",
    "val_prompts",
    "edit",
    "video",
]
