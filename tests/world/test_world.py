"""Tests of the synthetic world: grammar and split, parser errors, tokenizer, renderer, detector."""

import time

import numpy as np
import pytest

from spotlight_jax import world as W
from spotlight_jax.world.detect import label_components
from spotlight_jax.world.font import text_mask
from spotlight_jax.world.grammar import split_words
from spotlight_jax.world.render import layout
from spotlight_jax.world.tokenizer import canonical_words


# ---------------------------------------------------------------- grammar and split
def test_split_is_disjoint_complete_and_covers_every_kind():
    train, val, every = W.train_prompts(), W.val_prompts(), W.all_prompts()
    assert len(set(every)) == len(every)
    assert not set(train) & set(val)
    assert sorted(train + val) == sorted(every)
    for split in ("train", "val"):
        by_kind = W.prompts_by_kind(split=split)
        assert set(by_kind) == set(W.KINDS)
        assert all(len(v) > 0 for v in by_kind.values()), (split, by_kind)
    n_all = {k: len(v) for k, v in W.prompts_by_kind().items()}
    n_val = {k: len(v) for k, v in W.prompts_by_kind(split="val").items()}
    assert n_all == {"single": 12, "counting": 24, "two_object": 54, "position": 216, "text": 110}
    for k in W.KINDS:  # stratified ~15%
        assert abs(n_val[k] / n_all[k] - 0.15) < 0.05, (k, n_val[k], n_all[k])
    # Deterministic, and a different seed gives a different split.
    assert W.val_prompts(W.WorldConfig()) == val
    assert W.val_prompts(W.WorldConfig(split_seed=1)) != val


def test_parse_round_trips_every_prompt():
    for p in W.all_prompts():
        spec = W.parse(p)
        assert W.format_prompt(spec) == p
    s = W.parse("a red bar on the left of a blue square")
    assert s.kind == "position" and s.relation == "left"
    assert s.groups == (W.Group(1, "red", "bar"), W.Group(1, "blue", "square"))
    assert W.parse("three green columns") == W.PromptSpec(
        "counting", (W.Group(3, "green", "column"),)
    )
    assert W.parse('the text "07"') == W.PromptSpec("text", text="07")
    assert W.parse("  A Red Bar ").kind == "single"  # case and spacing tolerant


@pytest.mark.parametrize(
    "prompt, fragment",
    [
        ("a purple bar", 'unknown color "purple"'),
        ("a white bar", "text color"),
        ("a red hexagon", 'unknown shape "hexagon"'),
        ("two red bar", "plural"),
        ("a red bars", "singular"),
        ("seven red bars", 'unknown count word "seven"'),
        ("a red bar and a red square", "its own color"),
        ("a red bar on the left of", "expected"),
        ("two red bars on the left of a blue square", "single objects"),
        ("red bar", "expected"),
        ('the text "ab"', "digits"),
        ('the text "123"', "allowed lengths"),
        ("the text 37", "malformed text prompt"),
        ("three red bars and three blue squares", "at most 4"),
        ("", "empty prompt"),
    ],
)
def test_parse_errors_are_clear(prompt, fragment):
    with pytest.raises(ValueError) as e:
        W.parse(prompt)
    assert fragment in str(e.value)
    if "unknown color" in fragment:
        assert "known colors: red, green, blue, yellow" in str(e.value)


def test_world_config_validation():
    with pytest.raises(ValueError, match="unknown color"):
        W.WorldConfig(colors=("red", "purple"))
    with pytest.raises(ValueError, match="text_color"):
        W.WorldConfig(colors=("red", "white"))
    with pytest.raises(ValueError, match="do not fit"):
        W.WorldConfig(object_size=(15, 16))
    cfg = W.WorldConfig(colors=("red", "cyan"), shapes=("square",), max_count=4)
    assert len(W.prompts_by_kind(cfg)["counting"]) == 3 * 2


# ---------------------------------------------------------------- tokenizer
def test_tokenizer():
    prompts = W.all_prompts()
    ids, mask = W.tokenize(prompts)
    assert ids.dtype == np.int32 and ids.shape == (len(prompts), W.DEFAULT_MAX_LEN)
    assert mask.dtype == bool and (mask == (ids != W.PAD_ID)).all() and W.PAD_ID == 0
    assert W.VOCAB[0] == "<pad>" and len(set(W.VOCAB)) == W.VOCAB_SIZE
    assert (mask.sum(1) >= 2).all()
    # Prefix masks (right padding) and exact round trip.
    assert (np.diff(mask.astype(int), axis=1) <= 0).all()
    # Round trip up to the canonical relation order: the decoded prompt is the same scene, with
    # "right of" / "below" read as "left of" / "above" from the other object.
    flip = {"right": "left", "below": "above"}
    for p, back in zip(prompts, W.decode(ids)):
        a, b = W.parse(p), W.parse(back)
        if a.relation in flip:
            assert (b.relation, b.groups) == (flip[a.relation], a.groups[::-1]), (p, back)
        else:
            assert back == p
    t, _ = W.tokenize(['the text "37"'])
    assert [W.VOCAB[i] for i in t[0, :6]] == ["the", "text", '"', "3", "7", '"']
    with pytest.raises(ValueError, match='unknown word "purple"'):
        W.tokenize(["a purple bar"])
    with pytest.raises(ValueError, match="max_len"):
        W.tokenize(["a red bar on the left of a blue square"], max_len=5)


def test_relations_are_encoded_in_canonical_order():
    ids = lambda p: W.encode(p)  # noqa: E731
    assert ids("a red bar on the right of a blue square") == ids(
        "a blue square on the left of a red bar")
    assert ids("a red bar below a blue square") == ids("a blue square above a red bar")
    assert ids("a red bar on the left of a blue square") != ids(
        "a blue square on the left of a red bar")
    # The first-named object of the canonical form is the left (upper) one in the renderer's images.
    for p in ("a red bar on the right of a blue square", "a red bar below a blue square"):
        spec = W.parse(W.decode(W.tokenize([p])[0])[0])
        (y0, x0, *_), (y1, x1, *_) = layout(spec, np.random.default_rng(0))[:2]
        assert (x0 < x1) if spec.relation == "left" else (y0 < y1)
    # Other prompts are untouched, and the words are only reordered.
    w = ["two", "red", "bars"]
    assert canonical_words(w) == w
    words = split_words("a red bar on the right of a blue square")
    assert sorted(canonical_words(words)) == sorted(
        split_words("a blue square on the left of a red bar"))


# ---------------------------------------------------------------- renderer
def test_shape_masks_fill_their_box():
    for s in W.COMPACT_SHAPES:
        for h in range(3, 21):
            m = W.shape_mask(s, h, h)
            assert m.any(0).all() and m.any(1).all(), (s, h)
            np.testing.assert_array_equal(W.object_mask(s, h), m)
    fills = {s: W.shape_mask(s, 12, 12).mean() for s in W.COMPACT_SHAPES}
    assert fills["square"] == 1.0 and 0.7 < fills["circle"] < 0.9 and fills["triangle"] < 0.65


def test_bars_and_columns_are_centred_bands_of_their_box():
    for s in range(3, 21):
        bar, col = W.object_mask("bar", s), W.object_mask("column", s)
        np.testing.assert_array_equal(col, bar.T)
        rows = np.flatnonzero(bar.any(1))
        assert bar[rows].all() and rows.size == max(1, round(W.DEFAULT.bar_thickness * s))
        assert np.diff(rows).max(initial=1) == 1  # one contiguous band
        top, bottom = rows[0], s - 1 - rows[-1]
        assert abs(top - bottom) <= 1, (s, top, bottom)  # centred
    with pytest.raises(ValueError, match="unknown compact shape"):
        W.shape_mask("bar", 5, 5)


def test_render_is_deterministic_and_uses_only_the_palette():
    prompts = W.train_prompts()[::7]
    a = W.sample_batch(prompts, np.random.default_rng(3))
    b = W.sample_batch(prompts, np.random.default_rng(3))
    c = W.sample_batch(prompts, np.random.default_rng(4))
    assert a.dtype == np.float32 and a.shape == (len(prompts), 32, 32, 3)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.min() >= 0.0 and a.max() <= 1.0
    colors = {tuple(v) for v in a.reshape(-1, 3).tolist()}
    assert colors <= {tuple(v) for v in W.DEFAULT.class_rgb.tolist()}
    one = W.render(prompts[0], np.random.default_rng(3))
    assert np.array_equal(one, a[0])


def test_layouts_respect_counts_gaps_and_relations():
    rng = np.random.default_rng(0)
    cfg = W.DEFAULT
    lo, hi = cfg.size_range
    for p in W.all_prompts()[:306:3]:
        spec = W.parse(p)
        boxes = layout(spec, rng, cfg)
        assert len(boxes) == sum(g.count for g in spec.groups)
        for i, (y, x, s, _, _) in enumerate(boxes):
            assert lo <= s <= hi
            assert cfg.edge_margin <= min(y, x) and max(y, x) + s <= 32 - cfg.edge_margin
            for y2, x2, s2, _, _ in boxes[i + 1 :]:
                g = cfg.object_gap
                assert x + s + g <= x2 or x2 + s2 + g <= x or y + s + g <= y2 or y2 + s2 + g <= y
        if spec.relation:
            (ya, xa, sa, *_), (yb, xb, sb, *_) = boxes
            ok = {
                "left": xa + sa <= xb,
                "right": xb + sb <= xa,
                "above": ya + sa <= yb,
                "below": yb + sb <= ya,
            }[spec.relation]
            assert ok, (p, boxes)


def test_data_stream():
    prompts = W.train_prompts()
    s1 = W.data_stream(prompts, 64, seed=5)
    s2 = W.data_stream(prompts, 64, seed=5)
    p1, x1 = next(s1)
    p2, x2 = next(s2)
    assert p1 == p2 and np.array_equal(x1, x2)
    assert len(p1) == 64 and x1.shape == (64, 32, 32, 3) and x1.dtype == np.float32
    t = time.perf_counter()
    kinds = []
    for _ in range(5):
        p, _ = next(s1)
        kinds += [W.parse(q).kind for q in p]
    per_batch = (time.perf_counter() - t) / 5
    print(f"data_stream: {per_batch * 1e3:.1f} ms per batch of 64")
    counts = {k: kinds.count(k) for k in W.KINDS}
    assert min(counts.values()) > 30, counts  # balanced: ~64 of each kind in 320 draws
    with pytest.raises(ValueError, match="unknown color"):
        next(W.data_stream(["a purple bar"], 4, 0))


def test_bigger_world_renders_and_reads_back():
    cfg = W.WorldConfig(image_size=64)
    assert cfg.size_range == (18, 26) and cfg.glyph_scale == 8
    prompts = W.train_prompts(cfg)[::9]
    x = W.sample_batch(prompts, np.random.default_rng(0), cfg)
    assert x.shape == (len(prompts), 64, 64, 3)
    from spotlight_jax.rewards import constraint_breakdown

    bd = constraint_breakdown(x, prompts, cfg)
    for k, v in bd.items():
        assert np.nanmin(v) == 1.0, k


# ---------------------------------------------------------------- detector
def test_label_components_4_connectivity():
    c = np.zeros((2, 6, 6), np.int32)
    c[0, 0:2, 0:2] = 1
    c[0, 2:4, 2] = 1  # touches the first block only diagonally -> separate
    c[0, 0:2, 4:6] = 2
    c[0, 2, 4:6] = 1  # adjacent to class 2 but a different class -> separate
    c[1] = 3  # one image-wide component, not merged with image 0
    lab = label_components(c)
    assert (lab[c == 0] == -1).all()
    n0 = len(np.unique(lab[0][lab[0] >= 0]))
    assert n0 == 4
    assert len(np.unique(lab[1])) == 1 and lab[1, 0, 0] not in lab[0]
    # A snake-shaped component (worst case for label propagation) is one component.
    s = np.zeros((1, 9, 9), np.int32)
    s[0, ::2, :] = 1
    s[0, 1::4, 8] = 1
    s[0, 3::4, 0] = 1
    lab = label_components(s)
    assert len(np.unique(lab[lab >= 0])) == 1


@pytest.mark.parametrize("cfg", [W.DEFAULT, W.WorldConfig(shapes=W.KNOWN_SHAPES)],
                         ids=["default", "all_shapes"])
def test_detect_finds_objects_shapes_and_ignores_specks(cfg):
    rng = np.random.default_rng(0)
    a, b, c = ("triangle", "circle", "square") if "circle" in cfg.shapes else ("bar", "column",
                                                                               "square")
    x = W.sample_batch([f"three yellow {a}s", f"a red {b} and a blue {c}"], rng, cfg)
    x[0, 0, 0] = (1.0, 0.0, 0.0)  # one-pixel speck: below min_px, ignored
    x[1, 5:9, 0:4] = 0.5  # gray haze: far from every palette color -> background
    d = W.detect(x, cfg)
    assert len(d) == 5
    i0, i1 = d.of_image(0), d.of_image(1)
    assert len(i0) == 3 and set(d.shape[i0]) == {cfg.shapes.index(a)}
    names = {cfg.class_names[k]: cfg.shapes[s] for k, s in zip(d.cls[i1], d.shape[i1])}
    assert names == {"red": b, "blue": c}


def test_detect_tells_every_shape_from_every_other_at_every_size():
    """Each shape, rendered at every object size, is classified as itself with all five shapes
    known; a square blob never passes as a bar and a bar never as a square."""
    cfg = W.WorldConfig(shapes=W.KNOWN_SHAPES)
    lo, hi = cfg.size_range
    for shape in cfg.shapes:
        for s in range(lo, hi + 1):
            x = np.zeros((1, 32, 32, 3), np.float32)
            x[0, 5 : 5 + s, 7 : 7 + s][W.object_mask(shape, s)] = W.PALETTE["red"]
            d = W.detect(x, cfg)
            assert len(d) == 1 and cfg.shapes[d.shape[0]] == shape, (shape, s, d.shape_ious)
            assert d.shape_iou[0] == 1.0


def test_ocr_reads_every_text_prompt():
    prompts = W.prompts_by_kind()["text"]
    x = W.sample_batch(prompts, np.random.default_rng(1))
    assert W.read_text(x) == [W.parse(p).text for p in prompts]
    assert W.read_text(np.zeros((1, 32, 32, 3), np.float32)) == [""]
    # Scale 2 (smaller than the default 3) is read too: the scale comes from the text height.
    cfg = W.WorldConfig(text_scale=2)
    x = W.sample_batch(prompts[::5], np.random.default_rng(2), cfg)
    assert W.read_text(x, cfg) == [W.parse(p).text for p in prompts[::5]]
    assert text_mask("37", 3).shape == (15, 21)
