"""Two trainer processes (jax.distributed over gloo on localhost, 2 CPU devices each) run the
same GRPO update as one process over 4 devices, on the same batch and base weights.

Tolerance: the data-parallel gradient is an all-reduce over 4 devices in both runs, but across
processes gloo sums the shards in its own order, so float32 sums can differ in the last bits
(relative ~1e-7 per reduction). Adam normalises the update, so the parameter change of one step
is ~lr per element; we allow 1e-3 of the largest change (1e-6 absolute at lr 1e-3) — far below
any real discrepancy (a wrong batch split or a missing all-reduce changes the update by O(1)).
"""
import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import MICRO_RUN_OVERRIDES, TINY, child_env, config_flags, free_port, micro_config

from spotlight_jax import runner
from spotlight_jax.config import RunSpec, build_mesh, model_config, rl_config, sampler_config
from spotlight_jax.io import checkpoints
from spotlight_jax.models.factory import create_model
from spotlight_jax.parallel.sharding import shard_state
from spotlight_jax.rl import GRPOTrainer, advantages
from spotlight_jax.runner.backends.rollouts import group_seeds


@pytest.mark.cluster
def test_two_process_gloo_update_equals_single_process(tmp_path):
    c = micro_config(1)
    graphdef, base = create_model(model_config(c))
    base_dir = str(tmp_path / "base")
    checkpoints.save_params(base_dir, base, {})
    run = runner.build_run(RunSpec.from_config(c), str(tmp_path / "run"), graphdef, base,
                           jax.devices()[:1])
    prompts = run.prompts(0)
    batch = run.rollout(prompts, group_seeds(c.seed, 0, len(prompts),
                                                        c.rl.group_size))
    train = {"latents": batch["latents"], "log_probs": batch["log_probs"],
             "advantages": advantages(batch["rewards"], batch["prompt_ids"]),
             "tokens": batch["tokens"], "mask": batch["mask"]}
    assert np.abs(train["advantages"]).max() > 0
    np.savez(tmp_path / "batch.npz", **{k: np.asarray(v) for k, v in train.items()})

    # one process, 4 devices
    mesh = build_mesh(c, jax.devices()[:4])
    ref = GRPOTrainer(graphdef, shard_state(base, mesh), rl_config(c),
                      sampler_config(c), mesh=mesh)
    ref_metrics = ref.update(train, jax.random.key(c.seed), 0)
    want = [np.asarray(x) for x in jax.tree.leaves(ref.trainable)]
    before = [np.asarray(x) for x in jax.tree.leaves(
        GRPOTrainer(graphdef, base, rl_config(c), sampler_config(c)).trainable)]

    # two processes x 2 devices
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "spotlight_jax.cluster_programs.update_check",
         f"--coordinator=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}",
         "--cpu_devices=2", f"--config={TINY}", *config_flags(MICRO_RUN_OVERRIDES),
         f"--base={base_dir}", f"--batch={tmp_path / 'batch.npz'}",
         f"--out={tmp_path / 'got.npz'}"], env=child_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    metrics = [json.loads(line) for out in outs for line in out.splitlines()
               if line.startswith('{"process"')]
    assert sorted(m["process"] for m in metrics) == [0, 1]
    for m in metrics:   # every process computed the same (replicated) metrics
        np.testing.assert_allclose(m["loss"], ref_metrics["loss"], rtol=1e-5, atol=1e-7)
    with np.load(tmp_path / "got.npz") as f:
        got = [f[k] for k in sorted(f.files)]
    assert [g.shape for g in got] == [w.shape for w in want]
    change = max(float(np.abs(w - b).max()) for w, b in zip(want, before))
    assert change > 0
    worst = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
    print(f"two processes vs one: max |dparam| {worst:.2e}, largest update {change:.2e}")
    assert worst <= 1e-3 * change, (worst, change)
