"""Reward registry: `resolve(name)` turns a reward name, or a weighted mix of names, into the one
:class:`Reward` a run and every caller use; `register(name, fn)` adds a reward.

Contract (docs/design.md, Rewards): a reward is a callable
`(images: float32 [B, H, W, 3] in [0, 1] (numpy or jax), prompts: list[str]) -> np.float32 [B]`.
Rewards are host-side numpy so they can run while the accelerator samples the next batch.
Every registered function is wrapped so that its output is checked (shape [B], finite) and
converted to np.float32: a reward bug then fails loudly at the call instead of turning into a
silent NaN advantage several layers down (`get(name)` is that checked function alone, for a
caller that needs no terms or parts). A reward that is the mean of parts can register them
(`register(name, fn, components=parts_fn)`); the resolved reward's `parts` returns them as
`[B, K]` (NaN where a part does not apply) for GRPO's decoupled advantages.

Clips: a reward registered for clips (`register(..., video=True)`) takes `[B, F, H, W, 3]`. An
image reward given clips scores every frame with the clip's prompt and returns the frames'
mean (a learned preference reward on a video run: `rl.reward='video_motion:1.0,aesthetic:0.1'`);
a clip reward given images is an error.

Wherever a reward name is taken, a weighted mix of registered rewards is too
(``'geneval_lite:1.0,jpeg_compressibility:0.5'``, `rewards.mix`). A run resolves each name
once, `resolve(name)`, into one :class:`Reward` that every caller receives: its checked
function (the weighted sum of a mix's clipped terms), the terms themselves (logged per iteration
and evaluation), and the components and weights the decoupled advantages take.

Shipped (see each module for the exact definitions):
  geneval_lite          fraction of the prompt's constraints met (color, count, shape, position,
                        text), graded, read by the world's detector  (`rewards.geneval`)
  geneval_lite_shaped   geneval_lite with partial credit per glyph on text prompts: a training
                        reward with the same exact successes (`rewards.ocr.graded_ocr_score`)
  geneval_lite_aspect   geneval_lite whose shape credit also slopes toward the asked elongation:
                        a training reward with the same exact successes
                        (`rewards.geneval.aspect_credit`)
  ocr_lite              max(1 - edit_distance(read, target) / len(target), 0)  (`rewards.ocr`)
  jpeg_compressibility  -(JPEG bytes at quality 95) / 1000 / 500  (`rewards.jpeg`)
  edit_lite             editing world (`world.edit`): instruction applied x the rest of the source
                        kept, read by the world's detector from an edit prompt
                        ("<instruction> | <source prompt> | <seed>")  (`rewards.edit`)
  video_motion          video world (clips [B, F, H, W, 3]): mean of count, shape, motion and
                        persistence of the asked objects  (`rewards.motion`)
  video_motion_exact    their product: 1 only for a clip that meets every part
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from spotlight_jax.rewards import mix
from spotlight_jax.rewards.edit import edit_breakdown, edit_lite, edit_reward, make_edit_lite
from spotlight_jax.rewards.geneval import (
    aspect_breakdown,
    constraint_breakdown,
    geneval_lite,
    geneval_lite_aspect,
    geneval_lite_shaped,
    make_geneval_lite,
    missing_credit,
    shape_binding,
    shaped_breakdown,
)
from spotlight_jax.rewards.jpeg import jpeg_compressibility
from spotlight_jax.rewards.motion import video_motion, video_motion_exact, video_motion_parts
from spotlight_jax.rewards.ocr import (
    edit_distance,
    graded_ocr_score,
    make_ocr_lite,
    ocr_lite,
    ocr_score,
)

RewardFn = Callable[[np.ndarray, Sequence[str]], np.ndarray]

_REGISTRY: dict[str, RewardFn] = {}
# A reward's parts, for rewards that are the mean of several (GRPO's decoupled advantages):
# `(images, prompts) -> {part: float32 [B]}`, NaN where a part does not apply to a prompt.
_COMPONENTS: dict[str, Callable] = {}
_VIDEO: set[str] = set()          # the rewards registered for clips [B, F, H, W, 3]
IMAGE_WORLD_REWARDS = ("geneval_lite", "geneval_lite_shaped", "geneval_lite_aspect", "ocr_lite",
                       "edit_lite")
"""The rewards that read the image world's prompts (counts, positions, text): no reward of a
video prompt's frames."""


def register(name: str, fn: RewardFn, *, overwrite: bool = False,
             components: Callable | None = None, video: bool = False) -> None:
    """Register `fn` under `name`; a taken name raises ValueError unless `overwrite=True`.

    `components`, if given, returns the parts `fn` averages (`{part: [B]}`, NaN where a part
    does not apply); a resolved :class:`Reward` hands it out as ``parts``. ``video``: `fn`
    scores clips ``[B, F, H, W, 3]`` (otherwise images; given clips, it scores each frame)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"reward name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise ValueError(f"reward {name!r} must be callable, got {type(fn).__name__}")
    if name in _REGISTRY and not overwrite:
        raise ValueError(
            f"reward {name!r} is already registered; pass overwrite=True to replace it"
        )
    if components is not None and not callable(components):
        raise ValueError(f"components of reward {name!r} must be callable")
    _REGISTRY[name] = fn
    _COMPONENTS.pop(name, None)
    _VIDEO.discard(name)
    if components is not None:
        _COMPONENTS[name] = components
    if video:
        _VIDEO.add(name)


def unregister(name: str) -> None:
    """Remove a registered reward (ValueError if it is not registered)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown reward {name!r}; registered rewards: {', '.join(names())}")
    del _REGISTRY[name]
    _COMPONENTS.pop(name, None)
    _VIDEO.discard(name)


def names() -> list[str]:
    """Registered reward names, sorted."""
    return sorted(_REGISTRY)


def is_video_reward(name: str) -> bool:
    """Whether the registered reward ``name`` scores clips (not images)."""
    return name in _VIDEO


def frame_mean(fn: RewardFn, clips, prompts: Sequence[str]) -> np.ndarray:
    """The image reward ``fn`` of every frame of ``clips`` ``[B, F, H, W, 3]`` (each frame with
    its clip's prompt), averaged over the frames: ``float32 [B]``."""
    b, f = np.shape(clips)[:2]
    frames = np.reshape(np.asarray(clips), (b * f, *np.shape(clips)[2:]))
    r = np.asarray(fn(frames, [p for p in prompts for _ in range(f)]), np.float32)
    if r.shape != (b * f,):
        raise ValueError(f"returned shape {r.shape} for {b * f} frames, expected ({b * f},)")
    return r.reshape(b, f).mean(axis=1)


def _unknown(name: str) -> ValueError:
    return ValueError(f"unknown reward {name!r}; registered rewards: {', '.join(names())}")


def _mix_terms(spec: str) -> tuple[mix.Term, ...]:
    """The terms of a mix spec, every name registered (ValueError otherwise)."""
    terms = mix.parse(spec)
    for t in terms:
        if t.name not in _REGISTRY:
            raise ValueError(f"reward mix {spec!r}: {_unknown(t.name)}")
    return terms


def _checked(name: str, fn: Callable) -> RewardFn:
    """``fn`` wrapped to check its prompts and its output (shape [B], finite) and convert it."""
    def reward(images, prompts: Sequence[str]) -> np.ndarray:
        if isinstance(prompts, str):
            raise ValueError(f"reward {name!r} expects a list of prompts, got a single str")
        n = len(prompts)
        if np.shape(images)[0] != n:
            raise ValueError(f"reward {name!r}: {np.shape(images)[0]} images but {n} prompts")
        video, clips = name in _VIDEO, np.ndim(images) == 5
        if video and not clips:
            raise ValueError(f"reward {name!r} scores clips [B, F, H, W, 3], got "
                             f"{np.shape(images)}")
        if clips and not video:        # an image reward of a clip: its frames' mean
            try:
                r = frame_mean(fn, images, list(prompts))
            except ValueError as e:
                raise ValueError(f"reward {name!r} per frame: {e}") from None
        else:
            r = np.asarray(fn(images, list(prompts)), dtype=np.float32)
        if r.shape != (n,):
            raise ValueError(f"reward {name!r} returned shape {r.shape}, expected ({n},)")
        if not np.isfinite(r).all():
            raise ValueError(f"reward {name!r} returned non-finite values: {r}")
        return r

    reward.__name__ = name
    reward.__doc__ = fn.__doc__
    reward.__wrapped__ = fn
    return reward


@dataclasses.dataclass(frozen=True, eq=False)
class Reward:
    """A reward name (or mix spec) resolved once, with everything its callers ask of it.

    ``fn``: the checked reward ``(images, prompts) -> float32 [B]`` (also the object's own
    call). ``scored``: ``(images, prompts) -> (reward [B], {term: [B]})``, the reward and the
    clipped, unweighted terms it sums in one evaluation (a plain name: one term, itself).
    ``terms``: the mix's terms (one unweighted term for a plain name). ``parts``: the reward's
    components ``(images, prompts) -> float32 [B, K]`` for decoupled advantages (a mix's clipped
    terms; a mean of parts' parts, NaN where one does not apply), or None. ``weights``: the
    parts' weights (a mix's term weights; None = equal)."""

    name: str
    terms: tuple[mix.Term, ...]
    fn: RewardFn
    scored: Callable
    parts: Callable | None
    weights: np.ndarray | None

    @property
    def is_mix(self) -> bool:
        return mix.is_mix(self.name)

    @property
    def term_names(self) -> list[str]:
        return [t.name for t in self.terms]

    def __call__(self, images, prompts: Sequence[str]) -> np.ndarray:
        return self.fn(images, prompts)

    def components(self) -> Callable:
        """:attr:`parts`, or a ValueError naming the rewards that have them."""
        if self.parts is None:
            with_parts = ", ".join(sorted(_COMPONENTS)) or "none"
            raise ValueError(f"reward {self.name!r} has no components (rewards with components: "
                             f"{with_parts}); use rl.advantage='reward' with it")
        return self.parts


def resolve(name: str) -> Reward:
    """The reward registered as ``name``, or the weighted mix ``name`` spells, resolved into a
    :class:`Reward`; ValueError for an unknown name or a malformed mix."""
    if mix.is_mix(name):
        terms = _mix_terms(name)
        fns = [_checked(t.name, _REGISTRY[t.name]) for t in terms]

        def scored(images, prompts):
            # each term is a checked reward (shape [B], finite), so their weighted sum is too
            clipped = mix.clip(terms, np.stack([f(images, prompts) for f in fns], axis=1))
            return (mix.combine(terms, clipped),
                    {t.name: clipped[:, k].astype(np.float32) for k, t in enumerate(terms)})

        total = lambda images, prompts: scored(images, prompts)[0]  # noqa: E731
        total.__doc__ = f"Weighted reward mix {name!r} (rewards.mix)."
        parts = lambda images, prompts: np.stack(  # noqa: E731
            list(scored(images, prompts)[1].values()), 1)
        return Reward(name, terms, _checked(name, total), scored, parts, mix.weights(terms))
    if name not in _REGISTRY:
        raise _unknown(name)
    fn = _checked(name, _REGISTRY[name])
    return Reward(name, (mix.Term(name),), fn,
                  lambda images, prompts: (r := fn(images, prompts), {name: r}),
                  _parts_of(name), None)


def _parts_of(name: str) -> Callable | None:
    """The registered components of ``name`` as ``[B, K]`` columns, or None."""
    if name not in _COMPONENTS:
        return None
    parts_fn = _COMPONENTS[name]

    def parts(images, prompts: Sequence[str]) -> np.ndarray:
        got = parts_fn(images, list(prompts))
        return np.stack([np.asarray(v, np.float32) for v in got.values()], axis=1)

    return parts


def get(name: str) -> RewardFn:
    """The checked reward function of ``name`` (:func:`resolve`'s ``fn``)."""
    return resolve(name).fn


register("geneval_lite", geneval_lite, components=constraint_breakdown)
register("geneval_lite_shaped", geneval_lite_shaped, components=shaped_breakdown)
register("geneval_lite_aspect", geneval_lite_aspect, components=aspect_breakdown)
register("ocr_lite", ocr_lite)
register("edit_lite", edit_lite)
register("jpeg_compressibility", jpeg_compressibility)
register("video_motion", video_motion, components=video_motion_parts, video=True)
register("video_motion_exact", video_motion_exact, video=True)

__all__ = [
    "IMAGE_WORLD_REWARDS",
    "RewardFn",
    "frame_mean",
    "is_video_reward",
    "constraint_breakdown",
    "missing_credit",
    "edit_breakdown",
    "edit_distance",
    "edit_lite",
    "edit_reward",
    "geneval_lite",
    "geneval_lite_aspect",
    "geneval_lite_shaped",
    "graded_ocr_score",
    "Reward",
    "get",
    "mix",
    "jpeg_compressibility",
    "make_edit_lite",
    "make_geneval_lite",
    "make_ocr_lite",
    "names",
    "ocr_lite",
    "ocr_score",
    "register",
    "resolve",
    "shape_binding",
    "unregister",
]
