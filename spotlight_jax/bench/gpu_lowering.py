"""What a config's programs ask an NVIDIA GPU to run, read from their lowering on any machine.

  python -m spotlight_jax.bench.gpu_lowering [--config=configs/qwen_image.py] [--depth=2]
      [--latent=64] [--latent_width=0] [--batch=1] [--rank=32] [--sp=4]
      [--remat_policy=POLICY] [--out=FILE.json]

Lowers (StableHLO for the ``cuda`` platform: no GPU and no compile, so a laptop reads a
full-width model) the config's model at ``--depth`` blocks -- its forward and the gradients of
a flow-matching loss under full fine-tuning and under factored LoRA r``--rank``, the programs
``bench.step_flops`` counts -- and the project's attention at the model's sequence in each
sequence-parallel strategy over ``--sp`` emulated devices, with the kernel
``attention_impl='auto'`` picks on a Hopper GPU. Each program's census:

* cuDNN flash attention's calls, forward and backward (the ``__cudnn$fmha...`` custom calls);
* score-sized values: ops whose result is ``[batch, heads, queries, keys]`` (in any order of
  the leading axes) at the sequence's lengths: attention computed outside a kernel (XLA's
  implementation, the ring's backward);
* the matmul FLOPs by operand dtypes (the share at the tensor cores' bf16 rate), and the fused
  attention's FLOPs (``4 b h q k d`` per forward call, twice that per backward, as model FLOPs
  count them).

What the GPU's compiler then makes of the program (fusions, each kernel's speed) only a device
measures (``bench.device_check``); this says whether the program asks for the right kernels
before one is lent. JAX asks the cuDNN library for its version while lowering its fused
attention: the lowering here assumes cuDNN 9.8 on a Hopper GPU (:func:`cudnn_assumed`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import re

from absl import app, flags

from spotlight_jax import programs
from spotlight_jax.bench.step_flops import define_model_flags

FLAGS = flags.FLAGS
CUDNN_VERSION = 90800


@dataclasses.dataclass(frozen=True)
class TargetDevice:
    """A device a program is lowered for, with what ``parallel.kernels`` reads of one."""

    platform: str
    device_kind: str
    compute_capability: str


HOPPER = TargetDevice("gpu", "NVIDIA H100 80GB HBM3", "9.0")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    fv = {"flag_values": flag_values}
    define_model_flags(flag_values, depth=2)
    flags.DEFINE_integer("sp", 4, "Sequence-parallel degree of the attention paths.", **fv)
    flags.DEFINE_string("remat_policy", "", "The model's remat policy (models.mmdit."
                        "REMAT_POLICIES; empty: the config's).", **fv)
    flags.DEFINE_integer("latent_width", 0, "A video model's latent columns (0: square).", **fv)
    flags.DEFINE_string("out", None, "Also write the census as JSON here.", **fv)


@contextlib.contextmanager
def cudnn_assumed(version: int = CUDNN_VERSION, capability: str = HOPPER.compute_capability):
    """Within: JAX lowers cuDNN's fused attention as if cuDNN ``version`` ran on a GPU of
    compute ``capability`` (its lowering asks the library, which a machine without a GPU
    lacks); JAX's own checks are restored on exit."""
    from jax._src.cudnn import fused_attention_stablehlo as fused  # noqa: PLC0415

    names = ("check_cudnn_version", "check_compute_capability")
    missing = [n for n in names if not hasattr(fused, n)]
    if missing:
        import jax  # noqa: PLC0415
        raise RuntimeError(f"JAX {jax.__version__} has no {', '.join(missing)} in its cuDNN "
                           "attention module (read from JAX 0.10's): bench.gpu_lowering."
                           "cudnn_assumed needs updating for this JAX")
    saved = {n: getattr(fused, n) for n in names}
    fused.check_cudnn_version = lambda: version
    fused.check_compute_capability = lambda wanted: float(wanted) <= float(capability)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(fused, name, fn)


def lower_for_cuda(fn, *args) -> str:
    """The StableHLO text of ``jax.jit(fn)`` at ``args`` (arrays or ShapeDtypeStructs),
    lowered for NVIDIA GPUs on whatever machine this is."""
    import jax  # noqa: PLC0415

    with cudnn_assumed():
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@dataclasses.dataclass(frozen=True)
class MatmulCounts:
    """The matmul FLOPs of a lowered program by operand dtypes, and its fused attention's."""

    matmul_flops: dict           # "lhs x rhs" operand dtypes -> FLOPs
    fused_attention_flops: float

    @property
    def flops(self) -> float:
        """The matmuls' FLOPs and the fused attention's."""
        return sum(self.matmul_flops.values()) + self.fused_attention_flops

    @property
    def half_share(self) -> float:
        """The share of the matmul FLOPs with both operands in bf16 or f16."""
        total = sum(self.matmul_flops.values())
        half = sum(f for k, f in self.matmul_flops.items()
                   if set(k.split(" x ")) <= {"bf16", "f16"})
        return half / total if total else 1.0


@dataclasses.dataclass(frozen=True)
class Census(MatmulCounts):
    """What one program lowered for CUDA asks for (see the module doc)."""

    cudnn_forward: int = 0
    cudnn_backward: int = 0
    score_values: int = 0


_FMHA = re.compile(r"custom_call @__cudnn\$fmha(\w*)")
_FMHA_OPERANDS = re.compile(r"custom_call @__cudnn\$fmha(\w*)\(.*\}\s*:\s*\((tensor<[^>]*>),"
                            r"\s*(tensor<[^>]*>)")
_TENSOR = re.compile(r"tensor<((?:\d+x)+)(\w+)>")
_DOT = re.compile(r"stablehlo\.dot_general .*?contracting_dims = \[([\d, ]*)\] x \[[\d, ]*\]"
                  r".*:\s*\((tensor<[^>]*>),\s*(tensor<[^>]*>)\)\s*->\s*(tensor<[^>]*>)")


def tensor_shape(tensor_type: str) -> tuple[tuple[int, ...], str]:
    """``(dims, dtype)`` of a StableHLO tensor type ``tensor<2x4xbf16>``."""
    m = _TENSOR.fullmatch(tensor_type)
    return tuple(int(d) for d in m.group(1).rstrip("x").split("x")), m.group(2)


_NAME = r'@("[^"]+"|[\w.$-]+)'          # a symbol, quoted when it has other characters
_FUNC = re.compile(r"^\s*func\.func (?:public |private )?" + _NAME + r"\(")
_CALL = re.compile(r"\bcall " + _NAME + r"\(")


def expanded(text: str) -> list[str]:
    """The lines of a lowered module's entry function ``main`` with every ``call @f(...)``
    replaced by ``f``'s lines, recursively: a function JAX lowers once and calls at N sites
    (a jitted helper, a kernel wrapped in ``jit``) counts N times. A loop's body counts once."""
    bodies, name = {}, None
    for line in text.splitlines():
        m = _FUNC.match(line)
        if m:
            name = m.group(1)
            bodies[name] = []
        elif name is not None:
            bodies[name].append(line)
    if "main" not in bodies:
        return text.splitlines()
    done: dict[str, list[str]] = {}

    def lines_of(fn: str) -> list[str]:
        if fn not in done:
            out = []
            for line in bodies.get(fn, []):
                out.append(line)
                for callee in _CALL.findall(line):
                    out.extend(lines_of(callee))
            done[fn] = out
        return done[fn]

    return lines_of("main")


def scan(lines: list[str], lengths, fused_flops) -> tuple[int, dict, float]:
    """``(score-sized values, matmul FLOPs by operand dtypes, fused attention FLOPs)`` of a
    lowered program's StableHLO ``lines`` (its entry function, calls :func:`expanded`) whose
    attention runs over sequences of the given ``lengths`` (queries' and keys', every local
    length): a score-sized value is one of rank 4
    or more (batch, heads, maybe head groups, queries, keys) whose last two dimensions are such
    lengths. ``fused_flops(line)``: a fused attention call's FLOPs on ``line`` (0 elsewhere)."""
    lengths = set(lengths)
    scores, flops, fused = 0, {}, 0.0
    for line in lines:
        if " = " not in line:
            continue
        fused += fused_flops(line)
        m = _DOT.search(line)
        if m:
            lhs, lt = tensor_shape(m.group(2))
            _, rt = tensor_shape(m.group(3))
            out, _ = tensor_shape(m.group(4))
            contracted = 1
            for i in (int(i) for i in m.group(1).split(",") if i.strip()):
                contracted *= lhs[i]
            size = 1
            for d in out:
                size *= d
            key = f"{lt} x {rt}"
            flops[key] = flops.get(key, 0.0) + 2.0 * size * contracted
        results = _TENSOR.findall(line.split("->")[-1] if "->" in line else line.split(":")[-1])
        for dims, _ in results[-1:]:
            shape = tuple(int(d) for d in dims.rstrip("x").split("x"))
            if len(shape) >= 4 and shape[-2] in lengths and shape[-1] in lengths:
                scores += 1
    return scores, flops, fused


def _cudnn_flops(line: str) -> float:
    """``4 b h q k d`` for a cuDNN forward call, twice that for a backward one."""
    m = _FMHA_OPERANDS.search(line)
    if not m:
        return 0.0
    (b, sq, h, d), _ = tensor_shape(m.group(2))        # q [b, queries, heads, d] (the BTNH layout)
    sk = tensor_shape(m.group(3))[0][1]
    return 4.0 * b * h * sq * sk * d * (2 if m.group(1).endswith("Backward") else 1)


def census(text: str, lengths) -> Census:
    """The census of a program lowered for CUDA (``text``) whose attention runs over sequences
    of the given ``lengths`` (:func:`scan`)."""
    lines = expanded(text)
    kernels = _FMHA.findall("\n".join(lines))
    backward = sum(name.endswith("Backward") for name in kernels)
    scores, flops, fused = scan(lines, lengths, _cudnn_flops)
    return Census(flops, fused, len(kernels) - backward, backward, scores)


def model_programs(config_path: str, depth: int, latent: int, batch: int, rank: int,
                   target=HOPPER, **model):
    """``(model config, kernel, why not the target's fused kernel or None, {name: (fn,
    args)})``: the forward, the full and the factored LoRA gradients of ``bench.step_flops``
    (``model``: overrides of the model section), with the attention kernel ``auto`` resolves to
    on ``target`` (cuDNN on a GPU, splash on a TPU)."""
    from spotlight_jax import config as conf  # noqa: PLC0415
    from spotlight_jax.bench.step_flops import reduced_overrides, step_programs  # noqa: PLC0415
    from spotlight_jax.models import AttentionSpec  # noqa: PLC0415
    from spotlight_jax.models.mmdit import as_dtype  # noqa: PLC0415
    from spotlight_jax.parallel import kernels  # noqa: PLC0415

    cfg = conf.model_config(conf.load_config(config_path, {
        **reduced_overrides(config_path, depth, latent),
        **{f"model.{k}": v for k, v in model.items()}}))
    dtype, head_dim = as_dtype(cfg.dtype), cfg.head_dim
    kernel = kernels.resolve("auto", dtype, head_dim, [target])
    why = (kernels.splash_refusal([target]) if target.platform == "tpu" else
           kernels.cudnn_refusal(dtype, head_dim, [target]))
    cfg, progs = step_programs(config_path, depth, latent, batch, rank,
                               attn=AttentionSpec(impl=kernel), **model)
    return cfg, kernel, why, {k: progs[k] for k in ("forward", "full", "lora_factored")}


def sequence_of(cfg) -> int:
    """The model's self-attention sequence: image and text tokens jointly for an MMDiT, the
    video's tokens for Wan (whose text is attended by cross-attention)."""
    from spotlight_jax.models.factory import is_video  # noqa: PLC0415

    return cfg.num_patches + (0 if is_video(cfg) else cfg.text_len)


def attention_programs(cfg, kernel, batch: int, sp: int, devices=None):
    """``{strategy: (fn, args)}``: the gradient of the project's attention
    (``parallel.attention``) at ``cfg``'s sequence, heads and head dim, the last
    ``text_len`` keys padding, in each SP strategy over ``sp`` of ``devices``."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import Mesh  # noqa: PLC0415

    from spotlight_jax import parallel  # noqa: PLC0415
    from spotlight_jax.models.mmdit import as_dtype  # noqa: PLC0415

    devices = list(jax.devices() if devices is None else devices)
    if len(devices) < sp:
        raise ValueError(f"--sp={sp}: the attention paths need {sp} devices and this process "
                         f"has {len(devices)}; lower --sp")
    mesh = Mesh(np.array(devices[:sp]), ("sp",))
    qkv = jax.ShapeDtypeStruct((batch, sequence_of(cfg), cfg.num_heads, cfg.head_dim),
                               as_dtype(cfg.dtype))
    mask = jax.ShapeDtypeStruct((batch, sequence_of(cfg)), jnp.bool_)
    out = {}
    for strategy in parallel.STRATEGIES:
        def loss(q, k, v, m, strategy=strategy):
            o = parallel.attention(q, k, v, mesh=mesh, strategy=strategy, kv_mask=m,
                                   implementation=kernel)
            return o.astype(jnp.float32).sum()
        out[strategy] = (jax.grad(loss, argnums=(0, 1, 2)), (qkv, qkv, qkv, mask))
    return out


def model_overrides(config_path: str, remat_policy: str = "", latent_width: int = 0) -> dict:
    """The model section's overrides of the flags: ``remat_policy`` (``""``: the config's) and
    a video model's latent width (0: square); a width for an image model is a ValueError."""
    from spotlight_jax import config as conf  # noqa: PLC0415
    from spotlight_jax.models.factory import is_video  # noqa: PLC0415

    model = {"remat_policy": remat_policy} if remat_policy else {}
    if latent_width:
        if not is_video(conf.model_config(conf.load_config(config_path))):
            raise ValueError(f"--latent_width={latent_width}: only a video model's latent is "
                             f"not square, and {config_path}'s model is an image one; leave "
                             "it 0")
        model["image_width"] = latent_width
    return model


def gpu_lowering(config_path: str, depth: int, latent: int, batch: int, rank: int,
                 sp: int, remat_policy: str = "", latent_width: int = 0) -> dict:
    """Every program's census (see the module doc), as a JSON-able dict; ``remat_policy``
    overrides the config's (``""``: the config's); ``latent_width`` makes a video model's
    latent ``latent`` x ``latent_width`` (0: square)."""
    model = model_overrides(config_path, remat_policy, latent_width)
    cfg, kernel, why, progs = model_programs(config_path, depth, latent, batch, rank, **model)
    n, heads = sequence_of(cfg), cfg.num_heads
    lengths = {n, cfg.text_len} | {-(-n // d) for d in range(2, sp + 1)}
    rows = {}
    for name, (fn, args) in progs.items():
        rows[name] = census(lower_for_cuda(fn, *args), lengths)
    for strategy, (fn, args) in attention_programs(cfg, kernel, batch, sp).items():
        rows[f"attention_{strategy}"] = census(lower_for_cuda(fn, *args), lengths)
    import jax  # noqa: PLC0415

    from spotlight_jax.io import provenance  # noqa: PLC0415

    return {"config": config_path, "depth": depth, "latent": latent,
            "latent_width": latent_width or latent, "batch": batch,
            "rank": rank, "sp": sp, "jax": jax.__version__, "code": provenance.code_version(),
            "remat": cfg.remat and cfg.remat_policy, "target": HOPPER.device_kind,
            "cudnn": CUDNN_VERSION,
            "kernel": kernel.impl, "not_cudnn": why, "sequence": n, "heads": heads,
            "programs": {k: dict(dataclasses.asdict(c), half_share=c.half_share, flops=c.flops)
                         for k, c in rows.items()}}


LABELS = {"forward": "forward", "full": "full fine-tuning gradient",
          "lora_factored": "LoRA gradient (factored)"}


def table(r: dict) -> str:
    head = (f"{r['config']} at {r['depth']} block(s), {r['latent']} x {r['latent_width']} "
            f"latent, batch {r['batch']}"
            f", {r['sequence']} tokens, {r['heads']} heads, remat {r['remat'] or 'off'}; lowered "
            f"for {r['target']} (cuDNN {r['cudnn']}): attention kernel {r['kernel']}"
            + (f" ({r['not_cudnn']})" if r["not_cudnn"] else ""))
    lines = [head, "", "| program | cuDNN fwd | cuDNN bwd | score-sized values | matmul FLOPs "
             "| fused attention FLOPs | x forward | matmuls in bf16 |",
             "|---|---|---|---|---|---|---|---|"]
    forward = _total(r["programs"]["forward"])
    for name, c in r["programs"].items():
        label = LABELS.get(name, name.replace("attention_", f"attention, {r['sp']}-way ")
                           .replace(f"{r['sp']}-way dense", "dense"))
        ratio = f"{_total(c) / forward:.2f}" if not name.startswith("attention") else "-"
        lines.append(f"| {label} | {c['cudnn_forward']} | {c['cudnn_backward']} | "
                     f"{c['score_values']} | {sum(c['matmul_flops'].values()):.3e} | "
                     f"{c['fused_attention_flops']:.3e} | {ratio} | "
                     f"{100 * c['half_share']:.1f}% |")
    return "\n".join(lines)


def _total(row: dict) -> float:
    return sum(row["matmul_flops"].values()) + row["fused_attention_flops"]


def main(argv):
    del argv
    programs.emulate_devices(FLAGS.sp)
    try:
        result = gpu_lowering(FLAGS.config, FLAGS.depth, FLAGS.latent, FLAGS.batch, FLAGS.rank,
                              FLAGS.sp, FLAGS.remat_policy, FLAGS.latent_width)
    except ValueError as e:         # a bad flag: one line, no traceback
        raise SystemExit(f"bench.gpu_lowering: {e}") from None
    programs.emit(result, table(result), FLAGS.out)


if __name__ == "__main__":
    define_flags()
    app.run(main)
