"""Flow-matching pretraining of the base MMDiT on the synthetic world's data stream.

Rectified flow: ``x_t = (1 - t) x0 + t noise``, target velocity ``noise - x0``, ``t`` from a
logit-normal (or uniform) distribution shifted toward high noise, 10% prompt dropout for CFG, an
EMA of the weights for sampling. The train step is pure and jitted with donation; its key is
``fold_in(key, step)``. The detector reward of EMA samples on held-out prompts is logged as it
trains.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from spotlight_jax import rewards, world
from spotlight_jax.diffusion import Sampler, SamplerConfig, from_image, prompt, sample_t
from spotlight_jax.evaluate import evaluate
from spotlight_jax.io.metrics import MetricWriter
from spotlight_jax.models.factory import is_edit, is_video
from spotlight_jax.world import edit, video

T_SAMPLING = ("uniform", "logit_normal")   # diffusion.sample_t's kinds


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    steps: int = 3000
    batch_size: int = 64
    lr: float = 1e-3
    warmup: int = 200
    end_lr_frac: float = 0.1
    weight_decay: float = 0.0
    t_sampling: str = "logit_normal"
    t_shift: float = 3.0
    prompt_dropout: float = 0.1
    ema: float = 0.999
    eval_every: int = 500
    eval_prompts: int = 64
    eval_seeds: int = 2
    grad_clip: float = 1.0
    # Start from the parameters of this checkpoint where names and shapes match (a model grown
    # by zero-initialised modules continues from the smaller one); "" = from scratch.
    init_from: str = ""
    # Curriculum stages: train only on these task kinds (comma-separated, e.g. "position";
    # "" = every kind, balanced) and only at flow times t >= t_min (the high-noise regime where
    # the layout is decided; the t distribution above is rescaled onto [t_min, 1]).
    kinds: str = ""
    t_min: float = 0.0

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"{name}={getattr(self, name)!r}: {why}")

        try:
            world.parse_kinds(self.kinds)
        except ValueError as e:
            bad("kinds", str(e))
        if not 0.0 <= self.t_min < 1.0:
            bad("t_min", "must be in [0, 1)")
        for name in ("steps", "batch_size", "eval_prompts", "eval_seeds"):
            if getattr(self, name) < 1:
                bad(name, "must be >= 1")
        for name in ("warmup", "eval_every"):
            if getattr(self, name) < 0:
                bad(name, "must be >= 0")
        for name in ("lr", "grad_clip", "t_shift"):
            if not getattr(self, name) > 0:
                bad(name, "must be > 0")
        if self.weight_decay < 0:
            bad("weight_decay", "must be >= 0")
        if not 0.0 <= self.end_lr_frac <= 1.0:
            bad("end_lr_frac", "must be in [0, 1] (the final lr as a share of lr)")
        if not 0.0 <= self.prompt_dropout < 1.0:
            bad("prompt_dropout", "must be in [0, 1)")
        if not 0.0 <= self.ema < 1.0:
            bad("ema", "must be in [0, 1) (e.g. ema=0.999)")
        if self.t_sampling not in T_SAMPLING:
            bad("t_sampling", f"choose one of {T_SAMPLING}")

    @property
    def kind_list(self) -> tuple[str, ...]:
        return world.parse_kinds(self.kinds)


def make_optimizer(cfg: PretrainConfig):
    """AdamW with a linear warm-up and a cosine decay; a run shorter than its warm-up warms up
    over all but its last step (a few-step base for a smoke test or a device check)."""
    steps = max(cfg.steps, 2)
    warmup = min(max(cfg.warmup, 1), steps - 1)
    sched = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, warmup, steps,
                                               cfg.lr * cfg.end_lr_frac)
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                       optax.adamw(sched, weight_decay=cfg.weight_decay))


def flow_matching_loss(model, x0, tokens, mask, key, cfg: PretrainConfig):
    b = x0.shape[0]
    k_t, k_n, k_d = jax.random.split(key, 3)
    t = sample_t(k_t, b, kind=cfg.t_sampling, shift=cfg.t_shift)
    t = cfg.t_min + (1.0 - cfg.t_min) * t
    noise = jax.random.normal(k_n, x0.shape)
    tb = t.reshape((b,) + (1,) * (x0.ndim - 1))
    xt = (1 - tb) * x0 + tb * noise
    keep = jax.random.uniform(k_d, (b,)) >= cfg.prompt_dropout
    # dropped prompts become the sampler's guidance null prompt (diffusion.prompt.null_prompt:
    # a prompt-embedding file's empty prompt, else zero tokens or embeddings with no mask)
    tokens, mask = prompt.drop(tokens, mask, keep)
    kwargs = {k: v for k, v in prompt.model_kwargs(tokens).items() if v is not None}
    v = model(xt, t, prompt.model_inputs(tokens)[0], mask, **kwargs)
    return jnp.mean((v - (noise - x0)) ** 2)


def make_train_step(graphdef, optimizer, cfg: PretrainConfig):
    def step(state, opt_state, ema, images, tokens, mask, key, step_idx):
        key = jax.random.fold_in(key, step_idx)

        def loss_fn(s):
            return flow_matching_loss(nnx.merge(graphdef, s), from_image(images), tokens, mask,
                                      key, cfg)

        loss, grads = jax.value_and_grad(loss_fn)(state)
        updates, opt_state = optimizer.update(grads, opt_state, state)
        state = optax.apply_updates(state, updates)
        # EMA warm-up: early on the average must not be dominated by the initial weights
        # (adaLN-Zero init predicts v = 0, so a cold EMA samples washed-out noise).
        decay = jnp.minimum(cfg.ema, (1.0 + step_idx) / (10.0 + step_idx))
        ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, ema, state)
        return state, opt_state, ema, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    return jax.jit(step, donate_argnums=(0, 1, 2))


class Prefetcher:
    """Renders the next batches in a background thread so data never stalls the train step.
    ``tokenize``: the run's prompt source's (default the world's tokenizer)."""

    def __init__(self, stream, text_len: int, depth: int = 4, tokenize=world.tokenize):
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stream, self._text_len, self._tokenize = stream, text_len, tokenize
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        for prompts, images in self._stream:
            if self._stop.is_set():
                return
            tokens, mask = self._tokenize(prompts, self._text_len)
            self._q.put((images, tokens, mask))

    def __next__(self):
        return self._q.get()

    def close(self):
        self._stop.set()


def pretrain(graphdef, state, model_cfg, cfg: PretrainConfig, eval_sampler_cfg: SamplerConfig, *,
             workdir: str, world_cfg=None, seed: int = 0, start_step: int = 0, opt_state=None,
             ema=None, progress: bool = True, log_name: str = "pretrain", on_eval=None,
             tokenize=world.tokenize):
    """Runs ``cfg.steps`` of flow-matching pretraining on the world's images (a video model's:
    the video world's clips, evaluated by ``video_motion``; an editing model's: the editing
    world's edited scenes given instruction and source, evaluated by ``edit_lite``); returns
    ``(state, opt_state, ema, history)``. ``on_eval(step, state, ema, result)`` is called
    after each evaluation (snapshots).
    ``tokenize``: the run's prompt source's (``config.prompt_source``; default the world's
    tokenizer): the images are the world's, rendered from its prompts, whatever encodes them.
    """
    world_cfg = world_cfg or world.WorldConfig(image_size=model_cfg.image_size)
    optimizer = make_optimizer(cfg)
    opt_state = optimizer.init(state) if opt_state is None else opt_state
    ema = jax.tree.map(jnp.copy, state) if ema is None else ema
    step_fn = make_train_step(graphdef, optimizer, cfg)
    clips = is_video(model_cfg)
    if clips:                   # the video world: moving shapes, scored by their motion
        if cfg.kind_list:
            raise ValueError(f"kinds={cfg.kinds!r}: task kinds are the image world's; a video "
                             "model pretrains on every video prompt (kinds='')")
        prompts, val = video.video_train_prompts(world_cfg), video.video_val_prompts(world_cfg)
        stream = video.video_stream(prompts, cfg.batch_size, seed + start_step,
                                    model_cfg.frames, cfg=world_cfg)
        eval_reward = rewards.resolve("video_motion")
    elif is_edit(model_cfg):    # the editing world: instruction + source -> the edited scene
        if cfg.kind_list:
            raise ValueError(f"kinds={cfg.kinds!r}: task kinds are the image world's; an "
                             "editing model pretrains on every edit kind (kinds='')")
        val = edit.edit_prompts(edit.val_tasks(world_cfg))
        stream = edit.edit_stream(edit.train_tasks(world_cfg), cfg.batch_size,
                                  seed + start_step, world_cfg)
        eval_reward = rewards.resolve("edit_lite")
    else:
        if cfg.kind_list:
            by_kind = world.prompts_by_kind(world_cfg, "train")
            prompts = [p for k in cfg.kind_list for p in by_kind[k]]
        else:
            prompts = world.train_prompts(world_cfg)
        val = world.val_prompts(world_cfg)
        stream = world.data_stream(prompts, cfg.batch_size, seed + start_step, world_cfg)
        eval_reward = None                  # evaluate's default: geneval_lite
    rng = np.random.default_rng(seed)
    val = [val[i] for i in sorted(rng.choice(len(val), min(cfg.eval_prompts, len(val)),
                                             replace=False))]
    eval_sampler = Sampler(graphdef, model_cfg.latent_shape, eval_sampler_cfg)
    data = Prefetcher(stream, model_cfg.text_len, tokenize=tokenize)
    writer = MetricWriter(workdir, log_name)
    key = jax.random.key(seed)
    history = []

    def run_eval(step):
        res, _, _ = evaluate(eval_sampler, ema, val, num_seeds=cfg.eval_seeds,
                             text_len=model_cfg.text_len, reward=eval_reward, tokenize=tokenize)
        res.pop("scores")
        writer.write(step, **{f"eval/{k}": v for k, v in res.items()})
        history.append({"step": step, **res})
        return res

    if start_step == 0 and cfg.eval_every:
        run_eval(0)
    bar = tqdm(range(start_step, cfg.steps), disable=not progress, desc="pretrain",
               dynamic_ncols=True, initial=start_step, total=cfg.steps)
    t0, losses = time.time(), []
    for step in bar:
        images, tokens, mask = next(data)
        state, opt_state, ema, m = step_fn(state, opt_state, ema, images, tokens, mask, key,
                                           jnp.int32(step))
        losses.append(m["loss"])
        if (step + 1) % 50 == 0 or step + 1 == cfg.steps:
            loss = float(np.mean(jax.device_get(losses)))
            if not np.isfinite(loss):
                raise FloatingPointError(f"pretraining loss is {loss} at step {step + 1}; lower "
                                         "pretrain.lr or check the data")
            losses = []
            writer.write(step + 1, loss=loss, grad_norm=float(m["grad_norm"]),
                         steps_per_s=(step + 1 - start_step) / (time.time() - t0))
            bar.set_postfix(loss=f"{loss:.4f}")
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            res = run_eval(step + 1)
            if on_eval is not None:
                on_eval(step + 1, state, ema, res)
            accs = " ".join(f"{k[4:]}={v:.2f}" for k, v in res.items() if k.startswith("acc_"))
            bar.write(f"step {step + 1}: held-out reward {res['reward']:.3f} {accs}")
    data.close()
    writer.close()
    return state, opt_state, ema, history
