"""The accelerator check: a real-shape model at reduced depth, timed on whatever device JAX has.

  python -m spotlight_jax.bench.device_check [--config=configs/qwen_image.py] [--depth=8]
      [--latent=128] [--batch=4] [--parts=attention,paths,...,iteration]
      [--profile_depth=2] [--iteration_set=k=v,...] [--stand_in_reward=pickscore]
      [--stand_in_layers=0] [--out=device_check.json]

The one prepared script for a lent GPU (see docs/performance.md, "Accelerator check"), in
parts, each a median of ``--repeats`` timed runs after a compile; the JSON is rewritten after
every part, so a run cut short keeps what it measured:

1. ``attention``: ``jax.nn.dot_product_attention`` at the model's joint sequence (text + image
   tokens, heads, head_dim) in the compute dtype, ``implementation='xla'`` against ``'cudnn'``
   (flash attention; GPU only), forward and forward+backward, with the largest difference.
2. ``paths``: the project's attention (``parallel.attention``, the kernel ``auto`` picks, text
   padding masked, text last) against that kernel called alone, dense, and with two or more
   devices Ulysses and ring over all of them (each against the dense result).
3. ``model``: one velocity evaluation of the config's MMDiT at ``--depth`` blocks (the real
   width, heads, text length and dtype), ``--batch`` latents of ``--latent``^2 cells, and its
   full fine-tuning train step (flow-matching loss, AdamW, donated state); the attention kernel
   the compiled forward calls (read from its HLO).
4. ``lora``: the same train step with LoRA r32 adapters, the optimizer on the adapters only.
5. ``concurrent``: with two or more devices, a train step on one device while a rollout step
   runs on another (training and exploration on disjoint devices), against running them one
   after the other; skipped, and said so, with one device.
6. ``profile``: ``bench.device_profile`` at ``--profile_depth`` (the cost model's image size;
   the decode and a PickScore-shaped reward timed on random-weight stand-ins where no weights
   are on the device), also written alone beside ``--out`` (``*_profile.json``) for
   ``cost.profile_file``.
7. ``iteration``: a few Spotlight iterations (``spotlight`` and ``spotlight_pipelined``) of the
   demo's world at Qwen-Image's compute shape at 512 px (``ITERATION_SET``: width 3072, 24
   heads, 1024 image + 256 text tokens, bf16, 2 blocks, a 2-step base), the trainer and the
   fleet sharing this machine's devices, scoring with a learned reward in the loop (PickScore's
   CLIP with random weights: ``--stand_in_reward``); each phase's time, images/s and MFU from
   the runs' own ``rl.jsonl``.
8. ``remat``: the full train step with remat under each ``model.remat_policy`` (at
   ``REMAT_DEPTH`` blocks at most: the policies differ per block).

On a CPU it runs too (``--config=configs/tiny.py --depth=1 --latent=8``: what the tests do), so the
script cannot rot between GPU loans; the cuDNN rows then say they were skipped.
"""
from __future__ import annotations

import json
import statistics
import time

from absl import app, flags

from spotlight_jax import programs
from spotlight_jax.bench import device_profile

FLAGS = flags.FLAGS
# in the order of what a short device loan should measure first (each written as it finishes)
PARTS = ("attention", "paths", "model", "lora", "concurrent", "profile", "iteration", "remat")
REMAT_DEPTH = 2          # the policies differ per block: two blocks compile three times faster
LORA_RANK = 32           # the paper's setting
# part iteration: the demo's world at Qwen-Image's compute shape at 512 px (width 3072, 24
# heads, 64^2 pixels in 2x2 patches = the 1024 tokens of a 64^2 latent, 256 text tokens), bf16,
# 2 blocks, a 2-step base, a few iterations of 4 prompts x 8 seeds
ITERATION_MODES = ("spotlight", "spotlight_pipelined")
ITERATION_SET = ("model.width=3072", "model.num_heads=24", "model.depth=2",
                 "model.dtype=bfloat16", "model.param_dtype=bfloat16", "model.image_size=64",
                 "model.patch_size=2", "model.text_len=256", "model.conv_stem=0",
                 "model.conv_head=False", "model.pixel_head=0", "base_checkpoint=none",
                 "pretrain.steps=2", "pretrain.batch_size=4", "rl.prompts_per_iter=4",
                 "rl.group_size=8", "rl.iterations=3", "rl.eval_every=0",
                 "rl.max_minutes=0")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("config", str(programs.REPO / "configs" / "qwen_image.py"),
                        "Config file whose model shapes are checked.", **fv)
    flags.DEFINE_integer("depth", 2, "Blocks of the model (reduced depth, real width).", **fv)
    flags.DEFINE_integer("latent", 128, "Latent cells per side (128 = a 1024^2 image at /8).",
                         **fv)
    flags.DEFINE_integer("batch", 1, "Latents per forward / train step.", **fv)
    flags.DEFINE_integer("repeats", 5, "Timed runs per measurement (median).", **fv)
    flags.DEFINE_list("parts", list(PARTS), f"Parts to run, of {PARTS}.", **fv)
    flags.DEFINE_integer("profile_depth", 2, "Blocks of the profiled model (part profile).",
                         **fv)
    flags.DEFINE_list("iteration_set", list(ITERATION_SET), "Part iteration: the "
                      "configs/tiny.py overrides its runs take (key=value).", **fv)
    flags.DEFINE_string("stand_in_reward", "pickscore", "Parts profile and iteration: the "
                        "learned reward timed on its random-weight stand-in ('' = the "
                        "config's / the world's own).", **fv)
    flags.DEFINE_integer("stand_in_layers", 0, "Layers per tower of the stand-in reward (0 = "
                         "the real model's).", **fv)
    flags.DEFINE_string("out", None, "Write the results as JSON here (after every part).", **fv)


def median_seconds(fn, repeats: int) -> float:
    """Median wall seconds of ``fn()`` (which must block on its result) after one warm-up."""
    fn()
    ts = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def check_attention(batch, seq, heads, head_dim, dtype, repeats):
    """Rows ``{implementation, fwd_ms, fwd_bwd_ms, max_abs_diff_vs_xla}``; cuDNN only on GPU."""
    import jax  # noqa: PLC0415 - benchmarks import JAX after the device set-up
    import jax.numpy as jnp  # noqa: PLC0415

    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, (batch, seq, heads, head_dim), dtype) for kk in keys)
    rows, ref = [], None
    for impl in ("xla", "cudnn"):
        if impl == "cudnn" and jax.default_backend() != "gpu":
            rows.append({"implementation": impl, "skipped": "not a GPU backend"})
            continue

        def fwd(q, k, v, impl=impl):
            return jax.nn.dot_product_attention(q, k, v, implementation=impl)

        def loss(q, k, v, impl=impl):
            return jnp.sum(fwd(q, k, v).astype(jnp.float32) ** 2)

        try:
            f = jax.jit(fwd)
            g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            out = f(q, k, v).block_until_ready()
            row = {"implementation": impl,
                   "fwd_ms": 1e3 * median_seconds(lambda f=f: f(q, k, v).block_until_ready(),
                                                  repeats),
                   "fwd_bwd_ms": 1e3 * median_seconds(
                       lambda g=g: jax.block_until_ready(g(q, k, v)), repeats)}
        except Exception as e:  # noqa: BLE001 - an unsupported kernel is a result, not a crash
            rows.append({"implementation": impl, "skipped": f"{type(e).__name__}: {e}"[:200]})
            continue
        if ref is None:
            ref = out.astype(jnp.float32)
        row["max_abs_diff_vs_xla"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)))
        rows.append(row)
    return rows


def check_attention_paths(batch, text_len, image_len, heads, head_dim, dtype, repeats):
    """The project's attention (``parallel.attention`` with the kernel ``auto`` picks, the last
    quarter of the text keys masked, text last as the models put it for cuDNN) against that
    kernel called alone; Ulysses and ring over the most devices whose count divides the heads,
    against the dense result."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from spotlight_jax.parallel import MeshConfig, attention, kernels, make_mesh  # noqa: PLC0415

    seq = text_len + image_len
    keys = jax.random.split(jax.random.key(1), 3)
    q, k, v = (jax.random.normal(kk, (batch, seq, heads, head_dim), dtype) for kk in keys)
    valid = seq - text_len // 4
    mask = jnp.asarray(np.arange(seq)[None, :] < valid).repeat(batch, 0)
    kernel = kernels.resolve("auto", dtype, head_dim)
    lengths = jnp.full((batch,), valid, jnp.int32)

    def raw(q, k, v):          # the kernel alone, the padding said its own way
        if kernel.by_lengths:
            return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths,
                                                implementation=kernel.impl)
        return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None, None, :],
                                            implementation=kernel.impl)

    def timed(fn):
        f = jax.jit(fn)
        g = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) ** 2),
                             argnums=(0, 1, 2)))
        out = f(q, k, v)
        return out, {"fwd_ms": 1e3 * median_seconds(lambda: f(q, k, v).block_until_ready(),
                                                    repeats),
                     "fwd_bwd_ms": 1e3 * median_seconds(
                         lambda: jax.block_until_ready(g(q, k, v)), repeats)}

    result = {"kernel": kernel.impl, "seq": seq, "masked_keys": seq - valid}
    ref, result["kernel_alone"] = timed(raw)
    dense, result["dense"] = timed(lambda q, k, v: attention(q, k, v, kv_mask=mask,
                                                              implementation=kernel))
    result["dense"]["vs_kernel"] = result["dense"]["fwd_bwd_ms"] / \
        result["kernel_alone"]["fwd_bwd_ms"]
    ref = ref.astype(jnp.float32)
    result["dense"]["max_abs_diff"] = float(jnp.max(jnp.abs(dense.astype(jnp.float32) - ref)))
    # the SP degree: the most devices whose count divides the heads (Ulysses' condition)
    n = max(d for d in range(1, len(jax.devices()) + 1) if heads % d == 0)
    for strategy in ("ulysses", "ring"):
        if n < 2:
            result[strategy] = {"skipped": f"{len(jax.devices())} device(s), {heads} heads: "
                                           "no SP degree of two or more"}
            continue
        mesh = make_mesh(jax.devices()[:n], MeshConfig(data=1, fsdp=1, sp=n))
        out, row = timed(lambda q, k, v, s=strategy, m=mesh: attention(
            q, k, v, mesh=m, strategy=s, kv_mask=mask, implementation=kernel))
        row["max_abs_diff_vs_dense"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)))
        result[strategy] = {"devices": n, **row}
    return result


def attention_kernel_in_hlo(fn, *args) -> str:
    """Which attention kernel ``fn(*args)`` calls: ``cudnn`` when its lowered program has
    cuDNN's fused attention custom call (``__cudnn$fmha...``, emitted at lowering: no compile),
    else ``xla``."""
    import jax  # noqa: PLC0415

    return "cudnn" if "__cudnn$fmha" in jax.jit(fn).lower(*args).as_text() else "xla"


def build(config_path: str, depth: int, latent: int, **model):
    """``(model config, graphdef, state)`` of the config's model at ``depth`` blocks and a
    ``latent``^2 input, initialised at random on the default device."""
    from spotlight_jax import config as conf  # noqa: PLC0415
    from spotlight_jax.models.factory import create_model  # noqa: PLC0415

    config = conf.load_config(config_path, {"model.depth": depth, "model.image_size": latent,
                                            "model.scan_blocks": False,
                                            **{f"model.{k}": v for k, v in model.items()}})
    cfg = conf.model_config(config)
    graphdef, state = create_model(cfg)
    return cfg, graphdef, state


def inputs(cfg, batch: int, seed: int = 0):
    """Random latents, flow times and prompt inputs of the model's shapes and dtypes."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    ks = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(ks[0], (batch, *cfg.latent_shape))
    t = jax.random.uniform(ks[1], (batch,))
    if cfg.text_width:
        tokens = jax.random.randint(ks[2], (batch, cfg.text_len), 0, cfg.vocab_size)
    else:
        tokens = jax.random.normal(ks[2], (batch, cfg.text_len, cfg.text_embed_dim))
    return x, t, tokens, jnp.ones((batch, cfg.text_len), bool)


def check_model(cfg, graphdef, state, batch: int, repeats: int):
    """Forward and train-step timings of the model (full fine-tuning, AdamW, donated state),
    and the attention kernel its compiled forward calls."""
    import jax  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from spotlight_jax.bench.gpu_lowering import census, sequence_of  # noqa: PLC0415
    from spotlight_jax.models import count_params  # noqa: PLC0415

    x, t, tokens, mask = inputs(cfg, batch)
    # a copy: the train step donates it, and the other parts still read ``state``
    params = jax.tree.map(lambda a: a.copy(), nnx.to_pure_dict(state))

    def velocity(p, x, t):
        s = jax.tree.map(lambda a: a, state)
        nnx.replace_by_pure_dict(s, p)
        return nnx.merge(graphdef, s)(x, t, tokens, mask)

    fwd = jax.jit(velocity)
    fwd_s = median_seconds(lambda: fwd(params, x, t).block_until_ready(), repeats)
    train, carry, data, step_s = timed_train_step(velocity, params, x, t, repeats)
    # what the step's program asks for, lowered here (no compile): a kernel call per block
    # forward and backward, no score-sized value, when the fused kernel runs everywhere
    step_census = census(train.lower(carry["p"], carry["o"], *data).as_text(),
                         {sequence_of(cfg), cfg.text_len})
    return {"params": count_params(state), "forward_ms": 1e3 * fwd_s,
            "train_step_ms": 1e3 * step_s, "train_samples_per_s": batch / step_s,
            "hlo_attention_kernel": attention_kernel_in_hlo(velocity, params, x, t),
            "hlo_train_step": {"cudnn_forward": step_census.cudnn_forward,
                               "cudnn_backward": step_census.cudnn_backward,
                               "score_values": step_census.score_values,
                               "matmul_half_share": step_census.half_share}}, \
        (fwd, train, carry, data)


def timed_train_step(velocity, trainable, x, t, repeats: int):
    """``(step, carry, data, seconds)`` of a flow-matching train step of ``velocity(trainable,
    x, t)``: AdamW on ``trainable`` only, its state donated."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import optax  # noqa: PLC0415

    opt = optax.adamw(1e-5)
    opt_state = jax.jit(opt.init)(trainable)

    def step(p, o, x, t, eps):
        def loss(p):
            tb = t.reshape((-1,) + (1,) * (x.ndim - 1))
            xt = (1 - tb) * x + tb * eps
            return jnp.mean((velocity(p, xt, t) - (eps - x)) ** 2)
        value, grads = jax.value_and_grad(loss)(p)
        updates, o = opt.update(grads, o, p)
        return optax.apply_updates(p, updates), o, value

    train = jax.jit(step, donate_argnums=(0, 1))
    eps = jax.random.normal(jax.random.key(1), x.shape)
    carry = {"p": trainable, "o": opt_state}

    def one_step():
        carry["p"], carry["o"], value = train(carry["p"], carry["o"], x, t, eps)
        value.block_until_ready()

    return train, carry, (x, t, eps), median_seconds(one_step, repeats)


def check_lora(cfg, graphdef, state, batch: int, repeats: int, rank: int = LORA_RANK):
    """The train step with LoRA adapters of ``rank`` on the blocks' attention projections
    (``rl.lora``), AdamW on the adapters only, the base frozen."""
    import jax  # noqa: PLC0415

    from spotlight_jax.rl import lora as lora_lib  # noqa: PLC0415

    x, t, tokens, mask = inputs(cfg, batch)
    lora = lora_lib.init_lora(state, rank, jax.random.key(2))

    def velocity(adapters, x, t):   # applied factored, as the objectives' train steps do
        return lora_lib.adapted_model(graphdef, state, adapters, 2.0)(x, t, tokens, mask)

    *_, step_s = timed_train_step(velocity, lora, x, t, repeats)
    return {"rank": rank, "adapter_params": sum(a.size for a in jax.tree.leaves(lora)),
            "train_step_ms": 1e3 * step_s, "train_samples_per_s": batch / step_s}


def check_remat(config_path: str, depth: int, latent: int, batch: int, repeats: int):
    """The full train step with remat under each policy (``models.mmdit.REMAT_POLICIES``)."""
    from spotlight_jax.models.mmdit import REMAT_POLICIES  # noqa: PLC0415

    rows = {}
    for policy in REMAT_POLICIES:
        cfg, graphdef, state = build(config_path, depth, latent, remat=True,
                                     remat_policy=policy)
        timings, _ = check_model(cfg, graphdef, state, batch, repeats)
        rows[policy] = {"train_step_ms": timings["train_step_ms"]}
    return rows


def check_concurrent(parts, repeats: int):
    """A train step on device 0 and a forward (one rollout step) on device 1, dispatched together,
    against one after the other. Needs two devices."""
    import jax  # noqa: PLC0415

    devices = jax.devices()
    if len(devices) < 2:
        return {"skipped": f"{len(devices)} device: training and exploration need two"}
    fwd, train, carry, (x, t, eps) = parts
    on1 = jax.device_put((jax.tree.map(lambda a: a, carry["p"]), x, t), devices[1])
    on0 = jax.device_put((x, t, eps), devices[0])

    def explore():
        return fwd(*on1)

    def learn():
        carry["p"], carry["o"], value = train(carry["p"], carry["o"], *on0)
        return value

    seq = median_seconds(lambda: (learn().block_until_ready(), explore().block_until_ready()),
                         repeats)
    both = median_seconds(lambda: jax.block_until_ready((learn(), explore())), repeats)
    return {"sequential_ms": 1e3 * seq, "concurrent_ms": 1e3 * both,
            "overlap_speedup": seq / both}


def run(config_path: str, depth: int, latent: int, batch: int, repeats: int,
        parts=PARTS, out: str | None = None, profile_depth: int = 2,
        iteration_set=ITERATION_SET,
        stand_ins: device_profile.StandIns = device_profile.STAND_INS) -> dict:
    """Every part of ``parts`` (:data:`PARTS`) in order, the result rewritten to ``out`` after
    each (a run cut short keeps what it measured); a part that raises is recorded under
    ``errors`` and the next one runs. ``stand_ins``: what the profile and
    iteration parts time the decode and the reward on (``device_profile.StandIns``)."""
    import jax  # noqa: PLC0415

    from spotlight_jax.io import provenance  # noqa: PLC0415

    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"--parts: unknown {unknown}; the parts are {', '.join(PARTS)}")
    cfg, graphdef, state = build(config_path, depth, latent)
    seq = cfg.text_len + (latent // cfg.patch_size) ** 2
    result = {"backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
              "devices": len(jax.devices()), "config": str(config_path), "depth": depth,
              "latent": latent, "batch": batch, "width": cfg.width, "heads": cfg.num_heads,
              "seq": seq, "dtype": cfg.dtype, "code": provenance.code_version(), "parts": {}}

    def done(part, started):
        result["parts"][part] = round(time.perf_counter() - started, 1)
        if out:
            with open(out, "w") as f:
                json.dump(result, f, indent=1)

    state_of = {"model_parts": None}
    for part in [p for p in PARTS if p in parts]:
        started = time.perf_counter()
        try:
            _run_part(part, result, state_of, config_path, cfg, graphdef, state, depth, latent,
                      batch, repeats, profile_depth, out, iteration_set, stand_ins)
        except Exception as e:  # noqa: BLE001 - one part failing must not lose the others
            result.setdefault("errors", {})[part] = f"{type(e).__name__}: {e}"[:500]
        done(part, started)
    return result


def _run_part(part, result, state_of, config_path, cfg, graphdef, state, depth, latent, batch,
              repeats, profile_depth, out, iteration_set, stand_ins) -> None:
    """One part of :func:`run`, its numbers put into ``result``."""
    import jax  # noqa: PLC0415

    from spotlight_jax.models import as_dtype  # noqa: PLC0415

    dtype = as_dtype(cfg.dtype)
    image_len = (latent // cfg.patch_size) ** 2
    if part == "attention":
        result["attention"] = check_attention(batch, result["seq"], cfg.num_heads, cfg.head_dim,
                                              dtype, repeats)
    elif part == "paths":
        result["paths"] = check_attention_paths(batch, cfg.text_len, image_len, cfg.num_heads,
                                                cfg.head_dim, dtype, repeats)
    if part in ("model", "concurrent") and state_of["model_parts"] is None:
        timings, state_of["model_parts"] = check_model(cfg, graphdef, state, batch, repeats)
        result.update(timings)
        result.update(utilisation(cfg, batch, timings))
    if part == "lora":
        result["lora"] = check_lora(cfg, graphdef, state, batch, repeats)
        if "peak_tflops" not in result:
            from spotlight_jax.emulation import utilization  # noqa: PLC0415
            result["peak_tflops"] = utilization.device_peak(jax.devices()[0])[0] / 1e12
        result["lora"]["train_step_mfu"] = train_step_mfu(
            cfg, batch, result["lora"]["train_step_ms"], result["peak_tflops"] * 1e12)
    elif part == "remat":
        result["remat"] = check_remat(config_path, min(depth, REMAT_DEPTH), latent, batch,
                                      repeats)
    elif part == "concurrent":
        result["concurrent"] = check_concurrent(state_of["model_parts"], repeats)
    elif part == "profile":
        result["profile"] = device_profile.profile(
            config_path, profile_depth, repeats=repeats, stand_ins=stand_ins)
        if out:
            with open(profile_path(out), "w") as f:
                json.dump(result["profile"], f, indent=1)
    elif part == "iteration":
        workdir = (profile_path(out)[:-len("_profile.json")] + "_runs") if out else None
        result["iteration"] = check_iterations(iteration_set, workdir, stand_ins.reward,
                                               stand_ins.layers)


# rl.jsonl's per-iteration wall-clock columns the iteration part reports (medians)
# (a pipelined iteration rolls out on the spot groups only: no trainer rollout columns, its
# batch's sampling in explore_wall_s / sched_makespan_s)
ITERATION_COLUMNS = ("time_rollout", "time_train", "rollout_images_per_s", "rollout_tflops",
                     "train_images_per_s", "train_tflops", "train_mfu", "explore_wall_s",
                     "explore_overlap", "sched_makespan_s")


def check_iterations(overrides, workdir: str | None = None, reward: str = "",
                     reward_layers: int = 0) -> dict:
    """A few iterations of each of :data:`ITERATION_MODES` (``python -m spotlight_jax.main``
    on ``configs/tiny.py`` with ``overrides``), on this machine's devices (one GPU: the trainer
    and the fleet share it): per mode the medians of the iterations after the first (which
    compiles) of the run's own throughput columns; a run that fails gives its last lines.
    ``reward``: a learned reward scored in the loop by its random-weight stand-in
    (``bench._stand_ins``, ``reward_layers`` per tower, 0 = the real depth), written to a
    temporary folder (never under ``workdir``: PickScore's is 3.9 GB); '': the world's."""
    import statistics  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    from spotlight_jax.io.metrics import read_jsonl  # noqa: PLC0415

    workdir = workdir or tempfile.mkdtemp(prefix="device_check_runs_")
    out = {"overrides": list(overrides)}
    if reward:
        from spotlight_jax.bench import _stand_ins  # noqa: PLC0415
        from spotlight_jax.rewards.learned import NEEDS  # noqa: PLC0415
        folder = _stand_ins.reward_folder(reward, reward_layers)
        overrides = [*overrides, f"rl.reward={reward}",
                     f"learned_rewards.{NEEDS[reward][0]}={folder}"]
        out["reward"] = f"{reward} stand-in: {_stand_ins.reward_label(reward, reward_layers)}"
    for mode in ITERATION_MODES:
        run_dir = f"{workdir}/{mode}"
        cmd = [sys.executable, "-m", "spotlight_jax.main", f"--config={programs.TINY_CONFIG}",
               f"--workdir={run_dir}", f"--config.mode={mode}",
               *(f"--config.{kv}" for kv in overrides)]
        started = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=str(programs.REPO))
        row = {"wall_s": round(time.perf_counter() - started, 1)}
        if done.returncode != 0:
            row["failed"] = (done.stdout + done.stderr)[-1500:]
        else:
            rows = [r for r in read_jsonl(f"{run_dir}/rl.jsonl") if r.get("step", 0) >= 2]
            for col in ITERATION_COLUMNS:
                values = [float(r[col]) for r in rows if col in r]
                if values:
                    row[col] = statistics.median(values)
            row["iterations_timed"] = len(rows)
        out[mode] = row
    return out


def profile_path(out: str) -> str:
    """Where the profile part is written alone (``cost.profile_file``) beside ``out``."""
    stem = out[:-5] if out.endswith(".json") else out
    return stem + "_profile.json"


def utilisation(cfg, batch: int, timings: dict) -> dict:
    """Model FLOP/s and MFU of the forward and the train step
    (``spotlight_jax.emulation.utilization``: matmul FLOPs, the step's backward counted as two
    forwards) against the device's peak (its datasheet's dense bf16, or a measured f32 matmul
    where there is none)."""
    import jax  # noqa: PLC0415

    from spotlight_jax.emulation import utilization  # noqa: PLC0415
    from spotlight_jax.emulation.flops import forward_flops  # noqa: PLC0415

    peak, source = utilization.device_peak(jax.devices()[0])
    fwd = float(forward_flops(cfg, batch=batch))
    fwd_s, step_s = timings["forward_ms"] / 1e3, timings["train_step_ms"] / 1e3
    return {"peak_tflops": peak / 1e12, "peak_source": source,
            "forward_tflops": fwd / fwd_s / 1e12,
            "forward_mfu": utilization.mfu(fwd, fwd_s, peak, 1),
            "train_step_tflops": 3 * fwd / step_s / 1e12,
            "train_step_mfu": train_step_mfu(cfg, batch, timings["train_step_ms"], peak)}


def train_step_mfu(cfg, batch: int, step_ms: float, peak: float) -> float:
    """MFU of a train step of ``step_ms`` against ``peak`` FLOP/s (the backward counted as two
    forwards)."""
    from spotlight_jax.emulation import utilization  # noqa: PLC0415
    from spotlight_jax.emulation.flops import forward_flops  # noqa: PLC0415

    return utilization.mfu(3 * float(forward_flops(cfg, batch=batch)), step_ms / 1e3, peak, 1)


def table(result: dict) -> str:
    """The result as the markdown lines docs/performance.md records (the parts it ran)."""
    lines = [f"{result['device']} ({result['backend']}, {result['devices']} device(s)), "
             f"{result['config']}, depth {result['depth']}, {result['dtype']}, batch "
             f"{result['batch']}, {result['seq']} tokens", "",
             "| measurement | value |", "|---|---|"]
    if "forward_ms" in result:
        lines += [f"| forward ({result['params'] / 1e6:.0f}M params) | "
                  f"{result['forward_ms']:.1f} ms ({result['forward_tflops']:.1f} model "
                  f"TFLOP/s, MFU {result['forward_mfu']:.1%}); attention kernel in its HLO: "
                  f"{result['hlo_attention_kernel']} |",
                  f"| train step (AdamW, full) | {result['train_step_ms']:.1f} ms "
                  f"({result['train_samples_per_s']:.2f} samples/s, "
                  f"{result['train_step_tflops']:.1f} model TFLOP/s, MFU "
                  f"{result['train_step_mfu']:.1%}) |",
                  "| train step's program | {cudnn_forward} cuDNN attention forward and "
                  "{cudnn_backward} backward calls, {score_values} score-sized values, "
                  "{matmul_half_share:.0%} of matmul FLOPs in bf16/f16 |".format(
                      **result["hlo_train_step"]),
                  f"| peak per device | {result['peak_tflops']:.4g} TFLOP/s "
                  f"({result['peak_source']}) |"]
    if "lora" in result:
        r = result["lora"]
        lines.append(f"| train step (AdamW, LoRA r{r['rank']}) | {r['train_step_ms']:.1f} ms "
                     f"(MFU {r['train_step_mfu']:.1%}) |")
    for policy, r in result.get("remat", {}).items():
        lines.append(f"| train step, remat `{policy}` | {r['train_step_ms']:.1f} ms |")
    for row in result.get("attention", []):
        name = f"attention `{row['implementation']}`"
        if "skipped" in row:
            lines.append(f"| {name} | skipped: {row['skipped']} |")
        else:
            lines.append(f"| {name} | fwd {row['fwd_ms']:.2f} ms, fwd+bwd "
                         f"{row['fwd_bwd_ms']:.2f} ms, max diff vs xla "
                         f"{row['max_abs_diff_vs_xla']:.2e} |")
    if "paths" in result:
        p = result["paths"]
        lines.append(f"| attention kernel `{p['kernel']}` alone | fwd "
                     f"{p['kernel_alone']['fwd_ms']:.2f} ms, fwd+bwd "
                     f"{p['kernel_alone']['fwd_bwd_ms']:.2f} ms |")
        lines.append(f"| `parallel.attention` dense | fwd+bwd {p['dense']['fwd_bwd_ms']:.2f} ms "
                     f"({p['dense']['vs_kernel']:.2f}x the kernel alone) |")
        for strategy in ("ulysses", "ring"):
            r = p[strategy]
            lines.append(f"| `parallel.attention` {strategy} | " + (
                f"skipped: {r['skipped']}" if "skipped" in r else
                f"fwd+bwd {r['fwd_bwd_ms']:.2f} ms on {r['devices']} devices, max diff vs "
                f"dense {r['max_abs_diff_vs_dense']:.2e}") + " |")
    if "concurrent" in result:
        c = result["concurrent"]
        lines.append("| train + explore on disjoint devices | "
                     + (f"skipped: {c['skipped']}" if "skipped" in c else
                        f"{c['concurrent_ms']:.1f} ms together vs {c['sequential_ms']:.1f} ms "
                        f"one after the other ({c['overlap_speedup']:.2f}x)") + " |")
    reward = result.get("iteration", {}).get("reward", "the world's")
    for mode in ITERATION_MODES:
        r = result.get("iteration", {}).get(mode)
        if r is None:
            continue
        shown = ", ".join(f"{k} {r[k]:.3g}" for k in ITERATION_COLUMNS if k in r)
        lines.append(f"| `{mode}` iteration | " + (
            "failed: " + r["failed"].strip().splitlines()[-1] if "failed" in r else
            f"{shown} (medians of {r['iterations_timed']} iterations; reward: {reward})")
            + " |")
    for part, error in result.get("errors", {}).items():
        lines.append(f"| part `{part}` | failed: {error} |")
    if "profile" in result:
        lines += ["", device_profile.table(result["profile"])]
    return "\n".join(lines)


def main(argv):
    del argv
    result = run(FLAGS.config, FLAGS.depth, FLAGS.latent, FLAGS.batch, FLAGS.repeats,
                 tuple(FLAGS.parts), FLAGS.out, FLAGS.profile_depth, tuple(FLAGS.iteration_set),
                 device_profile.StandIns(FLAGS.stand_in_reward, FLAGS.stand_in_layers))
    print(table(result))


if __name__ == "__main__":
    define_flags()
    app.run(main)
