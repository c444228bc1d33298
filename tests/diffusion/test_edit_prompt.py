"""An editing prompt carries its input image (``diffusion.prompt.IMAGE``) through every row
operation: guidance's null prompt keeps the image and drops the words, prompt dropout too, and
``rollout.velocity`` hands the image to both of guidance's forwards, equal to calling the
model directly; a rollout of an editing model runs end to end."""
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spotlight_jax.diffusion import prompt, rollout
from spotlight_jax.models import MMDiT, MMDiTConfig

CFG = MMDiTConfig(image_size=8, channels=3, patch_size=2, width=32, depth=1, num_heads=2,
                  text_len=4, text_width=16, text_layers=1, text_heads=2, reference_images=1)


@pytest.fixture(scope="module")
def model():
    m = MMDiT(CFG, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    # the zero-initialised output layers would make every velocity 0: give them weights
    for layer in (m.final, m.final_mod, m.blocks[0].img.mod, m.blocks[0].txt.mod):
        layer.kernel[...] = rng.normal(size=layer.kernel.shape) * 0.1
    return m


def inputs(b=2):
    rng = np.random.default_rng(1)
    image = jnp.asarray(rng.normal(size=(b, 8, 8, 3)), jnp.float32)
    tokens = {prompt.EMBEDS: jnp.asarray(rng.integers(1, 60, size=(b, 4))),
              prompt.IMAGE: image}
    mask = jnp.ones((b, 4), bool).at[1, 2:].set(False)
    x = jnp.asarray(rng.normal(size=(b, 8, 8, 3)), jnp.float32)
    return x, tokens, mask, image


def test_the_null_prompt_keeps_the_image_and_drops_the_words():
    _, tokens, mask, image = inputs()
    null, null_mask = prompt.null_prompt(tokens, mask)
    assert null[prompt.IMAGE] is image
    assert not np.asarray(null[prompt.EMBEDS]).any() and not np.asarray(null_mask).any()
    kept, _ = prompt.drop(tokens, mask, jnp.array([True, False]))
    np.testing.assert_array_equal(kept[prompt.IMAGE], image)
    np.testing.assert_array_equal(kept[prompt.EMBEDS][1], 0)
    # a prompt-embedding file's carried null prompt gets the row's image too
    filed = {**tokens, prompt.NULL: {prompt.EMBEDS: jnp.zeros((2, 4), jnp.int32),
                                     prompt.MASK: jnp.zeros((2, 4), bool)}}
    assert prompt.null_prompt(filed, mask)[0][prompt.IMAGE] is image


def test_guided_velocity_passes_the_image_to_both_forwards(model):
    x, tokens, mask, image = inputs()
    t = jnp.full((2,), 0.6)
    guided = nnx.jit(lambda m, tokens: rollout.velocity(m, x, 0.6, tokens, mask, guidance=4.0))
    direct = nnx.jit(lambda m, words, mask: m(x, t, words, mask, image_latents=image))
    got = guided(model, tokens)
    cond = direct(model, tokens[prompt.EMBEDS], mask)
    uncond = direct(model, jnp.zeros_like(tokens[prompt.EMBEDS]), jnp.zeros_like(mask))
    np.testing.assert_allclose(got, uncond + 4.0 * (cond - uncond), rtol=1e-5, atol=1e-5)
    other = guided(model, {**tokens, prompt.IMAGE: image[::-1]})
    assert np.abs(np.asarray(other) - np.asarray(got)).max() > 1e-4   # the image is used


def test_an_editing_model_without_its_image_says_so(model):
    x, tokens, mask, _ = inputs()
    with pytest.raises(ValueError, match=r"^image_latents=None: this model edits an input "
                                         r"image"):
        rollout.velocity(model, x, 0.6, tokens[prompt.EMBEDS], mask)


def test_encode_prompt_context_gives_the_same_guided_velocity(model):
    x, tokens, mask, _ = inputs()
    context = nnx.jit(lambda m: rollout.encode_prompt(m, tokens, mask, guidance=4.0))(model)
    direct = nnx.jit(lambda m: rollout.velocity(m, x, 0.3, tokens, mask, guidance=4.0))(model)
    cached = nnx.jit(lambda m, c: rollout.velocity(m, x, 0.3, tokens, mask, guidance=4.0,
                                                   context=c))(model, context)
    np.testing.assert_allclose(cached, direct, rtol=1e-5, atol=1e-5)
