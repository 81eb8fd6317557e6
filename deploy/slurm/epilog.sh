#!/usr/bin/env bash
# Slurm Epilog: stops the job's perseus clockd (deploy/slurm/prolog.sh) and leaves the job's GPUs
# at default clocks for the next job (docs/clock-access.md). Runs as root on every node of the job.
set -uo pipefail
[ -n "${SLURM_JOB_GPUS:-}" ] || exit 0
unit=perseus-clockd-job${SLURM_JOB_ID}
# SIGTERM: the daemon resets the job's GPUs and removes its socket (SIGKILL after 30 s).
systemctl stop "$unit" 2>/dev/null
rm -f "/run/perseus/job-${SLURM_JOB_ID}.sock"
# A daemon killed before its reset leaves its last lock: reset the job's GPUs in any case.
nvidia-smi -i "$SLURM_JOB_GPUS" --reset-gpu-clocks >/dev/null 2>&1
exit 0
