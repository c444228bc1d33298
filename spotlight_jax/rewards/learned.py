"""Learned preference rewards in JAX, in process: CLIP score, PickScore, the LAION aesthetic
predictor, on a Flax CLIP (``rewards.clip_model``) jitted and batched on the devices JAX gives.

* ``clip_score``: ``max(100 * cos(image, text), 0)`` of a CLIP's projected embeddings, as
  torchmetrics' ``CLIPScore`` (its default model: OpenAI's ViT-L/14).
* ``pickscore``: ``exp(logit_scale) * cos(image, text)``, PickScore's (a CLIP-H/14 fine-tuned on
  Pick-a-Pic; transformers format); raw, about 18-24 for real images (Flow-GRPO divides by 26).
* ``aesthetic``: the LAION improved aesthetic predictor v2: its MLP (768 -> 1024 -> 128 -> 64 ->
  16 -> 1, no activations between, as published) on the L2-normalised CLIP ViT-L/14 image
  embedding; scores about 1-10. The head is published as a torch pickle: convert it once with
  ``python -m spotlight_jax.tools.convert_reward_head --aesthetic=IN.pth --output=OUT.safetensors``
  (needs torch).
* ``hpsv2``: HPSv2.1's score, ``cos(image, text)`` of its fine-tuned open_clip ViT-H/14 (about
  0.2-0.35), from the published ``HPS_v2.1_compressed.pt`` converted once (``python -m
  spotlight_jax.tools.convert_reward_head --open_clip=HPS_v2.1_compressed.pt
  --output=hps.safetensors``) and the ViT-H/14 tokenizer's ``tokenizer.json``; open_clip's
  preprocessing (torchvision's centre crop rounds where transformers' floors).

Each is a :class:`LearnedReward` with the registry's contract (host images ``[B, H, W, 3]`` in
[0, 1] and prompts in, ``float32 [B]`` out; images preprocessed on the host exactly as
transformers' ``CLIPImageProcessor`` does) and a device path, :meth:`LearnedReward.score_device`,
that keeps images on device (the resize there is ``jax.image.resize``'s antialiased bicubic, not
PIL's: close, not equal; docs/rewards.md states how close).
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spotlight_jax.io import safetensors_format
from spotlight_jax.rewards import clip_model

KINDS = ("clip_score", "pickscore", "aesthetic", "hpsv2")
NEEDS = {"clip_score": ("clip_dir",), "pickscore": ("pickscore_dir",),
         "aesthetic": ("aesthetic_clip_dir", "aesthetic_head"),
         "hpsv2": ("hpsv2_weights", "hpsv2_tokenizer_dir")}
"""A learned reward's name -> the :class:`LearnedRewardsConfig` fields it needs."""


@dataclasses.dataclass(frozen=True)
class LearnedRewardsConfig:
    """Where the learned rewards' models are (``learned_rewards`` in the config): transformers
    CLIP folders and the converted aesthetic head; '' = not configured."""

    clip_dir: str = ""
    pickscore_dir: str = ""
    aesthetic_clip_dir: str = ""
    aesthetic_head: str = ""
    hpsv2_weights: str = ""
    hpsv2_tokenizer_dir: str = ""
    batch_size: int = 32

    def validate(self) -> LearnedRewardsConfig:
        """Returns self, or a one-line ValueError naming the bad field and the fix."""
        for name in ("clip_dir", "pickscore_dir", "aesthetic_clip_dir", "hpsv2_tokenizer_dir"):
            value = getattr(self, name)
            if value and not pathlib.Path(value).is_dir():
                raise ValueError(f"{name}={value!r}: not a directory (a transformers CLIPModel "
                                 "folder, or '' when the reward is not used)")
        for name in ("aesthetic_head", "hpsv2_weights"):
            value = getattr(self, name)
            if value and not pathlib.Path(value).is_file():
                raise ValueError(f"{name}={value!r}: no such file (converted to .safetensors "
                                 "once, or '' when the reward is not used)")
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size!r}: must be >= 1 (images per call)")
        return self


AESTHETIC_LAYERS = (0, 2, 4, 6, 7)      # the published nn.Sequential's Linear indices


class LearnedReward:
    """One learned reward (``kind`` in :data:`KINDS`) over a transformers CLIP folder
    (``clip_dir``: model, ``preprocessor_config.json`` where the checkpoint has one, the
    tokenizer's ``tokenizer.json``), and for ``aesthetic`` its head (``head``: safetensors
    with ``layers.{0,2,4,6,7}.{weight,bias}``); for ``hpsv2``, ``clip_dir`` is the open_clip
    ViT-H-14 state dict as safetensors and ``head`` the folder of its tokenizer.json.

    ``devices``: a reward mesh: the weights replicated on each, every batch split over them
    (padded to a multiple of their count); None: JAX's default device."""

    def __init__(self, kind: str, clip_dir, head=None, batch_size: int = 32, devices=None):
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: choose one of {KINDS}")
        self.kind, self.batch_size = kind, int(batch_size)
        if kind == "hpsv2":
            model, self.cfg = clip_model.from_open_clip(clip_dir)
            tokenizer_dir = head
        else:
            model, self.cfg = clip_model.from_transformers(clip_dir)
            tokenizer_dir = clip_dir
        self.graphdef, self.state = nnx.split(model)
        self.tokenize = (clip_model.load_tokenizer(tokenizer_dir, self.cfg)
                         if kind != "aesthetic" else None)
        self.rows = None             # a reward mesh's batch sharding (None: one device)
        if devices is not None and len(devices) > 1:
            from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: PLC0415
            mesh = Mesh(np.asarray(devices), ("data",))
            self.state = jax.device_put(self.state, NamedSharding(mesh, PartitionSpec()))
            self.rows = NamedSharding(mesh, PartitionSpec("data"))
        self.head = load_aesthetic_head(head) if kind == "aesthetic" else None
        if kind == "aesthetic" and self.head[0][0].shape[0] != self.cfg.projection:
            raise ValueError(f"aesthetic head {head}: takes {self.head[0][0].shape[0]}-wide "
                             f"embeddings, the CLIP at {clip_dir} gives {self.cfg.projection} "
                             "(the predictor is for CLIP ViT-L/14)")

    def __call__(self, images, prompts) -> np.ndarray:
        pixels = clip_model.preprocess(images, self.cfg)
        return self._batched(pixels, list(prompts))

    def score_device(self, images, prompts) -> jax.Array:
        """:meth:`__call__` for images already on device (float ``[B, H, W, 3]`` in [0, 1]):
        8-bit rounding, the resize and crop in JAX; the scores stay on device."""
        pixels = preprocess_device(images, self.cfg)
        ids = None if self.tokenize is None else self.tokenize(list(prompts))
        return score(self.graphdef, self.kind, self.state, pixels, ids, self.head)

    def _batched(self, pixels: np.ndarray, prompts: list) -> np.ndarray:
        out = []
        for i in range(0, len(pixels), self.batch_size):
            px = pixels[i:i + self.batch_size]
            ids = (None if self.tokenize is None
                   else self.tokenize(prompts[i:i + self.batch_size]))
            n = len(px)
            if self.rows is not None:          # pad to the mesh, split the rows over it
                pad = -n % self.rows.mesh.size
                px = np.concatenate([px, np.repeat(px[-1:], pad, 0)])
                ids = None if ids is None else np.concatenate([ids, np.repeat(ids[-1:], pad, 0)])
                px = jax.device_put(px, self.rows)
                ids = None if ids is None else jax.device_put(ids, self.rows)
            out.append(np.asarray(score(self.graphdef, self.kind, self.state,
                                         jnp.asarray(px), ids, self.head))[:n])
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


@functools.partial(jax.jit, static_argnums=(0, 1))
def score(graphdef, kind, state, pixels, ids, head):
    """Reward ``kind`` of the CLIP ``(graphdef, state)`` on preprocessed ``pixels`` and token
    ``ids`` (None for ``aesthetic``, which scores with ``head``), jitted: ``float32 [B]``."""
    model = nnx.merge(graphdef, state)
    img = model.image_embeds(pixels)
    img = img / jnp.linalg.norm(img, axis=-1, keepdims=True)
    if kind == "aesthetic":
        x = img
        for w, b in head:
            x = x @ w + b
        return x[:, 0]
    txt = model.text_embeds(ids)
    txt = txt / jnp.linalg.norm(txt, axis=-1, keepdims=True)
    cos = jnp.sum(img * txt, axis=-1)
    if kind == "clip_score":
        return jnp.maximum(100.0 * cos, 0.0)
    if kind == "hpsv2":
        return cos
    return jnp.exp(model.logit_scale[...]) * cos


def preprocess_device(images, cfg: clip_model.CLIPConfig) -> jax.Array:
    """:func:`clip_model.preprocess` in JAX on device: 8-bit rounding, shortest side to
    ``image_size`` (antialiased bicubic), centre crop, mean and std."""
    x = jnp.round(jnp.clip(jnp.asarray(images, jnp.float32), 0.0, 1.0) * 255.0)
    b, h, w, _ = x.shape
    s = cfg.image_size
    nh, nw = (s, int(s * w / h)) if h <= w else (int(s * h / w), s)
    x = jnp.clip(jnp.round(jax.image.resize(x, (b, nh, nw, 3), "bicubic", antialias=True)),
                 0.0, 255.0)
    top, left = (nh - s) // 2, (nw - s) // 2
    x = x[:, top:top + s, left:left + s] / 255.0
    return (x - jnp.asarray(cfg.mean, jnp.float32)) / jnp.asarray(cfg.std, jnp.float32)


def load_aesthetic_head(path) -> tuple:
    """The aesthetic predictor's five Linear layers as ``((kernel [in, out], bias), ...)``."""
    p = pathlib.Path(path) if path else None
    if p is None or not p.is_file():
        raise FileNotFoundError(f"aesthetic head {path!r}: no such file (convert the published "
                                "sac+logos+ava1-l14-linearMSE.pth once: python -m "
                                "spotlight_jax.tools.convert_reward_head --aesthetic=IN.pth "
                                "--output=OUT.safetensors)")
    t = safetensors_format.load(p)
    try:
        return tuple((jnp.asarray(np.asarray(t[f"layers.{i}.weight"], np.float32).T),
                      jnp.asarray(np.asarray(t[f"layers.{i}.bias"], np.float32)))
                     for i in AESTHETIC_LAYERS)
    except KeyError as e:
        raise ValueError(f"aesthetic head {p}: missing {e.args[0]!r}; expected the LAION "
                         "predictor's layers.{0,2,4,6,7}.{weight,bias}") from None


def convert_open_clip(src, dst) -> None:
    """A published open_clip checkpoint (a torch pickle of its state dict, possibly under
    ``state_dict`` with a ``module.`` prefix) -> safetensors of its tensors (needs torch)."""
    import torch  # noqa: PLC0415
    sd = torch.load(src, map_location="cpu", weights_only=True)
    sd = sd.get("state_dict", sd)
    out = {k.removeprefix("module."): v.float().numpy() for k, v in sd.items()
           if hasattr(v, "numpy")}
    safetensors_format.save(dst, out, {"format": "pt", "source": str(src)})


def convert_aesthetic(src, dst) -> None:
    """The published torch pickle of the aesthetic head -> safetensors (needs torch once)."""
    import torch  # noqa: PLC0415
    sd = torch.load(src, map_location="cpu", weights_only=True)
    keys = [f"layers.{i}.{n}" for i in AESTHETIC_LAYERS for n in ("weight", "bias")]
    safetensors_format.save(dst, {k: sd[k].float().numpy() for k in keys},
                            {"format": "pt", "source": str(src)})
