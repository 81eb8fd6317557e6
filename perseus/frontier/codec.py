"""The frontier file: perseus writes version 2 and reads versions 1 and 2.

Version 2 stores the schedule's instruction order once, and every point's clocks as indices
into one sorted table of the clocks the file uses, packed as a little-endian uint8 (uint16 when
more than 256 clocks appear) matrix points × instructions, zlib-compressed and base64-encoded.
At 16,384 instructions and hundreds of points that is megabytes where version 1, which spells out
``{kind, microbatch, chunk, freq_mhz}`` for every instruction of every point, needs hundreds.
The layout is documented in docs/frontier-format.md. An unlocked instruction's clock
(``UNLOCKED_MHZ``: default clocks) is spelled ``"unlocked"`` in the clock table.

The same JSON document is what the runtime sends between ranks (``perseus.runtime.plane.collective``).
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from pathlib import Path
from typing import Any, cast

import numpy as np

from perseus.atomic import write_atomic
from perseus.errors import FrontierError
from perseus.frontier.model import Frontier, FrontierPoint, thin_points
from perseus.frontier.non_compute import NonCompute
from perseus.frontier.v1 import decode_v1_points, document_head, document_provenance
from perseus.profile.unlocked import UNLOCKED_MHZ, UNLOCKED_NAME, is_unlocked
from perseus.schedules import Instruction, InstructionKind, Schedule, build_schedule

FORMAT = "perseus-frontier"
VERSION = 2
READABLE_VERSIONS = (1, 2)
CLOCK_ENCODING = "zlib+base64"
_INDEX_DTYPES: dict[str, np.dtype[np.unsignedinteger[Any]]] = {"uint8": np.dtype("<u1"), "uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


# ---------------------------------------------------------------- writing


def encode_frontier_json(frontier: Frontier, max_points: int | None = None) -> dict[str, Any]:
    """The version 2 JSON document of ``frontier`` (at most ``max_points`` points of each kind)."""
    sched = frontier.schedule
    points = thin_points(frontier.points, max_points)
    paced = thin_points(frontier.paced_points, max_points)
    table, index = clock_table(_whole_mhz(np.stack([np.asarray(p.freqs_mhz) for p in points + paced])))
    return {
        **document_head(frontier, VERSION),
        "instructions": [[_encode_instruction(i) for i in stage] for stage in sched.stages],
        **document_provenance(frontier),
        "metadata": dict(frontier.metadata),
        "clocks_mhz": [UNLOCKED_NAME if is_unlocked(f) else f for f in table.tolist()],
        "points": _encode_block(points, index[: len(points)], len(table)),
        "paced_points": _encode_block(paced, index[len(points) :], len(table)),
    }


def _encode_instruction(inst: Instruction) -> list[Any]:
    """``[kind, microbatch, chunk]``; a fused unit adds its backward's ``microbatch, chunk``."""
    pair = inst.backward_pair()
    return [inst.kind, inst.microbatch, inst.chunk] if pair is None else [inst.kind, inst.microbatch, inst.chunk, *pair]


def _whole_mhz(freqs: np.ndarray) -> np.ndarray:
    """Clocks as int64; float clocks are accepted when they are whole MHz (as version 1 read them)."""
    if np.issubdtype(freqs.dtype, np.integer):
        return freqs.astype(np.int64, copy=False)
    whole = np.rint(freqs)
    if not np.array_equal(whole, freqs):
        raise FrontierError("frontier clocks must be whole MHz")
    return whole.astype(np.int64)


def clock_table(freqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct clocks, index of every entry in them) of an integer matrix."""
    if freqs.size and freqs.min() >= 0 and freqs.max() < 1 << 20:  # MHz: a linear-time lookup
        present = np.bincount(freqs.ravel(), minlength=1) > 0
        table = np.flatnonzero(present)
        lookup = np.cumsum(present) - 1
        return table.astype(np.int64), lookup[freqs]
    table, inverse = np.unique(freqs, return_inverse=True)
    return table.astype(np.int64), inverse.reshape(freqs.shape)


def _index_dtype(num_clocks: int) -> str:
    return "uint8" if num_clocks <= 1 << 8 else "uint16" if num_clocks <= 1 << 16 else "uint32"


def _encode_block(points: list[FrontierPoint], index: np.ndarray, num_clocks: int) -> dict[str, Any]:
    dtype = _index_dtype(num_clocks)
    packed = zlib.compress(np.ascontiguousarray(index, dtype=_INDEX_DTYPES[dtype]).tobytes(), 6)
    return {
        "time_s": [p.time_s for p in points],
        "energy_j": [p.energy_j for p in points],
        "clock_index": {"dtype": dtype, "encoding": CLOCK_ENCODING, "data": base64.b64encode(packed).decode("ascii")},
    }


def save_frontier(frontier: Frontier, path: str | Path, max_points: int | None = None) -> None:
    """Write ``frontier`` as a version 2 file, atomically."""

    write_atomic(path, json.dumps(encode_frontier_json(frontier, max_points), separators=(",", ":")))


# ---------------------------------------------------------------- reading


def load_frontier(path: str | Path) -> Frontier:
    """Read a version 1 or 2 frontier file; every problem is one ``FrontierError`` line."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        data = json.loads(raw)
    except OSError as exc:
        raise FrontierError(f"{path}: cannot read frontier ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise FrontierError(f"{path}: not a perseus frontier file (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        # Every frontier file is one JSON object: one that does not end with '}' was cut short.
        hint = "; the file looks truncated, write it again (perseus plan)" if not raw.rstrip().endswith(b"}") else ""
        raise FrontierError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}{hint}") from None
    return frontier_from_json_dict(data, str(path))


def frontier_from_json_dict(data: Any, source: str = "<json>") -> Frontier:
    """The frontier in a parsed version 1 or 2 document (``source`` names it in errors)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise FrontierError(f"{source}: not a perseus frontier file (missing \"format\": \"{FORMAT}\")")
    version = data.get("version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        found = "has no \"version\"" if version is None else f"has version {version!r}"
        raise FrontierError(
            f"{source}: frontier file {found}; this perseus reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))} (upgrade perseus, or plan again with this one)"
        )
    try:
        group = data.get("group_size")  # absent: the default group size (older files never have it)
        overlap = data.get("overlap_p2p", False)  # absent: megatron-core's blocking exchanges
        if not isinstance(overlap, bool):
            raise TypeError(f"overlap_p2p must be true or false, not {overlap!r}")
        schedule = build_schedule(str(data["schedule"]), int(data["stages"]), int(data["microbatches"]),
                                  int(data["chunks"]), None if group is None else int(group), overlap)
        if version == 1:

            points = decode_v1_points(data["points"], "points", schedule, source)
            paced = decode_v1_points(data.get("paced_points") or [], "paced_points", schedule, source)
        else:
            _check_instructions(data["instructions"], schedule, source)
            table = _decode_table(data["clocks_mhz"], source)
            points = _decode_block(data["points"], "points", table, schedule.num_instructions, source)
            paced = _decode_block(data["paced_points"], "paced_points", table, schedule.num_instructions, source)
        baseline = data["baseline"]
        return Frontier(
            schedule=schedule,
            p_blocking_w=float(data["p_blocking_w"]),
            baseline_time_s=float(baseline["time_s"]),
            baseline_energy_j=float(baseline["energy_j"]),
            points=points,
            gpu_name=str(data.get("gpu_name", "unknown")),
            solve_time_s=float(data.get("solve_time_s", 0.0)),
            metadata=dict(data.get("metadata") or {}),
            paced_points=paced,
            non_compute=_non_compute(data.get("non_compute"), source),
        )
    except FrontierError:
        raise
    except KeyError as exc:
        raise FrontierError(f"{source}: malformed frontier file (missing field {exc.args[0]!r})") from None
    except Exception as exc:  # noqa: BLE001 - malformed structure: report where, not a deep traceback
        raise FrontierError(f"{source}: malformed frontier file ({type(exc).__name__}: {exc})") from None


def _non_compute(data: Any, source: str) -> NonCompute:
    """The file's ``non_compute`` object; absent (every file written before it existed): none."""
    try:
        return NonCompute.from_json(data)
    except FrontierError as exc:
        raise FrontierError(f"{source}: {exc}") from None


def _check_instructions(stages: Any, schedule: Schedule, source: str) -> None:
    """The stored instruction order must be the schedule's: a plan is never applied to another order."""
    if not isinstance(stages, list) or len(stages) != schedule.num_stages:
        raise FrontierError(f"{source}: \"instructions\" must list {schedule.num_stages} stages")
    for s, (stored, expected) in enumerate(zip(stages, schedule.stages)):
        # the cast is checked by the comparison: an unknown kind equals none of the schedule's instructions
        if [Instruction(cast(InstructionKind, str(k)), int(m), int(c), *(int(x) for x in pair))
                for k, m, c, *pair in stored] != list(expected):
            raise FrontierError(f"{source}: instructions of stage {s} do not follow the {schedule.name} order")


def _decode_table(values: Any, source: str) -> np.ndarray:
    """The clock table; ``"unlocked"`` (default clocks, the card's own DVFS) is ``UNLOCKED_MHZ``."""
    if isinstance(values, list):
        values = [UNLOCKED_MHZ if v == UNLOCKED_NAME else v for v in values]
    table = np.asarray(values, dtype=np.int64)
    if table.ndim != 1 or table.size == 0 or (table.size > 1 and not (np.diff(table) > 0).all()):
        raise FrontierError(f"{source}: \"clocks_mhz\" must be a non-empty, strictly increasing list of clocks")
    return table


def _decode_block(block: Any, name: str, table: np.ndarray, num_instructions: int, source: str) -> list[FrontierPoint]:
    times = [float(t) for t in block["time_s"]]
    energies = [float(e) for e in block["energy_j"]]
    if len(times) != len(energies):
        raise FrontierError(f"{source}: {name} has {len(times)} times but {len(energies)} energies")
    packed = block["clock_index"]
    dtype = _INDEX_DTYPES.get(packed["dtype"])
    if dtype is None or packed["encoding"] != CLOCK_ENCODING:
        raise FrontierError(
            f"{source}: {name}.clock_index has dtype {packed['dtype']!r} and encoding {packed['encoding']!r}; "
            f"expected one of {', '.join(_INDEX_DTYPES)} and {CLOCK_ENCODING!r}"
        )
    try:
        raw = zlib.decompress(base64.b64decode(packed["data"], validate=True))
    except (binascii.Error, zlib.error, ValueError) as exc:
        raise FrontierError(f"{source}: {name}.clock_index data is corrupt ({exc}); write the file again") from None
    expected = len(times) * num_instructions
    if len(raw) != expected * dtype.itemsize:
        raise FrontierError(
            f"{source}: {name}.clock_index holds {len(raw) // dtype.itemsize} clocks, expected "
            f"{len(times)} points x {num_instructions} instructions = {expected}"
        )
    index = np.frombuffer(raw, dtype=dtype).reshape(len(times), num_instructions)
    if index.size and int(index.max()) >= len(table):
        raise FrontierError(f"{source}: {name}.clock_index refers past the {len(table)} entries of \"clocks_mhz\"")
    freqs = table[index]
    return [FrontierPoint(t, e, freqs[i]) for i, (t, e) in enumerate(zip(times, energies))]
