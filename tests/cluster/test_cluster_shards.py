"""The shared update on real Ray spot hosts (``deployment.shared_update`` over
``deployment.transport='ray'``): a host computes a gradient shard from the step's inputs over its
own resident base exactly as the trainer does (LoRA, and full fine-tuning); in a run the hosts
take the share the iteration's plan chose while they explore; a host killed with shards in
flight loses nothing (the trainer recomputes them) and the step equals a twin trainer's.
References are independent: the trainer's own shard computation, and a second trainer computing
every shard itself on the same batch."""
import contextlib
import dataclasses

import jax
import numpy as np
import pytest
from helpers import micro_model, mode_config

ray = pytest.importorskip("ray", reason="cluster tests need: pip install -e '.[cluster]'")
from spotlight_jax import runner  # noqa: E402
from spotlight_jax.config import RunSpec  # noqa: E402
from spotlight_jax.rl import shards as shards_lib  # noqa: E402

pytestmark = pytest.mark.cluster

TAKE_OVER_S = 60.0    # the longest the test's trainer waits for a host's shard (or its death)
#                       before taking it over (a fixed 5 s lost to a host on a loaded machine)


def _config(objective="flow_grpo", split="fixed"):
    c = mode_config("spotlight", iterations=1, objective=objective)
    c.deployment.update({"transport": "ray", "spot_nodes": 2, "spot_devices_per_node": 2,
                         "ray_explore_deadline": False, "ray_host_wait_s": 600.0,
                         "spot_regroup_precompile": False, "shared_update": split,
                         "update_spot_share": 1.0})
    c.trace.rate_per_node_hour = 0.0
    return c


def _close(a, b, rtol, atol=0.0):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        err, scale = float(np.abs(x - y).max()), max(float(np.abs(y).max()), 1e-12)
        assert err <= rtol * scale + atol, (err, scale)


def _train_batch(r):
    """A training batch of iteration 0's prompts, rolled out on the trainer."""
    prompts = r.prompts(0)
    batch = r.rollout(prompts, r.mode.seeds(r, 0, prompts))
    ids = np.repeat(np.arange(len(prompts)), r.settings.group_size)
    train = {k: batch[k] for k in r.trainer.batch_keys if k in batch}
    train["prompt_ids"] = ids
    train["advantages"] = r.trainer.advantages(batch["rewards"], ids, None, None)
    return train


def _each_host_equals_the_trainer(hosts):
    """A ``run`` for ``update_sharded``: host i computes shard i from the step's inputs (through
    the object store, over its own base), compared with the trainer's own computation; the step
    is never applied."""
    def run(step):
        for i, w in enumerate(hosts):
            weights, rows = step.inputs(i)
            grads, metrics = ray.get(w.shard(ray.put(jax.tree.map(np.asarray, weights)),
                                             ray.put(jax.tree.map(np.asarray, rows))))
            want = step.compute(i)
            _close(grads, want.grads, 1e-5)
            np.testing.assert_allclose(metrics["loss"], np.asarray(want.metrics["loss"]),
                                       rtol=1e-5, atol=1e-8)
        raise StopIteration
    return run


@contextlib.contextmanager
def _run_on_hosts(c, tmp_path):
    """The run state of ``c`` with its two hosts up and holding the base, and a training batch
    of iteration 0: ``(run, hosts, batch)``; the run is closed after."""
    _, graphdef, state = micro_model()      # perturbed: a fresh adaLN-Zero model has no gradient
    r = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, state)
    try:
        r.ray_fleet.top_up(0, r.trainer.sampling_state())
        hosts = list(r.ray_fleet.hosts)
        assert len(hosts) == 2 and all(w.has_base for w in hosts)
        yield r, hosts, _train_batch(r)
    finally:
        r.close()


def test_ray_hosts_compute_shards_and_a_killed_host_changes_nothing(cluster, tmp_path):
    c = _config()
    with _run_on_hosts(c, tmp_path) as (r, hosts, train):
        key = jax.random.key(0)

        # 1. a host's shard from the step's inputs (through the object store) over its own base
        with pytest.raises(StopIteration):
            r.trainer.update_sharded(train, key, 0, shards=4,
                                     run=_each_host_equals_the_trainer(hosts))

        # 2. in a run: the hosts take their shards while they explore
        row = r.step(0)
        assert row["update_shards"] > 0 and row["update_split"] == 1.0
        assert (row["update_shards_spot"] + row["update_lost"] + row["update_dropped"]
                == row["update_shards"])
        assert row["update_lost"] == 0 and np.isfinite(row["loss"])
        assert row["explore_hosts"] == 2

        # 3. one host killed with its shards in flight: recomputed here, the same step
        a = r.spec.make_trainer(r.trainer.graphdef, r.trainer.base, mesh=r.mesh)
        b = r.spec.make_trainer(r.trainer.graphdef, r.trainer.base, mesh=r.mesh)
        # the reference: every shard on the trainer (equal to its single-program update to
        # float rounding: tests/rl/test_shards.py)
        want = a.update_sharded(train, key, 0, shards=4,
                                run=lambda step: step.apply(shards_lib.run_locally(step)))
        victim, killed, calls = hosts[0], [], []
        submit = type(victim).shard

        def shard_then_die(w, weights_ref, rows_ref):
            ref = submit(w, weights_ref, rows_ref)
            calls.append(ref)                     # a step's shards 0-3, in call order
            if w is victim and not killed:
                ray.kill(w.actor)
                killed.append(True)
            return ref

        def slow(step):      # the trainer takes a host's shard over only once the host
            def compute(i):  # delivered it or its death surfaced (or after TAKE_OVER_S)
                ray.wait([calls[len(calls) - step.shards + i]], timeout=TAKE_OVER_S)
                return step.compute(i)
            return dataclasses.replace(step, compute=compute)

        r.ray_fleet.hosts = hosts
        r.ray_shards.take_counts()
        type(victim).shard = shard_then_die
        try:
            got = b.update_sharded(train, key, 0, shards=4,
                                   run=lambda step: r.ray_shards.run(slow(step), share=1.0))
        finally:
            type(victim).shard = submit
        counts = r.ray_shards.take_counts()
        # Flow-GRPO: optimizer steps of 4 shards each, dealt in turn: the even ones to the victim.
        # Every call made after the kill is lost; the one in flight when it was killed may
        # still have been delivered (the kill races the actor's short computation).
        n = counts["update_shards"]
        assert n % 4 == 0 and n > 0
        assert counts["update_lost"] in (n // 2 - 1, n // 2)
        assert counts["update_shards_spot"] == n - counts["update_lost"]
        assert counts["update_dropped"] == 0
        for k in ("loss", "grad_norm"):
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)
        # weights: float rounding of the summation order, far below one step (lr 1e-3 scale)
        _close(b.trainable, a.trainable, 1e-5, 1e-2 * float(c.rl.lr) * 4)


def test_full_fine_tuning_shards_on_ray_hosts_at_the_planned_split(cluster, tmp_path):
    """nft without LoRA, ``shared_update='auto'``: each host holds the base (the reference of
    the loss's KL term) and computes a full-weight shard as the trainer does; in a run each
    optimizer step's last ``round(split x shards)`` shards went to the hosts, the split being
    the one the iteration's plan chose."""
    c = _config(objective="nft", split="auto")
    c.rl.lora_rank = 0
    with _run_on_hosts(c, tmp_path) as (r, hosts, train):
        with pytest.raises(StopIteration):
            r.trainer.update_sharded(train, jax.random.key(0), 0, shards=4,
                                     run=_each_host_equals_the_trainer(hosts))

        row = r.step(0)
        n = r.settings.prompts_per_iter * r.settings.group_size
        steps = r.trainer.shard_units(r.trainer.cfg, n)[0]
        per_step = row["update_shards"] // steps
        assert row["update_shards"] == steps * per_step > 0
        assert 0 < row["update_split"] <= 1
        taken = row["update_shards_spot"] + row["update_lost"] + row["update_dropped"]
        assert taken == steps * round(row["update_split"] * per_step)
        assert row["update_lost"] == 0 and np.isfinite(row["loss"])
