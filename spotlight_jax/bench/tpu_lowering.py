"""What a config's programs ask a TPU to run, read from their lowering on any machine.

  python -m spotlight_jax.bench.tpu_lowering [--config=configs/qwen_image.py] [--depth=2]
      [--latent=64] [--latent_width=0] [--batch=1] [--rank=32] [--sp=4]
      [--remat_policy=POLICY] [--out=FILE.json]

``bench.gpu_lowering``'s census for the ``tpu`` platform: the same programs (the model's
forward, its full fine-tuning and factored LoRA r``--rank`` gradients, and the project's
attention in each SP strategy over ``--sp`` emulated devices), lowered to StableHLO for TPU
with the kernel ``attention_impl='auto'`` picks on a TPU (splash attention, a Pallas kernel
compiled by Mosaic: each call is a ``tpu_custom_call`` naming its kernel). Each program's
census:

* splash's calls: forward (``splash_mha_fwd...``) and its two backward kernels (``..._dq``,
  ``..._dkv``);
* score-sized values (must be 0 in the model's programs: attention outside the kernel);
* the matmul FLOPs by operand dtypes, and the fused attention's FLOPs as model FLOPs count them
  (``4 b h q k d`` per forward call at the kernel's tile-padded lengths; the backward's ``8 b h
  q k d`` split evenly between its dq and dkv calls);
* the collectives each program asks for (all-to-all, collective-permute, all-gather,
  all-reduce, reduce-scatter): what sequence parallelism inserts.

Lowering needs no TPU and compiles nothing; what the TPU's compiler makes of the program (its
fusions, the kernel's speed, the ICI's) only a TPU measures.
"""
from __future__ import annotations

import dataclasses
import re

from absl import app, flags

from spotlight_jax import programs
from spotlight_jax.bench import gpu_lowering

FLAGS = flags.FLAGS
define_flags = gpu_lowering.define_flags      # the same flags as the GPU census

# what parallel.kernels reads of a TPU (JAX's device_kind of a v5e chip)
TPU_V5E = gpu_lowering.TargetDevice("tpu", "TPU v5 lite", "")
COLLECTIVES = ("all_to_all", "collective_permute", "all_gather", "all_reduce", "reduce_scatter")


def lower_for_tpu(fn, *args) -> str:
    """The StableHLO text of ``jax.jit(fn)`` at ``args`` (arrays or ShapeDtypeStructs),
    lowered for TPUs on whatever machine this is."""
    import jax  # noqa: PLC0415

    return jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",)).as_text()


@dataclasses.dataclass(frozen=True)
class TpuCensus(gpu_lowering.MatmulCounts):
    """What one program lowered for TPU asks for (see the module doc)."""

    splash_forward: int = 0
    splash_dq: int = 0
    splash_dkv: int = 0
    score_values: int = 0
    collectives: dict = dataclasses.field(default_factory=dict)


_KERNEL = re.compile(r'kernel_name = "?(\w+)')
_COLLECTIVE = re.compile(r"stablehlo\.(" + "|".join(COLLECTIVES) + r")\b")


def splash_phase(name: str) -> str | None:
    """``fwd``, ``dq`` or ``dkv`` for a splash kernel's name; None for another kernel."""
    m = re.match(r"splash_mh?q?a_(fwd|dq|dkv)", name)
    return m.group(1) if m else None


def _splash_flops(line: str) -> float:
    """A splash call's model FLOPs (module doc) from its q and k operands."""
    if "tpu_custom_call" not in line:
        return 0.0
    name = _KERNEL.search(line)
    if name is None or splash_phase(name.group(1)) is None or " : (" not in line:
        return 0.0
    operands = line.rsplit(" : (", 1)[1].split(" -> ")[0]     # the operands' types, last
    tensors = [gpu_lowering.tensor_shape(t) for t in re.findall(r"tensor<[^>]*>", operands)]
    # q and k: the first two float operands, [b, h, s, d] (or [h, s, d] for one element)
    q, k = [(1,) * (4 - len(shape)) + shape for shape, dtype in tensors
            if len(shape) in (3, 4) and dtype in ("bf16", "f16", "f32")][:2]
    b, h, sq, d = q
    return 4.0 * b * h * sq * k[2] * d


def census(text: str, lengths) -> TpuCensus:
    """The census of a program lowered for TPU (``text``) whose attention runs over sequences
    of the given ``lengths`` (``gpu_lowering.scan``)."""
    lines = gpu_lowering.expanded(text)
    joined = "\n".join(lines)
    phases = [splash_phase(n) for n in _KERNEL.findall(joined)]
    scores, flops, fused = gpu_lowering.scan(lines, lengths, _splash_flops)
    collectives = {}
    for name in _COLLECTIVE.findall(joined):
        collectives[name] = collectives.get(name, 0) + 1
    return TpuCensus(flops, fused, phases.count("fwd"), phases.count("dq"), phases.count("dkv"),
                     scores, collectives)


def _padded(n: int) -> int:
    from spotlight_jax.parallel.kernels import SPLASH_TILE  # noqa: PLC0415

    return -(-n // SPLASH_TILE) * SPLASH_TILE


def tpu_lowering(config_path: str, depth: int, latent: int, batch: int, rank: int,
                 sp: int, remat_policy: str = "", latent_width: int = 0,
                 target=TPU_V5E) -> dict:
    """Every program's census (see the module doc), as a JSON-able dict; the arguments are
    ``bench.gpu_lowering.gpu_lowering``'s."""
    import jax  # noqa: PLC0415

    from spotlight_jax.io import provenance  # noqa: PLC0415

    model = gpu_lowering.model_overrides(config_path, remat_policy, latent_width)
    cfg, kernel, why, progs = gpu_lowering.model_programs(config_path, depth, latent, batch,
                                                          rank, target=target, **model)
    n, heads = gpu_lowering.sequence_of(cfg), cfg.num_heads
    local = {n, cfg.text_len} | {-(-n // d) for d in range(2, sp + 1)}
    # a length equal to the head dim is left out: every [.., s, d] activation would count
    lengths = (local | {_padded(x) for x in local}) - {cfg.head_dim}
    rows = {name: census(lower_for_tpu(fn, *args), lengths)
            for name, (fn, args) in progs.items()}
    for strategy, (fn, args) in gpu_lowering.attention_programs(cfg, kernel, batch, sp).items():
        rows[f"attention_{strategy}"] = census(lower_for_tpu(fn, *args), lengths)
    return {"config": config_path, "depth": depth, "latent": latent,
            "latent_width": latent_width or latent, "batch": batch, "rank": rank, "sp": sp,
            "jax": jax.__version__, "code": provenance.code_version(),
            "remat": cfg.remat and cfg.remat_policy, "target": target.device_kind,
            "kernel": kernel.impl, "not_splash": why, "sequence": n, "heads": heads,
            "head_dim": cfg.head_dim,
            "programs": {k: dict(dataclasses.asdict(c), half_share=c.half_share, flops=c.flops)
                         for k, c in rows.items()}}


def table(r: dict) -> str:
    head = (f"{r['config']} at {r['depth']} block(s), {r['latent']} x {r['latent_width']} "
            f"latent, batch {r['batch']}, {r['sequence']} tokens, {r['heads']} heads, remat "
            f"{r['remat'] or 'off'}; lowered for {r['target']}: attention kernel {r['kernel']}"
            + (f" ({r['not_splash']})" if r["not_splash"] else ""))
    lines = [head, "", "| program | splash fwd | splash dq / dkv | score-sized values | "
             "matmul FLOPs | fused attention FLOPs | x forward | matmuls in bf16 | "
             "collectives |", "|---|---|---|---|---|---|---|---|---|"]
    forward = r["programs"]["forward"]["flops"]
    for name, c in r["programs"].items():
        label = gpu_lowering.LABELS.get(name, name.replace(
            "attention_", f"attention, {r['sp']}-way ").replace(f"{r['sp']}-way dense", "dense"))
        ratio = f"{c['flops'] / forward:.2f}" if not name.startswith("attention") else "-"
        comms = ", ".join(f"{k} {v}" for k, v in sorted(c["collectives"].items())) or "-"
        lines.append(f"| {label} | {c['splash_forward']} | {c['splash_dq']} / "
                     f"{c['splash_dkv']} | {c['score_values']} | "
                     f"{sum(c['matmul_flops'].values()):.3e} | "
                     f"{c['fused_attention_flops']:.3e} | {ratio} | "
                     f"{100 * c['half_share']:.1f}% | {comms} |")
    return "\n".join(lines)


def main(argv):
    del argv
    programs.emulate_devices(FLAGS.sp)
    try:
        result = tpu_lowering(FLAGS.config, FLAGS.depth, FLAGS.latent, FLAGS.batch, FLAGS.rank,
                              FLAGS.sp, FLAGS.remat_policy, FLAGS.latent_width)
    except ValueError as e:         # a bad flag: one line, no traceback
        raise SystemExit(f"bench.tpu_lowering: {e}") from None
    programs.emit(result, table(result), FLAGS.out)


if __name__ == "__main__":
    define_flags()
    app.run(main)
