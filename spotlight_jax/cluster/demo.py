"""Spot hosts on a running Ray cluster serving one rollout queue, with an optional notice.

    python -m spotlight_jax.cluster.demo --address=auto --hosts=2 --requests=16 --notice_after=4

Connects to Ray, starts ``--hosts`` spot host actors (each needs one ``spot_node`` resource, so
they land on spot machines), publishes the config's base weights, submits ``--requests``
rollout requests and serves them; ``--notice_after=S`` sends the first host a SIGTERM (a
preemption notice) once it has computed S request-steps. Prints each host's leases, calls and
how it left, and checks that every request completed exactly once.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default="auto", help="Ray cluster address ('' = local)")
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--overrides", default="{}", help="JSON of dotted config overrides")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--cpu_devices", type=int, default=2, help="emulated devices per host (CPU)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--notice_after", type=int, default=0, help="0 = no notice")
    ap.add_argument("--resource", default="spot_node", help="custom resource of spot machines")
    return ap


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)

    import jax  # noqa: PLC0415
    jax.config.update("jax_num_cpu_devices", 1)
    import ray  # noqa: PLC0415

    from spotlight_jax import train, world  # noqa: PLC0415
    from spotlight_jax.builders import load_config, model_config  # noqa: PLC0415
    from spotlight_jax.cluster import spot  # noqa: PLC0415
    from spotlight_jax.sched import QueueConfig, RequestQueue, make_requests  # noqa: PLC0415

    overrides = json.loads(args.overrides)
    config = load_config(args.config, overrides)
    mcfg = model_config(config)
    graphdef, base, source = train.load_or_pretrain_base(config, "/tmp/spotlight_cluster_base")
    ray.init(address=args.address or None, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "")}})
    t0 = time.time()
    resources = {args.resource: 1} if args.resource else None
    workers = [spot.start_host(f"spot{i}", config, cpu_devices=args.cpu_devices,
                               worker={"commit_every": 2, "steps_per_call": 1, "microbatch": 2},
                               resources=resources) for i in range(args.hosts)]
    ref = spot.publish(base)
    for w in workers:
        w.set_policy(ref, 0)
    print(f"{args.hosts} spot hosts up in {time.time() - t0:.1f} s (base: {source})")
    prompts = world.val_prompts(world.WorldConfig(image_size=mcfg.image_size))
    queue = spot.LockedQueue(RequestQueue((mcfg.image_size,) * 2 + (mcfg.channels,),
                                          QueueConfig(lease_s=600.0)))
    queue.submit(make_requests(args.requests, num_steps=config.sampler.num_steps,
                               prompts=prompts, seed0=1000))
    t0 = time.time()
    threads, stats = spot.serve_in_threads(workers, queue)
    if args.notice_after:
        while workers[0].steps < args.notice_after and not queue.all_done:
            time.sleep(0.05)
        if not queue.all_done:
            os.kill(workers[0].pid, signal.SIGTERM)
            print(f"notice (SIGTERM) to {workers[0].group_id} after {workers[0].steps} steps")
    for t in threads:
        t.join()
    done = len(queue.completed())
    print(f"{done}/{args.requests} requests completed in {time.time() - t0:.1f} s; "
          f"request-steps computed {sum(w.steps for w in workers)} "
          f"(needed {args.requests * config.sampler.num_steps})")
    for w in workers:
        print(f"  {w.group_id}: {stats.get(w.group_id)}")
    if done != args.requests:
        raise SystemExit("not every request completed")


if __name__ == "__main__":
    main()
