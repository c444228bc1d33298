"""Word-level tokenizer for the world's prompts.

The grammar is tiny and closed, so a fixed word vocabulary is exact and needs no training:
every count word, every known color (the whole `PALETTE`, not only a config's subset, so token ids
never depend on the config), every shape in singular and plural, the relation and text words, the
ten digits as separate tokens and the quote character. Pad id is 0. Unknown words and prompts
longer than `max_len` raise ValueError rather than being mapped to an unknown token or truncated:
either would silently change what the model is conditioned on.

Relations are read in one canonical direction: "A on the right of B" is encoded as "B on the
left of A" and "A below B" as "B above A" (`canonical_words`). Both say the same thing, and a
from-scratch prompt encoder cannot learn the four-way phrasing on this budget: which object goes
left is the product of the relation word and the word order (a parity, with no first-order
signal), so the shipped models' encoders put "left" and "right" at nearly the same point and the
base model drew relations at chance (docs/world.md, Relations). In the canonical order the
first-named object is always the left (or upper) one, a first-order fact a small encoder learns
in a few hundred steps, as a pretrained text encoder would already know it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from spotlight_jax.world.config import COMPACT_SHAPES, COUNT_WORDS, ELONGATED_SHAPES, PALETTE
from spotlight_jax.world.grammar import split_words

PAD = "<pad>"
PAD_ID = 0
VOCAB: tuple[str, ...] = (
    PAD,
    *[w for w in COUNT_WORDS if w],
    "an",
    *PALETTE,
    *COMPACT_SHAPES,
    *[s + "s" for s in COMPACT_SHAPES],
    "and",
    "on",
    "the",
    "left",
    "right",
    "of",
    "above",
    "below",
    "text",
    '"',
    *"0123456789",
    # Words added after the first shipped base model go last, so the ids it was trained with stay.
    *ELONGATED_SHAPES,
    *[s + "s" for s in ELONGATED_SHAPES],
    # the video world's motions (world.video)
    "moving",
    "rising",
    "falling",
    "standing",
    "still",
    # the editing world's verbs (world.edit): recolour, move, add, remove
    "make",
    "put",
    "add",
    "remove",
)
TOKEN_ID: dict[str, int] = {w: i for i, w in enumerate(VOCAB)}
assert len(TOKEN_ID) == len(VOCAB), "duplicate word in VOCAB"
VOCAB_SIZE = len(VOCAB)
# Longest prompt of the default grammar is 10 tokens ("a yellow triangle on the right of a green
# square"); 12 leaves room without wasting attention on padding.
DEFAULT_MAX_LEN = 12
_QUOTED = re.compile(r'" ([0-9 ]*?) "')


# Relation phrases read in reverse, and the canonical phrase each becomes (object order swapped).
_REVERSED_RELATIONS = {("on", "the", "right", "of"): ("on", "the", "left", "of"),
                       ("below",): ("above",)}


def canonical_words(words: list[str]) -> list[str]:
    """Words of a prompt with a reversed relation rewritten canonically ("A below B" -> "B above
    A", "A on the right of B" -> "B on the left of A"); every other prompt unchanged."""
    for phrase, canon in _REVERSED_RELATIONS.items():
        n = len(phrase)
        hits = [i for i in range(len(words) - n + 1) if tuple(words[i:i + n]) == phrase]
        if len(hits) == 1:
            i = hits[0]
            return [*words[i + n:], *canon, *words[:i]]
    return words


def encode(prompt: str) -> list[int]:
    """Token ids of one prompt (no padding), relations in canonical order."""
    ids = []
    for w in canonical_words(split_words(prompt)):
        if w not in TOKEN_ID:
            raise ValueError(
                f'unknown word "{w}" in prompt {prompt!r}; the vocabulary has {VOCAB_SIZE} words: '
                f"{', '.join(VOCAB[1:])}"
            )
        ids.append(TOKEN_ID[w])
    if not ids:
        raise ValueError(f"prompt {prompt!r} has no tokens")
    return ids


def tokenize(
    prompts: Sequence[str], max_len: int = DEFAULT_MAX_LEN
) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize a batch.

    Returns:
      ids: int32 [B, max_len], right-padded with PAD_ID (0).
      mask: bool [B, max_len], True on real tokens.
    """
    if isinstance(prompts, str):
        raise ValueError("tokenize expects a list of prompts, got a single str")
    ids = np.zeros((len(prompts), max_len), np.int32)
    for i, p in enumerate(prompts):
        t = encode(p)
        if len(t) > max_len:
            raise ValueError(f"prompt {p!r} has {len(t)} tokens > max_len={max_len}")
        ids[i, : len(t)] = t
    return ids, ids != PAD_ID


def decode(ids: np.ndarray) -> list[str]:
    """Inverse of `tokenize` up to spacing (for debugging and sample grids)."""
    out = []
    for row in np.asarray(ids).reshape(-1, np.shape(ids)[-1]):
        words = " ".join(VOCAB[int(i)] for i in row if int(i) != PAD_ID)
        out.append(_QUOTED.sub(lambda m: '"' + m.group(1).replace(" ", "") + '"', words))
    return out
