"""A reward computed by an HTTP reward server: the client side (docs/rewards_remote.md).

Real reward models (GenEval's detector, OCR, VLM judges) run on their own host behind HTTP, as
Flow-GRPO's users run them. :class:`RemoteReward` is a callable with the reward contract
(``(images float32 [B, H, W, 3] in [0, 1], prompts) -> np.float32 [B]``) that sends the batch
to such a server in requests of ``batch_size`` images and reassembles the replies in order.

Two protocols (``RemoteRewardConfig.protocol``):

``json`` (default, ours; :mod:`spotlight_jax.rewards.server` speaks it)
    POST ``application/json``: ``{"version": 1, "image_format": "png", "images": [base64, ...],
    "prompts": [...], "metadata": [{...}, ...] | null, "components": false}``; reply
    ``{"version": 1, "rewards": [B floats]}`` (and ``"components": [[K floats or null] x B]``
    when asked). ``png`` is lossless for the 8-bit pixels a reward model sees; ``npy`` sends the
    float32 pixels themselves (exact for any image); ``jpeg`` is smaller. No pickle anywhere.
``flow_grpo_pickle`` (Flow-GRPO's reward servers: GenEval, UnifiedReward, DeQA)
    POST of ``pickle.dumps({"images": [JPEG bytes], "meta_datas": [dict per image],
    "only_strict": True, "prompts": [...]})``; the reply is a pickled dict whose ``"scores"``
    (GenEval) or ``"outputs"`` (UnifiedReward, DeQA) are the rewards. Unpickling a reply runs
    whatever code the server put in it, so this protocol is refused unless
    ``trust_pickle=True``: use it only with a server you run yourself.

When the server cannot be reached (connection refused or reset, a timeout, HTTP 502/503/504)
the call pauses and retries with exponential back-off, logging one line per back-off with the
URL and how long it has waited, for up to ``max_wait_s`` (0 = forever); then it raises
:class:`RemoteRewardError`. Requests are pure (the same images give the same rewards), so a
retried request never changes the result, and each reply fills its own slice of the batch:
nothing is lost or counted twice. A reply the client cannot use (another HTTP error, bad JSON,
a wrong count, a non-finite reward) raises at once, naming the URL: a broken server is not
waited for, and the client never makes rewards up.
"""
from __future__ import annotations

import base64
import dataclasses
import http.client
import io
import json
import math
import pickle
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

import numpy as np
from absl import logging
from PIL import Image

PROTOCOL_VERSION = 1
PROTOCOLS = ("json", "flow_grpo_pickle")
IMAGE_FORMATS = ("png", "jpeg", "npy")
RETRY_STATUS = (502, 503, 504)      # a proxy or a server that is (re)starting: wait for it
SERVE_COMMAND = "python -m spotlight_jax.rewards.serve --reward=geneval_lite --port=18085"


class RemoteRewardError(RuntimeError):
    """The reward server could not give this batch's rewards; the message is one line naming
    the URL, what went wrong and the fix."""


@dataclasses.dataclass(frozen=True)
class RemoteRewardConfig:
    """How to reach a reward server (config section ``remote_reward``).

    Attributes:
      url: the server's endpoint, ``http(s)://host:port[/path]`` ('' = no server configured).
      protocol: 'json' (ours, safe) or 'flow_grpo_pickle' (Flow-GRPO's servers).
      trust_pickle: must be True for 'flow_grpo_pickle': unpickling a reply runs the server's
        code.
      image_format: how 'json' sends images: 'png' (lossless 8-bit), 'jpeg', or 'npy' (the
        float32 pixels, exact). 'flow_grpo_pickle' always sends JPEG (its servers decode JPEG).
      jpeg_quality: JPEG quality in [1, 100] (Flow-GRPO's client uses PIL's default, 75).
      batch_size: images per request.
      timeout_s: seconds one request may take before it counts as a failed attempt.
      backoff_s: the first wait after a failed attempt; each next wait doubles ...
      max_backoff_s: ... up to this.
      max_wait_s: give up (RemoteRewardError) after waiting this long for one request
        (0 = wait forever).
    """

    url: str = ""
    protocol: str = "json"
    trust_pickle: bool = False
    image_format: str = "png"
    jpeg_quality: int = 95
    batch_size: int = 64
    timeout_s: float = 120.0
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    max_wait_s: float = 600.0

    def validate(self) -> RemoteRewardConfig:
        """Self, or ValueError ``field=value: why (e.g. field=fix)`` for the first bad field."""
        def bad(field, why):
            raise ValueError(f"{field}={getattr(self, field)!r}: {why}")

        if not isinstance(self.url, str) or (
                self.url and not self.url.startswith(("http://", "https://"))):
            bad("url", "must start with http:// or https:// (e.g. url=http://127.0.0.1:18085; "
                "'' = no reward server)")
        if self.protocol not in PROTOCOLS:
            bad("protocol", f"choose one of {PROTOCOLS}")
        if self.protocol == "flow_grpo_pickle" and self.trust_pickle is not True:
            bad("trust_pickle", "protocol 'flow_grpo_pickle' unpickles the server's replies, "
                "which runs code the server chooses; set it only for a server you run "
                "yourself (e.g. trust_pickle=True), or use protocol 'json'")
        if self.image_format not in IMAGE_FORMATS:
            bad("image_format", f"choose one of {IMAGE_FORMATS}")
        if not 1 <= self.jpeg_quality <= 100:
            bad("jpeg_quality", "must be in [1, 100] (e.g. jpeg_quality=95)")
        if self.batch_size < 1:
            bad("batch_size", "must be >= 1 images per request (e.g. batch_size=64)")
        for field in ("timeout_s", "backoff_s", "max_backoff_s"):
            v = getattr(self, field)
            if not (math.isfinite(v) and v > 0):
                bad(field, f"must be > 0 seconds (e.g. {field}=1.0)")
        if self.max_backoff_s < self.backoff_s:
            bad("max_backoff_s", f"must be >= backoff_s={self.backoff_s!r}")
        if not (math.isfinite(self.max_wait_s) and self.max_wait_s >= 0):
            bad("max_wait_s", "must be >= 0 seconds (0 = wait for the server forever)")
        return self


# -- images on the wire -------------------------------------------------------------------------

def to_uint8(images) -> np.ndarray:
    """uint8 [B, H, W, 3] of float images in [0, 1] (rounded, as a reward model sees them)."""
    return np.round(np.clip(np.asarray(images, np.float32), 0.0, 1.0) * 255.0).astype(np.uint8)


def encode_image(image: np.ndarray, fmt: str, jpeg_quality: int = 95) -> bytes:
    """One image's bytes: ``png``/``jpeg`` of uint8 [H, W, 3], ``npy`` of float32 [H, W, 3]."""
    buf = io.BytesIO()
    if fmt == "npy":
        np.save(buf, np.ascontiguousarray(image, np.float32), allow_pickle=False)
    elif fmt in ("png", "jpeg"):
        kwargs = {"quality": int(jpeg_quality)} if fmt == "jpeg" else {}
        Image.fromarray(np.ascontiguousarray(image, np.uint8)).save(buf, format=fmt.upper(),
                                                                     **kwargs)
    else:
        raise ValueError(f"image_format={fmt!r}: choose one of {IMAGE_FORMATS}")
    return buf.getvalue()


def decode_image(data: bytes, fmt: str) -> np.ndarray:
    """float32 [H, W, 3] in [0, 1] of :func:`encode_image`'s bytes (``npy`` without pickle)."""
    if fmt == "npy":
        return np.asarray(np.load(io.BytesIO(data), allow_pickle=False), np.float32)
    if fmt in ("png", "jpeg"):
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"), np.float32) / 255.0
    raise ValueError(f"image_format={fmt!r}: choose one of {IMAGE_FORMATS}")


def wire_images(images, fmt: str, jpeg_quality: int = 95) -> list[bytes]:
    """Every image of the batch encoded as ``fmt`` (8-bit for png/jpeg, float32 for npy)."""
    pixels = (np.asarray(images, np.float32) if fmt == "npy" else to_uint8(images))
    return [encode_image(x, fmt, jpeg_quality) for x in pixels]


# -- the client ---------------------------------------------------------------------------------

class RemoteReward:
    """The reward of the server at ``cfg.url`` (see the module docstring for the protocols).

    ``sleep`` and ``clock`` are injectable so the back-off can be tested without waiting.
    Thread-safe: each call makes its own requests (the runner calls rewards from thread pools).
    """

    def __init__(self, cfg: RemoteRewardConfig, *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg.validate()
        if not cfg.url:
            raise ValueError("url='': a remote reward needs the server's address (e.g. "
                             f"url=http://127.0.0.1:18085; start one with: {SERVE_COMMAND})")
        self.url = cfg.url
        self._sleep, self._clock = sleep, clock
        self.__doc__ = f"The reward served at {self.url} (protocol {cfg.protocol!r})."

    def __call__(self, images, prompts: Sequence[str],
                 metadata: Sequence[dict] | None = None) -> np.ndarray:
        """np.float32 [B]: the server's reward of each image, in order."""
        images = np.asarray(images)
        out = [r for lo, hi in self._chunks(images, prompts, metadata)
               for r in self._request(images[lo:hi], prompts[lo:hi],
                                      None if metadata is None else metadata[lo:hi],
                                      components=False)]
        return np.asarray(out, np.float32)

    def components(self, images, prompts: Sequence[str],
                   metadata: Sequence[dict] | None = None) -> dict[str, np.ndarray]:
        """``{"part0": float32 [B], ...}``: the parts the server's reward averages (NaN where a
        part does not apply), in the server's order; only the 'json' protocol has them."""
        if self.cfg.protocol != "json":
            raise RemoteRewardError(f"remote reward {self.url}: protocol "
                                    f"{self.cfg.protocol!r} has no reward components; use "
                                    "rl.advantage='reward' with it")
        images = np.asarray(images)
        rows = [r for lo, hi in self._chunks(images, prompts, metadata)
                for r in self._request(images[lo:hi], prompts[lo:hi],
                                       None if metadata is None else metadata[lo:hi],
                                       components=True)]
        table = np.asarray(rows, np.float32).reshape(len(rows), -1)
        return {f"part{k}": table[:, k] for k in range(table.shape[1])}

    def health(self) -> dict:
        """The server's ``GET <url>/health`` reply (one attempt; RemoteRewardError if down)."""
        try:
            with urllib.request.urlopen(self.url.rstrip("/") + "/health",
                                        timeout=self.cfg.timeout_s) as resp:
                return json.loads(resp.read().decode("utf-8"))
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise RemoteRewardError(f"remote reward {self.url}: health check failed "
                                    f"({_one_line(e)})") from e

    # -- one request ------------------------------------------------------------------------
    def _chunks(self, images, prompts, metadata):
        if isinstance(prompts, str):
            raise ValueError(f"remote reward {self.url}: expects a list of prompts, got a str")
        n = len(prompts)
        if np.shape(images)[0] != n or (metadata is not None and len(metadata) != n):
            meta = "" if metadata is None else f", {len(metadata)} metadata"
            raise ValueError(f"remote reward {self.url}: {np.shape(images)[0]} images but {n} "
                             f"prompts{meta}")
        b = self.cfg.batch_size
        return [(lo, min(lo + b, n)) for lo in range(0, n, b)]

    def _request(self, images, prompts, metadata, *, components: bool) -> list:
        images, prompts = np.asarray(images), list(prompts)
        if self.cfg.protocol == "json":
            body = json.dumps({
                "version": PROTOCOL_VERSION, "image_format": self.cfg.image_format,
                "images": [base64.b64encode(b).decode("ascii") for b in wire_images(
                    images, self.cfg.image_format, self.cfg.jpeg_quality)],
                "prompts": prompts, "metadata": None if metadata is None else list(metadata),
                "components": components}).encode("utf-8")
            return self._parse_json(self._post(body, "application/json"), len(prompts),
                                    components)
        meta = [{"prompt": p} for p in prompts] if metadata is None else list(metadata)
        body = pickle.dumps({"images": wire_images(images, "jpeg", self.cfg.jpeg_quality),
                             "meta_datas": meta, "only_strict": True, "prompts": prompts})
        return self._parse_pickle(self._post(body, "application/octet-stream"), len(prompts))

    def _post(self, body: bytes, content_type: str) -> bytes:
        """The reply's body, retrying (with back-off, up to ``max_wait_s``) while the server
        cannot be reached; other failures raise at once."""
        cfg, start, delay = self.cfg, self._clock(), self.cfg.backoff_s
        while True:
            request = urllib.request.Request(self.url, data=body, method="POST",
                                             headers={"Content-Type": content_type})
            try:
                with urllib.request.urlopen(request, timeout=cfg.timeout_s) as resp:
                    return resp.read()
            except urllib.error.HTTPError as e:
                if e.code not in RETRY_STATUS:
                    raise RemoteRewardError(
                        f"remote reward {self.url}: HTTP {e.code}: {_detail(e)} (the server "
                        "rejected the request; check the server's log, remote_reward.url and "
                        "remote_reward.protocol)") from e
                why = f"HTTP {e.code}"
            except (OSError, http.client.HTTPException) as e:     # refused, reset, timed out
                why = _one_line(e)
            waited = self._clock() - start
            if cfg.max_wait_s and waited >= cfg.max_wait_s:
                raise RemoteRewardError(
                    f"remote reward {self.url}: no reply after waiting {waited:.1f} s "
                    f"(remote_reward.max_wait_s={cfg.max_wait_s:g}; last error: {why}); start "
                    f"the server ({SERVE_COMMAND}), fix --config.remote_reward.url, or raise "
                    "--config.remote_reward.max_wait_s (0 = wait forever)")
            if cfg.max_wait_s:
                delay = min(delay, cfg.max_wait_s - waited)
            logging.warning("remote reward %s: %s; paused, waited %.1f s so far, retrying in "
                            "%.1f s", self.url, why, waited, delay)
            self._sleep(delay)
            delay = min(2.0 * delay, cfg.max_backoff_s)

    # -- replies ----------------------------------------------------------------------------
    def _malformed(self, why: str) -> RemoteRewardError:
        return RemoteRewardError(f"remote reward {self.url}: malformed reply: {why} (is it a "
                                 f"reward server speaking protocol {self.cfg.protocol!r}?)")

    def _parse_json(self, raw: bytes, n: int, components: bool) -> list:
        try:
            reply = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise self._malformed(f"not JSON ({_one_line(e)}): {_preview(raw)}") from e
        if not isinstance(reply, dict):
            raise self._malformed(f"expected a JSON object, got {type(reply).__name__}")
        if reply.get("version", PROTOCOL_VERSION) != PROTOCOL_VERSION:
            raise self._malformed(f"protocol version {reply.get('version')!r}, this client "
                                  f"speaks {PROTOCOL_VERSION}")
        if "error" in reply:
            raise RemoteRewardError(f"remote reward {self.url}: the server says: "
                                    f"{_one_line(reply['error'])}")
        if components:
            rows = reply.get("components")
            if not isinstance(rows, list) or len(rows) != n or not all(
                    isinstance(r, list) and len(r) == len(rows[0]) for r in rows):
                raise self._malformed(f"'components' must be {n} rows of equal length")
            try:
                return [[math.nan if v is None else float(v) for v in r] for r in rows]
            except (TypeError, ValueError) as e:
                raise self._malformed(f"'components' holds a non-number ({e})") from e
        return self._checked(reply.get("rewards"), n, "rewards")

    def _parse_pickle(self, raw: bytes, n: int) -> list:
        try:
            reply = pickle.loads(raw)    # noqa: S301 - opt-in: trust_pickle=True (see validate)
        except Exception as e:          # noqa: BLE001 - any unpickling failure is malformed
            raise self._malformed(f"not a pickle ({_one_line(e)}): {_preview(raw)}") from e
        if not isinstance(reply, dict):
            raise self._malformed(f"expected a pickled dict, got {type(reply).__name__}")
        key = "scores" if "scores" in reply else "outputs"
        return self._checked(reply.get(key), n, key)

    def _checked(self, values, n: int, key: str) -> list[float]:
        if not isinstance(values, (list, tuple, np.ndarray)):
            raise self._malformed(f"no list of rewards under {key!r}")
        try:
            out = [float(v) for v in values]
        except (TypeError, ValueError) as e:
            raise self._malformed(f"{key!r} holds a non-number ({e})") from e
        if len(out) != n:
            raise self._malformed(f"{len(out)} rewards for {n} images")
        if not all(math.isfinite(v) for v in out):
            raise self._malformed(f"non-finite rewards {[v for v in out if not math.isfinite(v)]}")
        return out


def _one_line(e) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__


def _preview(raw: bytes) -> str:
    return repr(raw[:80]) + ("..." if len(raw) > 80 else "")


def _detail(e: urllib.error.HTTPError) -> str:
    """The first line of an HTTP error's body (our server's JSON ``error``, or its text)."""
    try:
        raw = e.read()
    except OSError:
        return str(e.reason)
    try:
        return _one_line(json.loads(raw.decode("utf-8"))["error"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        text = raw.decode("utf-8", "replace").strip().splitlines()
        return _one_line(text[-1] if text else e.reason)
