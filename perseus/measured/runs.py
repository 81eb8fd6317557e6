"""Reading measured runs: one workload directory of the Perseus artifact into typed values.

A workload directory (``merak+<model>+<partition>+dp1+pp<S>+tp1+mbs<b>+nmb<M>+PointSolution``)
holds, per schedule ``N``, ``N.sched.json`` (per rank the SM clock of every command of Merak's
1F1B stream: ``perseus.measured.commands``) and ``N.prof.json`` (per rank and iteration the
iteration time, the GPU's energy counter over it, and each microbatch's forward and backward time).
Everything is checked on the way in; a malformed file is one ``ProfileError`` line naming the file
and the problem. A run's iteration time is the slowest rank's, its energy the sum over ranks, both
per iteration; what a schedule measured is their median over the iterations after the first (the
first warms up).
"""

from __future__ import annotations

import json
import math
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from perseus.errors import ProfileError
from perseus.measured.commands import instruction_clocks

_NAME = re.compile(r"^merak\+(?P<model>[^+]+)\+.*\+dp(?P<dp>\d+)\+pp(?P<pp>\d+)\+tp(?P<tp>\d+)"
                   r"\+mbs(?P<mbs>\d+)\+nmb(?P<nmb>\d+)(\+.*)?$")
_SCHED = re.compile(r"^(\d+)\.sched\.json$")
STALL_RATIO = 1.05  # an instance or iteration this much slower than its median stalled: not noise, not the clock


@dataclass(frozen=True)
class WorkloadShape:
    """What a workload directory's name says: the model and the pipeline's shape."""

    model: str
    stages: int
    microbatches: int
    microbatch_size: int


@dataclass(frozen=True, eq=False)
class RankRun:
    """One rank (= one stage) of one measured schedule. Arrays are per iteration, first included."""

    rank: int
    forward_clock_mhz: np.ndarray  # (M,) the clock each microbatch's forward ran at
    backward_clock_mhz: np.ndarray  # (M,)
    iter_time_s: np.ndarray  # (I,)
    iter_energy_j: np.ndarray  # (I,)
    forward_s: np.ndarray  # (I, M) each microbatch's forward time
    backward_s: np.ndarray  # (I, M)
    forward_median_s: np.ndarray = field(init=False, repr=False)  # (M,) median over the iterations after the first
    backward_median_s: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "forward_median_s", np.median(self.forward_s[1:], axis=0))
        object.__setattr__(self, "backward_median_s", np.median(self.backward_s[1:], axis=0))

    def clocks(self, kind: str) -> np.ndarray:
        return self.forward_clock_mhz if kind == "forward" else self.backward_clock_mhz

    def times(self, kind: str) -> np.ndarray:
        return self.forward_s if kind == "forward" else self.backward_s

    def instance_medians(self, kind: str) -> np.ndarray:
        """(M,) each microbatch's time, median over the iterations after the first."""
        return self.forward_median_s if kind == "forward" else self.backward_median_s


@dataclass(frozen=True, eq=False)
class ScheduleRun:
    """One measured schedule: every rank's clocks and measurements."""

    index: int
    ranks: tuple[RankRun, ...]
    source: str

    @property
    def iteration_times_s(self) -> np.ndarray:
        """Per iteration, the slowest rank's time."""
        return np.max([r.iter_time_s for r in self.ranks], axis=0)

    @property
    def iteration_energies_j(self) -> np.ndarray:
        """Per iteration, the energy summed over ranks."""
        return np.sum([r.iter_energy_j for r in self.ranks], axis=0)

    @property
    def time_s(self) -> float:
        return float(np.median(self.iteration_times_s[1:]))

    @property
    def energy_j(self) -> float:
        return float(np.median(self.iteration_energies_j[1:]))

    @property
    def max_clock_mhz(self) -> int:
        return int(max(max(r.forward_clock_mhz.max(), r.backward_clock_mhz.max()) for r in self.ranks))

    def stalled_iterations(self) -> int:
        """Iterations after the first more than ``STALL_RATIO`` slower than the run's median."""
        times = self.iteration_times_s[1:]
        return int((times > STALL_RATIO * np.median(times)).sum())

    def runs_everything_at(self, clock_mhz: int) -> bool:
        return all(bool((r.forward_clock_mhz == clock_mhz).all() and (r.backward_clock_mhz == clock_mhz).all())
                   for r in self.ranks)


@dataclass(frozen=True, eq=False)
class Workload:
    """Every measured schedule of one workload, in schedule order."""

    name: str
    path: Path
    shape: WorkloadShape
    runs: tuple[ScheduleRun, ...]

    @property
    def stages(self) -> int:
        return self.shape.stages

    @property
    def microbatches(self) -> int:
        return self.shape.microbatches

    @property
    def max_clock_mhz(self) -> int:
        """The highest clock any instruction ran at: what "all-max" means here."""
        return max(run.max_clock_mhz for run in self.runs)

    @property
    def all_max(self) -> tuple[int, ...]:
        """Indices (positions in ``runs``) of the schedules that run every instruction at the max clock."""
        top = self.max_clock_mhz
        return tuple(i for i, run in enumerate(self.runs) if run.runs_everything_at(top))


def parse_workload_name(name: str, where: str | None = None) -> WorkloadShape:
    """The shape in a workload directory's name; ``ProfileError`` unless it is the artifact's naming
    of a pipeline-only run (dp1, tp1: one rank per stage)."""
    found = _NAME.match(name)
    where = where or name
    if found is None:
        raise ProfileError(f"{where}: not a workload directory name "
                           "(expected merak+<model>+...+dp1+pp<S>+tp1+mbs<b>+nmb<M>+...)")
    if int(found["dp"]) != 1 or int(found["tp"]) != 1:
        raise ProfileError(f"{where}: dp{found['dp']} tp{found['tp']}: only dp1 tp1 runs (one rank per stage) are read")
    shape = WorkloadShape(found["model"], int(found["pp"]), int(found["nmb"]), int(found["mbs"]))
    if shape.stages < 1 or shape.microbatches < 1:
        raise ProfileError(f"{where}: pp{shape.stages} nmb{shape.microbatches} is not a pipeline")
    return shape


def read_workload(path: str | Path) -> Workload:
    """Read and check every schedule of one workload directory."""
    path = Path(path)
    if not path.is_dir():
        raise ProfileError(f"{path}: not a directory")
    shape = parse_workload_name(path.name, str(path))
    indices = sorted(int(m[1]) for p in path.iterdir() if (m := _SCHED.match(p.name)))
    if not indices:
        raise ProfileError(f"{path}: no N.sched.json files")
    runs = tuple(_read_schedule(path, n, shape) for n in indices)
    return Workload(path.name, path, shape, runs)


def find_workload_dirs(root: str | Path) -> list[Path]:
    """Workload directories at or below ``root``: ``root`` itself, its children, or, for the
    artifact's root (``sosp24_data``: Perseus's runs beside EnvPipe's), those under ``perseus/``."""
    root = Path(root)
    if not root.is_dir():
        raise ProfileError(f"{root}: not a directory")
    if any(_SCHED.match(p.name) for p in root.iterdir()):
        return [root]
    found = sorted({p.parent for p in root.rglob("*.sched.json") if _NAME.match(p.parent.name)})
    perseus = [p for p in found if "perseus" in p.relative_to(root).parts[:-1]]
    return perseus or found


def extract_archive(archive: str | Path, dest: str | Path) -> Path:
    """Unpack a ``.tar.xz`` (or any tar) of measured runs into ``dest``; returns ``dest``."""
    dest = Path(dest)
    try:
        with tarfile.open(archive, "r:*") as tar:
            if hasattr(tarfile, "data_filter"):  # refuses absolute paths, links out of dest, devices
                tar.extractall(dest, filter="data")
            else:
                tar.extractall(dest)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ProfileError(f"{archive}: cannot unpack ({exc})") from None
    return dest


# ------------------------------------------------------------------------------------------ files


def _load(path: Path) -> Any:
    if not path.is_file():
        raise ProfileError(f"{path}: missing (every schedule N needs N.sched.json and N.prof.json)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read ({exc})") from None


def _per_rank(doc: Any, path: Path, stages: int) -> list[dict[str, Any]]:
    """The file's per-rank objects in rank order, exactly one per stage."""
    if not isinstance(doc, list) or not all(isinstance(r, dict) for r in doc):
        raise ProfileError(f"{path}: expected a list of per-rank objects")
    ranks = sorted(r.get("rank") for r in doc if isinstance(r.get("rank"), int))
    if ranks != list(range(stages)) or len(doc) != stages:
        raise ProfileError(f"{path}: ranks {[r.get('rank') for r in doc]}, expected one per stage 0..{stages - 1}")
    return sorted(doc, key=lambda r: r["rank"])


def _numbers(value: Any, path: Path, what: str, positive: bool = True) -> np.ndarray:
    ok = isinstance(value, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 or not positive)
        and v >= 0 for v in value)
    if not ok or not value:
        kind = "positive" if positive else "non-negative"
        raise ProfileError(f"{path}: {what} must be a non-empty list of {kind} finite numbers")
    return np.asarray(value, dtype=float)


def _breakdown(prof: dict[str, Any], path: Path, rank: int, kind: str, microbatches: int,
               iterations: int) -> np.ndarray:
    """(I, M) per-microbatch times; the first iteration of a run may carry one leading dummy entry."""
    where = f"rank {rank} time_breakdown.{kind}"
    rows = prof.get("time_breakdown", {}).get(kind) if isinstance(prof.get("time_breakdown"), dict) else None
    if not isinstance(rows, list) or len(rows) != iterations:
        raise ProfileError(f"{path}: {where} must hold one list per iteration ({iterations})")
    out = np.empty((iterations, microbatches))
    for i, row in enumerate(rows):
        if i == 0 and isinstance(row, list) and len(row) == microbatches + 1:
            row = row[1:]  # the dummy entry of a run's first iteration
        if not isinstance(row, list) or len(row) != microbatches:
            got = len(row) if isinstance(row, list) else type(row).__name__
            raise ProfileError(f"{path}: {where} iteration {i} has {got} entries, expected {microbatches} (one per microbatch)")
        out[i] = _numbers(row, path, f"{where} iteration {i}")
    return out


def _read_schedule(directory: Path, n: int, shape: WorkloadShape) -> ScheduleRun:
    sched_path, prof_path = directory / f"{n}.sched.json", directory / f"{n}.prof.json"
    scheds = _per_rank(_load(sched_path), sched_path, shape.stages)
    profs = _per_rank(_load(prof_path), prof_path, shape.stages)
    ranks = []
    for stage, (sched, prof) in enumerate(zip(scheds, profs)):
        states = sched.get("power_states")
        if not isinstance(states, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in states):
            raise ProfileError(f"{sched_path}: rank {stage} power_states must be a list of positive integer clocks (MHz)")
        try:
            forward_clock, backward_clock = instruction_clocks(states, shape.stages, shape.microbatches, stage)
        except ValueError as exc:
            raise ProfileError(f"{sched_path}: rank {stage} power_states: {exc}") from None
        times = _numbers(prof.get("iter_time"), prof_path, f"rank {stage} iter_time")
        energies = _numbers(prof.get("iter_energy"), prof_path, f"rank {stage} iter_energy")
        if len(times) != len(energies) or len(times) < 2:
            raise ProfileError(f"{prof_path}: rank {stage} has {len(times)} iter_time and {len(energies)} iter_energy "
                               "entries; they must match and number at least 2 (the first iteration warms up)")
        forward = _breakdown(prof, prof_path, stage, "forward", shape.microbatches, len(times))
        backward = _breakdown(prof, prof_path, stage, "backward", shape.microbatches, len(times))
        ranks.append(RankRun(stage, forward_clock, backward_clock, times, energies, forward, backward))
    if len({len(r.iter_time_s) for r in ranks}) != 1:
        raise ProfileError(f"{prof_path}: ranks measured different numbers of iterations "
                           f"({[len(r.iter_time_s) for r in ranks]})")
    return ScheduleRun(n, tuple(ranks), str(prof_path))
