#!/usr/bin/env bash
# Clock access for a training container started with `docker run` (docs/clock-access.md).
# Two ways; pick one. Both need the NVIDIA container toolkit (--gpus).
#
#   deploy/docker/docker-run.sh cap-add IMAGE COMMAND...   # A: the container changes clocks itself
#   deploy/docker/docker-run.sh clockd IMAGE COMMAND...    # B: clockd on the host, socket mounted
set -euo pipefail
route=${1:?usage: docker-run.sh cap-add|clockd IMAGE COMMAND...}
image=${2:?usage: docker-run.sh cap-add|clockd IMAGE COMMAND...}
shift 2
cache=${PERSEUS_HOST_CACHE:-$HOME/.cache/perseus}   # profiles and frontiers, kept across containers
mkdir -p "$cache"

case "$route" in
  cap-add)
    # A: root in the container with CAP_SYS_ADMIN (the route Zeus documents). Rootless docker and
    # --userns-remap give a root without the capability over the GPU: use B there.
    exec docker run --rm --gpus all --ipc host --cap-add SYS_ADMIN \
      -v "$cache:/cache/perseus" -e PERSEUS_CACHE_DIR=/cache/perseus \
      "$image" "$@"
    ;;
  clockd)
    # B: the host runs clockd (deploy/systemd/perseus-clockd.service, or deploy/docker/compose.yaml's
    # clockd service); the container runs as your uid, which must be on the daemon's allowlist, and
    # needs no capability. The socket directory is mounted read-only: connect() needs no write access.
    exec docker run --rm --gpus all --ipc host --user "$(id -u):$(id -g)" \
      -v /run/perseus:/run/perseus:ro -e PERSEUS_CLOCKD_SOCKET=/run/perseus/clockd.sock \
      -v "$cache:/cache/perseus" -e PERSEUS_CACHE_DIR=/cache/perseus \
      "$image" "$@"
    ;;
  *)
    echo "docker-run.sh: unknown route '$route'; use cap-add or clockd" >&2
    exit 2
    ;;
esac
