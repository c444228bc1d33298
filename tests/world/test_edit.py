"""The editing world: the task generator and its split, (source, target) pairs that the detector
reads as the instruction says, the instructions' tokens, and the edit reward: 1 for the target,
0 for the unedited source, less for a target that also damaged a neighbour, graded in between."""
import numpy as np
import pytest

from spotlight_jax import rewards as R
from spotlight_jax import world as W
from spotlight_jax.rewards.edit import edit_breakdown, edit_reward
from spotlight_jax.world import edit as E

KIND_SIZES = {"recolour": 576, "move": 864, "add": 432, "remove": 432}


def key(t):
    return t.source_prompt, t.instruction


@pytest.fixture(scope="module")
def pairs():
    """About 40 tasks of each kind from both splits, each rendered at its own seed."""
    tasks = [t for ts in E.tasks_by_kind().values() for t in ts[:: max(1, len(ts) // 40)]]
    seeds = list(range(len(tasks)))
    src, tgt = E.render_pairs(tasks, seeds)
    return tasks, seeds, src, tgt


def readings(image):
    """{color: (shape, cy, cx)} of one image; each color found once."""
    d = W.detect(image[None])
    out = {}
    for k in range(len(d)):
        color = W.DEFAULT.class_names[d.cls[k]]
        assert color not in out, f"{color} found twice"
        out[color] = (W.DEFAULT.shapes[d.shape[k]], float(d.cy[k]), float(d.cx[k]))
    return out


# ---------------------------------------------------------------- generator and split
def test_generator_is_deterministic_and_the_splits_are_disjoint():
    every = E.all_tasks()
    assert every == E.all_tasks() and len({key(t) for t in every}) == len(every)
    assert {k: len(v) for k, v in E.tasks_by_kind().items()} == KIND_SIZES
    train, val = E.train_tasks(), E.val_tasks()
    assert not {key(t) for t in train} & {key(t) for t in val}
    assert sorted(map(key, train + val)) == sorted(map(key, every))
    n_val = {k: len(v) for k, v in E.tasks_by_kind(split="val").items()}
    for kind in E.EDIT_KINDS:
        assert E.tasks_by_kind(split="train")[kind], kind
        assert abs(n_val[kind] / KIND_SIZES[kind] - 0.15) < 0.02, (kind, n_val[kind])
    assert E.val_tasks(W.WorldConfig()) == val
    assert E.val_tasks(W.WorldConfig(split_seed=1)) != val
    with pytest.raises(ValueError, match="unknown split"):
        E.tasks_by_kind(split="test")


def test_tasks_round_trip_and_their_scenes_are_grammar_prompts():
    for t in E.all_tasks():
        assert E.parse_task(t.source_prompt, t.instruction) == t
        for spec in (t.source, t.target):
            assert W.parse(W.format_prompt(spec)) == spec
        assert E.parse_edit_prompt(E.format_edit_prompt(t, 17)) == (t, 17)
    t = E.parse_task("a red square and a green bar", "make the red square blue")
    assert (t.kind, t.color, W.format_prompt(t.target)) == (
        "recolour", "blue", "a blue square and a green bar")
    # a move written with the mover second is read with the mover first
    m = E.parse_task("a blue bar on the left of a red square", "put the red square above the "
                     "blue bar")
    assert m.source_prompt == "a red square on the right of a blue bar"
    assert W.format_prompt(m.target) == "a red square above a blue bar"


@pytest.mark.parametrize("source, instruction, fragment", [
    ("a red square", "paint the red square blue", "starts with one of"),
    ("a red square", "make the red square red", "already has a red"),
    ("a red square", "make the red bar blue", "no red bar"),
    ("a red square", "make the red square purple", 'unknown color "purple"'),
    ("a red square", "remove the red square", "only object"),
    ("a red square", "add a red bar", "already has a red"),
    ("a red square and a green bar and a blue column", "add a yellow bar", "at most 3"),
    ("a red square and a green bar", "put the red square above the green bar",
     "position scene"),
    ("a red square on the left of a green bar", "put the red square on the right of the "
     "green bar", 'relation is "left"'),
    ("a red square on the left of a green bar", "put the red square near the green bar",
     "relation of"),
    ("two red squares", "remove the red square", "single objects"),
])
def test_parse_task_errors_are_clear(source, instruction, fragment):
    with pytest.raises(ValueError, match=fragment):
        E.parse_task(source, instruction)


def test_instructions_tokenize_within_the_worlds_max_length():
    tasks = E.all_tasks()
    ids, mask = E.tokenize_instructions(tasks)
    assert ids.shape == (len(tasks), W.DEFAULT_MAX_LEN) and mask.sum(1).max() <= 11
    by_instruction = {}
    for t, row in zip(tasks, ids):
        by_instruction.setdefault(t.instruction, row.tobytes())
        assert by_instruction[t.instruction] == row.tobytes()
    assert len(set(by_instruction.values())) == len(by_instruction)  # no two read the same
    # the verbs are the vocabulary's last words; no earlier word moved
    assert W.VOCAB[-4:] == ("make", "put", "add", "remove") and W.VOCAB.index("still") == 49
    assert W.VOCAB_SIZE == 54


# ---------------------------------------------------------------- rendering
def test_pairs_are_deterministic_and_in_the_renderers_format(pairs):
    tasks, seeds, src, tgt = pairs
    assert src.shape == tgt.shape == (len(tasks), 32, 32, 3) and src.dtype == np.float32
    palette = {tuple(v) for v in W.DEFAULT.class_rgb.tolist()}
    assert {tuple(v) for v in np.concatenate([src, tgt]).reshape(-1, 3).tolist()} <= palette
    a, b = E.render_pair(tasks[5], 123), E.render_pair(tasks[5], 123)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], E.render_pair(tasks[5], 124)[0])
    # the sources and targets are images of their scenes' prompts
    for images, specs in ((src, [t.source for t in tasks]), (tgt, [t.target for t in tasks])):
        bd = R.constraint_breakdown(images, [W.format_prompt(s) for s in specs], exact=True)
        for k, v in bd.items():
            assert np.nanmin(v, initial=1.0) == 1.0, k


def test_the_detector_reads_each_pair_as_the_instruction_says(pairs):
    tasks, _, src, tgt = pairs
    margin = W.DEFAULT.position_margin * 32
    for t, s_img, t_img in zip(tasks, src, tgt):
        s, g = readings(s_img), readings(t_img)
        o = t.obj
        if t.kind == "recolour":
            assert s[o.color][0] == o.shape and t.color not in s
            assert g == {**{c: v for c, v in s.items() if c != o.color}, t.color: s[o.color]}
        elif t.kind == "remove":
            assert g == {c: v for c, v in s.items() if c != o.color} and o.color in s
        elif t.kind == "add":
            assert o.color not in s and g[o.color][0] == o.shape
            assert {c: v for c, v in g.items() if c != o.color} == s
        else:
            ref = t.reference.color
            assert g[ref] == s[ref] and g[o.color][0] == s[o.color][0] == o.shape
            assert E.relation_offset(s[o.color][1:], s[ref][1:], t.relation) <= 0
            assert E.relation_offset(g[o.color][1:], g[ref][1:], t.relation) >= margin


# ---------------------------------------------------------------- the edit reward
def test_reward_is_one_for_the_target_and_zero_for_the_unedited_source(pairs):
    tasks, seeds, src, tgt = pairs
    for kind in E.EDIT_KINDS:
        i = [j for j, t in enumerate(tasks) if t.kind == kind]
        sub = [tasks[j] for j in i]
        done, undone = edit_reward(tgt[i], src[i], sub), edit_reward(src[i], src[i], sub)
        assert done.dtype == np.float32 and done.shape == (len(i),)
        assert done.min() >= 0.99, (kind, done.min())
        assert undone.max() <= 0.05, (kind, undone.max())
    # the registered reward reads the task and the seed from the prompt and renders the source
    assert "edit_lite" in R.names() and "edit_lite" in R.IMAGE_WORLD_REWARDS
    prompts = [E.format_edit_prompt(t, s) for t, s in zip(tasks, seeds)]
    reward = R.get("edit_lite")
    np.testing.assert_allclose(reward(tgt, prompts), edit_reward(tgt, src, tasks))
    assert reward(src, prompts).max() <= 0.05
    with pytest.raises(ValueError, match="expected '<instruction> | <source prompt> | <seed>'"):
        reward(tgt[:1], ["a red square"])


def _paint_over(image, color, new):
    """`image` with every pixel of palette `color` painted `new` (an RGB or the background)."""
    out = image.copy()
    out[(out == W.PALETTE[color]).all(-1)] = new
    return out


def test_collateral_damage_costs_reward(pairs):
    tasks, _, src, tgt = pairs
    scored = 0
    for t, s_img, t_img in zip(tasks, src, tgt):
        if not t.untouched:
            continue
        u = t.untouched[0]
        used = {g.color for g in t.target.groups}  # at most 3 of the 4: one is free
        other = next(c for c in W.DEFAULT.colors if c not in used)
        damaged = [_paint_over(t_img, u.color, W.DEFAULT.background),  # a neighbour erased
                   _paint_over(t_img, u.color, W.PALETTE[other])]  # ... or recoloured too
        r = edit_reward(np.stack([t_img, *damaged]), np.stack([s_img] * 3), [t] * 3)
        assert r[0] >= 0.99 and (r[1:] <= 0.6).all(), (t.instruction, t.source_prompt, r)
        scored += 1
    assert scored > 100


def test_reward_is_graded_and_in_unit_range(pairs):
    tasks, _, src, tgt = pairs
    rng = np.random.default_rng(0)
    # noise the detector reads through keeps the reward; random images score in [0, 1]
    noisy = np.clip(tgt + rng.normal(0, 0.05, tgt.shape), 0, 1).astype(np.float32)
    assert edit_reward(noisy, src, tasks).min() >= 0.95
    r = edit_reward(rng.uniform(size=tgt.shape).astype(np.float32), src, tasks)
    assert r.min() >= 0.0 and r.max() <= 1.0
    assert edit_reward(np.zeros_like(tgt), src, tasks).max() <= 0.05  # an erased scene
    # partial edits earn partial credit
    rm = E.parse_task("a red square and a green bar", "remove the green bar")
    s, g = E.render_pair(rm, 1)
    half = s.copy()
    ys, xs = np.nonzero((s == W.PALETTE["green"]).all(-1))
    half[ys[xs < np.median(xs)], xs[xs < np.median(xs)]] = 0.0
    assert 0.3 < edit_reward(half[None], s[None], [rm])[0] < 0.7
    rc = E.parse_task("a red square and a green bar", "make the red square blue")
    s, g = E.render_pair(rc, 2)
    most = s.copy()
    ys, xs = np.nonzero((s == W.PALETTE["red"]).all(-1))
    low = ys > ys.min() + 1  # all but the top two rows recoloured
    most[ys[low], xs[low]] = W.PALETTE["blue"]
    bd = edit_breakdown(most[None], s[None], [rc])
    assert 0.5 < bd["reward"][0] < 1.0 and bd["preserved"][0] == 1.0
    # a move half way: on the asked side, by less than the margin
    mv = E.parse_task("a red square on the right of a green bar", "put the red square below "
                      "the green bar")
    src_boxes, _ = E.pair_layouts(mv, 5)
    (ya, xa, sa, *rest), b = src_boxes
    b_cy = E.centroid(b)[0]
    y_half = int(round(b_cy + 1.5 - sa / 2))  # red's centroid 1.5 px below green's
    part = E.paint([(y_half, xa, sa, *rest), b])
    r = edit_reward(part[None], E.paint(src_boxes)[None], [mv])[0]
    assert 0.2 < r < 0.8, r
