"""Export a frontier for other tools: Zeus's pipeline frequency optimizer (the Perseus artifact).

Zeus's ``PointSolution`` scheduler (``zeus/optimizer/pipeline_frequency/server/scheduler.py``)
``eval``s a ``freqs_pipeline_NNNNN.py`` file into ``list[list[tuple[str, int]]]``: one list per
pipeline rank of ``(instruction name, frequency MHz)`` in execution order, names ``"forward"`` /
``"backward"``; its client (``optimizer.py``) checks each name against the instruction it is about
to run. lowtime's solver writes one such file per solver iteration, starting from the slowest
plan, so file numbers grow as iteration time shrinks; we number the same way.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
from pathlib import Path

from perseus.errors import PerseusError
from perseus.frontier import Frontier, FrontierPoint

EXPORT_FORMATS = ("zeus",)
ZEUS_MANIFEST = "frontier_points.csv"


def zeus_file_name(number: int) -> str:
    return f"freqs_pipeline_{number:05d}.py"


def zeus_frequency_text(frontier: Frontier, point: FrontierPoint, index: int) -> str:
    """One point as the Python literal Zeus's ``PointSolution`` reads, with provenance comments."""
    lines = ["["]
    for stage in range(frontier.schedule.num_stages):
        pairs = [(inst.kind, int(freq)) for inst, freq in frontier.stage_plan(point, stage)]
        lines.append(f"{pairs!r},")
    lines.append("]")
    lines.append(f"# perseus frontier point {index} (fastest first): iteration time {point.time_s!r} s, energy {point.energy_j!r} J")
    sched = frontier.schedule
    lines.append(
        f"# schedule {sched.name}, {sched.num_stages} stages, {sched.num_microbatches} microbatches, "
        f"{sched.num_chunks} chunk(s); P_blocking {frontier.p_blocking_w!r} W"
    )
    return "\n".join(lines) + "\n"


def export_zeus(frontier: Frontier, out_dir: Path) -> list[Path]:
    """Write one ``freqs_pipeline_NNNNN.py`` per point (00000 = slowest) and a manifest CSV.

    ``out_dir`` must not exist or be empty, so stale files from an earlier, larger export can
    never be mixed in. Files are written to a temporary directory that is renamed into place.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise PerseusError(f"{out_dir}: output directory exists and is not empty; choose a new or empty one")
    parent = out_dir.absolute().parent
    if not parent.is_dir():
        raise PerseusError(f"{parent}: directory does not exist; create it first")
    count = len(frontier.points)
    manifest = io.StringIO()
    writer = csv.writer(manifest, lineterminator="\n")
    writer.writerow(["file", "perseus_index", "time_s", "energy_j"])
    try:
        tmp = parent / f".{out_dir.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()  # not mkdtemp: the final directory should get the usual (umask) permissions
    except OSError as exc:
        raise PerseusError(f"{parent}: cannot write there ({exc.strerror or exc})") from None
    try:
        names = []
        for index, point in enumerate(frontier.points):
            name = zeus_file_name(count - 1 - index)
            (tmp / name).write_text(zeus_frequency_text(frontier, point, index))
            writer.writerow([name, index, repr(point.time_s), repr(point.energy_j)])
            names.append(name)
        (tmp / ZEUS_MANIFEST).write_text(manifest.getvalue())
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(tmp, out_dir)
    except OSError as exc:
        raise PerseusError(f"{out_dir}: cannot write export ({exc.strerror or exc})") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return [out_dir / name for name in names]
