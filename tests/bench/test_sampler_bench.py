"""The sampler benchmark runs as a program, and its data-parallel contender draws the same images
as the one-device rollout (it prints the largest difference, which must be ~0)."""
import re
import subprocess
import sys

import pytest

from spotlight_jax import programs


@pytest.mark.e2e
def test_sampler_bench_with_two_devices_and_torch():
    pytest.importorskip("torch", reason="the benchmark's --torch comparison needs torch")
    out = subprocess.run(
        [sys.executable, "-m", "spotlight_jax.bench.sampler", "--batch=4", "--steps=2",
         "--repeats=1", "--torch", "--devices=2"],
        cwd=programs.REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    gap = float(re.search(r"images within (\S+) of one device's", out.stdout).group(1))
    assert gap < 1e-5
    ratios = dict(re.findall(r"^(jax jit(?: x2)?) / torch eager: ([\d.]+)x$", out.stdout, re.M))
    assert set(ratios) == {"jax jit", "jax jit x2"}
    assert all(float(r) > 0 for r in ratios.values())


def test_sampler_bench_rejects_devices_that_do_not_divide_the_batch():
    out = subprocess.run(
        [sys.executable, "-m", "spotlight_jax.bench.sampler", "--batch=5", "--devices=2"],
        cwd=programs.REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "--devices=2: must be >= 1 and divide --batch=5" in out.stderr
