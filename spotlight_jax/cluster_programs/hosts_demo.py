"""Spot hosts on a running Ray cluster serving one rollout queue, with an optional notice.

    python -m spotlight_jax.cluster_programs.hosts_demo --address=auto --hosts=2 --requests=16 \\
        --notice_after=4

Connects to Ray, starts ``--hosts`` spot host actors (each needs one ``--resource`` unit, so they
land on spot machines), publishes the config's base weights, submits ``--requests`` rollout
requests and serves them; ``--notice_after=S`` sends the first host a SIGTERM (a preemption
notice) once it has computed S request-steps. Prints each host's leases, calls and how it left,
and checks that every request completed exactly once. Needs the cluster extra
(``pip install -e ".[cluster]"``).
"""
from __future__ import annotations

import os
import signal
import time

from absl import app, flags

from spotlight_jax import programs
from spotlight_jax.config import RunSpec

FLAGS = flags.FLAGS
_CONFIG = None


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This program's flags (defined only when it runs; see ``spotlight_jax.programs``)."""
    global _CONFIG
    fv = dict(flag_values=flag_values)
    _CONFIG = programs.define_config_flag(flag_values)
    flags.DEFINE_string("address", "auto", "Ray cluster address ('' = start a local one).", **fv)
    flags.DEFINE_integer("hosts", 2, "Spot host actors.", **fv)
    flags.DEFINE_integer("cpu_devices", 2, "Emulated devices per host (CPU).", **fv)
    flags.DEFINE_integer("requests", 16, "Rollout requests.", **fv)
    flags.DEFINE_integer("notice_after", 0, "SIGTERM the first host after this many "
                         "request-steps (0 = no notice).", **fv)
    flags.DEFINE_string("resource", "spot_node", "Custom Ray resource of spot machines.", **fv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import jax  # noqa: PLC0415
    jax.config.update("jax_num_cpu_devices", 1)

    from spotlight_jax import world  # noqa: PLC0415
    from spotlight_jax.cluster import ray_hosts as spot  # noqa: PLC0415
    from spotlight_jax.config import model_config  # noqa: PLC0415
    from spotlight_jax.runner import base_model  # noqa: PLC0415
    from spotlight_jax.sched import QueueConfig, RequestQueue, make_requests  # noqa: PLC0415

    config = _CONFIG.value
    mcfg = model_config(config)
    spec = RunSpec.from_config(config)
    graphdef, base, source = base_model.load_or_pretrain_base(spec,
                                                         "/tmp/spotlight_cluster_base")
    env = {"log_to_driver": False,
           "runtime_env": {"env_vars": {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "")}}}
    if FLAGS.address:
        spot.join(FLAGS.address, include_dashboard=False, **env)
    else:                   # a local instance (127.0.0.1 only) with the hosts' resources
        spot.start_local(num_cpus=FLAGS.hosts, **env,
                         resources={FLAGS.resource: FLAGS.hosts} if FLAGS.resource else None)
    t0 = time.time()
    resources = {FLAGS.resource: 1} if FLAGS.resource else None
    workers = [spot.start_host(f"spot{i}", spec, cpu_devices=FLAGS.cpu_devices,
                               worker={"commit_every": 2, "steps_per_call": 1, "microbatch": 2},
                               resources=resources) for i in range(FLAGS.hosts)]
    ref = spot.publish(base)
    for w in workers:
        w.set_policy(ref, 0)
    print(f"{FLAGS.hosts} spot hosts up in {time.time() - t0:.1f} s (base: {source})")
    prompts = world.val_prompts(world.WorldConfig(image_size=mcfg.image_size))
    queue = spot.LockedQueue(RequestQueue(mcfg.latent_shape,
                                          QueueConfig(lease_s=600.0)))
    queue.submit(make_requests(FLAGS.requests, num_steps=config.sampler.num_steps,
                               prompts=prompts, seed0=1000))
    t0 = time.time()
    threads, stats = spot.serve_in_threads(workers, queue)
    if FLAGS.notice_after:
        while workers[0].steps < FLAGS.notice_after and not queue.all_done:
            time.sleep(0.05)
        if not queue.all_done:
            os.kill(workers[0].pid, signal.SIGTERM)
            print(f"notice (SIGTERM) to {workers[0].group_id} after {workers[0].steps} steps")
    for t in threads:
        t.join()
    done = len(queue.completed())
    print(f"{done}/{FLAGS.requests} requests completed in {time.time() - t0:.1f} s; "
          f"request-steps computed {sum(w.steps for w in workers)} "
          f"(needed {FLAGS.requests * config.sampler.num_steps})")
    for w in workers:
        print(f"  {w.group_id}: {stats.get(w.group_id)}")
    if done != FLAGS.requests:
        raise SystemExit("not every request completed")


if __name__ == "__main__":
    define_flags()
    app.run(main)
