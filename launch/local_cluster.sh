#!/usr/bin/env bash
# A real multi-process cluster on one machine, with the pieces that exist today:
#   1. the trainer's jax.distributed job: 2 processes x 2 emulated CPU devices, gloo collectives,
#      running one GRPO update of the tiny config on a rollout batch (process 0 reads it and
#      broadcasts it; both run the update over one 4-device mesh);
#   2. a local Ray head advertising 2 "spot_node" resources, and 2 spot hosts (Ray actors, each
#      a single-host JAX process with an SP group of 2 devices) serving a rollout queue owned by
#      this driver, one of them preempted with a SIGTERM notice half-way.
# Usage: launch/local_cluster.sh [WORKDIR]      (needs: pip install -e ".[cluster]")
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-/tmp/spotlight_local_cluster}
mkdir -p "$WORK"
export JAX_PLATFORMS=cpu
PORT=${PORT:-12355}

echo "== rollout batch and base weights for the trainer job"
python - "$WORK" <<'PY'
import sys, numpy as np, jax
jax.config.update("jax_num_cpu_devices", 1)
from spotlight_jax import controller, train
from spotlight_jax.builders import load_config
work = sys.argv[1]
c = load_config("tiny", {"mode": "flow_grpo", "num_cpu_devices": 1})
graphdef, base, src = train.load_or_pretrain_base(c, work)
run = controller.Run(c, f"{work}/run", graphdef, base)
p = run.prompts(0)
b = run.rollout(p, controller.group_seeds(c.seed, 0, len(p), c.rl.group_size))
adv = controller.advantages(b["rewards"], b["prompt_ids"])
np.savez(f"{work}/batch.npz", latents=b["latents"], log_probs=b["log_probs"], advantages=adv,
         tokens=b["tokens"], mask=b["mask"])
print("base:", src)
PY
BASE=$(python -c "from spotlight_jax import train; from spotlight_jax.builders import load_config; print(train.shipped_base_dir(load_config('tiny')) or '$WORK/base')")

echo "== trainer job: 2 processes x 2 devices over gloo"
for i in 0 1; do
  python -m spotlight_jax.cluster.trainer --coordinator=127.0.0.1:$PORT --num_processes=2 \
    --process_id=$i --cpu_devices=2 --config=tiny --base="$BASE" --batch="$WORK/batch.npz" \
    --out="$WORK/params_after_update.npz" > "$WORK/trainer$i.log" 2>&1 &
done
wait
grep '^{"process"' "$WORK"/trainer*.log

echo "== Ray head with 2 spot nodes; 2 spot hosts serve a rollout queue"
ray stop --force >/dev/null 2>&1 || true
ray start --head --num-cpus=4 --resources='{"spot_node": 2}' --include-dashboard=false >/dev/null
trap 'ray stop --force >/dev/null 2>&1 || true' EXIT
python -m spotlight_jax.cluster.demo --address=auto --hosts=2 --requests=16 --notice_after=4
