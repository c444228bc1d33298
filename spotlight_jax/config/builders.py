"""Objects built from a run's parsed sections: the trainer, the base and its VAE, the prompt
source, the mesh and attention layout, the emulated deployment, and the rewards that have to be
built before they can be resolved by name (a reward server's client, learned rewards).

``config.sections`` parses (a ConfigDict into validated frozen dataclasses, with no side
effects); this module builds from what it parsed. :class:`~spotlight_jax.config.spec.RunSpec`'s
methods call the ``*_of`` builders with its own sections; the functions that take a ConfigDict
(``make_trainer(config, ...)``, ``make_deployment(config)``, ...) parse it first, for callers
that hold a config (tests, notebooks, a study).
"""
from __future__ import annotations

import os
import pathlib

from flax import nnx
from jax.sharding import Mesh

from spotlight_jax import rewards, world
from spotlight_jax.config.loading import ConfigError, build_section, qualify, section_paths
from spotlight_jax.config.sections import (
    REMOTE_REWARD,
    cost_config,
    deployment_config,
    diffusers_base,
    family_of,
    mesh_config,
    model_config,
    rl_config,
    run_model_fields,
    sampler_config,
    slice_paths,
    trace_config,
    workload,
)
from spotlight_jax.diffusion import SamplerConfig
from spotlight_jax.emulation import (
    CostConfig,
    Deployment,
    DeploymentConfig,
    TraceConfig,
    TraceError,
    Workload,
)
from spotlight_jax.models import AttentionSpec, Flux2Config, MMDiTConfig, as_dtype, convert
from spotlight_jax.models.convert.vae import FLUX2_CLASS
from spotlight_jax.models.factory import abstract_model, is_video
from spotlight_jax.parallel import make_mesh
from spotlight_jax.parallel.sharding import param_shardings
from spotlight_jax.prompt_embeddings import (
    EditEmbeddingPrompts,
    EditPrompts,
    EmbeddingPrompts,
    PromptEmbeddingError,
    PromptSource,
    VideoPrompts,
    WorldPrompts,
)
from spotlight_jax.prompt_embeddings import read as read_prompt_embeddings
from spotlight_jax.prompt_embeddings.encoders import EVERY_TOKEN_FAMILIES
from spotlight_jax.prompt_embeddings.encoders import MODEL_FAMILY as ENCODER_MODEL_FAMILY
from spotlight_jax.rewards.learned import NEEDS as LEARNED_NEEDS
from spotlight_jax.rewards.learned import LearnedReward
from spotlight_jax.rewards.remote import RemoteReward, RemoteRewardConfig
from spotlight_jax.rl import trainer_class


def load_diffusers_base(config):
    """``(graphdef, state)`` of a diffusers base's transformer, converted into the MMDiT with
    :func:`model_config`'s run fields, parameters in ``model.param_dtype``."""
    return transformer_of(diffusers_base(config), model_config(config))


def transformer_of(base: str, cfg: MMDiTConfig, mesh: Mesh | None = None):
    """``(graphdef, state)`` of the transformer in the diffusers folder ``base`` as the model
    ``cfg`` (its architecture read from there, with the run's fields), each parameter streamed
    straight onto its sharding on ``mesh`` (:func:`base_shardings`; None: the default
    device)."""
    overrides = {f: getattr(cfg, f) for f in run_model_fields(type(cfg))
                 if f not in ("dtype", "param_dtype")}
    shardings = None if mesh is None else base_shardings(cfg, mesh)
    model, _ = build_section({}, lambda: convert.from_diffusers(
        os.path.join(base, "transformer"), dtype=as_dtype(cfg.param_dtype),
        shardings=shardings, **overrides))
    # the graph of model_config (compute dtype included), as every other process builds it
    graphdef, _ = abstract_model(cfg)
    return graphdef, nnx.split(model)[1]


def base_shardings(cfg: MMDiTConfig, mesh: Mesh):
    """``(path, shape) -> NamedSharding`` of the model ``cfg``'s parameters on ``mesh`` (the
    rule table's, as ``shard_state`` places them): where a converted base streams to."""
    _, abstract = abstract_model(cfg)
    table = {tuple(path): sharding for path, sharding in
             nnx.to_flat_state(param_shardings(abstract, mesh))}
    return lambda path, shape: table[tuple(path)]


def image_decoder(config):
    """The frozen VAE that turns a latent model's samples into the reward's images (a diffusers
    base's ``vae/`` folder), or None for a model that draws pixels."""
    return decoder_of(diffusers_base(config), model_config(config))


def decoder_of(base: str | None, cfg: MMDiTConfig):
    """:func:`image_decoder` of the diffusers folder ``base`` (None: pixels) for model ``cfg``:
    its ``vae/``, of whichever class its config.json names (``convert.vae_from_diffusers``),
    checked against the transformer: images or clips, latent channels, and FLUX.2's
    ``AutoencoderKLFlux2`` exactly for a FLUX.2 transformer (its latents are normalised per
    2 x 2 cell by that VAE's batch-norm statistics; any other VAE's for any other model)."""
    if base is None:
        return None
    vae_dir = os.path.join(base, "vae")
    if not os.path.isfile(os.path.join(vae_dir, "config.json")):
        raise ConfigError(f"base_checkpoint={base!r}: no vae/config.json next to transformer/ "
                          "(a latent model needs its VAE to turn samples into images)")
    vae = build_section({}, lambda: convert.vae_from_diffusers(vae_dir))
    if vae.video != is_video(cfg):
        raise ConfigError(f"base_checkpoint={base!r}: its VAE ({vae.family}) decodes "
                          f"{'clips' if vae.video else 'images'}, the transformer draws "
                          f"{'clips' if is_video(cfg) else 'images'}")
    if vae.latent_channels != cfg.channels:
        raise ConfigError(f"base_checkpoint={base!r}: the VAE has {vae.latent_channels} latent "
                          f"channels, the transformer {cfg.channels}")
    flux2 = isinstance(cfg, Flux2Config)
    if flux2 != (vae.family == FLUX2_CLASS):
        raise ConfigError(f"base_checkpoint={base!r}: its VAE is {vae.family}, the transformer "
                          f"{'is' if flux2 else 'is not'} FLUX.2's, whose latents only "
                          f"{FLUX2_CLASS} normalises (use the vae/ of the transformer's own "
                          f"pipeline)")
    return vae


def attention_spec(config, mesh: Mesh | None) -> AttentionSpec:
    """How the trainer's forwards (and the samplers on its mesh) lay out attention: the
    ``attention`` strategy over the mesh's ``sp`` axis when it has one, else dense, with the
    ``attention_impl`` kernel."""
    return attention_for(config.attention, mesh, config.get("attention_impl", "auto"))


def attention_for(strategy: str, mesh: Mesh | None, impl: str = "auto") -> AttentionSpec:
    """:func:`attention_spec` of the strategy name ``strategy`` and kernel ``impl``."""
    if mesh is None or mesh.shape.get("sp", 1) == 1 or strategy == "dense":
        return AttentionSpec(impl=impl)
    return AttentionSpec(mesh=mesh, strategy=strategy, axis="sp", impl=impl)


def make_trainer(config, graphdef, base, mesh=None):
    """The objective's trainer over ``base`` (placed on ``mesh``), sampling with
    :func:`sampler_config`, attention laid out by :func:`attention_spec`."""
    return trainer_of(rl_config(config), sampler_config(config), config.attention, graphdef,
                      base, mesh, int(config.seed), config.get("attention_impl", "auto"))


def trainer_of(rl, sampler: SamplerConfig, attention: str, graphdef, base, mesh, seed: int,
               impl: str = "auto"):
    """:func:`make_trainer` of built sections: the objective's trainer of ``rl``."""
    return trainer_class(rl)(graphdef, base, rl, sampler, mesh=mesh,
                             attn=attention_for(attention, mesh, impl), seed=seed)


def register_rewards(spec) -> None:
    """Registers the rewards the run ``spec`` names (alone or in a mix) that are built rather
    than shipped: the ``remote`` reward server's client (with the server's reward components
    for ``rl.advantage='decoupled'``) and the learned rewards (``rewards.learned.NEEDS``), each
    loaded once per folder. The runner, the explorer and the evaluation then resolve them by
    name like any shipped reward. A learned reward that does not load is a one-line ConfigError
    naming its field."""
    st = spec.settings
    named = {n for s in (st.reward, st.eval_reward) for n in rewards.mix.names(s)}
    if REMOTE_REWARD in named:
        _register_remote(spec.remote_reward)
    for name in sorted(named & set(LEARNED_NEEDS)):
        _register_learned(name, LEARNED_NEEDS[name], spec.learned_rewards)


def _register_remote(cfg: RemoteRewardConfig) -> None:
    """The client of the server ``cfg`` as the reward 'remote' (replacing an earlier run's)."""
    if _registered_remote.get(REMOTE_REWARD) == cfg and REMOTE_REWARD in rewards.names():
        return                          # this server's client is registered already
    client = RemoteReward(cfg)
    rewards.register(REMOTE_REWARD, client, overwrite=True, components=client.components)
    _registered_remote[REMOTE_REWARD] = cfg


# the config of the client registered as 'remote' (only this module registers that name)
_registered_remote: dict[str, RemoteRewardConfig] = {}


def _register_learned(name: str, fields: tuple[str, ...], cfg) -> None:
    """The learned reward ``name`` loaded from ``cfg``'s ``fields`` (``learned_rewards``)."""
    values = tuple(getattr(cfg, f) for f in fields)
    key = (name, values, cfg.batch_size)
    if _registered_learned.get(name) == key and name in rewards.names():
        return
    try:
        fn = LearnedReward(name, values[0], head=values[1] if len(values) > 1 else None,
                           batch_size=cfg.batch_size)
    except (OSError, ValueError) as e:
        raise ConfigError(f"learned_rewards.{fields[0]}={values[0]!r}: {e}") from None
    rewards.register(name, fn, overwrite=True)
    _registered_learned[name] = key


_registered_learned: dict[str, tuple] = {}


def prompt_source(config) -> PromptSource:
    """Where the run's prompts and their model inputs come from, decided once: a model with a
    prompt encoder (``model.text_width > 0``) reads the synthetic world's prompts through its
    word tokenizer; one without (``text_width == 0``) reads the prompt-embedding file
    ``prompts.embeddings_file`` (its train/val splits, embeddings of width
    ``model.text_embed_dim`` padded to ``model.text_len``): an edit file, whose rows carry their
    input image's latents, for an editing model (``model.reference_images > 0``), a text-only
    file for any other."""
    return prompts_of(model_config(config), config.prompts.embeddings_file,
                      config.prompts.train_kinds)


def prompts_of(m: MMDiTConfig, path: str, train_kinds: str) -> PromptSource:
    """:func:`prompt_source` of the model ``m``, the file ``path`` ('' = none) and the world's
    ``train_kinds``."""

    def bad(why):
        raise ConfigError(f"prompts.embeddings_file={path!r}: {why}")

    editing = getattr(m, "reference_images", 0) > 0
    if getattr(m, "text_width", 0):
        if path:
            bad(f"the model has its own prompt encoder (model.text_width={m.text_width}), which "
                "reads token ids; set --config.model.text_width=0 and "
                "--config.model.text_embed_dim=<the file's width> to use the file, or "
                "--config.prompts.embeddings_file=''")
        if editing:             # the editing world's kinds (world.edit.EDIT_KINDS)
            kinds = tuple(k.strip() for k in train_kinds.split(",") if k.strip())
            unknown = [k for k in kinds if k not in world.edit.EDIT_KINDS]
            if unknown:
                raise ConfigError(f"prompts.train_kinds={train_kinds!r}: unknown edit kind "
                                  f"{unknown[0]!r}; choose from {world.edit.EDIT_KINDS} "
                                  "(comma-separated, '' = all)")
            return EditPrompts(world.WorldConfig(image_size=m.image_size), kinds)
        try:
            kinds = world.parse_kinds(train_kinds)
        except ValueError as e:
            raise ConfigError(f"prompts.train_kinds={train_kinds!r}: {e}") from None
        if is_video(m):
            if kinds:
                raise ConfigError(f"prompts.train_kinds={train_kinds!r}: task kinds are the "
                                  "image world's; the video world trains on all its prompts "
                                  "(set --config.prompts.train_kinds='')")
            return VideoPrompts(world.WorldConfig(image_size=m.image_size))
        return WorldPrompts(world.WorldConfig(image_size=m.image_size), kinds)
    write_edits = ("write one with python -m spotlight_jax.tools.encode_prompts "
                   "--pipeline=<the Qwen-Image-Edit folder> --prompts=<edits.jsonl>")
    if editing and not path:
        raise ConfigError(f"model.reference_images={m.reference_images}: an editing model "
                          "without a prompt encoder needs prompt files holding each "
                          "instruction's input image (its latents and the encoder's embeddings "
                          f"of both): {write_edits} and pass --config.prompts.embeddings_file")
    if train_kinds:
        raise ConfigError(f"prompts.train_kinds={train_kinds!r}: task kinds are "
                          "the synthetic world's; a prompt-embedding file's training pool is its "
                          "train split (set --config.prompts.train_kinds='')")
    if not path:
        bad("model.text_width=0 feeds precomputed prompt embeddings; give a file written by "
            "python -m spotlight_jax.tools.encode_prompts")
    try:
        source = EmbeddingPrompts(read_prompt_embeddings(path))
    except PromptEmbeddingError as e:          # its message starts with the path: named above
        bad(" ".join(str(e).removeprefix(f"{pathlib.Path(path)}: ").split()))
    f = source.file
    _check_file_family(m, f, bad)
    if editing and not f.is_edit:
        raise ConfigError(f"model.reference_images={m.reference_images}: an editing model "
                          "without a prompt encoder needs prompt files holding each "
                          f"instruction's input image; prompts.embeddings_file={path!r} is "
                          f"text-only (family {f.family!r}): {write_edits}")
    if f.is_edit and not editing:
        bad(f"holds input-image latents (an edit file, family {f.family!r}) for an editing "
            "model, and this model is text-to-image (model.reference_images=0); use the "
            "editing pipeline's folder as base_checkpoint, or a text-only file")
    if f.is_edit:
        source = EditEmbeddingPrompts(f)
        h, w, c = f.latent_shape
        if c != m.channels:
            bad(f"input-image latents of {c} channels, the model takes model.channels="
                f"{m.channels}; encode the images with the base's own VAE (its pipeline folder)")
        if h % m.patch_size or w % m.patch_size:
            bad(f"input-image latents of {h}x{w} cells, not a multiple of the model's "
                f"patch_size={m.patch_size}; re-encode with another --image_area")
    if f.dim != m.text_embed_dim and family_of(m) in FOLDER_WIDTH:
        bad(f"embeddings of width {f.dim}, the transformer takes {m.text_embed_dim} (its "
            f"{FOLDER_WIDTH[family_of(m)]}); {_ENCODE_WITH_BASE}")
    if f.dim != m.text_embed_dim:
        bad(f"embeddings of width {f.dim}, the model takes model.text_embed_dim="
            f"{m.text_embed_dim}; set --config.model.text_embed_dim={f.dim}")
    if (f.family in EVERY_TOKEN_FAMILIES and not getattr(m, "use_text_mask", True)
            and f.text_len != m.text_len):
        raise ConfigError(f"model.text_len={m.text_len}: the {f.family} transformer attends to "
                          f"every text token, and prompts.embeddings_file={path!r} holds the "
                          f"pipeline's {f.text_len} per prompt (its max_sequence_length, pad "
                          f"tokens included); set --config.model.text_len={f.text_len}")
    if f.text_len > m.text_len:
        bad(f"{f.text_len} tokens per prompt, more than model.text_len={m.text_len}; set "
            f"--config.model.text_len={f.text_len} (tokens are never truncated)")
    if f.pooled_dim is not None and m.pooled != "input":
        bad(f"holds pooled embeddings of width {f.pooled_dim} (family {f.family!r}), which "
            f"model.pooled={m.pooled!r} would drop; set --config.model.pooled=input "
            f"--config.model.pooled_dim={f.pooled_dim}")
    if m.pooled == "input" and f.pooled_dim is None:
        bad(f"has no pooled embeddings (family {f.family!r}), which model.pooled='input' needs; "
            "write it with the model's family (e.g. sd3) or set --config.model.pooled=none")
    if m.pooled == "input" and f.pooled_dim != m.pooled_dim:
        bad(f"pooled embeddings of width {f.pooled_dim}, the model takes model.pooled_dim="
            f"{m.pooled_dim}; set --config.model.pooled_dim={f.pooled_dim}")
    if not source.train_prompts:
        bad("has no training prompts (split 'train'); re-run python -m "
            "spotlight_jax.tools.encode_prompts with them")
    return source


# the model families whose text width is the transformer's own (config.json, no run field):
# the field that holds it
FOLDER_WIDTH = {"z_image": "cap_feat_dim", "flux2": "joint_attention_dim"}
_ENCODE_WITH_BASE = ("encode the prompts with the base's own pipeline folder (python -m "
                     "spotlight_jax.tools.encode_prompts --pipeline=<the base_checkpoint "
                     "folder>)")


def _check_file_family(m, f, bad) -> None:
    """Refuses (through ``bad``) a prompt file written by a pipeline whose embeddings condition
    another model family than ``m``'s (``encoders.MODEL_FAMILY``: a Z-Image file for a FLUX.2
    run, an SD3 file for Z-Image, ...), and a FLUX.2 [dev] (Mistral) file for a [klein]
    transformer or the reverse; a file of a family it does not know (one written by other
    code) passes, its widths checked as any file's."""
    want = ENCODER_MODEL_FAMILY.get(f.family)
    have = family_of(m)
    fix = _ENCODE_WITH_BASE
    if want is not None and want != have:
        bad(f"written by a {f.encoder.split(':')[0] or f.family} (family {f.family!r}), whose "
            f"embeddings condition model.family={want!r}, and this run's model is "
            f"{have!r}; {fix}")
    if have == "flux2" and f.family in ("flux2", "flux2_klein"):
        dev = bool(m.guidance_embeds)
        if dev != (f.family == "flux2"):
            bad(f"written by a {f.encoder.split(':')[0] or f.family} (family {f.family!r}: "
                f"{'Mistral' if f.family == 'flux2' else 'Qwen3'} states, FLUX.2 "
                f"{'[dev]' if f.family == 'flux2' else '[klein]'}), and the base's transformer "
                f"is FLUX.2 {'[dev]' if dev else '[klein]'}'s; {fix}")


def build_mesh(config, devices=None) -> Mesh:
    return make_mesh(devices, mesh_config(config))


def make_deployment(config, rents_spot: bool = True) -> Deployment:
    """The emulated deployment (on-demand devices, spot nodes, trace, cost model) of ``config``
    (``rents_spot``: whether the run pays for the spot nodes, ``Deployment``). A trace file that
    is missing or unreadable raises :class:`TraceError` naming ``trace.path``, the file and the
    fix."""
    return deployment_of(deployment_config(config), trace_config(config), cost_config(config),
                         workload(config), int(config.sampler.num_steps), rents_spot)


def deployment_of(deploy: DeploymentConfig, trace: TraceConfig, cost: CostConfig,
                  work: Workload, num_steps: int, rents_spot: bool = True) -> Deployment:
    """:func:`make_deployment` of built sections (a spot slice that does not fit the device,
    its nodes or the trace's cloud: a ConfigError naming the config field)."""
    build_section(slice_paths(), lambda: deploy.spot_slice_shape(cost.device, trace.cloud))
    try:
        return Deployment(deploy, trace, cost, work, num_steps=num_steps, rents_spot=rents_spot)
    except TraceError as e:
        raise TraceError(qualify(str(e), section_paths("trace", TraceConfig))) from e
