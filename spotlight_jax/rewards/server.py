"""An HTTP server for any registered reward: the server side of :mod:`spotlight_jax.rewards.remote`.

:class:`RewardServer` scores batches with ``rewards.get(name)`` for clients on other hosts (or
other processes): it speaks the client's ``json`` protocol at ``POST /`` and, only when started
with ``allow_pickle=True``, Flow-GRPO's pickle protocol (so the pickle client can be tested
against it; unpickling a request runs the sender's code, so never expose that to anyone you do
not trust). ``GET /health`` says which reward it serves. Each request is one log line (client,
path, images, status, milliseconds). It binds 127.0.0.1 unless told otherwise. The command line
is :mod:`spotlight_jax.rewards.serve`.

Status codes: 200 with the rewards; 400 for a request it cannot read (JSON ``{"error": ...}``);
415 for the pickle protocol when it is off; 500 when the reward itself fails. Clients retry only
the codes a restarting server gives (502/503/504) and connection failures.
"""
from __future__ import annotations

import base64
import binascii
import json
import pickle
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from absl import logging

from spotlight_jax import rewards
from spotlight_jax.rewards.remote import IMAGE_FORMATS, PROTOCOL_VERSION, decode_image

POST_PATHS = ("/", "/reward")


class BadRequest(ValueError):
    """A request the server cannot read: answered with HTTP 400 and this one-line message."""


class RewardServer:
    """Serves the registered reward ``reward`` at ``http://host:port`` (port 0 = a free one).

    ``start()`` serves from a background thread (``url`` is then known); ``stop()`` shuts down
    cleanly (stops accepting, lets requests in flight answer) and may be called from any thread,
    a request handler's included. Usable as a context manager.
    """

    def __init__(self, reward: str, host: str = "127.0.0.1", port: int = 0, *,
                 allow_pickle: bool = False, max_body_bytes: int = 1 << 30):
        self.reward_name = reward
        self.reward = rewards.resolve(reward)       # an unknown name fails here
        self.reward_fn = self.reward.fn
        self.host, self.port = host, int(port)
        self.allow_pickle = bool(allow_pickle)
        self.max_body_bytes = int(max_body_bytes)
        self.requests = 0                           # POSTs received (any outcome)
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> RewardServer:
        """Bind and serve from a daemon thread; returns self."""
        if self._httpd is not None:
            raise RuntimeError(f"reward server {self.url} is already running")
        httpd = ThreadingHTTPServer((self.host, self.port), _handler(self))
        httpd.daemon_threads = True
        httpd.block_on_close = False                # stop() from a handler must not join it
        self._httpd, self.port = httpd, httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, name=f"reward-{self.port}",
                                        daemon=True)
        self._thread.start()
        logging.info("reward server: serving %r at %s (protocols: %s)", self.reward_name,
                     self.url, ", ".join(self.protocols))
        return self

    def stop(self) -> None:
        """Stop accepting connections and close the socket (idempotent)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        logging.info("reward server: stopped %s", self.url)

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def protocols(self) -> tuple[str, ...]:
        return ("json", "flow_grpo_pickle") if self.allow_pickle else ("json",)

    def health(self) -> dict:
        return {"status": "ok", "reward": self.reward_name, "version": PROTOCOL_VERSION,
                "protocols": list(self.protocols)}

    # -- the protocols (no HTTP here) -------------------------------------------------------
    def score_json(self, request) -> tuple[dict, int]:
        """The JSON reply to a JSON request and the number of images (BadRequest if
        unreadable)."""
        if not isinstance(request, dict):
            raise BadRequest(f"expected a JSON object, got {type(request).__name__}")
        version = request.get("version")
        if version != PROTOCOL_VERSION:
            raise BadRequest(f"version={version!r}: this server speaks protocol version "
                             f"{PROTOCOL_VERSION}")
        fmt = request.get("image_format")
        if fmt not in IMAGE_FORMATS:
            raise BadRequest(f"image_format={fmt!r}: choose one of {IMAGE_FORMATS}")
        encoded, prompts = request.get("images"), request.get("prompts")
        if not isinstance(encoded, list) or not isinstance(prompts, list) or not all(
                isinstance(p, str) for p in prompts):
            raise BadRequest("'images' must be a list of base64 strings and 'prompts' a list "
                             "of strings")
        try:
            blobs = [base64.b64decode(s, validate=True) for s in encoded]
        except (binascii.Error, TypeError, ValueError) as e:
            raise BadRequest(f"'images' holds invalid base64 ({e})") from e
        images = _stack([_decode(b, fmt) for b in blobs], len(prompts))
        reply = {"version": PROTOCOL_VERSION,
                 "rewards": [float(r) for r in self.reward_fn(images, prompts)]}
        if request.get("components"):
            try:
                parts = self.reward.components()
            except ValueError as e:
                raise BadRequest(str(e)) from e
            reply["components"] = [[None if np.isnan(v) else float(v) for v in row]
                                   for row in parts(images, prompts)]
        return reply, len(prompts)

    def score_pickle(self, request) -> tuple[dict, int]:
        """Flow-GRPO's reply to its request dict (``images``: JPEG bytes, ``meta_datas``, and
        ``prompts`` or each metadata's ``prompt``): the rewards under every key its clients
        read (GenEval's ``scores``/``rewards``/``strict_rewards``, UnifiedReward's
        ``outputs``)."""
        if not isinstance(request, dict) or not isinstance(request.get("images"), list):
            raise BadRequest("expected a pickled dict with a list of JPEG bytes under 'images'")
        prompts = request.get("prompts")
        if prompts is None:
            metas = request.get("meta_datas") or []
            prompts = [m.get("prompt") if isinstance(m, dict) else None for m in metas]
        prompts = [str(p) for p in prompts] if all(isinstance(p, str) for p in prompts) else None
        if prompts is None:
            raise BadRequest("no prompts: send 'prompts' or a 'prompt' in every 'meta_datas'")
        images = _stack([_decode(b, "jpeg") for b in request["images"]], len(prompts))
        scores = [float(r) for r in self.reward_fn(images, prompts)]
        return {"scores": scores, "rewards": scores, "strict_rewards": scores,
                "group_rewards": {}, "group_strict_rewards": {}, "outputs": scores}, len(prompts)


def _decode(blob, fmt: str) -> np.ndarray:
    try:
        return decode_image(bytes(blob), fmt)
    except Exception as e:          # noqa: BLE001 - PIL and numpy raise many kinds
        raise BadRequest(f"an image is not valid {fmt} ({' '.join(str(e).split())})") from e


def _stack(images: list[np.ndarray], n_prompts: int) -> np.ndarray:
    if len(images) != n_prompts:
        raise BadRequest(f"{len(images)} images but {n_prompts} prompts")
    if not images:
        return np.zeros((0, 1, 1, 3), np.float32)
    shapes = {x.shape for x in images}
    if len(shapes) != 1 or len(images[0].shape) != 3 or images[0].shape[-1] != 3:
        raise BadRequest(f"images must all be [H, W, 3] of one size, got shapes "
                         f"{sorted(shapes)}")
    return np.stack(images).astype(np.float32)


def _handler(server: RewardServer):
    """The request handler class bound to ``server``."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "spotlight-reward/1"

        def log_message(self, format, *args):       # noqa: A002 - one line per request below
            pass

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj) -> None:
            self._send(status, json.dumps(obj).encode("utf-8"), "application/json")

        def do_GET(self):                           # noqa: N802 - http.server's name
            if self.path.rstrip("/") == "/health":
                self._json(200, server.health())
            else:
                self._json(404, {"error": f"no page {self.path!r}; GET /health or POST /"})
            logging.info("reward server: %s GET %s -> %d", self.client_address[0], self.path,
                         200 if self.path.rstrip("/") == "/health" else 404)

        def do_POST(self):                          # noqa: N802 - http.server's name
            t0, n, status = time.perf_counter(), 0, 500
            kind = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
            pickled = kind != "application/json"
            with server._lock:                      # counted before any reply can arrive
                server.requests += 1
            try:
                status, n = self._answer(pickled)
            finally:
                logging.info("reward server: %s POST %s %s %d images -> %d in %.1f ms",
                             self.client_address[0], self.path,
                             "pickle" if pickled else "json", n, status,
                             1e3 * (time.perf_counter() - t0))

        def _answer(self, pickled: bool) -> tuple[int, int]:
            """Reads, scores and answers one POST; returns (status, images)."""
            if self.path.split("?")[0] not in POST_PATHS:
                self._json(404, {"error": f"no endpoint {self.path!r}; POST to /"})
                return 404, 0
            if pickled and not server.allow_pickle:
                self._json(415, {"error": "this server speaks only protocol 'json' (Content-"
                                 "Type: application/json); start it with --allow_pickle to "
                                 "serve Flow-GRPO's pickle protocol"})
                return 415, 0
            length = int(self.headers.get("Content-Length") or -1)
            if not 0 <= length <= server.max_body_bytes:
                self._json(413 if length > 0 else 411,
                           {"error": f"Content-Length={length}: must be in [0, "
                            f"{server.max_body_bytes}]"})
                return 413 if length > 0 else 411, 0
            body = self.rfile.read(length)
            try:
                if pickled:
                    reply, n = server.score_pickle(pickle.loads(body))  # noqa: S301 - opt-in
                    self._send(200, pickle.dumps(reply), "application/octet-stream")
                else:
                    reply, n = server.score_json(json.loads(body.decode("utf-8")))
                    self._json(200, reply)
                return 200, n
            except (BadRequest, UnicodeDecodeError, json.JSONDecodeError,
                    pickle.UnpicklingError) as e:
                self._error(400, e, pickled)
                return 400, 0
            except Exception as e:                  # noqa: BLE001 - the reward failed
                logging.exception("reward server: reward %r failed", server.reward_name)
                self._error(500, e, pickled)
                return 500, 0

        def _error(self, status: int, e: Exception, pickled: bool) -> None:
            message = f"{type(e).__name__}: {' '.join(str(e).split())}"
            if pickled:                             # Flow-GRPO's servers answer plain text
                self._send(status, message.encode("utf-8"), "text/plain; charset=utf-8")
            else:
                self._json(status, {"error": message})

    return Handler
