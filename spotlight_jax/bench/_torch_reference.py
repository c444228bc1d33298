"""A PyTorch eager port of this project's MMDiT, for the sampler benchmark's reference.

``bench.sampler --torch`` asks how much the jitted JAX rollout gains over what a PyTorch user
would write by hand: the same model, the same weights, the prompt encoded once, an eager
Euler loop under ``torch.inference_mode``. Measuring both in one process on one machine makes
the ratio independent of how busy or fast the machine is that day.

Only the project's own configuration is ported (sin-cos positions, text-mean pooling, the
synthetic prompt encoder, optional 3x3 conv stem and head, QK-norm); anything else raises.
It is written from the model's definition in ``spotlight_jax.models.mmdit``, not translated from
another code base, and ``tests/bench/test_torch_reference.py`` checks it against the JAX model
on random weights. Needs ``torch`` (``pip install torch``), which the default install lacks.
"""
from __future__ import annotations

import math

import numpy as np


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ImportError("the PyTorch reference needs torch: pip install torch (a CPU wheel "
                          "is enough)") from e
    return torch


def _check_supported(cfg) -> None:
    unsupported = {
        "pos_embed": (cfg.pos_embed, "sincos"), "pooled": (cfg.pooled, "text_mean"),
        "text_norm": (cfg.text_norm, False), "use_text_mask": (cfg.use_text_mask, True),
        "context_pre_only_last": (cfg.context_pre_only_last, False),
        "dual_attention_layers": (tuple(cfg.dual_attention_layers), ()),
        "pixel_head": (cfg.pixel_head, 0), "scan_blocks": (cfg.scan_blocks, False),
        "timestep_scaling": (cfg.timestep_scaling, "before_freqs"),
        "dtype": (cfg.dtype, "float32"),
    }
    for name, (value, wanted) in unsupported.items():
        if value != wanted:
            raise ValueError(f"{name}={value!r}: the PyTorch reference ports only this "
                             f"project's own model ({name}={wanted!r})")
    if not cfg.text_width:
        raise ValueError("text_width=0: the PyTorch reference needs the synthetic prompt "
                         "encoder (text_width > 0)")


def _sincos_1d(length: int, dim: int) -> np.ndarray:
    pos = np.arange(length, dtype=np.float32)[:, None]
    half = dim // 2
    omega = 1.0 / (10_000.0 ** (np.arange(half, dtype=np.float32) / half))
    return np.concatenate([np.sin(pos * omega), np.cos(pos * omega)], -1).astype(np.float32)


def _sincos_2d(gh: int, gw: int, dim: int) -> np.ndarray:
    quarter = dim // 4
    omega = 1.0 / (10_000.0 ** (np.arange(quarter, dtype=np.float32) / quarter))
    ys, xs = np.meshgrid(np.arange(gh, dtype=np.float32), np.arange(gw, dtype=np.float32),
                         indexing="ij")
    oy, ox = ys.reshape(-1)[:, None] * omega, xs.reshape(-1)[:, None] * omega
    return np.concatenate([np.sin(oy), np.cos(oy), np.sin(ox), np.cos(ox)], -1).astype(np.float32)


class TorchMMDiT:
    """``v = model(x [B,H,W,C], t [B], context)`` with ``context = model.encode(tokens, mask)``;
    tensors are float32 torch tensors, images NHWC as in the JAX model.

    ``params``: the JAX model's state as a nested dict of arrays (``nnx.State.to_pure_dict()``).
    """

    def __init__(self, cfg, params):
        torch = _torch()
        _check_supported(cfg)
        self.cfg = cfg
        self.torch = torch
        self.F = torch.nn.functional

        def convert(tree):
            if isinstance(tree, dict):
                return {str(k): convert(v) for k, v in tree.items()}
            return torch.from_numpy(np.array(tree, dtype=np.float32))

        self.p = convert(params)
        self.pos_text = torch.from_numpy(_sincos_1d(cfg.text_len, cfg.text_width))
        g = cfg.image_size // cfg.patch_size
        self.pos_img = torch.from_numpy(_sincos_2d(g, g, cfg.width))
        half = 128
        self.freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=torch.float32)
                               / half)

    # -- pieces ------------------------------------------------------------------------------
    @staticmethod
    def _dense(p, x):
        y = x @ p["kernel"]
        return y + p["bias"] if "bias" in p else y

    def _ln(self, x):
        return self.F.layer_norm(x, x.shape[-1:], eps=1e-6)

    def _rms(self, p, x):
        return x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * p["scale"]

    def _gelu(self, x):
        return self.F.gelu(x, approximate="tanh")

    def _conv(self, p, x):
        """3x3 SAME conv on NHWC with an HWIO kernel."""
        w = p["kernel"].permute(3, 2, 0, 1)
        y = self.F.conv2d(x.permute(0, 3, 1, 2), w, p["bias"], padding=1)
        return y.permute(0, 2, 3, 1)

    def _attention(self, q, k, v, key_mask):
        """q, k, v ``[B, S, H, D]``; key_mask bool ``[B, S]`` (True = attend)."""
        out = self.F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=key_mask[:, None, None, :])
        return out.transpose(1, 2)

    # -- the model ---------------------------------------------------------------------------
    def encode(self, tokens, mask):
        """``(text features [B, L, width], pooled conditioning [B, width])``, once per prompt."""
        torch, p, cfg = self.torch, self.p["encoder"], self.cfg
        mask = mask.bool()
        x = p["embed"][tokens.long()] + self.pos_text[: tokens.shape[1]]
        for i in range(cfg.text_layers):
            lp = p["layers"][str(i)]
            b, n, d = x.shape
            qkv = self._dense(lp["qkv"], self._ln(x)).reshape(b, n, 3, cfg.text_heads, -1)
            a = self._attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], mask)
            x = x + self._dense(lp["out"], a.reshape(b, n, d))
            x = x + self._dense(lp["fc2"], self._gelu(self._dense(lp["fc1"], self._ln(x))))
        x = self._ln(x)
        m = mask[..., None].to(x.dtype)
        mean = (x * m).sum(1) / torch.clamp(m.sum(1), min=1)
        return self._dense(self.p["text_proj"], x), self._dense(self.p["pool_proj"], mean), mask

    def _stream_pre(self, sp, x, c):
        cfg = self.cfg
        mods = self._dense(sp["mod"], c).chunk(6, dim=-1)
        b, n, d = x.shape
        h = self._ln(x) * (1 + mods[1][:, None]) + mods[0][:, None]
        qkv = self._dense(sp["qkv"], h).reshape(b, n, 3, cfg.num_heads, d // cfg.num_heads)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if cfg.qk_norm:
            q, k = self._rms(sp["q_norm"], q), self._rms(sp["k_norm"], k)
        return (q, k, v), mods[2:]

    def _stream_post(self, sp, x, attn, mods):
        gate1, shift2, scale2, gate2 = mods
        x = x + gate1[:, None] * self._dense(sp["out"], attn)
        h = self._ln(x) * (1 + scale2[:, None]) + shift2[:, None]
        h = self._dense(sp["fc2"], self._gelu(self._dense(sp["fc1"], h)))
        return x + gate2[:, None] * h

    def __call__(self, x, t, context):
        torch, p, cfg = self.torch, self.p, self.cfg
        txt, pooled, text_mask = context
        b, hh, ww, ch = x.shape
        ps = cfg.patch_size
        xin = self._gelu(self._conv(p["stem"], x)) if cfg.conv_stem else x
        c_in = xin.shape[-1]
        patches = (xin.reshape(b, hh // ps, ps, ww // ps, ps, c_in).permute(0, 1, 3, 2, 4, 5)
                   .reshape(b, (hh // ps) * (ww // ps), ps * ps * c_in))
        img = self._dense(p["patch_embed"], patches) + self.pos_img
        args = (t.float() * 1000.0)[:, None] * self.freqs[None]
        temb = torch.cat([torch.cos(args), torch.sin(args)], -1)
        temb = self._dense(p["t_fc2"], self.F.silu(self._dense(p["t_fc1"], temb)))
        c = self.F.silu(temb + pooled)
        kv_mask = torch.cat([text_mask, torch.ones(b, img.shape[1], dtype=torch.bool)], 1)
        lt = txt.shape[1]
        for i in range(cfg.depth):
            bp = p["blocks"][str(i)]
            (tq, tk, tv), tmods = self._stream_pre(bp["txt"], txt, c)
            (iq, ik, iv), imods = self._stream_pre(bp["img"], img, c)
            o = self._attention(torch.cat([tq, iq], 1), torch.cat([tk, ik], 1),
                                torch.cat([tv, iv], 1), kv_mask)
            o = o.reshape(b, o.shape[1], -1)
            txt = self._stream_post(bp["txt"], txt, o[:, :lt], tmods)
            img = self._stream_post(bp["img"], img, o[:, lt:], imods)
        shift, scale = self._dense(p["final_mod"], c).chunk(2, dim=-1)
        feats = self._ln(img) * (1 + scale[:, None]) + shift[:, None]
        out = self._dense(p["final"], feats)
        out = (out.reshape(b, hh // ps, ww // ps, ps, ps, ch).permute(0, 1, 3, 2, 4, 5)
               .reshape(b, hh, ww, ch))
        if cfg.conv_head:
            out = out + self._conv(p["head"], out)
        return out

    def ode_rollout(self, x, sigmas, tokens, mask):
        """Euler ODE from ``x`` (= x_T) over ``sigmas`` (1 -> 0), the prompt encoded once;
        returns the final sample. Runs under ``torch.inference_mode``."""
        torch = self.torch
        with torch.inference_mode():
            context = self.encode(tokens, mask)
            b = x.shape[0]
            for s, s_next in zip(sigmas[:-1], sigmas[1:]):
                v = self(x, torch.full((b,), float(s)), context)
                x = x + (float(s_next) - float(s)) * v
        return x
