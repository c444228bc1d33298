"""CLIP in Flax NNX, loaded from a transformers ``CLIPModel`` folder: the image and text towers
behind the learned rewards (CLIP score, PickScore, the LAION aesthetic predictor).

The architecture is transformers' ``CLIPModel``: a ViT (a bias-free ``patch x patch`` conv patch
embedding, a class token, learned positions, a pre-LayerNorm, pre-LN encoder layers, the class
token's post-LayerNorm, a bias-free projection) and a causal text transformer (token and learned
position embeddings, pre-LN layers, a final LayerNorm, the end-of-text token's state through a
bias-free projection), ``quick_gelu`` (OpenAI's checkpoints) or exact ``gelu`` (LAION's ViT-H,
PickScore) in the MLPs, ``logit_scale`` as stored (its exp multiplies the cosine).

What the originals do around the model, reproduced here because it is where ports drift:

* images (:func:`preprocess`): transformers' ``CLIPImageProcessor`` (the slow, PIL one):
  8-bit RGB, shortest side resized to ``image_size`` with PIL's bicubic filter (rounding as PIL
  does), a centre crop, ``/ 255``, then the checkpoint's mean and std;
* text (:func:`load_tokenizer`): the checkpoint's own tokenizer files through the ``tokenizers``
  library (``tokenizer.json``, else ``vocab.json`` + ``merges.txt`` as CLIP's BPE), truncated
  to ``max_position_embeddings`` with the end-of-text token kept last, padded after it.

``from_transformers(folder)`` gives ``(model, config)``; ``model.image_embeds(pixels)`` and
``model.text_embeds(ids)`` are the projected (not normalised) embeddings.
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spotlight_jax.io import safetensors_format

ACTIVATIONS = ("quick_gelu", "gelu")
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)     # OpenAI CLIP's, CLIPImageProcessor's default
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class CLIPLoadError(ValueError):
    """A CLIP folder that cannot be loaded: the message names the file, key or field."""


@dataclasses.dataclass(frozen=True)
class TowerConfig:
    """One transformer tower: width, layers, heads, MLP width, activation, LayerNorm eps."""

    width: int
    layers: int
    heads: int
    mlp: int
    act: str = "quick_gelu"
    eps: float = 1e-5


@dataclasses.dataclass(frozen=True)
class CLIPConfig:
    """A CLIP: its vision tower over ``image_size`` images of ``patch`` patches, its text tower
    over ``vocab`` tokens and ``max_len`` positions, the shared ``projection`` width, and the
    end-of-text id its text embedding is read at (``eos_id == 2``: transformers' legacy rule,
    the position of the largest id)."""

    vision: TowerConfig
    text: TowerConfig
    image_size: int = 224
    patch: int = 14
    vocab: int = 49408
    max_len: int = 77
    projection: int = 768
    eos_id: int = 49407
    mean: tuple = CLIP_MEAN
    std: tuple = CLIP_STD
    crop: str = "floor"           # centre crop offset: transformers' floor | torchvision's round


def _act(name: str):
    if name == "quick_gelu":
        return lambda x: x * jax.nn.sigmoid(1.702 * x)
    if name == "gelu":
        return lambda x: jax.nn.gelu(x, approximate=False)
    raise CLIPLoadError(f"hidden_act={name!r}: CLIP towers here use {ACTIVATIONS}")


class _Layer(nnx.Module):
    """Pre-LN encoder layer: self-attention (q, k, v, out with biases), then the MLP."""

    def __init__(self, cfg: TowerConfig, *, rngs: nnx.Rngs):
        d = cfg.width
        self.ln1 = nnx.LayerNorm(d, epsilon=cfg.eps, rngs=rngs)
        self.q = nnx.Linear(d, d, rngs=rngs)
        self.k = nnx.Linear(d, d, rngs=rngs)
        self.v = nnx.Linear(d, d, rngs=rngs)
        self.out = nnx.Linear(d, d, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, epsilon=cfg.eps, rngs=rngs)
        self.fc1 = nnx.Linear(d, cfg.mlp, rngs=rngs)
        self.fc2 = nnx.Linear(cfg.mlp, d, rngs=rngs)
        self.heads, self.act = cfg.heads, _act(cfg.act)

    def __call__(self, x, causal: bool):
        b, n, d = x.shape
        h = self.ln1(x)
        split = (b, n, self.heads, d // self.heads)
        q, k, v = (f(h).reshape(split) for f in (self.q, self.k, self.v))
        a = jax.nn.dot_product_attention(q, k, v, is_causal=causal)
        x = x + self.out(a.reshape(b, n, d))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class CLIP(nnx.Module):
    """The two towers and their projections (see the module docstring)."""

    def __init__(self, cfg: CLIPConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        v, t = cfg.vision, cfg.text
        grid = cfg.image_size // cfg.patch
        init = nnx.initializers.normal(0.02)
        self.patch_embed = nnx.Linear(cfg.patch * cfg.patch * 3, v.width, use_bias=False,
                                      rngs=rngs)
        self.class_embed = nnx.Param(init(rngs.params(), (v.width,)))
        self.vision_pos = nnx.Param(init(rngs.params(), (grid * grid + 1, v.width)))
        self.pre_ln = nnx.LayerNorm(v.width, epsilon=v.eps, rngs=rngs)
        self.vision_layers = nnx.List([_Layer(v, rngs=rngs) for _ in range(v.layers)])
        self.post_ln = nnx.LayerNorm(v.width, epsilon=v.eps, rngs=rngs)
        self.visual_proj = nnx.Linear(v.width, cfg.projection, use_bias=False, rngs=rngs)
        self.token_embed = nnx.Param(init(rngs.params(), (cfg.vocab, t.width)))
        self.text_pos = nnx.Param(init(rngs.params(), (cfg.max_len, t.width)))
        self.text_layers = nnx.List([_Layer(t, rngs=rngs) for _ in range(t.layers)])
        self.final_ln = nnx.LayerNorm(t.width, epsilon=t.eps, rngs=rngs)
        self.text_proj = nnx.Linear(t.width, cfg.projection, use_bias=False, rngs=rngs)
        self.logit_scale = nnx.Param(jnp.asarray(math.log(1 / 0.07), jnp.float32))

    def image_embeds(self, pixels):
        """Projected image embeddings ``[B, projection]`` of normalised ``pixels`` ``[B,
        image_size, image_size, 3]`` (:func:`preprocess`)."""
        cfg = self.cfg
        b, h, w, c = pixels.shape
        p = cfg.patch
        x = pixels.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
        x = self.patch_embed(x.reshape(b, (h // p) * (w // p), p * p * c))
        cls = jnp.broadcast_to(self.class_embed[...], (b, 1, x.shape[-1]))
        x = jnp.concatenate([cls, x], axis=1) + self.vision_pos[...][None]
        x = self.pre_ln(x)
        for layer in self.vision_layers:
            x = layer(x, causal=False)
        return self.visual_proj(self.post_ln(x[:, 0]))

    def text_embeds(self, ids):
        """Projected text embeddings ``[B, projection]`` of token ids ``[B, L]`` (each row
        holding the end-of-text token; what follows it is never attended to)."""
        cfg = self.cfg
        ids = jnp.asarray(ids, jnp.int32)
        x = jnp.take(self.token_embed[...], ids, axis=0) + self.text_pos[...][None, :ids.shape[1]]
        for layer in self.text_layers:
            x = layer(x, causal=True)
        x = self.final_ln(x)
        at = (jnp.argmax(ids, axis=-1) if cfg.eos_id == 2
              else jnp.argmax(ids == cfg.eos_id, axis=-1))
        return self.text_proj(x[jnp.arange(x.shape[0]), at])


def config_of(config: dict, source: str = "config.json") -> CLIPConfig:
    """Our config of a transformers ``CLIPModel`` ``config.json``."""
    if config.get("model_type", "clip") != "clip":
        raise CLIPLoadError(f"{source}: model_type={config.get('model_type')!r}; a transformers "
                            "CLIPModel folder is expected")

    def tower(c: dict) -> TowerConfig:
        act = c.get("hidden_act", "quick_gelu")
        _act(act)
        return TowerConfig(width=int(c["hidden_size"]), layers=int(c["num_hidden_layers"]),
                           heads=int(c["num_attention_heads"]), mlp=int(c["intermediate_size"]),
                           act=act, eps=float(c.get("layer_norm_eps", 1e-5)))

    try:
        vc, tc = config["vision_config"], config["text_config"]
        return CLIPConfig(vision=tower(vc), text=tower(tc), image_size=int(vc["image_size"]),
                          patch=int(vc["patch_size"]), vocab=int(tc["vocab_size"]),
                          max_len=int(tc["max_position_embeddings"]),
                          projection=int(config.get("projection_dim", 512)),
                          eos_id=int(tc.get("eos_token_id", 2)))
    except KeyError as e:
        raise CLIPLoadError(f"{source}: missing field {e.args[0]!r}") from None


def _affine(out: dict, ours: tuple, theirs: str) -> None:
    """The rules of a LayerNorm (``scale``, ``bias``) from ``theirs.weight`` / ``.bias``."""
    out[ours + ("scale",)] = (f"{theirs}.weight", "copy")
    out[ours + ("bias",)] = (f"{theirs}.bias", "copy")


def _tower_rules(out: dict, cfg: CLIPConfig, prefixes: tuple[str, str], attn: dict,
                 mlp: tuple[str, str], norms: tuple[str, str]) -> None:
    """Every encoder layer's rules: ``prefixes`` the vision and text layers' name prefixes
    (the layer index appended), ``attn`` our q/k/v/out -> (their tensor stem, layout of the
    weight, layout of the bias), ``mlp`` their fc1/fc2 stems, ``norms`` their ln1/ln2 stems."""
    for stack, prefix, n in (("vision_layers", prefixes[0], cfg.vision.layers),
                             ("text_layers", prefixes[1], cfg.text.layers)):
        for i in range(n):
            src = f"{prefix}.{i}"
            for ours, (stem, weight, bias) in attn.items():
                out[(stack, i, ours, "kernel")] = (f"{src}.{stem}_weight" if weight != "linear"
                                                   else f"{src}.{stem}.weight", weight)
                out[(stack, i, ours, "bias")] = (f"{src}.{stem}_bias" if bias != "copy"
                                                 else f"{src}.{stem}.bias", bias)
            for ours, stem in zip(("fc1", "fc2"), mlp):
                out[(stack, i, ours, "kernel")] = (f"{src}.{stem}.weight", "linear")
                out[(stack, i, ours, "bias")] = (f"{src}.{stem}.bias", "copy")
            for ours, stem in zip(("ln1", "ln2"), norms):
                _affine(out, (stack, i, ours), f"{src}.{stem}")


def _rules(cfg: CLIPConfig) -> dict[tuple, tuple[str, str]]:
    """Our parameter path -> (transformers tensor name, layout: 'copy' | 'linear' | 'patch')."""
    out = {("patch_embed", "kernel"): ("vision_model.embeddings.patch_embedding.weight", "patch"),
           ("class_embed",): ("vision_model.embeddings.class_embedding", "copy"),
           ("vision_pos",): ("vision_model.embeddings.position_embedding.weight", "copy"),
           ("visual_proj", "kernel"): ("visual_projection.weight", "linear"),
           ("token_embed",): ("text_model.embeddings.token_embedding.weight", "copy"),
           ("text_pos",): ("text_model.embeddings.position_embedding.weight", "copy"),
           ("text_proj", "kernel"): ("text_projection.weight", "linear"),
           ("logit_scale",): ("logit_scale", "copy")}
    for ours, theirs in (("pre_ln", "vision_model.pre_layrnorm"),
                         ("post_ln", "vision_model.post_layernorm"),
                         ("final_ln", "text_model.final_layer_norm")):
        _affine(out, (ours,), theirs)
    attn = {x: (f"self_attn.{x}_proj", "linear", "copy") for x in ("q", "k", "v")}
    attn["out"] = ("self_attn.out_proj", "linear", "copy")
    _tower_rules(out, cfg, ("vision_model.encoder.layers", "text_model.encoder.layers"), attn,
                 ("mlp.fc1", "mlp.fc2"), ("layer_norm1", "layer_norm2"))
    return out


def _layout(a: np.ndarray, how: str) -> np.ndarray:
    if how == "linear":                       # torch [out, in] -> [in, out]
        return a.T
    if how.startswith("third"):               # open_clip's fused in_proj [3d, d]: q, k or v
        d = a.shape[1]
        j = int(how[-1])
        return a[j * d:(j + 1) * d].T
    if how.startswith("bthird"):
        d = a.shape[0] // 3
        j = int(how[-1])
        return a[j * d:(j + 1) * d]
    if how == "patch":                        # conv [d, 3, p, p] -> [(py, px, c), d]
        return a.transpose(2, 3, 1, 0).reshape(-1, a.shape[0])
    return a


def load_weights(cfg: CLIPConfig, tensors: dict, source: str = "checkpoint", rules=None):
    """``(graphdef, state)`` of :class:`CLIP` holding ``tensors`` (transformers names, or
    another layout's ``rules``)."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: CLIP(cfg, rngs=nnx.Rngs(0))))
    rules = _rules(cfg) if rules is None else rules
    flat = {tuple(p): v for p, v in nnx.to_flat_state(abstract)}
    missing = sorted(set(flat) - set(rules), key=str)
    if missing:
        raise ValueError(f"no loading rule for our {missing[:3]}")
    skip = {"text_model.embeddings.position_ids", "vision_model.embeddings.position_ids"}
    unexpected = sorted(set(tensors) - {n for n, _ in rules.values()} - skip)
    pure = {}
    for path, (name, how) in rules.items():
        if name not in tensors:
            hint = f"; it has unexpected {unexpected[0]!r}" if unexpected else ""
            raise CLIPLoadError(f"{source}: missing tensor {name!r}{hint}")
        a = _layout(np.asarray(tensors[name], np.float32), how)
        want = tuple(flat[path].get_value().shape)
        if a.shape != want:
            raise CLIPLoadError(f"{source}: tensor {name!r} has shape {tuple(tensors[name].shape)}"
                                f", which does not fit {want} (config.json does not match)")
        node = pure
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = jnp.asarray(a)
    if unexpected:
        raise CLIPLoadError(f"{source}: unexpected tensor {unexpected[0]!r} (and "
                            f"{len(unexpected) - 1} more): not a CLIPModel checkpoint")
    nnx.replace_by_pure_dict(abstract, pure)
    return graphdef, abstract


def _unlayout(a: np.ndarray, how: str) -> np.ndarray:
    """:func:`_layout`'s inverse for the transformers layouts (ours -> theirs)."""
    if how == "linear":
        return a.T
    if how == "patch":                        # [(py, px, c), d] -> conv [d, 3, p, p]
        p = int(round((a.shape[0] // 3) ** 0.5))
        return a.reshape(p, p, 3, a.shape[1]).transpose(3, 2, 0, 1)
    return a


def transformers_tensors(model: CLIP) -> dict[str, np.ndarray]:
    """``model``'s weights under transformers ``CLIPModel`` names and layouts (float32): what
    :func:`from_transformers` loads back, bit for bit."""
    flat = {tuple(p): v for p, v in nnx.to_flat_state(nnx.state(model))}
    return {name: np.require(_unlayout(np.asarray(flat[path].get_value(), np.float32), how),
                              requirements="C")            # keeps 0-d arrays 0-d
            for path, (name, how) in _rules(model.cfg).items()}


def transformers_config(cfg: CLIPConfig) -> dict:
    """The ``config.json`` of a transformers ``CLIPModel`` with architecture ``cfg`` (what
    :func:`config_of` reads back)."""
    def tower(t: TowerConfig) -> dict:
        return {"hidden_size": t.width, "num_hidden_layers": t.layers,
                "num_attention_heads": t.heads, "intermediate_size": t.mlp,
                "hidden_act": t.act, "layer_norm_eps": t.eps}

    return {"model_type": "clip", "architectures": ["CLIPModel"],
            "projection_dim": cfg.projection,
            "vision_config": {**tower(cfg.vision), "image_size": cfg.image_size,
                              "patch_size": cfg.patch},
            "text_config": {**tower(cfg.text), "vocab_size": cfg.vocab,
                            "max_position_embeddings": cfg.max_len, "eos_token_id": cfg.eos_id}}


# open_clip architectures by name: (vision heads, text heads, activation); widths, depths and
# sizes come from the stored tensors
OPEN_CLIP_ARCHS = {"ViT-H-14": (16, 16, "gelu"), "ViT-L-14": (16, 12, "gelu"),
                   "ViT-B-32": (12, 8, "gelu")}


def _open_clip_rules(cfg: CLIPConfig) -> dict[tuple, tuple[str, str]]:
    """Our parameter path -> (open_clip tensor name, layout): like :func:`_rules`, with the
    fused ``in_proj`` q/k/v split (their thirds) and the projections stored ``[width, embed]``
    (x @ proj: 'copy')."""
    out = {("patch_embed", "kernel"): ("visual.conv1.weight", "patch"),
           ("class_embed",): ("visual.class_embedding", "copy"),
           ("vision_pos",): ("visual.positional_embedding", "copy"),
           ("visual_proj", "kernel"): ("visual.proj", "copy"),
           ("token_embed",): ("token_embedding.weight", "copy"),
           ("text_pos",): ("positional_embedding", "copy"),
           ("text_proj", "kernel"): ("text_projection", "copy"),
           ("logit_scale",): ("logit_scale", "copy")}
    for ours, theirs in (("pre_ln", "visual.ln_pre"), ("post_ln", "visual.ln_post"),
                         ("final_ln", "ln_final")):
        _affine(out, (ours,), theirs)
    attn = {x: ("attn.in_proj", f"third{j}", f"bthird{j}") for j, x in enumerate("qkv")}
    attn["out"] = ("attn.out_proj", "linear", "copy")
    _tower_rules(out, cfg, ("visual.transformer.resblocks", "transformer.resblocks"), attn,
                 ("mlp.c_fc", "mlp.c_proj"), ("ln_1", "ln_2"))
    return out


def open_clip_config(tensors: dict, arch: str = "ViT-H-14", source: str = "checkpoint",
                     heads: tuple[int, int] | None = None) -> CLIPConfig:
    """Our config of an open_clip CLIP state dict: sizes from its tensors, heads (unless
    ``heads`` = (vision, text) gives them) and activation from ``arch``
    (:data:`OPEN_CLIP_ARCHS`); open_clip's preprocessing (OpenAI's mean and std, torchvision's
    centre crop) and end-of-text rule (the largest id)."""
    if arch not in OPEN_CLIP_ARCHS:
        raise CLIPLoadError(f"arch={arch!r}: choose one of {sorted(OPEN_CLIP_ARCHS)}")
    vh, th, act = OPEN_CLIP_ARCHS[arch]
    vh, th = heads or (vh, th)
    try:
        conv = tensors["visual.conv1.weight"]
        vpos, tpos = tensors["visual.positional_embedding"], tensors["positional_embedding"]
        proj, fc = tensors["visual.proj"], tensors["visual.transformer.resblocks.0.mlp.c_fc.weight"]
        tfc = tensors["transformer.resblocks.0.mlp.c_fc.weight"]
    except KeyError as e:
        raise CLIPLoadError(f"{source}: missing tensor {e.args[0]!r}: not an open_clip CLIP "
                            "state dict") from None

    def depth(prefix):
        return len({k.split(".")[len(prefix.split("."))] for k in tensors
                    if k.startswith(prefix + ".")})

    vw, tw = int(conv.shape[0]), int(tpos.shape[1])
    grid = int(round((int(vpos.shape[0]) - 1) ** 0.5))
    return CLIPConfig(
        vision=TowerConfig(vw, depth("visual.transformer.resblocks"), vh, int(fc.shape[0]), act),
        text=TowerConfig(tw, depth("transformer.resblocks"), th, int(tfc.shape[0]), act),
        image_size=grid * int(conv.shape[2]), patch=int(conv.shape[2]),
        vocab=int(tensors["token_embedding.weight"].shape[0]), max_len=int(tpos.shape[0]),
        projection=int(proj.shape[1]), eos_id=2, crop="round")


def from_open_clip(path, arch: str = "ViT-H-14",
                   heads: tuple[int, int] | None = None) -> tuple[CLIP, CLIPConfig]:
    """``(model, config)`` of an open_clip CLIP state dict saved as safetensors (a published
    torch pickle, e.g. HPSv2.1's, converted once: ``python -m
    spotlight_jax.tools.convert_reward_head --open_clip=IN.pt --output=OUT.safetensors``)."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise CLIPLoadError(f"{p}: no such file (an open_clip state dict as .safetensors)")
    tensors = safetensors_format.load(p)
    cfg = open_clip_config(tensors, arch, str(p), heads)
    graphdef, state = load_weights(cfg, tensors, str(p), rules=_open_clip_rules(cfg))
    return nnx.merge(graphdef, state), cfg


def from_transformers(folder) -> tuple[CLIP, CLIPConfig]:
    """``(model, config)`` of a transformers ``CLIPModel`` folder (``config.json`` and
    ``model.safetensors``, sharded or not); the image mean/std from
    ``preprocessor_config.json`` where present."""
    d = pathlib.Path(folder)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise CLIPLoadError(f"{d}: no config.json (a transformers CLIPModel folder is expected)")
    cfg = config_of(json.loads(cfg_path.read_text()), str(cfg_path))
    pre = d / "preprocessor_config.json"
    if pre.is_file():
        p = json.loads(pre.read_text())
        cfg = dataclasses.replace(cfg, mean=tuple(p.get("image_mean", cfg.mean)),
                                  std=tuple(p.get("image_std", cfg.std)))
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CLIPLoadError(f"{d}: no .safetensors weights (convert a torch-only checkpoint "
                            "once with transformers' save_pretrained(safe_serialization=True))")
    tensors = {}
    for f in files:
        tensors.update(safetensors_format.load(f))
    graphdef, state = load_weights(cfg, tensors, str(d))
    return nnx.merge(graphdef, state), cfg


def preprocess(images, cfg: CLIPConfig) -> np.ndarray:
    """``images`` float ``[B, H, W, 3]`` in [0, 1] (or uint8) -> the model's normalised pixels
    ``[B, image_size, image_size, 3]`` float32, as transformers' slow ``CLIPImageProcessor``:
    8-bit, shortest side to ``image_size`` by PIL's bicubic filter, centre crop, ``/ 255``,
    mean and std (``cfg.crop='round'``: open_clip's torchvision crop offset)."""
    from PIL import Image  # noqa: PLC0415

    arr = np.asarray(images)
    if arr.dtype != np.uint8:
        arr = np.clip(np.round(arr.astype(np.float32) * 255.0), 0, 255).astype(np.uint8)
    s = cfg.image_size
    out = np.empty((arr.shape[0], s, s, 3), np.float32)
    for i, im in enumerate(arr):
        h, w = im.shape[:2]
        short, long = (h, w) if h <= w else (w, h)
        new_long = int(s * long / short)
        size = (new_long, s) if h <= w else (s, new_long)       # PIL: (width, height)
        pil = Image.fromarray(im).resize(size, resample=Image.BICUBIC)
        x = np.asarray(pil)
        if cfg.crop == "round":      # torchvision's CenterCrop: Python's round (half to even)
            top, left = int(round((x.shape[0] - s) / 2.0)), int(round((x.shape[1] - s) / 2.0))
        else:
            top, left = (x.shape[0] - s) // 2, (x.shape[1] - s) // 2
        x = x[top:top + s, left:left + s].astype(np.float32) / 255.0
        out[i] = (x - np.asarray(cfg.mean, np.float32)) / np.asarray(cfg.std, np.float32)
    return out


def load_tokenizer(folder, cfg: CLIPConfig):
    """``tokenize(prompts) -> int32 [B, max_len]``: the folder's own tokenizer files through the
    ``tokenizers`` library, lower-cased and whitespace-cleaned as CLIP's tokenizer does,
    truncated to ``max_len`` with the end-of-text token kept, padded after it with the
    tokenizer's pad id (the end-of-text id where it has none)."""
    try:
        from tokenizers import Tokenizer  # noqa: PLC0415
    except ImportError:
        raise ImportError("the learned rewards' tokenizer needs the tokenizers package: pip "
                          "install -e '.[rewards]'") from None

    d = pathlib.Path(folder)
    if (d / "tokenizer.json").is_file():
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    else:
        raise CLIPLoadError(f"{d}: no tokenizer.json (save the checkpoint's tokenizer with "
                            "transformers' CLIPTokenizerFast.save_pretrained once)")
    special = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (d / name).is_file():
            special.update(json.loads((d / name).read_text()))
    pad = special.get("pad_token")
    pad = pad.get("content") if isinstance(pad, dict) else pad
    pad_id = tok.token_to_id(pad) if pad else None
    pad_id = cfg.eos_id if pad_id is None else pad_id
    tok.no_padding()
    tok.no_truncation()

    def tokenize(prompts) -> np.ndarray:
        out = np.full((len(prompts), cfg.max_len), pad_id, np.int32)
        for i, enc in enumerate(tok.encode_batch(list(prompts))):
            ids = enc.ids
            if len(ids) > cfg.max_len:                    # keep start, cut, end-of-text last
                ids = ids[:cfg.max_len - 1] + [ids[-1]]
            out[i, :len(ids)] = ids
        return out

    return tokenize
