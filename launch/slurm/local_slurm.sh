#!/usr/bin/env bash
# A small SLURM cluster to try the launchers on (SLURM 22.05; Debian: apt-get install slurm-wlm
# munge): a controller on the first host, one slurmd per host, partitions `ondemand` (the first
# host: the trainer job), `spot` (the others, preemptible: PreemptMode=REQUEUE) and `urgent` (the
# spot hosts again at a higher priority tier: a job there preempts a spot job, the way a cloud
# reclaims a spot VM). The network test bed runs exactly these steps
# (spotlight_jax.cluster.testbed_slurm); on hosts of your own, run each step where it says, as
# root, with STATE on a folder every host shares.
#
#   export STATE=/shared/slurm CPUS=2                 # CPUS: what each host offers SLURM
#   launch/slurm/local_slurm.sh config h0=10.0.0.1 h1=10.0.0.2 h2=10.0.0.3   # once
#   launch/slurm/local_slurm.sh munge         # on every host (one munged may serve them all)
#   launch/slurm/local_slurm.sh controller    # on h0; stays in the foreground
#   launch/slurm/local_slurm.sh node h1       # on every host, h0 too; stays in the foreground
#   export SLURM_CONF=$STATE/slurm.conf
#   sinfo                                     # ondemand: h0; spot, urgent: h1 h2
#   WORKDIR=$STATE/../job CONFIG=configs/tiny.py sbatch --gpus-per-node=0 \
#       launch/slurm/spotlight.sbatch --cpu_devices=4
#   WORKDIR=$STATE/../job sbatch --array=0-1 --gpus-per-node=0 launch/slurm/spot_hosts.sbatch
set -euo pipefail
: "${STATE:?set STATE to a folder every host shares (slurm.conf, the munge key, job state)}"
CONF=$STATE/slurm.conf
MUNGE=$STATE/munge

case "${1:-}" in
config)    # slurm.conf and the munge key, from NAME=ADDRESS pairs (the first is the controller)
  shift
  [ $# -ge 2 ] || { echo "config: give the controller and at least one spot host as NAME=ADDRESS" >&2; exit 2; }
  mkdir -p "$STATE/ctld" "$MUNGE" && chmod 700 "$MUNGE"
  [ -s "$MUNGE/munge.key" ] || { head -c 1024 /dev/urandom > "$MUNGE/munge.key"; chmod 600 "$MUNGE/munge.key"; }
  first=${1%%=*}; spot=$(for h in "${@:2}"; do printf '%s,' "${h%%=*}"; done); spot=${spot%,}
  {
    echo "ClusterName=spotlight"
    echo "SlurmctldHost=$first(${1#*=})"
    echo "SlurmctldPort=6817"
    echo "SlurmdPort=6818"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$MUNGE/munge.socket"
    echo "StateSaveLocation=$STATE/ctld"
    echo "SlurmdSpoolDir=/tmp/slurmd"                   # per host (its own /tmp)
    echo "SlurmctldPidFile=$STATE/slurmctld.pid"
    echo "SlurmdPidFile=/tmp/slurmd.pid"
    echo "SlurmctldLogFile=$STATE/slurmctld.log"
    echo "SlurmdLogFile=$STATE/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "SwitchType=switch/none"
    echo "MpiDefault=none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "SchedulerType=sched/backfill"
    echo "PreemptType=preempt/partition_prio"           # a higher tier preempts a lower one
    echo "PreemptMode=REQUEUE"
    echo "ReturnToService=2"
    echo "SlurmUser=root"
    echo "KillWait=30"                                  # SIGTERM, then SIGKILL 30 s later
    for h in "$@"; do echo "NodeName=${h%%=*} NodeAddr=${h#*=} CPUs=${CPUS:-2} State=UNKNOWN"; done
    echo "PartitionName=ondemand Nodes=$first PriorityTier=10 Default=YES State=UP MaxTime=INFINITE"
    echo "PartitionName=spot Nodes=$spot PriorityTier=1 PreemptMode=REQUEUE State=UP MaxTime=INFINITE"
    echo "PartitionName=urgent Nodes=$spot PriorityTier=100 PreemptMode=OFF State=UP MaxTime=INFINITE"
  } > "$CONF"
  echo "$CONF"
  ;;
munge)     # munged with the shared key; its socket in STATE (the one AuthInfo names)
  exec munged --force --socket="$MUNGE/munge.socket" --key-file="$MUNGE/munge.key" \
      --pid-file="$MUNGE/munged.pid" --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed"
  ;;
controller)
  exec slurmctld -D -f "$CONF"
  ;;
node)      # NAME: this host's NodeName
  [ -n "${2:-}" ] || { echo "node: give this host's name (its NodeName in slurm.conf)" >&2; exit 2; }
  mkdir -p /tmp/slurmd
  exec slurmd -D -f "$CONF" -N "$2"
  ;;
*)
  echo "usage: STATE=DIR $0 config NAME=ADDRESS... | munge | controller | node NAME" >&2
  exit 2
  ;;
esac
