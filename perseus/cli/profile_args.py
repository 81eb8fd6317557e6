"""The flags ``plan`` and ``emulate`` share: a profile (``--profile``/``--example``) and the schedule
it is planned on, checked against each other before the planner starts."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from perseus.cli.arg_types import positive, share
from perseus.cli.common import UsageError
from perseus.examples import EXAMPLE_MICROBATCHES, example_profile_path, load_example_profile
from perseus.profile import Profile, fuse_forward_backward, load_profile, split_backward, split_into_chunks
from perseus.schedules import FUSED, SCHEDULES, SPLIT_BACKWARD, Schedule, build_schedule


def add_profile_args(p: argparse.ArgumentParser, *, allow_frontier: bool = False) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", type=Path, metavar="P", help="profile file: Zeus CSV (.csv) or perseus JSON (.json)")
    source.add_argument("--example", action="store_true", help="use the shipped example profile (4 stages, A100-like, synthetic)")
    if allow_frontier:
        source.add_argument("--frontier", type=Path, metavar="F", help="use an existing frontier.json instead of planning")
    p.add_argument("--stages", type=positive(int), metavar="S", help="pipeline stages (required with --profile)")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule (default: 1f1b)")
    p.add_argument("--chunks", type=positive(int), default=1, metavar="C",
                   help="virtual chunks per stage: interleaved, torch-interleaved, zb-interleaved, megatron-combined-1f1b; 2 for zbv and dualpipev "
                        "(--example: its stages split evenly into C chunks)")
    p.add_argument("--group-size", type=positive(int), metavar="G",
                   help="interleaved: megatron-core's microbatch_group_size_per_vp_stage (default: --stages)")
    p.add_argument("--overlap-p2p", action="store_true",
                   help="interleaved: megatron-core's overlap_p2p_comm is on (Megatron-LM's default for interleaved "
                        "runs; off with --no-overlap-p2p-communication): the exchanges' waits differ, not the order")
    p.add_argument("--split-backward", type=share, metavar="SHARE",
                   help="zero-bubble schedules (zb-interleaved, zbv) on a profile without I/W: derive backward_input "
                        "as SHARE of each backward's time and energy and backward_weight as the rest (e.g. 0.5)")
    p.add_argument("--fused-sum", action="store_true",
                   help="overlapped schedules (dualpipev, megatron-combined-1f1b) on a profile without fused units: "
                        "derive each forward+backward unit as its forward plus its backward (as torch 2.13 runs "
                        "DualPipeV's; an upper bound where the overlap hides communication). --example always does")
    p.add_argument("--p-blocking", type=positive(float), metavar="W", help="power while blocked on communication, watts (overrides the profile's)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="planner progress bar on stderr (default: only on a terminal)")
    # emulate records no GPU name; plan adds --gpu-name
    p.set_defaults(gpu_name=None)


def load_profile_arg(args: argparse.Namespace) -> tuple[Profile, str]:
    """The profile from --profile or --example, with --p-blocking / --gpu-name applied."""
    if args.example:
        profile, source = load_example_profile(), f"{example_profile_path()} (shipped example)"
    else:
        profile, source = load_profile(args.profile), str(args.profile)
    profile = adapt_profile(profile.with_p_blocking(args.p_blocking), example=args.example, chunks=args.chunks,
                            split_share=args.split_backward)
    if args.gpu_name:
        profile = replace(profile, gpu_name=args.gpu_name)
    return profile, source


def schedule_for(args: argparse.Namespace, profile: Profile, microbatches: int | None) -> tuple[Schedule, Profile]:
    """Build the schedule from --schedule/--stages/--chunks, checking it against the profile (with
    fused units derived by --fused-sum, or for --example, where the schedule has them)."""
    stages = args.stages
    if stages is None:
        if not args.example:
            raise UsageError("--stages is required with --profile (the number of pipeline stages)")
        stages = profile.num_stages
    if microbatches is None:
        if not args.example:
            raise UsageError("--microbatches is required with --profile (microbatches per iteration)")
        microbatches = EXAMPLE_MICROBATCHES
    schedule = build_schedule(args.schedule, stages, microbatches, args.chunks, args.group_size, args.overlap_p2p)
    _check_split_backward(schedule, profile)
    profile = fused_profile(schedule, profile, derive=args.fused_sum or args.example)
    profile.check_matches(schedule)
    profile.require_p_blocking()
    return schedule, profile


def fused_profile(schedule: Schedule, profile: Profile, *, derive: bool) -> Profile:
    """Overlapped schedules' fused units: measured in the profile, or derived as forward + backward
    where ``derive`` (--fused-sum; always for the synthetic --example, which measures nothing)."""
    if not any(inst.kind == FUSED for stage in schedule.stages for inst in stage):
        return profile
    if any(kind == FUSED for _, _, kind in profile.entries):
        return profile
    if not derive:
        raise UsageError(
            f"schedule {schedule.name!r} runs fused forward+backward units, which {profile.source} does not measure; "
            "profile them (the runtime's online profiling does) or derive each as its forward plus its backward "
            "with --fused-sum"
        )
    return fuse_forward_backward(profile, schedule)


def adapt_profile(profile: Profile, *, example: bool, chunks: int, split_share: float | None) -> Profile:
    """--example with --chunks C: the example's stages split evenly into C chunks; --split-backward:
    zero-bubble's I and W derived from each backward."""
    if example and chunks > 1 and profile.num_chunks == 1:
        profile = split_into_chunks(profile, chunks)
    if split_share is not None:
        profile = split_backward(profile, split_share)
    return profile


def _check_split_backward(schedule: Schedule, profile: Profile) -> None:
    needs = {inst.kind for stage in schedule.stages for inst in stage} & set(SPLIT_BACKWARD)
    has = {kind for _, _, kind in profile.entries}
    if needs and not needs <= has:
        raise UsageError(
            f"schedule {schedule.name!r} splits backwards into backward_input (I) and backward_weight (W), which "
            f"{profile.source} does not measure; profile them (perseus_torch's online profiling does) or derive "
            "them from backward with --split-backward 0.5 (I's share of B)"
        )
