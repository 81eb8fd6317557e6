"""Legacy frontier file format, version 1: every point spells out its whole plan.

Each point carries one ``{kind, microbatch, chunk, freq_mhz}`` object per instruction, so a file
grows as instructions × points (about 600 MB at 16,384 instructions and 300 points). Perseus
writes version 2 (``perseus.frontier.codec``); this module keeps version 1 files loadable and can
still write them, for tests and for the file-size benchmark.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perseus.errors import FrontierError
from perseus.frontier.model import Frontier, FrontierPoint, thin_points
from perseus.schedules import Instruction, Schedule

VERSION = 1


def document_head(frontier: Frontier, version: int) -> dict[str, Any]:
    """What every version's document starts with: its format and version, and the schedule's identity."""
    sched = frontier.schedule
    return {"format": "perseus-frontier", "version": version, "order": "fastest_first", "schedule": sched.name,
            "stages": sched.num_stages, "microbatches": sched.num_microbatches, "chunks": sched.num_chunks,
            **sched.variant_fields()}


def document_provenance(frontier: Frontier) -> dict[str, Any]:
    """Where a frontier came from, in every version: P_blocking, the GPU, the all-max baseline, the
    solve time, and the non-compute time per iteration where there is any (absent: none)."""
    extra = {"non_compute": frontier.non_compute.as_json()} if frontier.non_compute else {}
    return {"p_blocking_w": frontier.p_blocking_w, "gpu_name": frontier.gpu_name,
            "baseline": {"time_s": frontier.baseline_time_s, "energy_j": frontier.baseline_energy_j},
            "solve_time_s": frontier.solve_time_s, **extra}


def encode_v1(frontier: Frontier, max_points: int | None = None) -> dict[str, Any]:
    """The version 1 JSON document of ``frontier`` (what perseus wrote before version 2)."""
    sched = frontier.schedule

    def encode(point: FrontierPoint) -> dict[str, Any]:
        return {
            "time_s": point.time_s,
            "energy_j": point.energy_j,
            "plan": [
                [
                    {"kind": inst.kind, "microbatch": inst.microbatch, "chunk": inst.chunk, **_pair(inst), "freq_mhz": f}
                    for inst, f in frontier.stage_plan(point, s)
                ]
                for s in range(sched.num_stages)
            ],
        }

    return {
        **document_head(frontier, VERSION),
        **document_provenance(frontier),
        "metadata": frontier.metadata,
        "points": [encode(p) for p in thin_points(frontier.points, max_points)],
        "paced_points": [encode(p) for p in thin_points(frontier.paced_points, max_points)],
    }


def _pair(inst: Instruction) -> dict[str, int]:
    """A fused unit's backward (``backward_microbatch``, ``backward_chunk``); nothing for other kinds."""
    pair = inst.backward_pair()
    return {} if pair is None else {"backward_microbatch": pair[0], "backward_chunk": pair[1]}


def _decode(e: Any) -> Instruction:
    pair = [int(e[k]) for k in ("backward_microbatch", "backward_chunk") if k in e]
    return Instruction(e["kind"], int(e["microbatch"]), int(e.get("chunk", 0)), *pair)


def decode_v1_points(items: Any, name: str, schedule: Schedule, source: str) -> list[FrontierPoint]:
    """Points of a version 1 file, each checked to follow ``schedule``'s instruction order."""
    points = []
    for n, item in enumerate(items):
        freqs: list[int] = []
        plan = item["plan"]
        if len(plan) != schedule.num_stages:
            raise FrontierError(f"{source}: {name}[{n}] has {len(plan)} stages, expected {schedule.num_stages}")
        for s, (stage_plan, stage_insts) in enumerate(zip(plan, schedule.stages)):
            got = [_decode(e) for e in stage_plan]
            if got != list(stage_insts):
                raise FrontierError(f"{source}: {name}[{n}] stage {s} does not follow the {schedule.name} order")
            freqs.extend(int(e["freq_mhz"]) for e in stage_plan)
        points.append(FrontierPoint(float(item["time_s"]), float(item["energy_j"]), np.array(freqs, dtype=np.int64)))
    return points
