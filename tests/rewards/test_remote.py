"""Rewards served over HTTP, on loopback: the client's rewards equal the in-process reward's
(both protocols, in order across batches), the client waits for a server that is down or
restarting and then returns every reward once, gives up after max_wait_s with one line naming
the URL, rejects malformed replies at once, refuses pickle without the trust flag; a micro run
whose rewards come from the server equals the in-process run."""
import http.server
import json
import pathlib
import pickle
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import free_port, micro_config

from spotlight_jax import rewards as R
from spotlight_jax import world as W
from spotlight_jax.config import ConfigError, RunSpec, load_config, validate
from spotlight_jax.rewards.remote import (
    RemoteReward,
    RemoteRewardConfig,
    RemoteRewardError,
    decode_image,
    wire_images,
)
from spotlight_jax.rewards.server import RewardServer
from spotlight_jax.runner.modes import WALL_CLOCK_KEYS

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAST = {"backoff_s": 0.05, "max_backoff_s": 0.2, "max_wait_s": 30.0}


@pytest.fixture(scope="module")
def batch():
    """23 rendered images with shuffled prompts, so that the rewards differ from image to
    image and a misordered reply shows."""
    prompts = W.train_prompts()[:23]
    images = W.sample_batch(prompts, np.random.default_rng(0))
    shuffled = [prompts[i] for i in np.random.default_rng(1).permutation(len(prompts))]
    expected = R.get("geneval_lite")(images, shuffled)
    assert len(set(expected.tolist())) >= 4
    return images, shuffled, expected


@pytest.fixture
def server():
    s = RewardServer("geneval_lite", allow_pickle=True).start()
    yield s
    s.stop()


def client(url, **kw):
    return RemoteReward(RemoteRewardConfig(url=url, **{**FAST, **kw}))


def jpeg_pixels(images, quality):
    """The pixels a server decodes from the client's JPEGs (the reference for JPEG requests)."""
    return np.stack([decode_image(b, "jpeg") for b in wire_images(images, "jpeg", quality)])


# -- round trips --------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol, fmt", [("json", "png"), ("json", "npy"), ("json", "jpeg"),
                                           ("flow_grpo_pickle", "jpeg")])
def test_round_trip_equals_the_in_process_reward_in_order(server, batch, protocol, fmt):
    images, prompts, expected = batch
    c = client(server.url, protocol=protocol, trust_pickle=protocol != "json", image_format=fmt,
               batch_size=5)
    got = c(images, prompts)
    if fmt == "jpeg":                       # lossy: the reward of the pixels the server decodes
        expected = R.get("geneval_lite")(jpeg_pixels(images, 95), prompts)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    assert server.requests == 5             # 23 images in requests of 5: 5 + 5 + 5 + 5 + 3


def test_components_round_trip(server, batch):
    images, prompts, _ = batch
    got = client(server.url, batch_size=10).components(images, prompts)
    want = R.resolve("geneval_lite").components()(images, prompts)
    np.testing.assert_array_equal(np.stack(list(got.values()), axis=1), want)   # NaN == NaN


def test_registered_remote_reward_goes_through_the_registry_checks(server, batch):
    images, prompts, expected = batch
    R.register("remote_test", client(server.url), overwrite=True)
    try:
        np.testing.assert_array_equal(R.get("remote_test")(images, prompts), expected)
        assert client(server.url).health()["reward"] == "geneval_lite"
    finally:
        R.unregister("remote_test")


# -- a server that is down --------------------------------------------------------------------
def start_later(delay, reward="geneval_lite", port=0, started=None):
    """A thread that starts a reward server on ``port`` after ``delay`` seconds."""
    def run():
        time.sleep(delay)
        started.append(RewardServer(reward, port=port).start())
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_server_down_at_start_the_client_waits_then_succeeds(batch, caplog):
    images, prompts, expected = batch
    port, started = free_port(), []
    url = f"http://127.0.0.1:{port}"
    t = start_later(0.6, port=port, started=started)
    try:
        with caplog.at_level("WARNING"):
            got = client(url, batch_size=8)(images, prompts)
        np.testing.assert_array_equal(got, expected)
        waits = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
        assert waits and all(url in w and "waited" in w for w in waits)
    finally:
        t.join()
        for s in started:
            s.stop()


def test_server_stopped_between_calls_and_restarted(server, batch):
    images, prompts, expected = batch
    c = client(server.url, batch_size=8)
    np.testing.assert_array_equal(c(images, prompts), expected)
    server.stop()
    started = []
    t = start_later(0.5, port=server.port, started=started)
    try:
        np.testing.assert_array_equal(c(images, prompts), expected)
    finally:
        t.join()
        for s in started:
            s.stop()


def test_server_killed_mid_call_nothing_lost_or_duplicated(batch):
    """The server stops right after answering the first of three requests and comes back
    0.5 s later: the call returns every reward once, in order, and the server scored each
    image once."""
    images, prompts, expected = batch
    scored, servers = [], []
    inner = R.get("geneval_lite")

    def counting(ims, ps):
        scored.extend(ps)
        if len(servers) == 1:               # the first server's first request: kill it
            servers[0].stop()
            start_later(0.5, "remote_test_counting", servers[0].port, servers)
        return inner(ims, ps)

    R.register("remote_test_counting", counting, overwrite=True)
    try:
        servers.append(RewardServer("remote_test_counting").start())
        got = client(servers[0].url, batch_size=8)(images, prompts)
        np.testing.assert_array_equal(got, expected)
        assert scored == list(prompts)      # 8 + 8 + 7, each once, in order
        assert len(servers) == 2 and servers[0].requests == 1 and servers[1].requests == 2
    finally:
        for s in servers:
            s.stop()
        R.unregister("remote_test_counting")


def test_max_wait_exceeded_is_one_line_naming_the_url_and_the_fix(batch):
    images, prompts, _ = batch
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(RemoteRewardError) as e:
        client(url, max_wait_s=0.4)(images, prompts)
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert "\n" not in msg and url in msg and "max_wait_s=0.4" in msg
    assert "spotlight_jax.rewards.serve" in msg and "remote_reward.url" in msg


def test_backoff_doubles_up_to_its_cap_and_stops_at_max_wait():
    now, sleeps = [0.0], []

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    c = RemoteReward(RemoteRewardConfig(url=f"http://127.0.0.1:{free_port()}", backoff_s=1.0,
                                        max_backoff_s=4.0, max_wait_s=14.0),
                     sleep=sleep, clock=lambda: now[0])
    with pytest.raises(RemoteRewardError, match="no reply after waiting 14.0 s"):
        c(np.zeros((1, 4, 4, 3), np.float32), ["a red circle"])
    assert sleeps == [1.0, 2.0, 4.0, 4.0, 3.0]       # doubling, capped, then the time left


# -- replies the client cannot use ----------------------------------------------------------
class FakeServer:
    """A loopback HTTP server answering every POST with ``status`` and ``body``."""

    def __init__(self, status, body, content_type="application/json"):
        self.hits = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):               # noqa: N802
                outer.hits += 1
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("status, body, match", [
    (200, b"<html>not json</html>", "malformed reply: not JSON"),
    (200, json.dumps({"rewards": [0.5, 0.5]}).encode(), "malformed reply: 2 rewards for 3"),
    (200, b'{"rewards": [0.5, NaN, 0.5]}', "malformed reply: non-finite rewards"),
    (200, json.dumps({"scores": [1, 1, 1]}).encode(), "malformed reply: no list of rewards"),
    (200, json.dumps({"rewards": [1, "x", 1]}).encode(), "malformed reply: 'rewards' holds"),
    (200, json.dumps({"version": 2, "rewards": [1, 1, 1]}).encode(), "protocol version 2"),
    (500, json.dumps({"error": "ValueError: boom"}).encode(), "HTTP 500: ValueError: boom"),
    (404, b"not here", "HTTP 404: not here"),
], ids=["bad_json", "wrong_count", "nan", "no_rewards", "not_a_number", "version",
        "server_error", "not_found"])
def test_malformed_replies_raise_at_once_naming_the_url(status, body, match):
    fake = FakeServer(status, body)
    try:
        with pytest.raises(RemoteRewardError, match=match) as e:
            client(fake.url)(np.zeros((3, 4, 4, 3), np.float32), ["a", "b", "c"])
        assert fake.url in str(e.value) and "\n" not in str(e.value)
        assert fake.hits == 1                                   # no retry loop
    finally:
        fake.close()


def test_malformed_pickle_reply_names_the_url():
    fake = FakeServer(200, pickle.dumps({"scores": [1.0]}), "application/octet-stream")
    try:
        with pytest.raises(RemoteRewardError, match="1 rewards for 2 images") as e:
            client(fake.url, protocol="flow_grpo_pickle", trust_pickle=True)(
                np.zeros((2, 4, 4, 3), np.float32), ["a", "b"])
        assert fake.url in str(e.value) and fake.hits == 1
    finally:
        fake.close()


# -- pickle is opt-in -------------------------------------------------------------------------
def test_pickle_is_refused_without_the_trust_flag(server):
    cfg = RemoteRewardConfig(url=server.url, protocol="flow_grpo_pickle")
    for make in (cfg.validate, lambda: RemoteReward(cfg)):
        with pytest.raises(ValueError, match=r"^trust_pickle=False: .*runs code the server"):
            make()
    config = load_config("tiny", {"remote_reward.protocol": "flow_grpo_pickle",
                                  "remote_reward.url": server.url})
    with pytest.raises(ConfigError, match=r"^remote_reward\.trust_pickle=False: .*"
                                          r"--config\.remote_reward\.trust_pickle=True"):
        validate(config)


def test_server_refuses_pickle_unless_allowed(batch):
    images, prompts, _ = batch
    with RewardServer("geneval_lite") as s:
        c = client(s.url, protocol="flow_grpo_pickle", trust_pickle=True)
        with pytest.raises(RemoteRewardError, match="HTTP 415: .*--allow_pickle"):
            c(images[:2], prompts[:2])


def test_remote_reward_without_a_url_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^remote_reward\.url='': .*--config\.remote_reward"
                                          r"\.url=http"):
        validate(load_config("tiny", {"rl.reward": "remote"}))


# -- the command line ---------------------------------------------------------------------------
def test_serve_command_serves_logs_and_stops_cleanly(batch):
    images, prompts, expected = batch
    proc = subprocess.Popen([sys.executable, "-m", "spotlight_jax.rewards.serve",
                             "--reward=geneval_lite", "--port=0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving geneval_lite at http://127.0.0.1:"), line
        url = line.split()[-1]
        c = client(url, batch_size=10)
        assert c.health()["protocols"] == ["json"]
        np.testing.assert_array_equal(c(images, prompts), expected)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert len([x for x in err.splitlines() if "POST / json 10 images -> 200" in x]) == 2
    assert len([x for x in err.splitlines() if "POST / json 3 images -> 200" in x]) == 1


# -- end to end ---------------------------------------------------------------------------------


@pytest.mark.e2e
def test_micro_run_with_served_rewards_equals_the_in_process_run(tmp_path, base):
    """Every rl.jsonl value but the wall-clock times is equal (the rewards bitwise: npy images
    are exact); a served evaluation reward lacks only the per-constraint accuracies that
    evaluate() adds for geneval rewards computed in-process."""
    from spotlight_jax import runner

    graphdef, state = base
    runner.build_and_run(RunSpec.from_config(micro_config(1)), str(tmp_path / "local"), graphdef,
                         state,
               progress=False)
    with RewardServer("geneval_lite") as s:
        runner.build_and_run(RunSpec.from_config(micro_config(1, **{"rl.reward": "remote",
                                                              "rl.eval_reward": "remote",
                                      "remote_reward.url": s.url,
                                      "remote_reward.image_format": "npy",
                                      "remote_reward.batch_size": 3})),
                   str(tmp_path / "remote"), graphdef, state, progress=False)
        assert s.requests >= 4              # 8 rollouts in requests of 3, and the evaluation
    local, remote = ([json.loads(x) for x in open(tmp_path / d / "rl.jsonl")]
                     for d in ("local", "remote"))
    assert [r["step"] for r in local] == [r["step"] for r in remote] == [0, 1]
    assert "reward_mean" in local[1] and "val_reward" in local[0]
    for a, b in zip(local, remote):
        only_local = set(a) - set(b)
        assert set(b) <= set(a) and all(k.startswith(("val_acc_", "val_missing_"))
                                        for k in only_local), only_local
        assert {k: v for k, v in a.items() if k in b and k not in WALL_CLOCK_KEYS} == \
            {k: v for k, v in b.items() if k not in WALL_CLOCK_KEYS}


def test_the_remote_client_is_registered_once_per_server(monkeypatch):
    """A run's rewards are registered each time one is built (compare: per mode); the same
    server's client is built and registered once, another server's replaces it."""
    from spotlight_jax import config as conf

    def register(over):
        conf.register_rewards(conf.RunSpec.from_config(load_config("tiny", over)))

    built = []

    class Fake:
        def __init__(self, cfg):
            built.append(cfg.url)
            self.components = None

        def __call__(self, images, prompts):
            return np.zeros(len(prompts), np.float32)

    monkeypatch.setattr(conf.builders, "RemoteReward", Fake)
    monkeypatch.setattr(conf.builders, "_registered_remote", {})
    over = {"rl.reward": "remote", "remote_reward.url": "http://127.0.0.1:1"}
    try:
        for _ in range(3):
            register(over)
        assert built == ["http://127.0.0.1:1"]
        register({**over, "remote_reward.url": "http://127.0.0.1:2"})
        assert built == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    finally:
        R.unregister("remote")          # the fake client leaves with the test
