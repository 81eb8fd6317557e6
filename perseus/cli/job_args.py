"""The job-size flags of ``perseus emulate`` (straggler, sweep and grid replay alike): ``--gpus N`` or
``--dp D`` pipelines, ``--tp T`` GPUs per stage."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from perseus.cli.arg_types import positive

if TYPE_CHECKING:
    from perseus.timeline.emulator import DataParallelJob


def add_job_args(p: argparse.ArgumentParser) -> None:
    size = p.add_mutually_exclusive_group()
    size.add_argument("--gpus", type=positive(int), metavar="N", help="total GPUs (pipelines = N / (TP x stages))")
    size.add_argument("--dp", type=positive(int), metavar="D", help="number of data-parallel pipelines (instead of --gpus)")
    p.add_argument("--tp", type=positive(int), default=1, metavar="T", help="tensor-parallel GPUs per stage (default 1)")


def job_size(args: argparse.Namespace, num_stages: int) -> DataParallelJob:
    """The job of --gpus N or --dp D pipelines, --tp T GPUs per stage (checked: whole pipelines)."""
    from perseus.timeline.emulator import DataParallelJob

    if args.dp is not None:
        return DataParallelJob.from_gpus(args.dp * args.tp * num_stages, args.tp, num_stages)
    return DataParallelJob.from_gpus(args.gpus, args.tp, num_stages)
