"""``--dry_run``: size a config without allocating it (``jax.eval_shape`` only).

Prints the parameter count, bytes per device for parameters + AdamW state + the activations of
one gradient step of the update (the rows the objective's trainer pushes, the residuals its
backward keeps) under the config's mesh, whether that fits the HBM of the deployment's device
(``cost.device``'s datasheet), and the resolved PartitionSpec of every parameter group. Works
for the 20B paper-scale config on a laptop in seconds because nothing is materialised.
"""
from __future__ import annotations

import collections
import dataclasses
import math

import jax
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec

from spotlight_jax.config import RunSpec
from spotlight_jax.config.builders import base_shardings
from spotlight_jax.diffusion import prompt, velocity
from spotlight_jax.emulation.datasheets import device_spec
from spotlight_jax.models import AttentionSpec, as_dtype
from spotlight_jax.models.convert.transformer import host_peak_bytes
from spotlight_jax.models.factory import abstract_model, is_video
from spotlight_jax.parallel import kernels, make_mesh
from spotlight_jax.parallel.sharding import param_specs
from spotlight_jax.rl import lora as lora_lib
from spotlight_jax.rl import work_of
from spotlight_jax.rl.policy import policy_model
from spotlight_jax.rl.work import UpdateRows


def _shard_factor(spec: PartitionSpec, mesh) -> int:
    n = 1
    for axes in spec:
        for a in ((axes,) if isinstance(axes, str) else tuple(axes or ())):
            n *= mesh.shape[a]
    return n


def _prompts(cfg, rows: int):
    """Abstract prompts of ``rows`` rows in the form the model takes them: token ids, or a
    prompt-embedding file's embeddings (and pooled vector); an editing model's with its input
    images' latents."""
    mask = jax.ShapeDtypeStruct((rows, cfg.text_len), bool)
    refs = getattr(cfg, "reference_images", 0)
    if not cfg.text_embed_dim and not refs:
        return jax.ShapeDtypeStruct((rows, cfg.text_len), np.int32), mask
    tokens = {prompt.EMBEDS: (jax.ShapeDtypeStruct((rows, cfg.text_len, cfg.text_embed_dim),
                                                   np.float32) if cfg.text_embed_dim else
                              jax.ShapeDtypeStruct((rows, cfg.text_len), np.int32))}
    if cfg.pooled == "input":
        tokens[prompt.POOLED] = jax.ShapeDtypeStruct((rows, cfg.pooled_dim), np.float32)
    if refs:        # an editing model: every reference slot at the target's size, the most
        image = jax.ShapeDtypeStruct((rows, *cfg.latent_shape), np.float32)
        tokens[prompt.IMAGE] = image if refs == 1 else (image,) * refs
    return tokens, mask


def residual_bytes(cfg, graphdef, abstract, rl_cfg, guidance: float = 1.0,
                   attn: AttentionSpec = AttentionSpec()) -> int:
    """Bytes per row that the backward pass of the model's velocity keeps from its forward:
    the residuals of ``jax.vjp`` with respect to what the update trains (the LoRA factors, or
    every parameter), traced once for a symbolic row count (``jax.eval_shape``: nothing is
    allocated). Residuals without a row dimension (parameters the backward reads) are not
    counted here. With ``remat`` these are the blocks' inputs. ``attn``: how attention runs
    (``kernels.RECOMPUTE`` counts a fused kernel's residuals: no score matrix)."""
    rows, = jax.export.symbolic_shape("rows")
    x = jax.ShapeDtypeStruct((rows, *cfg.latent_shape), np.float32)
    t = jax.ShapeDtypeStruct((rows,), np.float32)
    tokens, mask = _prompts(cfg, rows)
    if rl_cfg.lora_rank:
        trainable = jax.eval_shape(lambda: lora_lib.init_lora(abstract, rl_cfg.lora_rank,
                                                              jax.random.key(0)))
    else:
        trainable = abstract

    def backward(trainable, base, x, t, tokens, mask):
        def loss(p):
            model = policy_model(graphdef, rl_cfg, p, base)
            return velocity(model, x, t, tokens, mask, guidance=guidance, attn=attn).sum()
        return jax.vjp(loss, trainable)[1]

    total = 0
    for a in jax.tree.leaves(jax.eval_shape(backward, trainable, abstract, x, t, tokens, mask)):
        per_row = [d for d in a.shape if not isinstance(d, int)]
        if len(per_row) > 1:
            raise ValueError(f"a residual of shape {a.shape} grows faster than the rows")
        if per_row:
            total += math.prod(d if isinstance(d, int) else d // rows
                               for d in a.shape) * np.dtype(a.dtype).itemsize
    return total


def activation_bytes(cfg, graphdef, abstract, rl_cfg, rows: UpdateRows, mesh,
                     fused_attention: bool = False) -> float:
    """The activation memory per device of one gradient step of the update, from what it runs
    (``rows``: the trainer's ``update_rows``).

    The rows' residuals (:func:`residual_bytes`) split over the batch axes ``data x fsdp`` and
    the sequence axis ``sp``; with ``remat``, plus one block's full residuals for its recompute.
    LoRA is applied factored in the train step (``rl.lora.adapted_model``): no merged kernel
    exists, and the rank-sized products it keeps are rows' residuals. Forwards without
    gradient (v_old, v_ref) hold one layer at a time: left out. ``fused_attention``: count
    attention as a fused (flash) kernel keeps it, O(sequence) per row, instead of XLA's
    attention, whose backward keeps each head's score matrix."""
    attn = AttentionSpec(impl=kernels.RECOMPUTE) if fused_attention else AttentionSpec()
    per_row = residual_bytes(cfg, graphdef, abstract, rl_cfg, rows.guidance, attn)
    if cfg.remat:   # the same graph with remat off (``cfg.remat`` is read per call)
        model = nnx.merge(graphdef, abstract)
        model.cfg = dataclasses.replace(cfg, remat=False)
        plain, _ = nnx.split(model)
        per_row += (residual_bytes(cfg, plain, abstract, rl_cfg, rows.guidance, attn)
                    / (cfg.depth + cfg.single_blocks))
    return rows.grad * per_row / (mesh.shape["data"] * mesh.shape["fsdp"] * mesh.shape["sp"])


def hbm_fit(device: str, update_bytes: float, weight_bytes: float,
            fused_bytes: float | None = None) -> str:
    """The dry run's line on memory against ``device``'s HBM (a ``datasheets.DEVICES`` key,
    ``cost.device``): the update's bytes per device (and with the fused kernel it runs
    there: :func:`fused_kernel_on`), and a spot SP group's rollout, which keeps the whole
    weights on every device (SP replicates them; its activations are not sized here)."""
    spec = device_spec(device)
    gib = 1024**3
    if not spec.hbm_gb:
        return f"HBM: {spec.label} (cost.device={device!r}) has no capacity on record"
    hbm = spec.hbm_gb * 1e9

    def verdict(nbytes):
        if nbytes <= hbm:
            return f"{nbytes / gib:.3f} GiB fits ({nbytes / hbm:.0%})"
        return f"{nbytes / gib:.3f} GiB does NOT fit ({(nbytes - hbm) / gib:.3f} GiB over)"

    fits = verdict(update_bytes)
    if fused_bytes is not None:
        fits += f"; with the fused kernel {verdict(fused_bytes)}"
    line = (f"HBM of cost.device={device!r} ({spec.label}): {spec.hbm_gb:g} GB = "
            f"{hbm / gib:.2f} GiB per device; the update: {fits}; a spot SP group's rollout "
            f"keeps the whole weights on every device: {verdict(weight_bytes)} (plus its "
            "activations, not sized here)")
    if update_bytes > hbm or weight_bytes > hbm:
        line += ("; to fit: more fsdp devices (mesh.fsdp), smaller gradient steps (more "
                 "rl.nft.minibatches / rl.minibatches) or a device with more HBM")
    return line


def fused_kernel_on(device: str, impl: str, dtype, head_dim: int) -> str | None:
    """The fused attention kernel ``impl`` runs on the accelerator ``device`` (a datasheet
    name, the run's ``cost.device``) for ``dtype`` inputs of ``head_dim``: splash attention on
    a TPU, cuDNN flash attention on an NVIDIA GPU where it can run; None for XLA's."""
    if device_spec(device).is_tpu:
        return "splash attention" if impl in ("auto", "splash") else None
    if kernels.fused_on_gpus(impl, dtype, head_dim):
        return "cuDNN flash attention"
    return None


def dry_run(config, devices=None) -> str:
    """The report of the run ``config`` (a RunSpec, or a ConfigDict built into one here) over
    ``devices`` (default: all)."""
    run = RunSpec.of(config)
    cfg = run.model
    mesh = run.build_mesh(devices)
    graphdef, abstract = abstract_model(cfg)
    specs = param_specs(abstract, mesh)
    leaves = jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(abstract))
    spec_leaves = jax.tree.leaves(nnx.to_pure_dict(specs),
                                  is_leaf=lambda x: isinstance(x, PartitionSpec))
    total = sum(math.prod(a.shape) for _, a in leaves)
    weight_bytes = sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for _, a in leaves)
    per_device = 0.0
    groups = collections.OrderedDict()
    for (path, a), pspec in zip(leaves, spec_leaves):
        nbytes = math.prod(a.shape) * np.dtype(a.dtype).itemsize
        per_device += nbytes / _shard_factor(pspec, mesh)
        name = "/".join(str(getattr(p, "key", p)) for p in path)
        name = ".".join(part for part in name.split("/") if not part.isdigit())
        g = groups.setdefault(name, [0, str(pspec), a.shape, str(a.dtype)])
        g[0] += math.prod(a.shape)
    rl_cfg = run.rl
    rank = int(rl_cfg.lora_rank)
    if rank:   # LoRA: the trainable factors (f32, replicated), AdamW mu and nu of them
        lora = sum(math.prod(a.shape[:-2]) * rank * (a.shape[-2] + a.shape[-1])
                   for path, a in leaves if lora_lib.is_target(path))
        opt = 3 * 4 * lora
        opt_name = f"LoRA rank {rank} ({lora / 1e6:.1f}M, f32) + AdamW state"
    else:      # full fine-tuning: AdamW mu, nu in f32 of every (sharded) parameter
        opt = 2 * per_device * (4 / np.dtype(as_dtype(cfg.param_dtype)).itemsize)
        opt_name = "AdamW state"
    batch = run.settings.prompts_per_iter * run.settings.group_size
    rows = work_of(rl_cfg, run.sampler).update_rows(batch)
    act = activation_bytes(cfg, graphdef, abstract, rl_cfg, rows, mesh)
    # what the run's fused kernel would keep on cost.device, where one would run there
    fused_kernel = fused_kernel_on(run.cost.device, run.process.attention_impl,
                                   as_dtype(cfg.dtype), cfg.head_dim)
    fused = None
    if fused_kernel:
        fused = activation_bytes(cfg, graphdef, abstract, rl_cfg, rows, mesh,
                                 fused_attention=True)
    load_peak = host_peak_bytes(cfg, base_shardings(cfg, mesh))
    host_peak = host_peak_bytes(cfg, base_shardings(cfg, make_mesh(list(mesh.devices.flat))))
    gib = 1024**3
    video = (f"{type(cfg).__name__} latent {'x'.join(map(str, cfg.latent_shape))} "
             if is_video(cfg) else "")
    refs = getattr(cfg, "reference_images", 0)
    references = f"+{refs * cfg.num_patches} (reference images)" if refs else ""
    lines = [
        f"model: {video}width={cfg.width} depth={cfg.depth}"
        f"{f' (+{cfg.single_blocks} single-stream)' if cfg.single_blocks else ''} "
        f"heads={cfg.num_heads} "
        f"tokens={cfg.num_patches}{references}+{cfg.text_len} dtype={cfg.dtype}/{cfg.param_dtype} "
        f"remat={cfg.remat} scan={cfg.scan_blocks}",
        f"mesh: {dict(mesh.shape)} over {mesh.devices.size} "
        f"{mesh.devices.flat[0].platform} devices",
        f"parameters: {total:,} ({total / 1e9:.2f}B)",
        f"per device: params {per_device / gib:.3f} GiB + {opt_name} {opt / gib:.3f} GiB + "
        f"activations {act / gib:.3f} GiB = {(per_device + opt + act) / gib:.3f} GiB",
        f"activations: the backward's residuals of {rows.grad} rows per gradient step"
        f"{' at CFG ' + format(rows.guidance, 'g') if cfg.passes(rows.guidance) == 2 else ''} "
        f"(+{rows.forward} rows forward only), XLA's attention (its backward keeps every "
        f"head's scores)"
        + ("" if fused is None else
           f"; with the fused kernel a run on {run.cost.device} uses ({fused_kernel}, "
           f"attention_impl='{run.process.attention_impl}' in {cfg.dtype}): "
           f"{fused / gib:.3f} GiB, "
           f"{(per_device + opt + fused) / gib:.3f} GiB per device in all"),
        hbm_fit(run.cost.device, per_device + opt + act, weight_bytes,
                None if fused is None else per_device + opt + fused),
        f"loading the base from a diffusers folder (streamed onto these shardings): host "
        f"peak {load_peak / gib:.3f} GiB per process (its largest parameter's local shards + "
        f"one source tensor); a spot host holding it whole on its devices: "
        f"{host_peak / gib:.3f} GiB",
        "parameter groups (count, PartitionSpec, shape, dtype):",
    ]
    for name, (n, spec, shape, dtype) in groups.items():
        lines.append(f"  {name:<48} {n:>14,}  {spec:<28} {shape} {dtype}")
    return "\n".join(lines)
