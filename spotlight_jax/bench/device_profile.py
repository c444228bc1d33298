"""The device profile the cost model is priced from: the phases it charges, timed on this device.

  python -m spotlight_jax.bench.device_profile --config=configs/qwen_image.py --depth=N
      --out=FILE [--batches=1,4] [--sp=1,2] [--objectives=nft,flow_grpo] [--steps=2]
      [--stand_in_reward=pickscore] [--stand_in_layers=0] [--[no]stand_in_vae]

The config's model at ``--depth`` blocks (its real width, heads, text length and dtype, a random
initialisation) at the cost model's image size (``cost.image_pixels / cost.vae_factor`` latent
cells), on whatever devices JAX has. Timed (median of ``--repeats`` after a compile):

* ``rollout``: the run's sampler (``--steps`` of its SDE, every CFG pass) for each batch of
  ``--batches`` on an SP group of each degree of ``--sp`` the devices allow (Ulysses where the
  heads divide, else ring), per denoising step;
* ``update``: each objective's own trainer (``rl.objective`` of ``--objectives``) updating on
  the largest batch's rollouts, LoRA or full as the config says, per image;
* ``decode``: the config's VAE decoding a batch where the config has one (a diffusers base),
  else for a latent model a random-weight stand-in of the released Wan VAE (``--stand_in_vae``;
  Qwen-Image's VAE on single frames);
* ``reward``: on the decoded images, a learned reward's model with random weights
  (``--stand_in_reward``, PickScore's CLIP-H/14 by default: what the cost model's per-image
  reward assumption stands for), or with ``--stand_in_reward=`` the run's own reward;
* ``regroup``: the weights re-placed from the whole device set onto a smaller SP group (the
  elastic shrink) where there are two or more devices.

Each phase keeps its FLOPs in the cost model's own count and its MFU against the device's peak
(``utilization.device_peak``); ``--config.cost.profile_file=FILE`` then prices a run from it
(``emulation.profile_file``). Prints one markdown table; writes the JSON with ``--out``.
"""
from __future__ import annotations

import dataclasses

from absl import app, flags

from spotlight_jax import programs

FLAGS = flags.FLAGS
OBJECTIVES = ("nft", "flow_grpo")
# one accumulated chunk and one minibatch: an update on the profiled batch, whatever the run's
OVERRIDES = {"rl.nft.minibatches": 1, "rl.minibatches": 1, "model.scan_blocks": False}


@dataclasses.dataclass(frozen=True)
class StandIns:
    """What times the decode and the reward where their weights are not on the device
    (``bench._stand_ins``): ``reward`` a learned reward's CLIP with random weights ('' = the
    run's own reward) at ``layers`` per tower (0 = its real depth), ``vae`` the released Wan
    VAE of a latent model's channels with random weights (True), a ``WanVAEConfig``, or None."""

    reward: str = "pickscore"
    layers: int = 0
    vae: object = True


STAND_INS = StandIns()                    # the full-size stand-ins (a lent device's profile)
NO_STAND_INS = StandIns("", 0, None)      # the config's own VAE and the run's own reward


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("config", str(programs.REPO / "configs" / "qwen_image.py"),
                        "Config file whose model and run are profiled.", **fv)
    flags.DEFINE_integer("depth", 2, "Blocks of the profiled model (the real width).", **fv)
    flags.DEFINE_list("batches", ["1", "4"], "Rollout batches to time.", **fv)
    flags.DEFINE_list("sp", ["1", "2", "4", "8"], "SP degrees to time (those the devices "
                      "allow).", **fv)
    flags.DEFINE_list("objectives", list(OBJECTIVES), "Objectives whose update is timed.", **fv)
    flags.DEFINE_integer("steps", 0, "Denoising steps per timed rollout (0 = the run's).",
                         **fv)
    flags.DEFINE_integer("repeats", 3, "Timed runs per measurement (median).", **fv)
    flags.DEFINE_string("stand_in_reward", "pickscore", "Time this learned reward's model "
                        "with random weights (bench._stand_ins; '' = the run's own reward).", **fv)
    flags.DEFINE_integer("stand_in_layers", 0, "Layers per tower of the stand-in reward "
                         "(0 = the real model's).", **fv)
    flags.DEFINE_bool("stand_in_vae", True, "Time a random-weight Wan VAE decode for a latent "
                      "model whose config has no VAE.", **fv)
    flags.DEFINE_string("out", None, "Write the profile as JSON here.", **fv)


def profiled_spec(config_path: str, depth: int, objective: str | None = None, steps: int = 0):
    """The run of ``config_path`` at ``depth`` blocks and the cost model's image size."""
    from spotlight_jax import config as conf  # noqa: PLC0415 - JAX after the device set-up

    base = conf.load_config(config_path)
    k = base.cost
    over = {**OVERRIDES, "model.depth": depth,
            "model.image_size": int(k.image_pixels) // int(k.vae_factor)}
    if steps:          # fewer steps than the run's, every one of them stochastic
        over.update({"sampler.num_steps": steps, "sampler.sde_window": None})
    if objective:
        over["rl.objective"] = objective
    return conf.RunSpec.from_config(conf.load_config(config_path, over))


def prompt_inputs(cfg, batch: int, seed: int = 0):
    """Random prompt inputs of the model's shapes: token ids, or a real encoder's states."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    key = jax.random.key(seed)
    if cfg.text_width:
        tokens = jax.random.randint(key, (batch, cfg.text_len), 1, cfg.vocab_size)
    else:
        tokens = jax.random.normal(key, (batch, cfg.text_len, cfg.text_embed_dim))
    return tokens, jnp.ones((batch, cfg.text_len), bool)


def cost_of(spec):
    """The cost model of the profiled model itself (its FLOPs, the run's CFG passes and LoRA
    rank): the count every phase's MFU is taken in."""
    from spotlight_jax.emulation.cost_models import ProfileCost  # noqa: PLC0415

    cost = dataclasses.replace(spec.cost, cfg_passes=0, lora_rank=-1, profile=None,
                               profile_file="")
    return ProfileCost(cost, spec.model, spec.workload)


def time_rollouts(spec, graphdef, state, batches, sps, repeats, peak):
    """Rows ``{batch, sp, strategy, step_s, flops, mfu}`` of the run's sampler."""
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import NamedSharding  # noqa: PLC0415
    from jax.sharding import PartitionSpec as P  # noqa: PLC0415

    from spotlight_jax.diffusion import Sampler  # noqa: PLC0415
    from spotlight_jax.emulation import median_time  # noqa: PLC0415
    from spotlight_jax.models import AttentionSpec  # noqa: PLC0415
    from spotlight_jax.parallel import MeshConfig, make_mesh  # noqa: PLC0415

    cfg, cost, devices = spec.model, cost_of(spec), jax.devices()
    shape = cfg.latent_shape
    rows, outputs = [], {}
    for sp in sorted({s for s in sps if s <= len(devices)}):
        if sp == 1:
            attn, placed = AttentionSpec(impl=spec.process.attention_impl), state
        else:
            mesh = make_mesh(devices[:sp], MeshConfig(data=1, fsdp=1, sp=sp))
            strategy = "ulysses" if cfg.num_heads % sp == 0 else "ring"
            attn = AttentionSpec(mesh=mesh, strategy=strategy, axis="sp",
                                 impl=spec.process.attention_impl)
            placed = jax.device_put(state, NamedSharding(mesh, P()))
        sampler = Sampler(graphdef, shape, spec.sampler, attn=attn)
        for b in batches:
            tokens, mask = prompt_inputs(cfg, b)
            seeds = np.arange(b)

            def roll(sampler=sampler, placed=placed, tokens=tokens, mask=mask, seeds=seeds):
                return jax.block_until_ready(sampler.rollout(placed, tokens, mask, seeds))

            t = median_time(roll, repeats) / spec.sampler.num_steps
            flops = cost.cfg_passes * b * cost.flops
            rows.append({"batch": b, "sp": sp, "strategy": attn.strategy, "step_s": t,
                         "flops": flops, "mfu": min(1.0, flops / (sp * t * peak))})
            if sp == 1:
                outputs[b] = jax.device_get(roll())
    return rows, outputs


def time_update(spec, graphdef, state, rollout, repeats, peak):
    """The objective's trainer updating once on ``rollout`` (the sampler's output)."""
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from spotlight_jax.emulation import median_time  # noqa: PLC0415

    trainer = spec.make_trainer(graphdef, state)
    n = int(rollout["latents"].shape[0])
    tokens, mask = prompt_inputs(spec.model, n)
    batch = {"latents": rollout["latents"], "log_probs": rollout.get("log_probs"),
             "tokens": tokens, "mask": mask, "prompt_ids": np.arange(n) // max(1, n // 2),
             "advantages": np.resize(np.array([1.0, -1.0], np.float32), n)}
    batch = {k: v for k, v in batch.items() if k in trainer.batch_keys or k == "advantages"}
    step = {"i": 0}

    def update():
        step["i"] += 1
        return jax.block_until_ready(trainer.update(batch, jax.random.key(step["i"]),
                                                    step=step["i"]))

    t = median_time(update, repeats)
    cost = cost_of(spec)
    flops = n * cost.train_flops_per_sample()
    return {"images": n, "s": t, "s_per_image": t / n, "flops": flops,
            "lora_rank": spec.rl.lora_rank, "mfu": min(1.0, flops / (t * peak))}


def time_decode_and_reward(spec, rollout, repeats,
                           stand_ins: StandIns = NO_STAND_INS) -> tuple[dict, dict]:
    """The VAE decode and the reward per image, or why each was skipped.

    The decode is the config's VAE (a diffusers base), else for a latent model (not 3
    channels) ``stand_ins.vae``; a model that draws pixels has nothing to decode. The reward
    is ``stand_ins.reward``'s stand-in where given, else the run's own, on the decoded images
    (the default: no stand-ins, :data:`NO_STAND_INS`)."""
    import jax  # noqa: PLC0415

    from spotlight_jax import rewards  # noqa: PLC0415
    from spotlight_jax.bench import _stand_ins  # noqa: PLC0415
    from spotlight_jax.diffusion import to_image  # noqa: PLC0415
    from spotlight_jax.emulation import median_time  # noqa: PLC0415
    from spotlight_jax.models.factory import is_video  # noqa: PLC0415

    # a trajectory [B, T+1, *latent] (its final latent), or final latents already
    traj = rollout["latents"].ndim == len(spec.model.latent_shape) + 2
    latents = rollout["latents"][:, -1] if traj else rollout["latents"]
    n = int(latents.shape[0])
    decoder, decode = spec.image_decoder(), {}
    if decoder is None and spec.model.channels != 3 and stand_ins.vae:
        config = None if stand_ins.vae is True else stand_ins.vae
        decoder = _stand_ins.vae_decoder(spec.model.channels, is_video(spec.model), config)
        decode["stand_in"] = f"random-weight Wan VAE, base_dim {decoder.config.base_dim}"
    if decoder is not None:
        def run():
            return jax.block_until_ready(decoder.decode_with(decoder.state, latents))
        decode.update(images=n, s_per_image=median_time(run, repeats) / n)
        images = run()
    elif spec.model.channels == 3:
        decode = {"skipped": "the model draws pixels: nothing to decode"}
        images = to_image(jax.numpy.asarray(latents))
    else:
        decode = {"skipped": "the config has no VAE (a random base; give a diffusers base "
                             "with base_checkpoint, or time a stand-in: --stand_in_vae)"}
        return decode, {"skipped": "no decoded images"}
    try:
        pool = spec.prompt_source().train_prompts          # prompts the reward can read
        prompts = [pool[i % len(pool)] for i in range(n)]
        if stand_ins.reward:
            name = stand_ins.reward
            reward = _stand_ins.learned_reward(name, stand_ins.layers)
            extra = {"stand_in": _stand_ins.reward_label(name, stand_ins.layers)}
        else:
            name, extra = spec.settings.reward, {}
            reward = rewards.resolve(name).fn

        def score():
            return jax.block_until_ready(reward(images, prompts))
        return decode, {"name": name, "s_per_image": median_time(score, repeats) / n, **extra}
    except Exception as e:  # noqa: BLE001 - a reward that cannot run here is a result
        return decode, {"skipped": f"{type(e).__name__}: {e}"[:200]}


def time_regroup(state, repeats) -> dict:
    """The weights moved from every device onto half of them (an SP group losing members)."""
    import jax  # noqa: PLC0415
    from jax.sharding import NamedSharding  # noqa: PLC0415
    from jax.sharding import PartitionSpec as P  # noqa: PLC0415

    from spotlight_jax.emulation import median_time  # noqa: PLC0415
    from spotlight_jax.parallel import MeshConfig, make_mesh  # noqa: PLC0415

    devices = jax.devices()
    if len(devices) < 2:
        return {"skipped": "one device: nothing to regroup onto"}
    whole = make_mesh(devices, MeshConfig(data=1, fsdp=1, sp=len(devices)))
    half = make_mesh(devices[:len(devices) // 2],
                     MeshConfig(data=1, fsdp=1, sp=len(devices) // 2))
    on_whole = jax.device_put(state, NamedSharding(whole, P()))
    return {"devices": [len(devices), len(devices) // 2], "shrink_s": median_time(
        lambda: jax.block_until_ready(jax.device_put(on_whole, NamedSharding(half, P()))),
        repeats)}


def profile(config_path: str, depth: int, batches=(1, 4), sps=(1, 2), objectives=OBJECTIVES,
            steps: int = 0, repeats: int = 3, stand_ins: StandIns = STAND_INS) -> dict:
    """The profile (``emulation.profile_file``'s JSON) of ``config_path`` on this device."""
    import jax  # noqa: PLC0415

    from spotlight_jax.emulation import utilization  # noqa: PLC0415
    from spotlight_jax.emulation.profile_file import KIND, VERSION  # noqa: PLC0415
    from spotlight_jax.io import provenance  # noqa: PLC0415
    from spotlight_jax.models.factory import create_model  # noqa: PLC0415

    spec = profiled_spec(config_path, depth, steps=steps)
    peak, source = utilization.device_peak(jax.devices()[0])
    graphdef, state = create_model(spec.model)
    rows, outputs = time_rollouts(spec, graphdef, state, batches, sps, repeats, peak)
    largest = outputs[max(outputs)]
    updates = {obj: time_update(profiled_spec(config_path, depth, obj, steps), graphdef, state,
                                largest, repeats, peak) for obj in objectives}
    decode, reward = time_decode_and_reward(spec, largest, repeats, stand_ins)
    return {"kind": KIND, "version": VERSION, "device": str(jax.devices()[0].device_kind),
            "backend": jax.default_backend(), "devices": len(jax.devices()),
            "peak_tflops": peak / 1e12, "peak_source": source, "config": str(config_path),
            "code": provenance.code_version(), "model": dataclasses.asdict(spec.model),
            "attention_impl": spec.process.attention_impl, "rollout": rows,
            "update": updates, "decode": decode, "reward": reward,
            "regroup": time_regroup(state, repeats)}


def table(result: dict) -> str:
    """The profile as markdown: one line per measured phase."""
    m = result["model"]
    lines = [f"{result['device']} ({result['backend']}, {result['peak_tflops']:.4g} TFLOP/s "
             f"peak: {result['peak_source']}), {result['config']} at depth {m['depth']}, "
             f"{m['image_size']}^2 latent, {m['dtype']}", "",
             "| phase | time | MFU |", "|---|---|---|"]
    for r in result["rollout"]:
        lines.append(f"| rollout step, batch {r['batch']}, sp {r['sp']} ({r['strategy']}) | "
                     f"{1e3 * r['step_s']:.2f} ms | {r['mfu']:.1%} |")
    for name, u in result["update"].items():
        how = f"LoRA r{u['lora_rank']}" if u["lora_rank"] else "full"
        lines.append(f"| update `{name}` ({how}), per image | {1e3 * u['s_per_image']:.1f} ms "
                     f"| {u['mfu']:.1%} |")
    for name in ("decode", "reward"):
        d = result[name]
        shown = (f"skipped: {d['skipped']}" if "skipped" in d
                 else f"{1e3 * d['s_per_image']:.2f} ms")
        how = f" ({d['stand_in']})" if "stand_in" in d else ""
        lines.append(f"| {name} per image{how} | {shown} | |")
    g = result["regroup"]
    lines.append("| regroup (shrink) | " + (f"skipped: {g['skipped']}" if "skipped" in g else
                                           f"{1e3 * g['shrink_s']:.2f} ms") + " | |")
    return "\n".join(lines)


def main(argv):
    del argv
    result = profile(FLAGS.config, FLAGS.depth, tuple(int(b) for b in FLAGS.batches),
                     tuple(int(s) for s in FLAGS.sp), tuple(FLAGS.objectives), FLAGS.steps,
                     FLAGS.repeats, StandIns(FLAGS.stand_in_reward, FLAGS.stand_in_layers,
                                             FLAGS.stand_in_vae))
    programs.emit(result, table(result), FLAGS.out)


if __name__ == "__main__":
    define_flags()
    app.run(main)
