#!/usr/bin/env bash
# Slurm TaskProlog: points every task of a job at the node's perseus clockd (docs/clock-access.md).
# Runs as the job's user before each task; each `export NAME=value` line it prints goes into the
# task's environment. The job's own daemon (deploy/slurm/prolog.sh) comes first, then a daemon
# that serves every job (deploy/systemd/perseus-clockd.service). A job that sets
# PERSEUS_CLOCKD_SOCKET itself keeps its value.
[ -n "${PERSEUS_CLOCKD_SOCKET:-}" ] && exit 0
for socket in "/run/perseus/job-${SLURM_JOB_ID}.sock" /run/perseus/clockd.sock; do
  if [ -S "$socket" ]; then
    echo "export PERSEUS_CLOCKD_SOCKET=$socket"
    break
  fi
done
exit 0
