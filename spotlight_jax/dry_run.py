"""``--dry_run``: size a config without allocating it (``jax.eval_shape`` only).

Prints the parameter count, bytes per device for parameters + AdamW state + an activation
estimate under the config's mesh, and the resolved PartitionSpec of every parameter group. Works
for the 20B paper-scale config on a laptop in seconds because nothing is materialised.
"""
from __future__ import annotations

import collections
import math

import jax
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec

from spotlight_jax.builders import abstract_model, build_mesh, model_config, objective
from spotlight_jax.models import as_dtype
from spotlight_jax.parallel.sharding import param_specs
from spotlight_jax.rl import lora as lora_lib


def _shard_factor(spec: PartitionSpec, mesh) -> int:
    n = 1
    for axes in spec:
        for a in ((axes,) if isinstance(axes, str) else tuple(axes or ())):
            n *= mesh.shape[a]
    return n


def activation_bytes(cfg, batch: int, mesh) -> float:
    """Rough per-device activation memory of one training forward+backward.

    Korthikanti et al. (2022) per-layer estimate for a transformer layer in 16-bit:
    ``s*b*h*(34 + 5*a*s/h)`` bytes; with remat only the block input (``2*s*b*h``) is kept per layer
    plus one layer's full set. Batch divides over data*fsdp, sequence over sp.
    """
    s = cfg.num_patches + cfg.text_len
    h, a = cfg.width, cfg.num_heads
    bytes_per = np.dtype(as_dtype(cfg.dtype)).itemsize / 2.0
    per_layer = s * batch * h * (34 + 5 * a * s / h) * bytes_per
    if cfg.remat:
        total = cfg.depth * 2 * s * batch * h * bytes_per + per_layer
    else:
        total = cfg.depth * per_layer
    b_div = mesh.shape["data"] * mesh.shape["fsdp"]
    return total / b_div / mesh.shape["sp"]


def dry_run(config, devices=None) -> str:
    cfg = model_config(config)
    mesh = build_mesh(config, devices)
    _, abstract = abstract_model(cfg)
    specs = param_specs(abstract, mesh)
    leaves = jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(abstract))
    spec_leaves = jax.tree.leaves(nnx.to_pure_dict(specs),
                                  is_leaf=lambda x: isinstance(x, PartitionSpec))
    total = sum(math.prod(a.shape) for _, a in leaves)
    per_device = 0.0
    groups = collections.OrderedDict()
    for (path, a), spec in zip(leaves, spec_leaves):
        nbytes = math.prod(a.shape) * np.dtype(a.dtype).itemsize
        per_device += nbytes / _shard_factor(spec, mesh)
        name = "/".join(str(getattr(p, "key", p)) for p in path)
        name = ".".join(part for part in name.split("/") if not part.isdigit())
        g = groups.setdefault(name, [0, str(spec), a.shape, str(a.dtype)])
        g[0] += math.prod(a.shape)
    rank = int(config.rl.lora_rank)
    if rank:   # LoRA: the trainable factors (f32, replicated), AdamW mu and nu of them
        lora = sum(math.prod(a.shape[:-2]) * rank * (a.shape[-2] + a.shape[-1])
                   for path, a in leaves if lora_lib.is_target(path))
        opt = 3 * 4 * lora
        opt_name = f"LoRA rank {rank} ({lora / 1e6:.1f}M, f32) + AdamW state"
    else:      # full fine-tuning: AdamW mu, nu in f32 of every (sharded) parameter
        opt = 2 * per_device * (4 / np.dtype(as_dtype(cfg.param_dtype)).itemsize)
        opt_name = "AdamW state"
    batch = config.rl.prompts_per_iter * config.rl.group_size
    minibatches = (config.rl.nft.minibatches if objective(config) == "nft"
                   else config.rl.minibatches)
    act = activation_bytes(cfg, batch // max(minibatches, 1), mesh)
    gib = 1024**3
    lines = [
        f"model: width={cfg.width} depth={cfg.depth} heads={cfg.num_heads} "
        f"tokens={cfg.num_patches}+{cfg.text_len} dtype={cfg.dtype}/{cfg.param_dtype} "
        f"remat={cfg.remat} scan={cfg.scan_blocks}",
        f"mesh: {dict(mesh.shape)} over {mesh.devices.size} "
        f"{mesh.devices.flat[0].platform} devices",
        f"parameters: {total:,} ({total / 1e9:.2f}B)",
        f"per device: params {per_device / gib:.3f} GiB + {opt_name} {opt / gib:.3f} GiB + "
        f"activations (est., {batch // max(minibatches, 1)} samples/minibatch) "
        f"{act / gib:.3f} GiB = {(per_device + opt + act) / gib:.3f} GiB",
        "parameter groups (count, PartitionSpec, shape, dtype):",
    ]
    for name, (n, spec, shape, dtype) in groups.items():
        lines.append(f"  {name:<48} {n:>14,}  {spec:<28} {shape} {dtype}")
    return "\n".join(lines)
