"""Editing tasks of the synthetic world: a source scene, an instruction in words, a target scene.

An edit task names a source scene the grammar already describes (a prompt spec of 1-3 objects of
distinct colors, or a two-object position scene) and one instruction of four kinds:

  recolour  "make the red square blue"              the object keeps its shape and place
  move      "put the red square below the blue bar"  the named object goes to the asked side of
                                                     the other one, which stays where it is
  add       "add a green bar"                        a new object in free space
  remove    "remove the yellow column"               the object is gone

Every object of a scene has its own color (as in the grammar), so "the red square" names one
object and the detector attributes components to objects by color alone. Moves are between
perpendicular relations ("A on the right of B" -> "put A below B"): on the 32 px canvas two
objects side by side nearly fill a row, so an object cannot cross to the opposite side of a
fixed one, and the source is drawn so that the asked relation does not already hold (the
mover's centroid is not on the asked side of the other's). The moving object is always the
first of its source scene, so no two tasks are the same edit in other words.

The task set is finite: `all_tasks` enumerates it deterministically and `train_tasks` /
`val_tasks` split every kind separately (seeded by `cfg.split_seed`) on (source prompt,
instruction) pairs, like the grammar's train/validation prompts. `render_pair` draws the source
with the renderer's own `layout` and derives the target from the same boxes (recoloured, one
dropped, one added in free space, or one moved), so untouched objects keep every pixel.
Instructions use the world's tokenizer; its four verbs ("make", "put", "add", "remove") are the
last words of its vocabulary, and it reads a move's relation in its canonical order ("put A on
the right of B" is encoded as "the B on the left of put A": the first-named object is the left
one after the edit, and "put" still marks the one that moves). `format_edit_prompt` writes a
task and a layout seed as one string ("make the red square blue | a red square and a green bar |
7") from which the registered edit reward (`rewards.edit`) re-renders the source it scores an
edited image against.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterator, Sequence

import numpy as np

from spotlight_jax.world.config import DEFAULT, PALETTE, RELATIONS, WorldConfig
from spotlight_jax.world.grammar import Group, PromptSpec, format_prompt, parse
from spotlight_jax.world.render import layout, object_mask
from spotlight_jax.world.tokenizer import DEFAULT_MAX_LEN, tokenize

EDIT_KINDS: tuple[str, ...] = ("recolour", "move", "add", "remove")
VERBS = {"recolour": "make", "move": "put", "add": "add", "remove": "remove"}
MAX_SCENE = 3  # most objects in a source or target scene
_RELATION_PHRASES = {"left": "on the left of", "right": "on the right of", "above": "above",
                     "below": "below"}
_PERPENDICULAR = {"left": ("above", "below"), "right": ("above", "below"),
                  "above": ("left", "right"), "below": ("left", "right")}
_OPPOSITE = {"left": "right", "right": "left", "above": "below", "below": "above"}
_CANDIDATES = 64  # placement candidates drawn at once
_ATTEMPTS = 2000  # source layouts tried before giving up (moves reject most of them)


Box = tuple[int, int, int, str, str]  # (y, x, side, color, shape), as `render.layout` gives


@dataclasses.dataclass(frozen=True)
class EditTask:
    """One edit: a source scene and what to do to it.

    Attributes:
      kind: one of `EDIT_KINDS`.
      source: the source scene (single or two_object kind with one object per group; a
        position scene for moves, whose first group is the object that moves).
      obj: the object the instruction names (for add: the new object).
      color: recolour: the new color.
      relation: move: where `obj` goes relative to `reference`.
      reference: move: the object that stays (the source's second group).
    """

    kind: str
    source: PromptSpec
    obj: Group
    color: str | None = None
    relation: str | None = None
    reference: Group | None = None

    @property
    def instruction(self) -> str:
        return format_instruction(self)

    @property
    def source_prompt(self) -> str:
        return format_prompt(self.source)

    @property
    def target(self) -> PromptSpec:
        """The scene after the edit (a spec the grammar describes)."""
        groups = self.source.groups
        if self.kind == "move":
            return PromptSpec("position", (self.obj, self.reference), self.relation)
        if self.kind == "recolour":
            groups = tuple(Group(1, self.color, g.shape) if g == self.obj else g for g in groups)
        elif self.kind == "add":
            groups = (*groups, self.obj)
        else:
            groups = tuple(g for g in groups if g != self.obj)
        return PromptSpec("single" if len(groups) == 1 else "two_object", groups)

    @property
    def untouched(self) -> tuple[Group, ...]:
        """The source objects the instruction does not touch (for a move: the reference)."""
        return tuple(g for g in self.source.groups if self.kind == "add" or g != self.obj)


def _name(g: Group, article: str = "the") -> str:
    if article == "a" and g.color[0] in "aeiou":
        article = "an"
    return f"{article} {g.color} {g.shape}"


def format_instruction(task: EditTask) -> str:
    """The instruction in words (inverse of the instruction half of `parse_task`)."""
    if task.kind == "recolour":
        return f"make {_name(task.obj)} {task.color}"
    if task.kind == "move":
        return f"put {_name(task.obj)} {_RELATION_PHRASES[task.relation]} {_name(task.reference)}"
    if task.kind == "add":
        return f"add {_name(task.obj, 'a')}"
    if task.kind == "remove":
        return f"remove {_name(task.obj)}"
    raise ValueError(f'unknown edit kind "{task.kind}"; known kinds: {", ".join(EDIT_KINDS)}')


# ---------------------------------------------------------------- parsing


def parse_task(source: str | PromptSpec, instruction: str, cfg: WorldConfig = DEFAULT) -> EditTask:
    """The `EditTask` of a source scene and an instruction; ValueError naming what is wrong.

    A move whose source names the moving object second ("a blue bar on the left of a red square",
    "put the red square above the blue bar") is rewritten with the mover first, the form the
    enumeration uses.
    """
    return _parse_task_cached(source if isinstance(source, str) else format_prompt(source),
                              instruction, cfg)


@functools.lru_cache(maxsize=8192)
def _parse_task_cached(source: str, instruction: str, cfg: WorldConfig) -> EditTask:
    spec = parse(source, cfg)

    def fail(msg: str):
        raise ValueError(f"{msg} (instruction {instruction!r}, source {source!r})")

    if not isinstance(instruction, str):
        fail(f"instruction must be a str, got {type(instruction).__name__}")
    words = instruction.strip().lower().split()
    verbs = {v: k for k, v in VERBS.items()}
    if not words or words[0] not in verbs:
        fail(f'an instruction starts with one of: {", ".join(verbs)}')
    kind = verbs[words[0]]

    def obj(ws: list[str], article: str = "the") -> Group:
        articles = ("a", "an") if article == "a" else ("the",)
        if len(ws) != 3 or ws[0] not in articles:
            fail(f'expected "{article} <color> <shape>", got {" ".join(ws)!r}')
        if ws[1] not in cfg.colors:
            fail(f'unknown color "{ws[1]}"; known colors: {", ".join(cfg.colors)}')
        if ws[2] not in cfg.shapes:
            fail(f'unknown shape "{ws[2]}"; known shapes: {", ".join(cfg.shapes)}')
        return Group(1, ws[1], ws[2])

    if kind == "move":
        if spec.kind != "position":
            fail("a move needs a position scene as its source")
        rel = None
        for r, phrase in _RELATION_PHRASES.items():
            ph = phrase.split()
            for i in range(len(words) - len(ph) + 1):
                if words[i : i + len(ph)] == ph and i == 4:
                    rel, a, b = r, obj(words[1:4]), obj(words[4 + len(ph) :])
        if rel is None:
            fail('expected "put the <color> <shape> <relation> the <color> <shape>" with a '
                 f'relation of: {", ".join(_RELATION_PHRASES.values())}')
        (g0, g1), r0 = spec.groups, spec.relation
        if (a, b) == (g1, g0):
            (g0, g1), r0 = (g1, g0), _OPPOSITE[r0]
        if (a, b) != (g0, g1):
            fail(f"the source shows {_name(g0, 'a')} and {_name(g1, 'a')}")
        if rel not in _PERPENDICULAR[r0]:
            fail(f'the source relation is "{r0}"; a move asks one of '
                 f'{", ".join(_PERPENDICULAR[r0])}')
        return EditTask("move", PromptSpec("position", (a, b), r0), a, relation=rel,
                        reference=b)

    if spec.kind not in ("single", "two_object") or any(g.count != 1 for g in spec.groups):
        fail(f"a {kind} needs a source of single objects joined by 'and'")
    colors = [g.color for g in spec.groups]
    if kind == "add":
        new = obj(words[1:], "a")
        if new.color in colors:
            fail(f'the source already has a {new.color} object; each object has its own color')
        if len(colors) + 1 > min(MAX_SCENE, cfg.max_objects):
            fail(f"a scene holds at most {min(MAX_SCENE, cfg.max_objects)} objects")
        return EditTask("add", spec, new)
    named = obj(words[1:4])
    if named not in spec.groups:
        fail(f"the source has no {named.color} {named.shape}")
    if kind == "remove":
        if len(words) != 4:
            fail('expected "remove the <color> <shape>"')
        if len(colors) < 2:
            fail("removing the only object leaves no scene")
        return EditTask("remove", spec, named)
    if len(words) != 5:
        fail('expected "make the <color> <shape> <color>"')
    new_color = words[4]
    if new_color not in cfg.colors:
        fail(f'unknown color "{new_color}"; known colors: {", ".join(cfg.colors)}')
    if new_color in colors:
        fail(f'the source already has a {new_color} object; each object has its own color')
    return EditTask("recolour", spec, named, color=new_color)


# ---------------------------------------------------------------- enumeration and split


def _scenes(cfg: WorldConfig, n: int) -> list[PromptSpec]:
    kind = "single" if n == 1 else "two_object"
    return [PromptSpec(kind, tuple(Group(1, c, s) for c, s in zip(cs, ss)))
            for cs in itertools.combinations(cfg.colors, n)
            for ss in itertools.product(cfg.shapes, repeat=n)]


@functools.lru_cache(maxsize=16)
def _enumerate(cfg: WorldConfig) -> dict[str, tuple[EditTask, ...]]:
    most = min(MAX_SCENE, cfg.max_objects, len(cfg.colors))
    out: dict[str, list[EditTask]] = {k: [] for k in EDIT_KINDS}
    for n in range(1, most + 1):
        for spec in _scenes(cfg, n):
            used = {g.color for g in spec.groups}
            free = [c for c in cfg.colors if c not in used]
            for g in spec.groups:
                out["recolour"] += [EditTask("recolour", spec, g, color=c) for c in free]
            if n < most:
                out["add"] += [EditTask("add", spec, Group(1, c, s)) for c in free
                               for s in cfg.shapes]
            if n >= 2:
                out["remove"] += [EditTask("remove", spec, g) for g in spec.groups]
    objs = [Group(1, c, s) for c in cfg.colors for s in cfg.shapes]
    for a, b in itertools.product(objs, objs):
        if a.color == b.color:
            continue
        for rel in RELATIONS:
            for r0 in _PERPENDICULAR[rel]:
                out["move"].append(EditTask("move", PromptSpec("position", (a, b), r0), a,
                                            relation=rel, reference=b))
    return {k: tuple(v) for k, v in out.items()}


def _key(task: EditTask) -> tuple[str, str]:
    return task.source_prompt, task.instruction


@functools.lru_cache(maxsize=16)
def _split(cfg: WorldConfig) -> tuple[dict[str, tuple[EditTask, ...]], dict]:
    rng = np.random.default_rng([cfg.split_seed, 11])
    train, val = {}, {}
    for kind, tasks in _enumerate(cfg).items():
        n_val = int(round(cfg.val_fraction * len(tasks)))
        n_val = min(max(n_val, 1), len(tasks) - 1) if len(tasks) > 1 else 0
        held = set(rng.permutation(len(tasks))[:n_val].tolist())
        train[kind] = tuple(t for i, t in enumerate(tasks) if i not in held)
        val[kind] = tuple(t for i, t in enumerate(tasks) if i in held)
    return train, val


def all_tasks(cfg: WorldConfig = DEFAULT) -> list[EditTask]:
    """Every edit task of the world, in a fixed order (grouped by kind, in `EDIT_KINDS` order)."""
    return [t for ts in _enumerate(cfg).values() for t in ts]


def tasks_by_kind(cfg: WorldConfig = DEFAULT, split: str = "all") -> dict[str, list[EditTask]]:
    """{kind: tasks} for split "train", "val" or "all"."""
    if split == "all":
        return {k: list(v) for k, v in _enumerate(cfg).items()}
    if split not in ("train", "val"):
        raise ValueError(f'unknown split "{split}"; expected "train", "val" or "all"')
    return {k: list(v) for k, v in _split(cfg)[split == "val"].items()}


def train_tasks(cfg: WorldConfig = DEFAULT) -> list[EditTask]:
    """Training tasks: every kind minus its held-out share (fixed by cfg.split_seed)."""
    return [t for ts in _split(cfg)[0].values() for t in ts]


def val_tasks(cfg: WorldConfig = DEFAULT) -> list[EditTask]:
    """Held-out tasks: no (source prompt, instruction) pair of `train_tasks`; every kind."""
    return [t for ts in _split(cfg)[1].values() for t in ts]


# ---------------------------------------------------------------- layouts and rendering


def centroid(box: Box, cfg: WorldConfig = DEFAULT) -> tuple[float, float]:
    """(cy, cx) of a box's painted pixels, in the detector's convention (pixel centers)."""
    y, x, s, _, shape = box
    yy, xx = np.nonzero(object_mask(shape, s, cfg.bar_thickness))
    return y + yy.mean() + 0.5, x + xx.mean() + 0.5


def relation_offset(a: tuple[float, float], b: tuple[float, float], relation: str) -> float:
    """How far centroid `a` lies on the `relation` side of centroid `b` (negative: other side);
    y grows downwards, as in `rewards.geneval`."""
    (ay, ax), (by, bx) = a, b
    return {"left": bx - ax, "right": ax - bx, "above": by - ay, "below": ay - by}[relation]


def _free_spot(s: int, boxes: Sequence[Box], rng: np.random.Generator, cfg: WorldConfig,
               relation: str | None = None, ref: Box | None = None) -> tuple[int, int] | None:
    """(y, x) of an s-px box keeping `cfg.object_gap` from every box (and, with `relation`,
    entirely on that side of `ref`, as the renderer places a position prompt), or None."""
    S, m, gap = cfg.image_size, cfg.edge_margin, cfg.object_gap
    y = rng.integers(m, S - m - s + 1, size=_CANDIDATES)
    x = rng.integers(m, S - m - s + 1, size=_CANDIDATES)
    ok = np.ones(_CANDIDATES, bool)
    for by, bx, bs, *_ in boxes:
        ok &= (x + s + gap <= bx) | (bx + bs + gap <= x) | (y + s + gap <= by) | (by + bs + gap
                                                                                  <= y)
    if relation is not None:
        ry, rx, rs, *_ = ref
        ok &= {"left": x + s + gap <= rx, "right": rx + rs + gap <= x,
               "above": y + s + gap <= ry, "below": ry + rs + gap <= y}[relation]
    idx = np.flatnonzero(ok)
    return None if idx.size == 0 else (int(y[idx[0]]), int(x[idx[0]]))


def _target_boxes(task: EditTask, src: list[Box], rng: np.random.Generator,
                  cfg: WorldConfig) -> list[Box] | None:
    if task.kind == "recolour":
        return [(y, x, s, task.color if c == task.obj.color else c, sh) for y, x, s, c, sh in src]
    if task.kind == "remove":
        return [b for b in src if b[3] != task.obj.color]
    if task.kind == "add":
        lo, hi = cfg.size_range
        s = int(rng.integers(lo, hi + 1))
        spot = _free_spot(s, src, rng, cfg)
        return None if spot is None else [*src, (*spot, s, task.obj.color, task.obj.shape)]
    a, b = src
    if relation_offset(centroid(a, cfg), centroid(b, cfg), task.relation) > 0:
        return None  # the asked relation already (partly) holds in the source
    spot = _free_spot(a[2], [b], rng, cfg, task.relation, b)
    return None if spot is None else [(*spot, *a[2:]), b]


def pair_layouts(task: EditTask, rng: np.random.Generator | int,
                 cfg: WorldConfig = DEFAULT) -> tuple[list[Box], list[Box]]:
    """(source boxes, target boxes), each a list of (y, x, side, color, shape).

    The source is the renderer's `layout` of `task.source`; the target keeps every untouched box.
    A source whose target cannot be placed (no free spot for an added object, no room on the
    asked side for a moved one, or a move whose relation already holds) is redrawn.
    """
    rng = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
    for _ in range(_ATTEMPTS):
        src = layout(task.source, rng, cfg)
        tgt = _target_boxes(task, src, rng, cfg)
        if tgt is not None:
            return src, tgt
    raise ValueError(f"could not lay out the edit {task.instruction!r} of "
                     f"{task.source_prompt!r} in {_ATTEMPTS} attempts")


def paint(boxes: Sequence[Box], cfg: WorldConfig = DEFAULT) -> np.ndarray:
    """float32 [H, W, 3] in [0, 1]: the boxes painted as the renderer paints them."""
    img = np.empty((cfg.image_size, cfg.image_size, 3), np.float32)
    img[:] = cfg.background
    for y, x, s, color, shape in boxes:
        img[y : y + s, x : x + s][object_mask(shape, s, cfg.bar_thickness)] = PALETTE[color]
    return img


def render_pair(task: EditTask, rng: np.random.Generator | int,
                cfg: WorldConfig = DEFAULT) -> tuple[np.ndarray, np.ndarray]:
    """(source, target), each float32 [H, W, 3] in [0, 1] like `render.render`; deterministic
    given an int seed (or the generator's state)."""
    src, tgt = pair_layouts(task, rng, cfg)
    return paint(src, cfg), paint(tgt, cfg)


def render_pairs(tasks: Sequence[EditTask], seeds: Sequence[int],
                 cfg: WorldConfig = DEFAULT) -> tuple[np.ndarray, np.ndarray]:
    """(sources, targets), each float32 [B, H, W, 3]: `render_pair` of each task at its seed."""
    if len(tasks) != len(seeds):
        raise ValueError(f"{len(tasks)} tasks but {len(seeds)} seeds")
    pairs = [render_pair(t, int(s), cfg) for t, s in zip(tasks, seeds)]
    S = cfg.image_size
    if not pairs:
        return np.zeros((0, S, S, 3), np.float32), np.zeros((0, S, S, 3), np.float32)
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


# ---------------------------------------------------------------- words


def tokenize_instructions(tasks: Sequence[EditTask | str],
                          max_len: int = DEFAULT_MAX_LEN) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [B, max_len], mask bool [B, max_len]): the instructions through the world's
    tokenizer (`tokenizer.tokenize`, relations read in its canonical order)."""
    if isinstance(tasks, (str, EditTask)):
        raise ValueError("tokenize_instructions expects a list of tasks or instructions")
    return tokenize([t if isinstance(t, str) else t.instruction for t in tasks], max_len)


_SEP = " | "


def format_edit_prompt(task: EditTask, seed: int) -> str:
    """One string naming a task and its layout seed: "<instruction> | <source prompt> | <seed>",
    the prompt a registered edit reward reads (`parse_edit_prompt`)."""
    return _SEP.join((task.instruction, task.source_prompt, str(int(seed))))


def parse_edit_prompt(prompt: str, cfg: WorldConfig = DEFAULT) -> tuple[EditTask, int]:
    """(task, seed) of a `format_edit_prompt` string; ValueError on anything else."""
    parts = prompt.split("|") if isinstance(prompt, str) else []
    if len(parts) != 3 or not parts[2].strip().isdigit():
        raise ValueError(f"edit prompt {prompt!r}: expected '<instruction> | <source prompt> | "
                         "<seed>', e.g. 'make the red square blue | a red square | 0'")
    return parse_task(parts[1].strip(), parts[0].strip(), cfg), int(parts[2])


# ---------------------------------------------------------------- prompts and pretraining data

def edit_prompts(tasks: Sequence[EditTask]) -> list[str]:
    """The prompt pool of ``tasks``: each task once, its layout seed its index (a fixed source
    scene per task, so a prompt always shows the same image to edit)."""
    return [format_edit_prompt(t, i) for i, t in enumerate(tasks)]


def edit_stream(tasks: Sequence[EditTask], batch_size: int, seed: int,
                cfg: WorldConfig = DEFAULT) -> Iterator[tuple[list[str], np.ndarray]]:
    """Endless pretraining stream of (edit prompts [B], target images float32 [B, H, W, 3]):
    each example draws a kind uniformly, then a task of that kind and a fresh layout seed, so
    pretraining sees many layouts of each task (the prompt names the seed: its source image is
    re-rendered from it). Deterministic given ``seed``."""
    tasks = list(tasks)
    if not tasks:
        raise ValueError("edit_stream needs at least one task")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    by_kind = [np.array([i for i, t in enumerate(tasks) if t.kind == k]) for k in EDIT_KINDS]
    by_kind = [ix for ix in by_kind if ix.size]
    rng = np.random.default_rng(seed)
    while True:
        kinds = rng.integers(len(by_kind), size=batch_size)
        picked = [tasks[int(by_kind[k][rng.integers(by_kind[k].size)])] for k in kinds]
        seeds = rng.integers(1 << 30, size=batch_size)
        _, targets = render_pairs(picked, seeds, cfg)
        yield [format_edit_prompt(t, s) for t, s in zip(picked, seeds)], targets
