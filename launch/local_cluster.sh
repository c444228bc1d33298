#!/usr/bin/env bash
# A real multi-process cluster on one machine, running the tiny config end to end:
#   1. a local Ray head (listening on 127.0.0.1 only) advertising 2 "spot_node" resources
#      (the spot machines);
#   2. the trainer's jax.distributed job: 2 processes x 2 emulated CPU devices over gloo.
#      Process 0 runs the runner (spot_rollout mode, Ray transport): each iteration's
#      rollouts go to 2 spot host actors (single-host JAX processes with an SP group of 2
#      devices) that pull requests from its queue; the GRPO update runs over all 4 trainer
#      devices, process 1 joining every collective; evaluation and checkpoints in process 0;
#   3. the spot hosts' preemption path: a host gets a SIGTERM notice half-way through a queue
#      and hands its in-flight requests back, committed (every request completes exactly once);
#   4. the trainer job's checkpoint resumed by the single-process command for one more
#      iteration (the cluster's run continues on a laptop).
# Usage: launch/local_cluster.sh [WORKDIR] [ITERATIONS]   (needs: pip install -e ".[cluster]")
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-/tmp/spotlight_local_cluster}
ITERS=${2:-3}
mkdir -p "$WORK"
export JAX_PLATFORMS=cpu
PORT=${PORT:-12355}

echo "== Ray head with 2 spot nodes"
ray stop --force >/dev/null 2>&1 || true
# listening on 127.0.0.1 only, without the dashboard (spotlight_jax.cluster.ray_hosts.ray_start)
python -c 'from spotlight_jax.cluster import ray_hosts; ray_hosts.ray_start()' \
  --head --num-cpus=4 --resources='{"spot_node": 2}' >/dev/null
trap 'ray stop --force >/dev/null 2>&1 || true' EXIT

echo "== trainer job: 2 processes x 2 devices over gloo, $ITERS iterations (logs: $WORK/trainer*.log)"
for i in 0 1; do
  python -m spotlight_jax.main --coordinator=127.0.0.1:$PORT --num_processes=2 \
    --process_id=$i --cpu_devices=2 --config=configs/tiny.py --workdir="$WORK/run" \
    --config.mode=spot_rollout --config.deployment.transport=ray \
    --config.deployment.spot_nodes=2 --config.deployment.ray_spot_resource=spot_node \
    --config.rl.iterations=$ITERS --config.rl.eval_every=$ITERS > "$WORK/trainer$i.log" 2>&1 &
done
wait
grep '^{"process"' "$WORK/trainer0.log"
grep -h "stop after" "$WORK/trainer1.log"

echo "== spot hosts serving a queue; the first one preempted with a SIGTERM notice"
python -m spotlight_jax.cluster_programs.hosts_demo --address=auto --hosts=2 --requests=16 --notice_after=4

echo "== the trainer job's checkpoint, resumed in one process for one more iteration"
python -m spotlight_jax.main --config=configs/tiny.py --workdir="$WORK/run" \
  --config.mode=spot_rollout --config.rl.iterations=$((ITERS + 1)) --config.rl.eval_every=0 \
  2>&1 | grep -E "resumed from|== spot_rollout|held-out"
