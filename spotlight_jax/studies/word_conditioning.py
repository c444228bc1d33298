"""Does the base model read every word of its prompts? Its loss with one word swapped.

  python -m spotlight_jax.studies.word_conditioning --config=configs/tiny_video.py
      [--clips 256] [--ceiling] [--config.base_checkpoint=PATH] [--out F.json]

Renders ``--clips`` clips of the video world's training prompts, noises them to several flow
times t (the same noise for every prompt) and measures the base model's flow-matching loss
with the true prompt and with one word replaced (``world.video.vary``: the count, the color, the
shape or the direction). A word the model reads costs loss when it is wrong; a word it ignores
costs nothing: RL can only select among clips that a word changes. Run it on a candidate base
before a demo (docs/video.md).

``--ceiling`` adds pure noise (t = 1) to the flow times and, beside the model's gaps there, the
gap of the best possible model (:func:`pure_noise_ceiling`) and of the best model without
absolute positions (:func:`position_free`): how much of what a word decides the model reads
where the sampler starts, and how much it could without knowing where a pixel is.
"""
from __future__ import annotations

import functools
import tempfile

import numpy as np
from absl import app, flags

from spotlight_jax import programs

FLAGS = flags.FLAGS
TIMES = (0.95, 0.85, 0.7, 0.5, 0.3, 0.15)


def word_loss_gaps(model, clips, prompts, tokenize, text_len: int, *, times=TIMES,
                   words=None, seed: int = 0) -> dict[str, list[float]]:
    """``{"loss": [per t], word: [per t], ...}``: the mean flow-matching loss of ``model`` on
    ``clips [B, F, H, W, 3]`` in [0, 1] with their ``prompts`` at each flow time in ``times``,
    and for each word of ``words`` (default every word of a video prompt) the mean increase of
    that loss when the word is swapped for another value."""
    import jax
    import jax.numpy as jnp

    from spotlight_jax.diffusion import from_image, prompt
    from spotlight_jax.world import video

    words = video.WORDS if words is None else tuple(words)
    rng = np.random.default_rng(seed)
    x0 = from_image(jnp.asarray(clips, jnp.float32))
    noise = jax.random.normal(jax.random.key(seed), x0.shape)

    @jax.jit
    def losses(t, tokens, mask):
        xt = (1 - t) * x0 + t * noise
        embeds, _ = prompt.model_inputs(tokens)
        v = model(xt, jnp.full((x0.shape[0],), t), embeds, mask)
        return jnp.mean((v - (noise - x0)) ** 2, axis=tuple(range(1, x0.ndim)))

    true = tokenize(list(prompts), text_len)
    swapped = {w: tokenize([video.vary(p, w, rng) for p in prompts], text_len) for w in words}
    out = {"t": list(times), "loss": []}
    for w in words:
        out[w] = []
    for t in times:
        base = losses(jnp.float32(t), *true)
        out["loss"].append(float(base.mean()))
        for w in words:
            out[w].append(float((losses(jnp.float32(t), *swapped[w]) - base).mean()))
    return out


def mean_gap(a, b) -> float:
    """An unbiased estimate of ``||E[a] - E[b]||^2 / D`` from samples ``a [n, ...]`` and
    ``b [m, ...]`` (D values each): the squared distance of the sample means less the variance
    each sample mean carries."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d2 = np.sum((a.mean(0) - b.mean(0)) ** 2)
    d2 -= a.var(0, ddof=1).sum() / len(a) + b.var(0, ddof=1).sum() / len(b)
    return float(d2 / a[0].size)


def pure_noise_ceiling(render, pool, alternatives, words, n: int = 400) -> dict[str, float]:
    """Per word, the loss gap of the best possible model at pure noise (t = 1), averaged over
    ``pool``'s prompts and every alternative of the word (``alternatives(prompt, word)``; the
    study's swaps draw one of them). At t = 1, x_t is the noise itself, so the loss-minimising
    velocity is ``noise - E[x0 | prompt]`` and a swapped prompt c' costs ``||E[x0 | c] -
    E[x0 | c']||^2 / D`` in expectation over c's clips (:func:`mean_gap` of ``n`` clips each,
    ``render(prompt, n) -> [n, ...]`` in the model's range). Also that best model's loss
    (``"loss"``: the clips' variance under their prompt) and the best loss of a model blind to
    the prompt (``"loss_blind"``: their spread around the pool's mean clip)."""
    cache = {}

    def clips(p):
        if p not in cache:
            cache[p] = np.asarray(render(p, n), np.float64)
        return cache[p]

    out = {w: float(np.mean([mean_gap(clips(p), clips(q)) for p in pool
                             for q in alternatives(p, w)])) for w in words}
    pooled_mean = np.mean([clips(p).mean(0) for p in pool], 0)
    out["loss"] = float(np.mean([clips(p).var(0, ddof=1).mean() for p in pool]))
    out["loss_blind"] = float(np.mean([((clips(p) - pooled_mean) ** 2).mean() for p in pool]))
    return out


def position_free(render):
    """``render`` with each clip replaced by its mean color, everywhere: at pure noise, the best
    a model without absolute positions (in space or time: RoPE alone) can output is such a
    clip, so :func:`pure_noise_ceiling` of it bounds what that model can read there."""
    def flat(p, n):
        c = np.asarray(render(p, n), np.float64)
        return np.broadcast_to(c.mean(axis=tuple(range(1, c.ndim - 1)), keepdims=True), c.shape)
    return flat


def report(gaps: dict, source: str, n: int, ceiling: dict | None = None,
           flat: dict | None = None) -> str:
    words = [k for k in gaps if k not in ("t", "loss")]
    lines = [f"{n} clips of the training prompts, base: {source}",
             "loss increase when one word is swapped (0 = the model ignores it)", "",
             "| t | loss | " + " | ".join(words) + " |", "|---" * (len(words) + 2) + "|"]
    for i, t in enumerate(gaps["t"]):
        lines.append(f"| {t:.2f} | {gaps['loss'][i]:.4f} | "
                     + " | ".join(f"{gaps[w][i]:+.4f}" for w in words) + " |")
    if ceiling:
        lines.append(f"| 1.00, the best possible model | {ceiling['loss']:.4f} (blind to the "
                     f"prompt: {ceiling['loss_blind']:.4f}) | "
                     + " | ".join(f"{ceiling[w]:+.4f}" for w in words) + " |")
    if flat:
        lines.append("| 1.00, the best model without absolute positions | | "
                     + " | ".join(f"{flat[w]:+.4f}" for w in words) + " |")
    return "\n".join(lines)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This study's flags (defined only when it runs as the program; see ``programs``)."""
    fv = dict(flag_values=flag_values)
    programs.define_config_flag(flag_values)
    flags.DEFINE_integer("clips", 256, "Clips of training prompts to score.", **fv)
    flags.DEFINE_integer("seed", 0, "Seed of the prompts, clips, noise and swapped words.", **fv)
    flags.DEFINE_bool("ceiling", False, "Also t = 1, and there the gaps of the best possible "
                      "model and of the best model without absolute positions (400 rendered "
                      "clips per prompt).", **fv)
    flags.DEFINE_string("out", None, "Write the gaps as JSON here.", **fv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from flax import nnx

    from spotlight_jax import world
    from spotlight_jax.config import RunSpec
    from spotlight_jax.models.factory import is_video
    from spotlight_jax.runner import base_model
    from spotlight_jax.world import video

    spec = RunSpec.from_config(FLAGS.config)
    if not is_video(spec.model):
        raise app.UsageError(f"--config={FLAGS.config!r} is an image model's; this study reads "
                             "the video world's prompts (e.g. --config=configs/tiny_video.py)")
    with tempfile.TemporaryDirectory() as workdir:    # no run: only a shipped or named base
        graphdef, state, source = base_model.load_or_pretrain_base(spec, workdir,
                                                              allow_pretrain=False)
    wcfg = world.WorldConfig(image_size=spec.model.image_size)
    rng = np.random.default_rng(FLAGS.seed)
    pool = video.video_train_prompts(wcfg)
    prompts = [pool[i] for i in rng.integers(len(pool), size=FLAGS.clips)]
    clips = np.stack([video.render_video(p, rng, spec.model.frames, cfg=wcfg) for p in prompts])
    times = ((1.0,) if FLAGS.ceiling else ()) + TIMES
    gaps = word_loss_gaps(nnx.merge(graphdef, state), clips, prompts,
                          spec.prompt_source().tokenize, spec.model.text_len, times=times,
                          seed=FLAGS.seed)
    ceiling = flat = None
    if FLAGS.ceiling:
        def render(p, n):
            return np.stack([video.render_video(p, rng, spec.model.frames, cfg=wcfg)
                             for _ in range(n)]) * 2.0 - 1.0      # the model's range
        alternatives = functools.partial(video.alternatives, cfg=wcfg)
        ceiling = pure_noise_ceiling(render, pool, alternatives, video.WORDS)
        flat = pure_noise_ceiling(position_free(render), pool, alternatives, video.WORDS)
    programs.emit({"base": source, "clips": FLAGS.clips, **gaps,
                   **({"ceiling_t1": ceiling, "ceiling_t1_position_free": flat}
                      if ceiling else {})},
                  report(gaps, source, FLAGS.clips, ceiling, flat), FLAGS.out)


if __name__ == "__main__":
    define_flags()
    app.run(main)
