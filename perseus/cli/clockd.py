"""``perseus clockd``: the per-node GPU clock daemon, so trainers need no privileges (docs/gpu.md)."""

from __future__ import annotations

import argparse

from perseus.cli.arg_types import number_list, octal, positive
from perseus.cli.common import Command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", required=True, metavar="PATH", help="Unix socket to serve")
    p.add_argument("--allow-uid", type=int, action="append", default=[], metavar="N", help="uid allowed to change clocks (repeatable)")
    p.add_argument("--allow-gid", type=int, action="append", default=[], metavar="N", help="gid allowed to change clocks (repeatable)")
    p.add_argument("--gpu", choices=("nvml", "sim"), default="nvml", help="GPU backend (default: nvml)")
    p.add_argument("--gpus", type=number_list(int), metavar="LIST", help="physical GPU indices to manage (default: all; sim: 0)")
    p.add_argument("--sim-dir", metavar="DIR", help="simulated GPUs' state directory (default: $PERSEUS_SIM_GPU_DIR)")
    p.add_argument("--rate", type=positive(float), default=500.0, metavar="HZ", help="clock changes per second per client (default 500)")
    p.add_argument("--burst", type=positive(int), default=50, metavar="N", help="back-to-back changes allowed (default 50)")
    p.add_argument("--max-clients", type=positive(int), default=64, metavar="N", help="simultaneous connections (default 64)")
    p.add_argument("--socket-mode", type=octal, default=0o666, metavar="OCTAL", help="socket file mode (default 666)")
    p.add_argument("--verify-environ", action="store_true",
                   help="require the CUDA_VISIBLE_DEVICES a client sends to match its /proc/PID/environ")
    p.add_argument("--require-open-device", action="store_true",
                   help="require a client to hold each GPU's /dev/nvidiaN open (proof the scheduler gave it that GPU)")
    p.add_argument("--min-clock-check-s", type=positive(float), default=0.05, metavar="S",
                   help="shortest period at which a client may have its held clock read back (default 0.05)")


def run(args: argparse.Namespace) -> int:
    from perseus.gpu.clockd.daemon import DaemonOptions, run as serve

    options = DaemonOptions(args.socket, frozenset(args.allow_uid), frozenset(args.allow_gid), rate_hz=args.rate,
                            burst=args.burst, max_clients=args.max_clients, socket_mode=args.socket_mode,
                            verify_environ=args.verify_environ, require_open_device=args.require_open_device,
                            min_clock_check_s=args.min_clock_check_s)
    return serve(args.gpu, args.gpus, args.sim_dir, options)


COMMAND = Command("clockd", help="per-node GPU clock daemon, so trainers need no privileges",
                  description="Serve GPU clock changes on a Unix socket to allowlisted unprivileged trainers "
                              "(they set PERSEUS_CLOCKD_SOCKET). Run once per node with CAP_SYS_ADMIN; see docs/gpu.md.",
                  add_arguments=add_arguments, run=run,
                  epilog="example:\n  sudo perseus clockd --socket /run/perseus/clockd.sock --allow-gid 1000")
