"""Layout conversions from diffusers (torch) tensors to our parameters, and the table-driven
renamer that applies them.

A converter is a list of :class:`Rule` s: our parameter path, the diffusers tensor name(s) it
comes from, and a layout op. Each op knows the source shapes it expects for a given target
shape (so a mis-shaped tensor is named before anything is computed) and how to rearrange the
source into our layout: torch ``Linear`` ``[out, in]`` -> kernel ``[in, out]``; separate q/k/v
-> one fused ``qkv`` kernel ``[in, 3 * d]``; a conv patch embedding -> a Dense over our patch
vector order ``(py, px, c)``; Flux/Qwen-Image's packed ``(c, py, px)`` order -> ours; and
diffusers' ``AdaLayerNormContinuous`` ``(scale, shift)`` -> our ``(shift, scale)``. All ops are
exact permutations, so nothing is rounded.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from spotlight_jax.models.convert.diffusers_folder import CheckpointError

Path = tuple  # our parameter path, e.g. ("blocks", 0, "img", "qkv", "kernel")


def path_name(path: Path) -> str:
    return "/".join(str(p) for p in path)


class Op:
    """A layout op: ``source_shapes(target shape)`` and ``__call__(source arrays)``."""

    def source_shapes(self, shape) -> list[tuple[int, ...]]:
        raise NotImplementedError

    def __call__(self, arrays: list[np.ndarray]) -> np.ndarray:
        raise NotImplementedError


class Copy(Op):
    """The same array (biases, norm scales)."""

    def source_shapes(self, shape):
        return [tuple(shape)]

    def __call__(self, arrays):
        return arrays[0]


class Linear(Op):
    """torch ``Linear.weight`` ``[out, in]`` -> kernel ``[in, out]``."""

    def source_shapes(self, shape):
        return [(shape[1], shape[0])]

    def __call__(self, arrays):
        return arrays[0].T


@dataclasses.dataclass(frozen=True)
class Fused(Op):
    """``n`` torch Linear weights ``[out, in]`` (q, k, v) -> one kernel ``[in, n * out]``."""

    n: int = 3

    def source_shapes(self, shape):
        return [(shape[1] // self.n, shape[0])] * self.n

    def __call__(self, arrays):
        return np.concatenate([a.T for a in arrays], axis=1)


@dataclasses.dataclass(frozen=True)
class FusedBias(Op):
    """``n`` biases ``[out]`` -> one ``[n * out]``."""

    n: int = 3

    def source_shapes(self, shape):
        return [(shape[0] // self.n,)] * self.n

    def __call__(self, arrays):
        return np.concatenate(arrays, axis=0)


@dataclasses.dataclass(frozen=True)
class SwapHalves(Op):
    """``inner``, then the two halves of the last axis swapped: diffusers'
    ``AdaLayerNormContinuous`` emits ``(scale, shift)``, our final modulation ``(shift,
    scale)``."""

    inner: Op = Copy()

    def source_shapes(self, shape):
        return self.inner.source_shapes(shape)

    def __call__(self, arrays):
        a = self.inner(arrays)
        half = a.shape[-1] // 2
        return np.concatenate([a[..., half:], a[..., :half]], axis=-1)


@dataclasses.dataclass(frozen=True)
class ConvPatch(Op):
    """A ``p x p`` stride-``p`` conv ``[d, c, p, p]`` -> a Dense kernel ``[p * p * c, d]`` over
    our patch vector order ``(py, px, c)`` (SD3's ``pos_embed.proj``)."""

    patch: int
    channels: int

    def source_shapes(self, shape):
        return [(shape[1], self.channels, self.patch, self.patch)]

    def __call__(self, arrays):
        w = arrays[0]
        return w.transpose(2, 3, 1, 0).reshape(-1, w.shape[0])


@dataclasses.dataclass(frozen=True)
class PackedIn(Op):
    """A Linear ``[d, c * p * p]`` over packed ``(c, py, px)`` patch vectors (Flux/Qwen-Image
    ``img_in``) -> a kernel ``[p * p * c, d]`` over ours ``(py, px, c)``."""

    patch: int
    channels: int

    def source_shapes(self, shape):
        return [(shape[1], shape[0])]

    def __call__(self, arrays):
        w = arrays[0]
        p, c = self.patch, self.channels
        return w.T.reshape(c, p, p, -1).transpose(1, 2, 0, 3).reshape(p * p * c, -1)


@dataclasses.dataclass(frozen=True)
class PackedOut(Op):
    """A Linear ``[c * p * p, d]`` emitting packed ``(c, py, px)`` patch vectors (``proj_out``)
    -> a kernel ``[d, p * p * c]`` emitting ours ``(py, px, c)``."""

    patch: int
    channels: int

    def source_shapes(self, shape):
        return [(shape[1], shape[0])]

    def __call__(self, arrays):
        w = arrays[0]
        p, c = self.patch, self.channels
        return w.T.reshape(-1, c, p, p).transpose(0, 2, 3, 1).reshape(-1, p * p * c)


@dataclasses.dataclass(frozen=True)
class PackedOutBias(Op):
    """The bias ``[c * p * p]`` of :class:`PackedOut` -> ``[p * p * c]``."""

    patch: int
    channels: int

    def source_shapes(self, shape):
        return [tuple(shape)]

    def __call__(self, arrays):
        p, c = self.patch, self.channels
        return arrays[0].reshape(c, p, p).transpose(1, 2, 0).reshape(-1)


@dataclasses.dataclass(frozen=True)
class Rule:
    """Our parameter ``target`` is ``op`` of the diffusers tensors ``sources``."""

    target: Path
    sources: tuple[str, ...]
    op: Op = Copy()


def dense(target: Path, source: str | tuple[str, ...], kernel_op: Op | None = None,
          bias_op: Op | None = None) -> list[Rule]:
    """The two rules of a Dense (``kernel``, ``bias``) from torch Linear(s) named ``source``
    (a tuple fuses several, e.g. q/k/v)."""
    names = (source,) if isinstance(source, str) else tuple(source)
    n = len(names)
    kernel_op = kernel_op or (Linear() if n == 1 else Fused(n))
    bias_op = bias_op or (Copy() if n == 1 else FusedBias(n))
    return [Rule(target + ("kernel",), tuple(f"{s}.weight" for s in names), kernel_op),
            Rule(target + ("bias",), tuple(f"{s}.bias" for s in names), bias_op)]


def apply_rules(tensors: dict[str, np.ndarray], rules: list[Rule],
                targets: dict[Path, tuple[int, ...]], *, checked: tuple[str, ...] = (),
                source: str = "checkpoint", lazy: bool = False) -> dict:
    """Our parameters ``{path: array}`` from the diffusers ``tensors`` by ``rules`` (with
    ``lazy``: ``{path: function returning the array}``, every check done first).

    ``targets`` are our parameter shapes; ``checked`` names tensors the caller verifies itself
    instead of loading (SD3's stored position table). Raises :class:`CheckpointError` naming
    the first missing tensor (with an unexpected one, which is often its new name), then the
    first unexpected tensor, then the first mis-shaped one with the shape expected.
    """
    ruled = {r.target for r in rules}
    if len(ruled) != len(rules):
        raise ValueError("conversion rules name one of our parameters twice")
    uncovered = sorted(path_name(p) for p in set(targets) - ruled)
    if uncovered or ruled - set(targets):
        extra = sorted(path_name(p) for p in ruled - set(targets))
        raise ValueError(f"conversion rules do not match the model: no rule for {uncovered[:3]}, "
                         f"rules for no parameter {extra[:3]}")
    used = {name for r in rules for name in r.sources} | set(checked)
    unexpected = sorted(set(tensors) - used)
    for r in rules:
        for name in r.sources:
            if name not in tensors:
                hint = f"; it has unexpected {unexpected[0]!r}" if unexpected else ""
                raise CheckpointError(f"{source}: missing tensor {name!r} (for our "
                                      f"{path_name(r.target)}){hint}")
    if unexpected:
        raise CheckpointError(f"{source}: unexpected tensor {unexpected[0]!r} (and "
                              f"{len(unexpected) - 1} more): config.json does not describe "
                              f"these weights, or the model has a part we do not convert")
    for r in rules:
        expected = r.op.source_shapes(targets[r.target])
        for name, shape in zip(r.sources, expected):
            if tuple(tensors[name].shape) != tuple(shape):
                raise CheckpointError(f"{source}: tensor {name!r} has shape "
                                      f"{tuple(tensors[name].shape)}, expected {tuple(shape)} "
                                      f"(for our {path_name(r.target)}; config.json does not "
                                      f"match the weights)")
    out = {}
    for r in rules:
        if lazy:    # converted when called: one parameter in host memory at a time
            out[r.target] = functools.partial(_convert, r, tensors)
        else:
            out[r.target] = _convert(r, tensors)
    return out


def _convert(r: Rule, tensors: dict[str, np.ndarray]) -> np.ndarray:
    return r.op([np.asarray(tensors[name]) for name in r.sources])
