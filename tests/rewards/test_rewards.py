"""Tests of the reward registry and the shipped rewards (geneval_lite, ocr_lite, jpeg)."""

import io

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from spotlight_jax import rewards as R
from spotlight_jax import world as W


@pytest.fixture(scope="module")
def renders():
    """Every training prompt rendered twice, with the detector's breakdown."""
    prompts = W.train_prompts() * 2
    images = W.sample_batch(prompts, np.random.default_rng(0))
    return prompts, images


# ---------------------------------------------------------------- geneval_lite
def test_geneval_scores_the_renderers_own_images_high(renders):
    prompts, images = renders
    r = R.get("geneval_lite")(images, prompts)
    assert r.dtype == np.float32 and r.shape == (len(prompts),)
    print(f"geneval_lite on renders: mean {r.mean():.4f}, min {r.min():.3f}")
    assert r.mean() >= 0.95
    bd = R.constraint_breakdown(images, prompts, exact=True)
    assert set(bd) == {"color", "count", "shape", "position", "text"}
    for k, v in bd.items():
        assert np.nanmean(v) >= 0.95, (k, np.nanmean(v))
    # NaN exactly where a constraint does not apply.
    kinds = np.array([W.parse(p).kind for p in prompts])
    assert np.isnan(bd["position"][kinds != "position"]).all()
    assert not np.isnan(bd["position"][kinds == "position"]).any()
    assert np.isnan(bd["text"][kinds != "text"]).all()
    assert np.isnan(bd["color"][kinds == "text"]).all()


def test_missing_credit_shares_sum_to_the_reward_shortfall(renders):
    # the per-constraint shares of 1 - mean(reward) add up exactly (closed form), and a constraint
    # that is always met has no share
    prompts, images = renders
    rng = np.random.default_rng(2)
    shuffled = [prompts[i] for i in rng.permutation(len(prompts))]
    for ps in (prompts, shuffled):
        bd = R.constraint_breakdown(images, ps)
        shares = R.missing_credit(bd)
        reward = R.get("geneval_lite")(images, ps).astype(np.float64)
        assert set(shares) == set(bd)
        np.testing.assert_allclose(sum(shares.values()), 1.0 - reward.mean(), atol=1e-6)
        assert all(v >= 0 for v in shares.values())
    perfect = {k: np.where(np.isnan(v), np.nan, 1.0) for k, v in bd.items()}
    assert all(v == 0.0 for v in R.missing_credit(perfect).values())
    only_text = dict(perfect, text=np.where(np.isnan(bd["text"]), np.nan, 0.0))
    kinds = np.array([W.parse(p).kind for p in ps])
    np.testing.assert_allclose(R.missing_credit(only_text)["text"], (kinds == "text").mean())


def _with_shapes(prompt: str, shapes) -> str:
    """The two-object prompt with its objects' shapes replaced, colors and relation kept."""
    spec = W.parse(prompt)
    a, b = (f"a {g.color} {s}" for g, s in zip(spec.groups, shapes))
    return prompt.replace(f"a {spec.groups[0].color} {spec.groups[0].shape}", a, 1).replace(
        f"a {spec.groups[1].color} {spec.groups[1].shape}", b, 1)


def test_shape_binding_counts_each_outcome_on_rendered_images():
    elong = {"bar": "wide", "column": "tall", "square": "compact"}
    two = [p for p in W.train_prompts() if W.parse(p).kind in ("two_object", "position")]
    differ = [p for p in two if len({elong[g.shape] for g in W.parse(p).groups}) == 2]
    same = [p for p in two if p not in differ]
    others = [p for p in W.train_prompts() if W.parse(p).kind in ("single", "text")][:20]
    assert differ and same
    images = W.sample_batch(differ, np.random.default_rng(3))
    # the renderer binds every shape: all "both"; prompts asking one elongation twice, single
    # objects and text are not scored
    b = R.shape_binding(np.concatenate([images, W.sample_batch(same + others,
                                                               np.random.default_rng(4))]),
                        differ + same + others)
    assert b["prompts"] == len(differ) and b["both"] == 1.0
    assert b["swapped"] == b["one"] == b["neither"] == b["missing"] == 0.0
    singles = [p for p in others if W.parse(p).kind == "single"]
    assert b["single_prompts"] == len(singles) > 0 and b["alone"] == 1.0
    # a single object scored against another elongation is not drawn as asked
    wrong = {"bar": "column", "column": "square", "square": "bar"}
    moved = [p.replace(W.parse(p).groups[0].shape, wrong[W.parse(p).groups[0].shape])
             for p in singles]
    assert R.shape_binding(W.sample_batch(singles, np.random.default_rng(5)), moved)["alone"] == 0.0
    # the same images scored against each prompt with its two shapes exchanged: all "swapped"
    swapped = [_with_shapes(p, [g.shape for g in W.parse(p).groups][::-1]) for p in differ]
    assert R.shape_binding(images, swapped)["swapped"] == 1.0
    # the first object's shape replaced by the third elongation: exactly one right
    third = {frozenset(("wide", "tall")): "square", frozenset(("wide", "compact")): "column",
             frozenset(("tall", "compact")): "bar"}
    one = [_with_shapes(p, (third[frozenset(elong[g.shape] for g in W.parse(p).groups)],
                            W.parse(p).groups[1].shape)) for p in differ]
    assert R.shape_binding(images, one)["one"] == 1.0
    # a black image has no asked color
    assert R.shape_binding(np.zeros((2, 32, 32, 3), np.float32), differ[:2])["missing"] == 1.0
    with pytest.raises(ValueError, match="3 images but 2 prompts"):
        R.shape_binding(np.zeros((3, 32, 32, 3), np.float32), differ[:2])


def test_geneval_scores_mismatched_prompts_low(renders):
    prompts, images = renders
    g = R.get("geneval_lite")
    rng = np.random.default_rng(1)
    shuffled = [prompts[i] for i in rng.permutation(len(prompts))]
    assert g(images, shuffled).mean() < 0.6
    # Within each kind (so mostly a different color, shape or count, same structure).
    kinds = [W.parse(p).kind for p in prompts]
    for kind in W.KINDS:
        idx = [i for i, k in enumerate(kinds) if k == kind]
        perm = rng.permutation(idx)
        r = g(images[idx], [prompts[i] for i in perm])
        assert r.mean() < 0.6, (kind, r.mean())


def test_geneval_floor_on_noise_and_black():
    prompts = W.train_prompts()[::3]
    g = R.get("geneval_lite")
    rng = np.random.default_rng(0)
    noise = rng.random((len(prompts), 32, 32, 3), dtype=np.float32)
    black = np.zeros_like(noise)
    gauss = np.clip(0.5 + 0.5 * rng.standard_normal(noise.shape), 0, 1).astype(np.float32)
    for name, x in [("uniform noise", noise), ("black", black), ("gaussian noise", gauss)]:
        r = g(x, prompts)
        print(f"geneval_lite on {name}: {r.mean():.3f}")
        assert r.mean() < 0.15, name


# The compact shapes the first world used (circles and triangles differ from squares in sub-patch
# detail); the default world's bars and columns are tested below.
CLASSIC = W.WorldConfig(shapes=("circle", "square", "triangle"))


def _img(*objects, size=32):
    """Hand-drawn image: objects are (y, x, side, color, shape)."""
    x = np.zeros((size, size, 3), np.float32)
    for y, x0, s, color, shape in objects:
        x[y : y + s, x0 : x0 + s][W.object_mask(shape, s)] = W.PALETTE[color]
    return x


def test_geneval_graded_constraints():
    c3 = [(1, 1, 9, "red", "circle"), (1, 20, 9, "red", "circle"), (20, 10, 9, "red", "circle")]
    c3_blue = c3 + [(20, 21, 9, "blue", "square")]
    imgs = np.stack([_img(*c3), _img(*c3_blue), _img(*c3[:1]), _img(*c3[:1])])
    prompts = ["two red circles", "two red circles", "two red circles", "two red squares"]
    bd = R.constraint_breakdown(imgs, prompts, CLASSIC)
    np.testing.assert_allclose(bd["count"], [1 / 2, 1 / 3, 1 / 2, 1 / 2])  # extras are errors
    np.testing.assert_allclose(bd["color"], [1, 1, 1, 1])
    # circles asked as squares: not the asked shape, but a circle fills ~79% of its box, close
    # to the square template -> the graded half credit; exact accuracy is 0
    np.testing.assert_allclose(bd["shape"], [1, 1, 1, 0.5])
    np.testing.assert_allclose(R.constraint_breakdown(imgs, prompts, CLASSIC, exact=True)["shape"],
                               [1, 1, 1, 0])
    r = R.make_geneval_lite(CLASSIC)(imgs, prompts)
    np.testing.assert_allclose(r, [(1 + 0.5 + 1) / 3, (1 + 1 / 3 + 1) / 3, 2.5 / 3, 2 / 3], 1e-6)
    exact = R.constraint_breakdown(imgs, prompts, CLASSIC, exact=True)
    np.testing.assert_array_equal(exact["count"], [0, 0, 0, 0])

    # Position: full credit on the right side, 0 on the wrong side or when an object is missing.
    a, b = (10, 2, 10, "red", "square"), (10, 19, 10, "green", "triangle")
    imgs = np.stack([_img(a, b), _img(a, b), _img(a)])
    prompts = [
        "a red square on the left of a green triangle",
        "a red square on the right of a green triangle",
        "a red square on the left of a green triangle",
    ]
    bd = R.constraint_breakdown(imgs, prompts, CLASSIC)
    np.testing.assert_allclose(bd["position"], [1, 0, 0])
    np.testing.assert_allclose(bd["color"], [1, 1, 0.5])
    # Small correct offsets get partial credit (d / (0.1 * 32)).
    near = _img((2, 10, 10, "red", "square"), (18, 12, 10, "green", "square"))
    bd = R.constraint_breakdown(near[None], ["a red square on the left of a green square"], CLASSIC)
    np.testing.assert_allclose(bd["position"], [2 / 3.2], rtol=1e-5)


def test_patch_blocks_are_not_squares():
    """4x4 blocks (what an undertrained 4x4-patch DiT scatters) must not pass as squares."""
    x = np.zeros((1, 32, 32, 3), np.float32)
    x[0, 4:8, 4:8] = W.PALETTE["red"]
    x[0, 20:24, 12:16] = W.PALETTE["red"]
    bd = R.constraint_breakdown(x, ["two red squares"])
    assert bd["count"][0] == 1.0 and bd["shape"][0] == 0.0


# ---------------------------------------------------------------- ocr_lite
def test_edit_distance():
    ed = R.edit_distance
    assert ed("", "") == 0 and ed("37", "37") == 0
    assert ed("", "37") == 2 and ed("37", "") == 2
    assert ed("37", "38") == 1 and ed("37", "73") == 2 and ed("3", "37") == 1
    assert ed("kitten", "sitting") == 3 and ed("sitting", "kitten") == 3
    assert R.ocr_score("37", "37") == 1.0
    assert R.ocr_score("3", "37") == 0.5
    assert R.ocr_score("", "37") == 0.0
    assert R.ocr_score("123", "7") == 0.0  # clipped at 0


def test_ocr_lite_reads_rendered_digits_exactly():
    prompts = W.prompts_by_kind()["text"]
    x = W.sample_batch(prompts, np.random.default_rng(7))
    r = R.get("ocr_lite")(x, prompts)
    assert (r == 1.0).all()
    shifted = [f'the text "{(int(W.parse(p).text[-1]) + 1) % 10}"' for p in prompts]
    assert R.get("ocr_lite")(x, shifted).max() <= 0.5
    assert R.get("ocr_lite")(np.zeros_like(x[:2]), prompts[:2]).tolist() == [0.0, 0.0]
    # Text prompts score the same through geneval_lite (it delegates to the OCR score).
    np.testing.assert_array_equal(R.get("geneval_lite")(x, prompts), r)
    with pytest.raises(ValueError, match="text prompts only"):
        R.get("ocr_lite")(x[:1], ["a red bar"])


def test_graded_ocr_score_closed_form_on_rendered_glyphs():
    from spotlight_jax.world.font import TEMPLATES
    dist = np.abs(TEMPLATES[:, None].astype(int) - TEMPLATES[None]).sum((2, 3))
    x = W.sample_batch(['the text "30"', 'the text "7"'], np.random.default_rng(1))
    cells = W.glyph_cells(x)
    assert [c.shape for c in cells] == [(2, 5, 3), (1, 5, 3)]
    assert W.read_text(x) == ["30", "7"]
    # a drawn 0 read against an asked 8: the templates are dist[0, 8] = 1 cell apart
    near = 0.5 * (1 - dist[0, 8] / R.ocr.GRADED_GLYPH_CELLS)
    assert R.graded_ocr_score(cells[0], "38") == pytest.approx((1 + near) / 2)
    assert R.ocr_score("30", "38") == 0.5
    assert R.graded_ocr_score(cells[0], "30") == 1.0
    # 7 and 1 are dist[7, 1] = 11 cells apart: no partial credit, the OCR score stands
    assert dist[7, 1] >= R.ocr.GRADED_GLYPH_CELLS
    assert R.graded_ocr_score(cells[1], "1") == 0.0
    assert R.graded_ocr_score(cells[0], "3") == R.ocr_score("30", "3") == 0.0  # lengths differ
    assert R.graded_ocr_score(np.zeros((0, 5, 3), np.float32), "3") == 0.0  # no text drawn


def test_shaped_reward_keeps_the_exact_successes_and_never_scores_below(renders):
    prompts, images = renders
    text = [i for i, p in enumerate(prompts) if W.parse(p).kind == "text"]
    xs = images[text]
    rng = np.random.default_rng(5)
    asked = [f'the text "{"".join(rng.choice(list("0123456789"), len(W.parse(prompts[i]).text)))}"'
             for i in text]
    plain, shaped = R.get("geneval_lite")(xs, asked), R.get("geneval_lite_shaped")(xs, asked)
    assert (shaped >= plain).all() and (shaped > plain).any()
    np.testing.assert_array_equal(shaped == 1.0, plain == 1.0)
    # non-text prompts score exactly as geneval_lite
    other = [i for i, p in enumerate(prompts) if W.parse(p).kind != "text"][::5]
    ps = [prompts[i] for i in other]
    np.testing.assert_array_equal(R.get("geneval_lite_shaped")(images[other], ps),
                                  R.get("geneval_lite")(images[other], ps))
    parts = R.resolve("geneval_lite_shaped").components()(xs, asked)
    np.testing.assert_allclose(np.nanmean(parts, axis=1), shaped, rtol=1e-6)
    with pytest.raises(ValueError, match="text_credit='pixels'"):
        R.constraint_breakdown(xs[:1], asked[:1], text_credit="pixels")


def test_aspect_credit_closed_form():
    cfg = W.WorldConfig()
    span = np.log(1 / cfg.bar_thickness)
    ac = R.geneval.aspect_credit
    # inside each shape's accepted range: full credit
    assert ac([10, 10, 10], [10, 12, 13], "square", cfg).tolist() == [1.0, 1.0, 1.0]
    assert ac([5, 4], [9, 12], "bar", cfg).tolist() == [1.0, 1.0]
    assert ac([9, 12], [5, 4], "column", cfg).tolist() == [1.0, 1.0]
    # outside: linear in log aspect, from the range's edge to 0 at a drawn bar's elongation
    assert ac([10], [10], "column", cfg)[0] == pytest.approx(1 - np.log(1.6) / span)
    assert ac([12], [10], "bar", cfg)[0] == pytest.approx(1 - (np.log(1.6) + np.log(1.2)) / span)
    assert ac([10], [20], "square", cfg)[0] == pytest.approx(1 - (np.log(2) - np.log(1.3)) / span)
    assert ac([10], [30], "column", cfg)[0] == 0.0


def test_aspect_reward_grades_elongation_and_keeps_the_exact_successes(renders):
    # a filled 10 x 10 red square asked to be a column: its IoU with the column template (0.45)
    # earns no credit under geneval_lite, its elongation some under geneval_lite_aspect
    x = np.zeros((1, 32, 32, 3), np.float32)
    x[0, 10:20, 10:20, 0] = 1.0
    cfg = W.WorldConfig()
    near = 1 - np.log(cfg.bar_min_aspect) / np.log(1 / cfg.bar_thickness)
    plain = R.constraint_breakdown(x, ["a red column"])
    aspect = R.constraint_breakdown(x, ["a red column"], shape_credit="aspect")
    assert plain["shape"][0] == 0.0
    assert aspect["shape"][0] == pytest.approx(0.5 * 0.5 * near, rel=1e-6)
    assert R.get("geneval_lite_aspect")(x, ["a red column"])[0] == pytest.approx(
        (2 + 0.25 * near) / 3, rel=1e-6)
    # the renderer's images and mismatched prompts: same exact successes, never below
    prompts, images = renders
    rng = np.random.default_rng(3)
    for ps in (prompts, [prompts[i] for i in rng.permutation(len(prompts))]):
        a, b = R.get("geneval_lite")(images, ps), R.get("geneval_lite_aspect")(images, ps)
        assert (b >= a - 1e-7).all()
        np.testing.assert_array_equal(a == 1.0, b == 1.0)
    parts = R.resolve("geneval_lite_aspect").components()(images, ps)
    np.testing.assert_allclose(np.nanmean(parts, axis=1), b, rtol=1e-6)
    with pytest.raises(ValueError, match="shape_credit='fill'"):
        R.constraint_breakdown(x, ["a red column"], shape_credit="fill")


# ---------------------------------------------------------------- jpeg
def test_jpeg_compressibility():
    rng = np.random.default_rng(0)
    flat = np.full((2, 32, 32, 3), 0.3, np.float32)
    noise = rng.random((2, 32, 32, 3), dtype=np.float32)
    j = R.get("jpeg_compressibility")
    rf, rn = j(flat, ["x", "y"]), j(noise, ["x", "y"])
    assert rf.dtype == np.float32 and (rf < 0).all() and (rf > rn).all()
    buf = io.BytesIO()
    Image.fromarray(np.round(noise[0] * 255).astype(np.uint8)).save(buf, "JPEG", quality=95)
    assert rn[0] == pytest.approx(-len(buf.getvalue()) / 1000 / 500)


# ---------------------------------------------------------------- registry and contract
def test_registry():
    assert {"geneval_lite", "ocr_lite", "jpeg_compressibility"} <= set(R.names())
    with pytest.raises(ValueError, match="registered rewards: .*geneval_lite"):
        R.get("pickscore")
    fn = lambda images, prompts: np.ones(len(prompts))
    R.register("test_ones", fn)
    try:
        out = R.get("test_ones")(np.zeros((3, 32, 32, 3)), ["a", "b", "c"])
        assert out.dtype == np.float32 and out.tolist() == [1, 1, 1]
        with pytest.raises(ValueError, match="already registered"):
            R.register("test_ones", fn)
        R.register("test_ones", lambda images, prompts: np.ones(2), overwrite=True)
        with pytest.raises(ValueError, match="returned shape"):
            R.get("test_ones")(np.zeros((3, 32, 32, 3)), ["a", "b", "c"])
    finally:
        R.unregister("test_ones")
    assert "test_ones" not in R.names()


def test_contract_errors_and_jax_input():
    g = R.get("geneval_lite")
    x = W.sample_batch(["a red bar", "a blue square"], np.random.default_rng(0))
    np.testing.assert_array_equal(g(jnp.asarray(x), ["a red bar", "a blue square"]), [1, 1])
    with pytest.raises(ValueError, match='unknown color "purple"'):
        g(x, ["a red bar", "a purple square"])
    with pytest.raises(ValueError, match="2 images but 1 prompts"):
        g(x, ["a red bar"])
    with pytest.raises(ValueError, match="single str"):
        g(x[:1], "a red bar")
    with pytest.raises(ValueError, match="NaN"):
        g(np.full_like(x, np.nan), ["a red bar", "a blue square"])
    with pytest.raises(ValueError, match="shape"):
        g(x[..., :2], ["a red bar", "a blue square"])


def test_exact_scores_of_the_graded_breakdown_equal_the_exact_breakdown(renders):
    from spotlight_jax.rewards.geneval import exact_scores
    prompts, images = renders
    shuffled = [prompts[i] for i in np.random.default_rng(3).permutation(len(prompts))]
    for ps in (prompts, shuffled):
        exact = R.constraint_breakdown(images, ps, exact=True)
        derived = exact_scores(R.constraint_breakdown(images, ps))
        for k in exact:
            np.testing.assert_array_equal(derived[k], exact[k])


def test_reward_components_average_to_the_reward(renders):
    prompts, images = renders
    prompts, images = prompts[::7], images[::7]
    parts = R.resolve("geneval_lite").components()(images, prompts)
    assert parts.shape == (len(prompts), 5)          # color, count, shape, position, text
    assert np.isnan(parts).any() and (~np.isnan(parts)).sum(1).min() >= 1
    np.testing.assert_allclose(np.nanmean(parts, axis=1), R.get("geneval_lite")(images, prompts),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="has no components.*geneval_lite"):
        R.resolve("ocr_lite").components()
    with pytest.raises(ValueError, match="unknown reward"):
        R.resolve("pickscore").components()
    R.register("test_parts", lambda images, prompts: np.ones(len(prompts)),
               components=lambda images, prompts: {"a": np.ones(len(prompts))})
    try:
        assert R.resolve("test_parts").components()(images[:2], prompts[:2]).shape == (2, 1)
    finally:
        R.unregister("test_parts")
    with pytest.raises(ValueError, match="unknown reward"):
        R.resolve("test_parts").components()


def test_an_image_reward_of_clips_is_its_frames_mean():
    """Each frame scored with its clip's prompt (checked against a loop over frames), a mix of
    a clip reward and a per-frame image reward, and a clip reward refusing images."""
    rng = np.random.default_rng(0)
    clips = rng.uniform(0, 1, (3, 5, 24, 24, 3)).astype(np.float32)
    prompts = ["a red square moving left", "two blue bars falling", "a green column rising"]
    seen = []

    def brightness(images, ps):
        seen.append(list(ps))
        return np.asarray(images).mean(axis=(1, 2, 3)) + np.asarray([len(p) for p in ps])

    R.register("test_brightness", brightness)
    try:
        got = R.get("test_brightness")(clips, prompts)
        want = [np.mean([clips[i, f].mean() + len(prompts[i]) for f in range(5)])
                for i in range(3)]
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert seen[-1] == [p for p in prompts for _ in range(5)]   # frame-major per clip
        mixed = R.resolve("video_motion:1.0,test_brightness:0.5")
        total, terms = mixed.scored(clips, prompts)
        np.testing.assert_allclose(terms["test_brightness"], want, rtol=1e-6)
        np.testing.assert_allclose(
            total, R.get("video_motion")(clips, prompts) + 0.5 * np.asarray(want), rtol=1e-6)
        assert R.is_video_reward("video_motion") and not R.is_video_reward("test_brightness")
    finally:
        R.unregister("test_brightness")
    with pytest.raises(ValueError, match=r"reward 'video_motion' scores clips \[B, F, H, W, 3\]"):
        R.get("video_motion")(clips[:, 0], prompts)
