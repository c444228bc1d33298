"""Shared test fixtures: a micro model that compiles in seconds, configs and subprocess helpers."""
import json
import os
import socket
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from spotlight_jax.emulation.flops import jaxpr_flops as dot_flops  # noqa: F401 - shared
from spotlight_jax.models import MMDiT, MMDiTConfig

MICRO = MMDiTConfig(image_size=16, patch_size=4, width=32, depth=2, num_heads=4, mlp_ratio=2.0,
                    vocab_size=64, text_len=12, text_width=16, text_layers=1, text_heads=2,
                    conv_stem=4, conv_head=True)


def built_model(cfg, seed=0):
    """``(graphdef, state)`` of an MMDiT of ``cfg``, its parameters perturbed by 0.05 N(0, 1)
    (adaLN-Zero makes a fresh model output exactly 0; tests should see real numerics). Built in
    one compiled program (eagerly, every parameter shape would compile its own initializer:
    seconds per test process) and perturbed with numpy."""
    graphdef, state = nnx.split(nnx.jit(lambda: MMDiT(cfg, rngs=nnx.Rngs(seed)))())
    rng = np.random.default_rng(seed + 1)
    state = jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(x.dtype),
                         state)
    return graphdef, state


def micro_model(seed=0, **overrides):
    import dataclasses
    cfg = dataclasses.replace(MICRO, **overrides)
    return (cfg, *built_model(cfg, seed))


# A whole run of the tiny config shrunk to the micro model (seconds per iteration), as dotted
# overrides of configs/tiny.py: shared by the resume, mode, notebook and cluster tests.
MICRO_RUN_OVERRIDES = {
    **{f"model.{f}": getattr(MICRO, f) for f in MICRO.__dataclass_fields__},
    "mode": "baseline", "rl.objective": "flow_grpo",
    "sampler.num_steps": 3,
    "sampler.sde_window": (0, 3),       # every step of the 3-step sampler
    "sampler.eval_steps": 2, "rl.prompts_per_iter": 2, "rl.group_size": 4, "rl.train_steps": 2,
    "rl.minibatches": 2, "rl.eval_every": 0, "rl.eval_prompts": 2, "rl.eval_seeds": 1,
    "rl.lr": 1e-3, "checkpoint.every": 1,
    "rl.nft.times": 2,                  # of the 2 grid times a 3-step sampler has in (0, 1)
}


def micro_config(iterations, **overrides):
    from spotlight_jax.config import load_config
    return load_config("tiny", {**MICRO_RUN_OVERRIDES, "rl.iterations": iterations, **overrides})


def config_flags(overrides: dict) -> list[str]:
    """Dotted config overrides as ``--config.x=y`` command-line flags (absl's syntax: tuples as
    ``(a,b)``; absl cannot set a field to None, so None values are refused here)."""
    out = []
    for key, value in overrides.items():
        if value is None:
            raise ValueError(f"{key}=None cannot be given as a --config flag")
        if isinstance(value, tuple):
            value = "(" + ",".join(str(v) for v in value) + ")"
        out.append(f"--config.{key}={value}")
    return out


TINY = str(Path(__file__).resolve().parents[1] / "configs" / "tiny.py")


def write_stand_in_trace(path) -> None:
    """A trace file of the SkyPilot format where a test needs one that only the real traces
    have (4 nodes alive for 10 days in 300 s ticks)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [4] * 2880}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict:
    """The environment of a child JAX process: CPU, without the test process's 8 forced host
    devices (each child sets its own count)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if "force_host_platform_device_count" not in f)
    return env


def mode_config(mode, iterations=2, objective="flow_grpo"):
    """The micro run in ``mode`` with small exploration pools."""
    c = micro_config(iterations, **{"rl.objective": objective})
    c.mode = mode
    c.explore.max_extra_per_prompt = 4
    c.explore.sync_extra_per_prompt = 2
    c.checkpoint.every = 10
    # one segment program for the scheduled rollouts (the per-group programs are compiled and
    # checked by test_scheduled_rollout_computes_on_the_groups_own_devices)
    c.deployment.rollout_on_groups = "false"
    return c


KILL_ITERATIONS = 3


def spotlight_config(objective="flow_grpo", mode="spotlight"):
    """A spotlight (or spotlight_pipelined) micro run on a busy trace (kill-and-resume)."""
    c = micro_config(KILL_ITERATIONS, **{"rl.objective": objective, "rl.nft.times": 2,
                                         "rl.nft.eta_rate": 0.25})
    c.mode = mode
    c.explore.max_extra_per_prompt = 4
    # a slow emulated reward stretches a micro iteration to ~80 emulated seconds (the trace
    # moves in 30 s steps), and a busy trace preempts and rejoins nodes within the run
    c.cost.reward_s_per_image = 10.0
    c.trace.rate_per_node_hour = 60.0
    c.trace.mean_outage_s = 60.0
    c.trace.abrupt_fraction = 0.5
    return c


def fake_encode(prompts, dim):
    """A deterministic stand-in for a text encoder: each word's fixed random vector plus a
    sin-cos code of its position; one real token per word, the empty prompt has none."""
    import numpy as np

    from spotlight_jax import world
    words = np.random.default_rng(7).normal(size=(world.VOCAB_SIZE, dim)).astype(np.float32)
    pos = np.arange(world.DEFAULT_MAX_LEN)[:, None] / 10.0 ** (np.arange(dim // 2) / dim)
    code = np.concatenate([np.sin(pos), np.cos(pos)], 1).astype(np.float32)
    rows = []
    for p in prompts:
        ids = world.encode(p) if p else []
        rows.append(words[ids] + code[:len(ids)] if ids else np.zeros((0, dim), np.float32))
    return rows


def world_prompt_file(path, dim, image_size, pooled_dim=0, video=False):
    """A prompt-embedding file of every world prompt (at ``image_size``; ``video``: the video
    world's) with its world split, plus the empty prompt, fake-encoded at width ``dim`` (and,
    with ``pooled_dim``, a pooled embedding: the mean of the prompt's word vectors' first
    ``pooled_dim`` entries); returns ``(prompts, embeds, mask)``."""
    import numpy as np

    from spotlight_jax import prompt_embeddings as pe
    from spotlight_jax import world
    wc = world.WorldConfig(image_size=image_size)
    if video:
        train, val = world.video.video_train_prompts(wc), world.video.video_val_prompts(wc)
    else:
        train, val = world.train_prompts(wc), world.val_prompts(wc)
    prompts = ["", *train, *val]
    rows = fake_encode(prompts, dim)
    embeds, mask = pe.pad_rows(rows)
    pooled = (np.stack([r[:, :pooled_dim].mean(0) if len(r) else np.zeros(pooled_dim)
                        for r in rows]).astype(np.float32) if pooled_dim else None)
    pe.write(path, prompts, embeds, mask, pooled, splits=["", *["train"] * len(train),
                                                  *["val"] * len(val)],
             family="synthetic", encoder="tests.fake_encode", info={"dim": dim})
    return prompts, embeds, mask


QWEN_PIPE = Path(__file__).resolve().parent / "fixtures" / "diffusers" / "pipeline_qwen_image"
QWEN_DIM = 24                # the fixture transformer's joint_attention_dim


def qwen_fixture_overrides(tmp_path, objective) -> dict:
    """The overrides that put the micro run on the tiny random Qwen-Image pipeline fixture
    (transformer + VAE), its prompts from an embedding file written into ``tmp_path``."""
    path = Path(tmp_path) / "prompts.safetensors"
    if not path.exists():
        world_prompt_file(path, QWEN_DIM, image_size=32)
    return {"base_checkpoint": str(QWEN_PIPE), "model.image_size": 8, "model.text_len": 12,
            "model.text_width": 0, "model.text_embed_dim": QWEN_DIM,
            "prompts.embeddings_file": str(path), "rl.objective": objective,
            "rl.eval_prompts": 2}


FLUX_PIPE = QWEN_PIPE.parent / "pipeline_flux"
FLUX_POOLED = 20             # its pooled_projection_dim


def flux_fixture_config(tmp_path, objective, iterations=1, **overrides):
    """The micro run on the tiny random FLUX.1 [dev] pipeline fixture (transformer + its
    SD3-architecture VAE), prompts with pooled embeddings from a file written into
    ``tmp_path``, the distilled guidance scale 3.5 as the model's input."""
    path = Path(tmp_path) / "flux_prompts.safetensors"
    if not path.exists():
        world_prompt_file(path, QWEN_DIM, image_size=32, pooled_dim=FLUX_POOLED)
    return micro_config(iterations, **{
        "base_checkpoint": str(FLUX_PIPE), "model.image_size": 8, "model.text_len": 12,
        "model.text_width": 0, "model.text_embed_dim": QWEN_DIM,
        "prompts.embeddings_file": str(path), "rl.objective": objective, "rl.eval_prompts": 2,
        "sampler.guidance": 3.5, "sampler.eval_guidance": 3.5, **overrides})


WAN_PIPE = QWEN_PIPE.parent / "pipeline_wan"     # text_dim 24 (QWEN_DIM), 16 latent channels


def wan_fixture_overrides(tmp_path) -> dict:
    """The overrides that put a video run on the tiny random Wan pipeline fixture (transformer +
    Wan VAE): 2 latent frames of 4 x 4 cells (5 frames of 32 x 32 pixels), the video world's
    prompts from an embedding file written into ``tmp_path``."""
    path = Path(tmp_path) / "wan_prompts.safetensors"
    if not path.exists():
        world_prompt_file(path, QWEN_DIM, image_size=32, video=True)
    return {"base_checkpoint": str(WAN_PIPE), "model.frames": 2, "model.image_size": 4,
            "model.text_len": 12, "model.text_width": 0, "prompts.embeddings_file": str(path)}


def qwen_fixture_config(tmp_path, objective, iterations=1, **overrides):
    """The micro run on the tiny random Qwen-Image pipeline fixture (``qwen_fixture_overrides``)."""
    return micro_config(iterations, **{**qwen_fixture_overrides(tmp_path, objective),
                                       **overrides})


def wandb_history(workdir) -> list[dict]:
    """The history rows of the offline W&B run(s) under ``workdir/wandb``, read from the
    ``run-*.wandb`` file itself: its header, then LevelDB-log records (32 KiB blocks, 7-byte
    chunk headers: crc, length, type FULL/FIRST/MIDDLE/LAST) holding protobuf ``Record``s."""
    import glob
    import json
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for path in sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))):
        data = open(path, "rb").read()
        assert data[:4] == b":W&B", path
        pos, chunks, part = 7, [], b""
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            if left < 7:
                pos += left
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if kind == 0:                                   # block padding
                pos += left
                continue
            chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind == 1:
                chunks.append(chunk)
            elif kind == 2:
                part = chunk
            elif kind == 3:
                part += chunk
            else:
                chunks.append(part + chunk)
        for chunk in chunks:
            record = pb.Record()
            record.ParseFromString(chunk)
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def qwen_edit_pipe(folder) -> Path:
    """A Qwen-Image-Edit pipeline folder standing in for a real one: the tiny Qwen-Image
    fixture's transformer and VAE (``QWEN_PIPE``, linked file by file so the transformer folder
    resolves here) beside a ``model_index.json`` naming ``QwenImageEditPipeline``, which makes
    the converted transformer an editing model (``reference_images=1``)."""
    folder = Path(folder)
    (folder / "transformer").mkdir(parents=True, exist_ok=True)
    for f in (QWEN_PIPE / "transformer").iterdir():
        if not (folder / "transformer" / f.name).exists():
            (folder / "transformer" / f.name).symlink_to(f)
    if not (folder / "vae").exists():
        (folder / "vae").symlink_to(QWEN_PIPE / "vae", target_is_directory=True)
    (folder / "model_index.json").write_text(json.dumps(
        {"_class_name": "QwenImageEditPipeline", "transformer":
         ["diffusers", "QwenImageTransformer2DModel"], "vae": ["diffusers",
                                                                "AutoencoderKLQwenImage"]}))
    return folder


def edit_prompt_file(path, dim, channels=16, cells=(8, 8), images=("beach.png", "room.png"),
                     train=3, val=2, seed=0):
    """A stand-in edit file (no encoder, no torch): world prompts as instructions on each of
    ``images`` (``train`` + ``val`` per image), each row fake-encoded as two tokens of its
    image's code then the instruction's words (``fake_encode``), its null row the image's two
    tokens alone; random latents ``[len(images), *cells, channels]``. Returns the file read."""
    from spotlight_jax import prompt_embeddings as pe
    from spotlight_jax import world
    rng = np.random.default_rng(seed)
    codes = rng.normal(size=(len(images), 2, dim)).astype(np.float32)
    words = world.train_prompts(world.WorldConfig(image_size=16))
    instructions, index, splits = [""] * len(images), list(range(len(images))), [""] * len(images)
    for k in range(len(images)):
        for j in range(train + val):
            instructions.append(words[(k * (train + val) + j) * 7 % len(words)])
            index.append(k)
            splits.append("train" if j < train else "val")
    rows = [np.concatenate([codes[k], r]) for k, r in zip(index, fake_encode(instructions, dim))]
    embeds, mask = pe.pad_rows(rows)
    latents = rng.normal(size=(len(images), *cells, channels)).astype(np.float32)
    pe.write_edits(path, instructions, index, list(images), latents, embeds, mask,
                   splits=splits, family="qwen_image_edit", encoder="tests.fake_encode",
                   info={"dim": dim})
    return pe.read(path)


FIXTURES = QWEN_PIPE.parent
Z_IMAGE_DIM = 16             # the Z-Image transformer fixture's cap_feat_dim
FLUX2_DIMS = {"flux2_dev": 24, "flux2_klein": 20}      # their joint_attention_dim
# the pipeline class of each stand-in folder (its model_index.json), by transformer fixture
STAND_IN_PIPELINES = {"z_image": ("ZImagePipeline", "AutoencoderKL"),
                      "flux2_dev": ("Flux2Pipeline", "AutoencoderKLFlux2"),
                      "flux2_klein": ("Flux2KleinPipeline", "AutoencoderKLFlux2")}


def stand_in_pipe(folder, fixture: str) -> Path:
    """A Z-Image or FLUX.2 pipeline folder standing in for a real one, made of links to the
    fixtures: the transformer fixture ``fixture`` (``z_image``, ``flux2_dev``, ``flux2_klein``:
    ``tests/fixtures/diffusers/transformer/``) as ``transformer/``, a VAE of its latent
    channels as ``vae/`` (Z-Image: the 4-channel SD1-style ``AutoencoderKL``, as Z-Image's own
    VAE is an ``AutoencoderKL``; FLUX.2: the ``AutoencoderKLFlux2`` fixture, 4 channels packed
    2x2 into the transformer's 16) and a ``model_index.json`` naming the pipeline (no text
    encoder: prompts come from a file)."""
    folder = Path(folder)
    pipeline, vae_class = STAND_IN_PIPELINES[fixture]
    vae = FIXTURES / "vae" / ("sd1_style" if fixture == "z_image" else "flux2")
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in (("transformer", FIXTURES / "transformer" / fixture), ("vae", vae)):
        if not (folder / name).exists():
            (folder / name).symlink_to(target, target_is_directory=True)
    transformer = json.loads((folder / "transformer" / "config.json").read_text())["_class_name"]
    (folder / "model_index.json").write_text(json.dumps(
        {"_class_name": pipeline, "transformer": ["diffusers", transformer],
         "vae": ["diffusers", vae_class]}))
    return folder


# the prompt-file family encode_prompts writes for each stand-in's pipeline
FILE_FAMILIES = {"z_image": "z_image", "flux2_dev": "flux2", "flux2_klein": "flux2_klein"}


def pipeline_prompt_file(path, fixture: str, text_len: int = 12, dim: int | None = None):
    """A stand-in of the file ``encode_prompts`` writes for the stand-in folder ``fixture``'s
    pipeline (no encoder, no torch): the image world's prompts (at 32 px) fake-encoded
    (``fake_encode``) at the transformer's text width (or ``dim``), family and layout as the
    pipeline's: Z-Image's rows its real tokens, zero-padded with a False mask; FLUX.2's rows
    ``text_len`` tokens all attended, the prompt's then a fixed pad token's state (the
    tokenizer pads to ``max_sequence_length`` and the encoder gives pad tokens states). Returns
    the file read."""
    from spotlight_jax import prompt_embeddings as pe
    from spotlight_jax import world
    family = FILE_FAMILIES[fixture]
    dim = dim or (Z_IMAGE_DIM if fixture == "z_image" else FLUX2_DIMS[fixture])
    wc = world.WorldConfig(image_size=32)
    train, val = world.train_prompts(wc), world.val_prompts(wc)
    prompts = ["", *train, *val]
    rows = fake_encode(prompts, dim)
    if family == "z_image":
        # the chat template's tokens around a prompt: even the empty one has real tokens
        rows = [np.concatenate([np.full((1, dim), 0.5, np.float32), r]) for r in rows]
        embeds, mask = pe.pad_rows(rows)
    else:
        pad = np.random.default_rng(11).normal(size=dim).astype(np.float32)
        embeds = np.stack([np.concatenate([r, np.broadcast_to(pad, (text_len - len(r), dim))])
                           for r in rows])
        mask = np.ones(embeds.shape[:2], bool)
    pe.write(path, prompts, embeds, mask, splits=["", *["train"] * len(train),
                                                  *["val"] * len(val)],
             family=family, encoder=f"{STAND_IN_PIPELINES[fixture][0]}: tests.fake_encode",
             info={"max_sequence_length": text_len})
    return pe.read(path)


def stand_in_pipe_config(tmp_path, fixture: str, objective="nft", iterations=1, **overrides):
    """The micro run on a stand-in Z-Image / FLUX.2 folder (:func:`stand_in_pipe` in
    ``tmp_path``): ``model.family`` set to the folder's, 8 x 8 latent cells, 12 text tokens,
    the world's prompts from a stand-in of the pipeline's prompt file
    (:func:`pipeline_prompt_file`)."""
    family = "z_image" if fixture == "z_image" else "flux2"
    path = Path(tmp_path) / f"{fixture}_prompts.safetensors"
    if not path.exists():
        pipeline_prompt_file(path, fixture, text_len=12)
    config = micro_config(iterations, **{
        "base_checkpoint": str(stand_in_pipe(Path(tmp_path) / fixture, fixture)),
        "model.image_size": 8, "model.text_len": 12, "prompts.embeddings_file": str(path),
        "rl.objective": objective, "rl.eval_prompts": 2, **overrides})
    config.model.family = family
    return config


def grown_from(source, model):
    """``model`` holding ``source``'s parameters wherever their names match (its own new ones
    kept): a model grown from a base without them, as ``checkpoints.grow_params`` grows a
    checkpoint, for tests that compare the two."""
    def take(a, b):
        return {k: (take(a[k], v) if isinstance(v, dict) else a[k]) if k in a else v
                for k, v in b.items()}
    state = nnx.state(model)
    nnx.replace_by_pure_dict(state, take(nnx.to_pure_dict(nnx.state(source)),
                                         nnx.to_pure_dict(state)))
    nnx.update(model, state)
    return model
