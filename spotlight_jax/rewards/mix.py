"""Weighted reward mixes: ``rl.reward='geneval_lite:1.0,jpeg_compressibility:0.5'``.

A mix spec is a comma-separated list of terms ``name:weight`` or ``name:weight:low:high``; the
mix's reward is ``sum_k weight_k * clip(r_k, low_k, high_k)`` (each term clipped before it is
weighted, so one reward's outliers cannot swamp the others). A plain name (no ``:`` or ``,``)
is the reward itself, unweighted and unclipped. With ``rl.advantage='decoupled'`` the terms are
the reward's components: each term's advantage is normalised within its group before the
weighted sum (``rl.advantages.decoupled_advantages``), so a reward with a small spread still
steers the update.

This module parses and combines; the registry (``rewards.resolve``) turns a
spec into reward functions.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class Term:
    """One reward of a mix: its registered name, weight and clip range."""
    name: str
    weight: float = 1.0
    low: float = -math.inf
    high: float = math.inf


def is_mix(spec: str) -> bool:
    """Whether ``spec`` names a weighted mix rather than one registered reward."""
    return "," in spec or ":" in spec


def _number(spec: str, term: str, what: str, text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"reward mix {spec!r}: term {term!r} has {what} {text!r}, not a number "
                         "(terms are name:weight or name:weight:low:high)") from None
    if math.isnan(x):
        raise ValueError(f"reward mix {spec!r}: term {term!r} has {what} nan")
    return x


def parse(spec: str) -> tuple[Term, ...]:
    """The terms of ``spec`` (one unweighted term for a plain name); ValueError naming the bad
    term for an empty name, a weight or bound that is not a number, low > high, a zero weight or
    a reward named twice."""
    if not is_mix(spec):
        return (Term(spec),)
    terms = []
    for raw in spec.split(","):
        fields = [f.strip() for f in raw.split(":")]
        if not fields[0] or len(fields) not in (2, 4):
            raise ValueError(f"reward mix {spec!r}: term {raw!r} is not name:weight or "
                             "name:weight:low:high (e.g. 'geneval_lite:1.0,"
                             "jpeg_compressibility:0.5:-1:0')")
        weight = _number(spec, raw, "weight", fields[1])
        low, high = ((_number(spec, raw, "low", fields[2]), _number(spec, raw, "high", fields[3]))
                     if len(fields) == 4 else (-math.inf, math.inf))
        if weight == 0.0:
            raise ValueError(f"reward mix {spec!r}: term {raw!r} has weight 0; drop the term")
        if low > high:
            raise ValueError(f"reward mix {spec!r}: term {raw!r} clips to [{low}, {high}], "
                             "an empty range (low must be <= high)")
        terms.append(Term(fields[0], weight, low, high))
    names = [t.name for t in terms]
    if len(set(names)) != len(names):
        raise ValueError(f"reward mix {spec!r} names a reward twice; give each reward one term")
    return tuple(terms)


def names(spec: str) -> list[str]:
    """The registered rewards ``spec`` uses."""
    return [t.name for t in parse(spec)]


def weights(terms: tuple[Term, ...]) -> np.ndarray:
    return np.asarray([t.weight for t in terms], np.float64)


def clip(terms: tuple[Term, ...], scores: np.ndarray) -> np.ndarray:
    """``scores`` ``[B, K]`` (column k: term k's reward), each column clipped to its range."""
    low = np.asarray([t.low for t in terms], np.float64)
    high = np.asarray([t.high for t in terms], np.float64)
    return np.clip(np.asarray(scores, np.float64), low, high)


def combine(terms: tuple[Term, ...], clipped: np.ndarray) -> np.ndarray:
    """The mix's reward ``[B]`` from its clipped terms ``[B, K]``: the weighted sum."""
    return (np.asarray(clipped, np.float64) @ weights(terms)).astype(np.float32)
