"""diffusers' ``Flux2Transformer2DModel`` (FLUX.2 [dev], [klein]) tensors ->
``models.flux2_transformer.Flux2Transformer`` parameters.

``flux2_config(config_json)`` reads a transformer folder's ``config.json`` into a
``Flux2Config`` (an option we do not convert, e.g. ``patch_size`` other than 1 or an
``out_channels`` other than ``in_channels``, is a one-line ``CheckpointError`` naming the key);
``flux2_rules(cfg)`` lists what maps where (``layout.Rule`` s: our parameter path, the diffusers
tensor(s), the layout op), and ``flux2_model(config, tensors, ...)`` builds the model with every
parameter converted and placed one at a time. What maps where:

* ``x_embedder`` / ``proj_out``: over packed ``(c, py, px)`` channels, permuted to our patch
  order ``(py, px, c)`` (``layout.PackedIn`` / ``PackedOut``), so the model takes unpacked
  latents;
* ``time_guidance_embed.{timestep,guidance}_embedder.linear_{1,2}`` -> ``time_*`` /
  ``guidance_*``; ``context_embedder`` -> ``txt_in``; the shared modulations
  ``double_stream_modulation_{img,txt}.linear`` and ``single_stream_modulation.linear`` ->
  ``mod_img`` / ``mod_txt`` / ``mod_single``; ``norm_out.linear`` -> ``final_mod`` (its
  (scale, shift) order kept);
* dual-stream ``transformer_blocks.i``: ``attn.to_{q,k,v}`` fused into ``img/qkv``,
  ``attn.add_{q,k,v}_proj`` into ``txt/qkv``, ``to_out.0`` / ``to_add_out``, ``norm_q/k`` /
  ``norm_added_q/k``, ``ff`` / ``ff_context`` ``linear_in`` (SwiGLU's [gate; value]) and
  ``linear_out``;
* single-stream ``single_transformer_blocks.i``: ``attn.to_qkv_mlp_proj`` split by rows into
  ``qkv`` (the first ``3 dim``) and ``fc1`` (the MLP's ``2 mlp_hidden``), ``attn.to_out`` ->
  ``out`` (over [attention; MLP]), ``attn.norm_q/k``.

A tensor missing, unexpected or of another shape is a one-line ``CheckpointError`` naming it
(``layout.apply_rules``). No bias exists in FLUX.2, so none is read.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from flax import nnx

from spotlight_jax.models.convert import layout, placement
from spotlight_jax.models.convert.diffusers_folder import CheckpointError
from spotlight_jax.models.flux2_transformer import PACK, Flux2Config, Flux2Transformer

CLASS_NAME = "Flux2Transformer2DModel"
_FIELDS = ("in_channels", "num_layers", "num_single_layers", "attention_head_dim",
           "num_attention_heads", "joint_attention_dim", "timestep_guidance_channels",
           "mlp_ratio", "axes_dims_rope", "rope_theta", "eps", "guidance_embeds")
# config.json keys read and checked here, not Flux2Config fields
_CHECKED_KEYS = ("patch_size", "out_channels")


def flux2_config(config: dict, *, source: str = "FLUX.2 transformer",
                 **overrides) -> Flux2Config:
    """The ``Flux2Config`` of a diffusers ``config.json`` (``overrides`` set other fields,
    e.g. ``scan_blocks=True``)."""
    if config.get("_class_name") != CLASS_NAME:
        raise CheckpointError(f"{source}: _class_name={config.get('_class_name')!r}: not a FLUX.2 "
                              f"transformer ({CLASS_NAME})")
    unknown = sorted(k for k in config if not k.startswith("_")
                     and k not in _FIELDS and k not in _CHECKED_KEYS)
    if unknown:
        raise CheckpointError(f"{source}: config.json key {unknown[0]!r}={config[unknown[0]]!r} "
                              f"is not a FLUX.2 option we convert (known: "
                              f"{sorted(_FIELDS + _CHECKED_KEYS)})")
    if int(config.get("patch_size", 1)) != 1:
        raise CheckpointError(f"{source}: patch_size={config['patch_size']!r}: FLUX.2's "
                              "transformer takes packed 2x2 latents with patch_size=1")
    cin = int(config.get("in_channels", 128))
    if config.get("out_channels") not in (None, cin):
        raise CheckpointError(f"{source}: out_channels={config['out_channels']!r}: must equal "
                              f"in_channels={cin} (or be null); the velocity has the latent's "
                              "channels")
    if cin % (PACK * PACK):
        raise CheckpointError(f"{source}: in_channels={cin}: must be a multiple of 4 (2x2 "
                              "packed latent cells)")
    values = {k: config[k] for k in _FIELDS if k in config}
    if "axes_dims_rope" in values:
        values["axes_dims_rope"] = tuple(int(a) for a in values["axes_dims_rope"])
    if "rope_theta" in values:
        values["rope_theta"] = float(values["rope_theta"])
    return Flux2Config(**{**values, **overrides}).validate()


@dataclasses.dataclass(frozen=True)
class LinearRows(layout.Op):
    """Rows ``[start, stop)`` of a torch Linear ``[rows, in]`` -> a kernel ``[in, stop -
    start]``: one part of diffusers' fused ``to_qkv_mlp_proj`` (q/k/v, then the MLP input)."""

    start: int
    stop: int
    rows: int

    def source_shapes(self, shape):
        return [(self.rows, shape[0])]

    def __call__(self, arrays):
        return arrays[0][self.start:self.stop].T


def _kernel(target: tuple, source: str | tuple[str, ...], op: layout.Op | None = None):
    names = (source,) if isinstance(source, str) else tuple(source)
    op = op or (layout.Linear() if len(names) == 1 else layout.Fused(len(names)))
    return layout.Rule(target + ("kernel",), tuple(f"{n}.weight" for n in names), op)


def flux2_rules(cfg: Flux2Config) -> list[layout.Rule]:
    """Our parameters (paths of the looped model) from diffusers' tensor names."""
    c, d, h = cfg.channels, cfg.dim, cfg.mlp_hidden
    tg = "time_guidance_embed"
    out = [
        _kernel(("img_in",), "x_embedder", layout.PackedIn(PACK, c)),
        _kernel(("txt_in",), "context_embedder"),
        _kernel(("time_1",), f"{tg}.timestep_embedder.linear_1"),
        _kernel(("time_2",), f"{tg}.timestep_embedder.linear_2"),
        _kernel(("mod_img",), "double_stream_modulation_img.linear"),
        _kernel(("mod_txt",), "double_stream_modulation_txt.linear"),
        _kernel(("mod_single",), "single_stream_modulation.linear"),
        _kernel(("final_mod",), "norm_out.linear"),
        _kernel(("proj_out",), "proj_out", layout.PackedOut(PACK, c)),
    ]
    if cfg.guidance_embeds:
        out += [_kernel(("guidance_1",), f"{tg}.guidance_embedder.linear_1"),
                _kernel(("guidance_2",), f"{tg}.guidance_embedder.linear_2")]
    for i in range(cfg.num_layers):
        src, a = f"transformer_blocks.{i}", f"transformer_blocks.{i}.attn"
        for stream, qkv, proj, ff, qn, kn in (
                ("img", ("to_q", "to_k", "to_v"), "to_out.0", "ff", "norm_q", "norm_k"),
                ("txt", ("add_q_proj", "add_k_proj", "add_v_proj"), "to_add_out",
                 "ff_context", "norm_added_q", "norm_added_k")):
            s = ("blocks", i, stream)
            out += [_kernel(s + ("qkv",), tuple(f"{a}.{n}" for n in qkv)),
                    _kernel(s + ("out",), f"{a}.{proj}"),
                    _kernel(s + ("fc1",), f"{src}.{ff}.linear_in"),
                    _kernel(s + ("fc2",), f"{src}.{ff}.linear_out"),
                    layout.Rule(s + ("q_norm", "scale"), (f"{a}.{qn}.weight",)),
                    layout.Rule(s + ("k_norm", "scale"), (f"{a}.{kn}.weight",))]
    fused = 3 * d + 2 * h
    for i in range(cfg.num_single_layers):
        s, a = ("single_blocks", i), f"single_transformer_blocks.{i}.attn"
        out += [_kernel(s + ("qkv",), f"{a}.to_qkv_mlp_proj", LinearRows(0, 3 * d, fused)),
                _kernel(s + ("fc1",), f"{a}.to_qkv_mlp_proj", LinearRows(3 * d, fused, fused)),
                _kernel(s + ("out",), f"{a}.to_out"),
                layout.Rule(s + ("q_norm", "scale"), (f"{a}.norm_q.weight",)),
                layout.Rule(s + ("k_norm", "scale"), (f"{a}.norm_k.weight",))]
    return out


def flux2_tensors(config: dict, tensors: dict, *, source: str = "FLUX.2 transformer",
                  lazy: bool = False, **overrides) -> tuple[Flux2Config, dict]:
    """``(config, {our looped-model parameter path: numpy array})`` (``lazy``: ``{path:
    function returning it}``), every tensor's presence and shape checked first."""
    cfg = flux2_config(config, source=source, **overrides)
    flat = dataclasses.replace(cfg, scan_blocks=False, remat=False)
    _, abstract = nnx.split(nnx.eval_shape(lambda: Flux2Transformer(flat, rngs=nnx.Rngs(0))))
    targets = {tuple(path): tuple(var.get_value().shape)
               for path, var in nnx.to_flat_state(abstract)}
    return cfg, layout.apply_rules(tensors, flux2_rules(cfg), targets, source=source,
                                   lazy=lazy)


def flux2_model(config: dict, tensors: dict, dtype="float32", shardings=None, *,
                source: str = "FLUX.2 transformer", **overrides):
    """``(Flux2Transformer, Flux2Config)`` from a folder's config and tensors, every parameter
    cast to ``dtype`` (the parameter and compute dtype) and placed, one at a time, on
    ``shardings(path, shape)`` (our parameter path, its shape; default: the default device).
    With ``scan_blocks=True`` each stacked parameter is filled one block's tensor at a time."""
    name = np.dtype(dtype).name
    cfg, thunks = flux2_tensors(config, tensors, source=source, lazy=True, dtype=name,
                                param_dtype=name, **overrides)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Flux2Transformer(cfg, rngs=nnx.Rngs(0))))
    stacks = ({"blocks": cfg.num_layers, "single_blocks": cfg.num_single_layers}
              if cfg.scan_blocks else {})
    placement.fill(state, placement.stack_parts(thunks, stacks), dtype, shardings, "FLUX.2")
    return nnx.merge(graphdef, state), cfg
