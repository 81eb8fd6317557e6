#!/usr/bin/env bash
# Slurm Prolog: a perseus clockd for each job, on each of its nodes, for that job's user and GPUs
# only (docs/clock-access.md). deploy/slurm/epilog.sh stops it; deploy/slurm/task_prolog.sh points
# the job's tasks at its socket. Install on every GPU node, in slurm.conf:
#
#   Prolog=/etc/slurm/perseus-prolog.sh
#   Epilog=/etc/slurm/perseus-epilog.sh
#   TaskProlog=/etc/slurm/perseus-task-prolog.sh
#
# (Add the lines to your existing scripts if you already have some.) A node that runs
# deploy/systemd/perseus-clockd.service for every job needs neither this nor the Epilog.
#
# Runs as root (SlurmdUser) with the job's SLURM_JOB_ID, SLURM_JOB_UID and SLURM_JOB_GPUS (the
# job's GPU indices on this node as gres.conf numbers them; with AutoDetect=nvml, NVML's order,
# which is what --gpus takes). With ConstrainDevices=yes in cgroup.conf, --require-open-device
# checks that the job claims only its own GPUs. It never fails the job: without a socket, the job
# trains on at default clocks and rank 0 says why.
set -uo pipefail
PATH=${PERSEUS_BIN:-/opt/perseus/venv/bin}:$PATH   # where `perseus` is installed on the node
[ -n "${SLURM_JOB_GPUS:-}" ] || exit 0             # a job without GPUs
mkdir -p -m 0755 /run/perseus
socket=/run/perseus/job-${SLURM_JOB_ID}.sock
unit=perseus-clockd-job${SLURM_JOB_ID}
# A transient systemd unit: outlives the prolog, and `systemctl stop` in the epilog sends SIGTERM,
# on which the daemon resets the job's GPUs and removes its socket.
systemd-run --quiet --unit "$unit" --collect --property KillSignal=SIGTERM --property TimeoutStopSec=30 \
  perseus clockd --socket "$socket" --gpu nvml --gpus "$SLURM_JOB_GPUS" \
  --allow-uid "$SLURM_JOB_UID" --require-open-device || exit 0
for _ in $(seq 300); do   # up to 30 s: the daemon resets the job's GPUs before it listens
  [ -S "$socket" ] && exit 0
  sleep 0.1
done
echo "perseus clockd for job $SLURM_JOB_ID did not start (journalctl -u $unit); the job runs at default clocks" >&2
exit 0
