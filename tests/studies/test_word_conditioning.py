"""The word-conditioning study: a model that reads one word of the prompt shows a loss gap for
that word alone, equal to the gap computed by hand; a model that reads no word shows none."""
import jax.numpy as jnp
import numpy as np
import pytest

from spotlight_jax.studies.word_conditioning import (
    mean_gap,
    position_free,
    pure_noise_ceiling,
    word_loss_gaps,
)
from spotlight_jax.world import tokenize, video

TIMES = (0.9, 0.4)


def _clips(n=12, seed=0):
    rng = np.random.default_rng(seed)
    pool = video.video_train_prompts()
    prompts = [pool[i] for i in rng.integers(len(pool), size=n)]
    return np.stack([video.render_video(p, rng, 5) for p in prompts]), prompts


def test_a_model_reading_no_word_has_no_gap():
    clips, prompts = _clips()

    def blind(xt, t, embeds, mask):
        return -xt

    gaps = word_loss_gaps(blind, clips, prompts, tokenize, 8, times=TIMES)
    for w in video.WORDS:
        assert gaps[w] == [0.0, 0.0]
    assert all(loss > 0 for loss in gaps["loss"])


def test_a_model_reading_the_color_word_has_that_gap_alone():
    clips, prompts = _clips()

    def reads_color(xt, t, embeds, mask):           # token 1 of "a red square ..." is the color
        return jnp.zeros_like(xt) + 0.01 * embeds[:, 1].astype(jnp.float32)[:, None, None, None,
                                                                             None]

    gaps = word_loss_gaps(reads_color, clips, prompts, tokenize, 8, times=TIMES, seed=3)
    assert gaps["count"] == gaps["shape"] == gaps["direction"] == [0.0, 0.0]
    # by hand: the same noise and the same swapped prompts (word_loss_gaps draws them with
    # np.random.default_rng(seed) in WORDS order)
    import jax

    from spotlight_jax.diffusion import from_image
    rng = np.random.default_rng(3)
    swapped = {w: [video.vary(p, w, rng) for p in prompts] for w in video.WORDS}
    x0 = np.asarray(from_image(jnp.asarray(clips)), np.float64)
    noise = np.asarray(jax.random.normal(jax.random.key(3), x0.shape), np.float64)
    target = noise - x0

    def loss(ps):
        c = 0.01 * tokenize(ps, 8)[0][:, 1].astype(np.float64)
        return np.mean((c[:, None, None, None, None] - target) ** 2, axis=(1, 2, 3, 4))

    want = float(np.mean(loss(swapped["color"]) - loss(prompts)))
    assert gaps["color"] == pytest.approx([want, want], rel=1e-4, abs=1e-7)
    assert abs(want) > 1e-4


def test_vary_changes_exactly_one_word():
    rng = np.random.default_rng(0)
    p = "two blue bars falling"
    for w in video.WORDS:
        for _ in range(5):
            q = video.parse_video(video.vary(p, w, rng))
            s = video.parse_video(p)
            changed = [k for k in video.WORDS if getattr(q, k) != getattr(s, k)]
            assert changed == [w]
    with pytest.raises(ValueError, match="words are"):
        video.vary(p, "speed", rng)


def test_mean_gap_is_the_distance_of_the_means_without_the_samples_variance():
    a, b = np.full((5, 2, 3), 0.5), np.full((7, 2, 3), -0.5)     # no spread: exact
    assert mean_gap(a, b) == pytest.approx(1.0)
    rng = np.random.default_rng(0)                                # spread: unbiased
    mu = rng.normal(size=(4, 4))
    est, raw = [], []
    for _ in range(400):
        a, b = mu + rng.normal(size=(50, 4, 4)), rng.normal(size=(30, 4, 4))
        est.append(mean_gap(a, b))
        raw.append(float(np.mean((a.mean(0) - b.mean(0)) ** 2)))
    want = float(np.mean(mu ** 2))
    assert np.mean(est) == pytest.approx(want, rel=0.03)
    # what the correction removes: the sample means' variance, 1/50 + 1/30 per value
    assert np.mean(raw) == pytest.approx(want + 1 / 50 + 1 / 30, rel=0.03)


def test_pure_noise_ceiling_is_the_loss_gap_of_the_optimal_model_at_t1():
    """At t = 1 the optimal velocity is noise - E[x0 | prompt]; the ceiling equals that model's
    loss gap per word written out: over the prompt's clips, ||m_q - x0||^2 - ||m_p - x0||^2."""
    prompts = ["a red square moving left", "a blue square moving left",
               "two red squares moving left", "a red square moving right"]
    means = {p: np.full((1, 2, 2, 3), i / 4) for i, p in enumerate(prompts)}

    def alternatives(p, w):
        return {("a red square moving left", "color"): ["a blue square moving left"],
                ("a red square moving left", "count"): ["two red squares moving left"],
                ("a red square moving left", "direction"): ["a red square moving right"]
                }.get((p, w), [])

    words = ("color", "count", "direction")
    got = pure_noise_ceiling(lambda p, n: np.repeat(means[p], n, 0), prompts[:1], alternatives,
                             words, n=8)
    # the optimal model's gap for one swap: the mean over clips of ||m_q - x0||^2 - ||m_p - x0||^2
    x0 = means[prompts[0]][0]
    for w in words:
        q = alternatives(prompts[0], w)[0]
        want = np.mean((means[q][0] - x0) ** 2) - np.mean((means[prompts[0]][0] - x0) ** 2)
        assert got[w] == pytest.approx(want)
    assert got["direction"] > got["count"] > got["color"] > 0
    assert got["loss"] == got["loss_blind"] == 0.0     # one prompt, clips without spread


def test_pure_noise_best_losses_with_and_without_the_prompt():
    rng = np.random.default_rng(0)
    means = {"p": np.zeros((2, 3)), "q": np.ones((2, 3))}

    def render(p, n):
        return means[p] + 0.5 * rng.normal(size=(n, 2, 3))

    got = pure_noise_ceiling(render, ["p", "q"], lambda p, w: [], (), n=4000)
    assert got["loss"] == pytest.approx(0.25, rel=0.05)              # the spread alone
    assert got["loss_blind"] == pytest.approx(0.25 + 0.25, rel=0.05)  # + each mean's 0.5 offset


def test_alternatives_are_what_vary_draws_from():
    p = "two blue bars falling"
    rng = np.random.default_rng(1)
    for w in video.WORDS:
        alts = video.alternatives(p, w)
        assert p not in alts and len(set(alts)) == len(alts)
        assert {video.vary(p, w, rng) for _ in range(60)} == set(alts)


def test_a_position_free_model_reads_only_the_mean_color():
    """Two prompts whose clips hold the same colors in other places: the best model reads the
    difference, the best one without positions cannot; a brighter clip it can."""
    left, right, bright = np.zeros((1, 2, 2, 3)), np.zeros((1, 2, 2, 3)), np.ones((1, 2, 2, 3))
    left[0, :, 0], right[0, :, 1] = 1.0, 1.0
    clips = {"left": left, "right": right, "bright": bright}

    def render(p, n):
        return np.repeat(clips[p], n, 0)

    def alternatives(p, w):
        return {"where": ["right"], "how": ["bright"]}[w] if p == "left" else []

    full = pure_noise_ceiling(render, ["left"], alternatives, ("where", "how"), n=4)
    flat = pure_noise_ceiling(position_free(render), ["left"], alternatives, ("where", "how"),
                              n=4)
    assert full["where"] == pytest.approx(1.0) and flat["where"] == pytest.approx(0.0)
    assert full["how"] == pytest.approx(0.5) and flat["how"] == pytest.approx(0.25)
