"""The word-conditioning study: a model that reads one word of the prompt shows a loss gap for
that word alone, equal to the gap computed by hand; a model that reads no word shows none."""
import jax.numpy as jnp
import numpy as np
import pytest

from spotlight_jax.studies.word_conditioning import word_loss_gaps
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
