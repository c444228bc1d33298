"""Prompt grammar of the synthetic world: enumeration, train/validation split and parsing.

The grammar mirrors the task kinds GenEval checks, restricted to what a 32x32 world can show:

  single      "a red bar"
  counting    "two blue squares", "three yellow columns"
  two_object  "a red bar and a green square"
  position    "a red bar on the left of a blue square" (also "on the right of", "above",
              "below")
  text        'the text "37"'  (1 or 2 digits)

Colors and shapes are constraints checked inside every object prompt. Within one prompt every
object group has its own color, so the detector can attribute components to groups by color alone.
Two-object and position prompts are enumerated for unordered color pairs only ("A left of B" is
the same scene as "B right of A"), so no held-out prompt is a paraphrase of a training prompt.

The grammar is finite: `all_prompts` enumerates it deterministically, and `train_prompts` /
`val_prompts` split every task kind separately (seeded), so both sets cover every kind.
`parse` is stricter than the enumeration needs (it accepts any number of "and"-joined groups up to
`max_objects`), and raises ValueError naming the offending word and the accepted alternatives.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from typing import NamedTuple

import numpy as np

from spotlight_jax.world.config import (
    COUNT_WORDS,
    DEFAULT,
    KINDS,
    PALETTE,
    RELATIONS,
    WorldConfig,
)

_RELATION_PHRASES = {
    "left": "on the left of",
    "right": "on the right of",
    "above": "above",
    "below": "below",
}


class Group(NamedTuple):
    """`count` objects of one color and shape."""

    count: int
    color: str
    shape: str


@dataclasses.dataclass(frozen=True)
class PromptSpec:
    """A parsed prompt.

    Attributes:
      kind: one of `KINDS`.
      groups: object groups (empty for text prompts). For position prompts, groups[0] is the subject
        and groups[1] the reference: "groups[0] is <relation> groups[1]".
      relation: "left" | "right" | "above" | "below" for position prompts, else None.
      text: the digits to draw for text prompts, else None.
    """

    kind: str
    groups: tuple[Group, ...] = ()
    relation: str | None = None
    text: str | None = None


def _plural(shape: str) -> str:
    return shape + "s"


def format_group(g: Group) -> str:
    noun = g.shape if g.count == 1 else _plural(g.shape)
    return f"{COUNT_WORDS[g.count]} {g.color} {noun}"


def format_prompt(spec: PromptSpec) -> str:
    """Inverse of `parse` for the canonical wording."""
    if spec.kind == "text":
        return f'the text "{spec.text}"'
    if spec.kind == "position":
        a, b = spec.groups
        return f"{format_group(a)} {_RELATION_PHRASES[spec.relation]} {format_group(b)}"
    return " and ".join(format_group(g) for g in spec.groups)


# ---------------------------------------------------------------- enumeration and split


def _enumerate_specs(cfg: WorldConfig) -> dict[str, list[PromptSpec]]:
    objs = [(c, s) for c in cfg.colors for s in cfg.shapes]
    out: dict[str, list[PromptSpec]] = {k: [] for k in KINDS}
    for c, s in objs:
        out["single"].append(PromptSpec("single", (Group(1, c, s),)))
    for n in range(2, cfg.max_count + 1):
        for c, s in objs:
            out["counting"].append(PromptSpec("counting", (Group(n, c, s),)))
    ci = {c: i for i, c in enumerate(cfg.colors)}
    pairs = [(a, b) for a, b in itertools.product(objs, objs) if ci[a[0]] < ci[b[0]]]
    for a, b in pairs:
        out["two_object"].append(PromptSpec("two_object", (Group(1, *a), Group(1, *b))))
    for rel in RELATIONS:
        for a, b in pairs:
            out["position"].append(PromptSpec("position", (Group(1, *a), Group(1, *b)), rel))
    for n in sorted(cfg.text_lengths):
        for digits in itertools.product("0123456789", repeat=n):
            out["text"].append(PromptSpec("text", text="".join(digits)))
    return out


@functools.lru_cache(maxsize=16)
def _split(cfg: WorldConfig) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    rng = np.random.default_rng(cfg.split_seed)
    train, val = {}, {}
    for kind, specs in _enumerate_specs(cfg).items():
        prompts = [format_prompt(s) for s in specs]
        if not prompts:
            train[kind], val[kind] = (), ()
            continue
        n_val = int(round(cfg.val_fraction * len(prompts)))
        n_val = min(max(n_val, 1), len(prompts) - 1) if len(prompts) > 1 else 0
        held = set(rng.permutation(len(prompts))[:n_val].tolist())
        train[kind] = tuple(p for i, p in enumerate(prompts) if i not in held)
        val[kind] = tuple(p for i, p in enumerate(prompts) if i in held)
    return train, val


def all_prompts(cfg: WorldConfig = DEFAULT) -> list[str]:
    """Every prompt of the grammar, in a fixed order (grouped by kind, in `KINDS` order)."""
    return [format_prompt(s) for specs in _enumerate_specs(cfg).values() for s in specs]


def prompts_by_kind(cfg: WorldConfig = DEFAULT, split: str = "all") -> dict[str, list[str]]:
    """{kind: prompts} for split "train", "val" or "all"."""
    if split == "all":
        return {k: [format_prompt(s) for s in v] for k, v in _enumerate_specs(cfg).items()}
    if split not in ("train", "val"):
        raise ValueError(f'unknown split "{split}"; expected "train", "val" or "all"')
    train, val = _split(cfg)
    return {k: list(v) for k, v in (train if split == "train" else val).items()}


def train_prompts(cfg: WorldConfig = DEFAULT) -> list[str]:
    """Training prompts: every kind minus its held-out share (fixed by cfg.split_seed)."""
    return [p for ps in _split(cfg)[0].values() for p in ps]


def val_prompts(cfg: WorldConfig = DEFAULT) -> list[str]:
    """Held-out validation prompts, disjoint from `train_prompts`, covering every kind."""
    return [p for ps in _split(cfg)[1].values() for p in ps]


def kind_of(prompt: str, cfg: WorldConfig = DEFAULT) -> str:
    return parse(prompt, cfg).kind


def parse_kinds(text: str) -> tuple[str, ...]:
    """Task kinds from a comma-separated list ("two_object, position"; "" = none given);
    ValueError naming the unknown ones and the known `KINDS`."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown kind(s) {unknown}; known kinds: {', '.join(KINDS)} "
                         "(comma-separated; '' = all)")
    return kinds


# ---------------------------------------------------------------- parsing

_TOKEN_RE = re.compile(r'"|[a-z]+|[0-9]|\S')


def split_words(prompt: str) -> list[str]:
    """Lower-cased word tokens: words, single digits and the quote character."""
    return _TOKEN_RE.findall(prompt.lower())


def parse(prompt: str, cfg: WorldConfig = DEFAULT) -> PromptSpec:
    """Parse a prompt of the grammar into a `PromptSpec`; ValueError on anything malformed."""
    return _parse_cached(prompt, cfg)


@functools.lru_cache(maxsize=8192)
def _parse_cached(prompt: str, cfg: WorldConfig) -> PromptSpec:
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a str, got {type(prompt).__name__}: {prompt!r}")
    p = prompt.strip().lower()
    if not p:
        raise ValueError("empty prompt")

    def fail(msg: str):
        raise ValueError(f"{msg} in prompt {prompt!r}")

    m = re.fullmatch(r'the text "([^"]*)"', p)
    if p.startswith("the text"):
        if m is None:
            fail('malformed text prompt (expected: the text "<digits>")')
        text = m.group(1)
        if not text.isdigit() or not text.isascii():
            fail(f'text "{text}" must be digits 0-9 only')
        if len(text) not in cfg.text_lengths:
            fail(f'text "{text}" has {len(text)} digits; allowed lengths: {cfg.text_lengths}')
        return PromptSpec("text", text=text)

    words = p.split()
    relation, parts = None, None
    for rel, phrase in _RELATION_PHRASES.items():
        ph = phrase.split()
        for i in range(len(words) - len(ph) + 1):
            if words[i : i + len(ph)] == ph:
                if relation is not None:
                    fail("more than one relation")
                relation, parts = rel, [words[:i], words[i + len(ph) :]]
    if relation is None:
        parts, cur = [], []
        for w in words:
            if w == "and":
                parts.append(cur)
                cur = []
            else:
                cur.append(w)
        parts.append(cur)
    elif any("and" in part for part in parts):
        fail('position prompts relate exactly two single objects (no "and")')

    groups = tuple(_parse_group(part, cfg, fail) for part in parts)
    colors = [g.color for g in groups]
    if len(set(colors)) != len(colors):
        fail(f"each object group needs its own color, got colors {colors}")
    total = sum(g.count for g in groups)
    if total > cfg.max_objects:
        fail(f"{total} objects asked; at most {cfg.max_objects} fit this world")
    if relation is not None:
        if any(g.count != 1 for g in groups):
            fail("position prompts relate single objects (use 'a')")
        return PromptSpec("position", groups, relation)
    if len(groups) > 1:
        return PromptSpec("two_object", groups)
    return PromptSpec("counting" if groups[0].count > 1 else "single", groups)


def _parse_group(words: list[str], cfg: WorldConfig, fail) -> Group:
    if len(words) != 3:
        fail(f'expected "<count> <color> <shape>" but got {" ".join(words)!r} ({len(words)} words)')
    cw, color, noun = words
    counts = {w: i for i, w in enumerate(COUNT_WORDS) if w and i <= cfg.max_count}
    if cw == "an":
        cw = "a"
    if cw not in counts:
        fail(f'unknown count word "{cw}"; known count words: {", ".join(counts)}')
    count = counts[cw]
    if color not in cfg.colors:
        extra = " (it is the text color)" if color == cfg.text_color else ""
        extra = extra or (" (not in this world's palette)" if color in PALETTE else "")
        fail(f'unknown color "{color}"{extra}; known colors: {", ".join(cfg.colors)}')
    singular = {s: s for s in cfg.shapes}
    plural = {_plural(s): s for s in cfg.shapes}
    if noun in singular:
        if count != 1:
            fail(f'"{cw}" needs a plural shape ("{_plural(noun)}"), got "{noun}"')
        shape = noun
    elif noun in plural:
        if count == 1:
            fail(f'"{cw}" needs a singular shape ("{plural[noun]}"), got "{noun}"')
        shape = plural[noun]
    else:
        fail(f'unknown shape "{noun}"; known shapes: {", ".join(cfg.shapes)}')
    return Group(count, color, shape)
