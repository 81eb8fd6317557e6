"""The runtime's control plane: its few operations, and the flat design (one gloo group).

Every call here is made by all ranks at the same step boundary; none is ever made from an
instruction hook. Without torch.distributed (single process) every call degenerates to the local
value, so the runtime runs unchanged in a plain script.

``Collective`` names the operations the runtime needs: agreement (``all_true``), broadcasts,
the sweep's votes (``vote_any``), each stage's plan (``deliver_stage``), the job check's rows per
pipeline (``pipeline_rows``/``start_pipeline_rows``), the profile's gather (``gather_measurements``)
and the P_blocking pair (``blocking_channel``). Here they run on one gloo group over every rank,
which connects every pair of ranks: the design before issue 29, kept for small jobs and as the
reference. ``perseus.runtime.plane.hierarchy`` runs the same operations along the job's grid (the
default; ``control_plane.open_control_plane`` chooses).

A collective never waits forever: the group has a stated timeout (``collective_timeout_s``), and
a failed or timed-out collective — another rank died or hung — is one ``CollectiveError`` line,
never gloo's multi-line traceback. The engine then leaves the job at default clocks and makes no
further collective (``PerseusRuntime._detach``).
"""

from __future__ import annotations

from concurrent.futures import Future
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from perseus.errors import PerseusError
from perseus.frontier import Frontier, encode_frontier_json, frontier_from_json_dict
from perseus.runtime.config import ControlPlaneDesign

try:  # torch is optional for planning-only use of perseus
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None  # type: ignore[assignment]  # no torch: single-process use, where no call reaches them
    dist = None  # type: ignore[assignment]  # no torch: single-process use, where no call reaches them


DEFAULT_TIMEOUT_S = 300.0
_TAG_SIZE, _TAG_DATA = 7301, 7302  # _scatter_bytes' messages, apart from the trainer's own tags


class CollectiveError(PerseusError):
    """A collective with the other ranks failed or timed out (a rank died, hung or was killed)."""


class PipelineRow(NamedTuple):
    """One data-parallel pipeline at a job check: its slowest rank's natural iteration time, its
    ranks' energy per iteration summed, whether any of its ranks left the plan."""

    dp: int
    natural_s: float
    energy_j: float
    diverged: bool


class PairChannel:
    """Two ranks' point-to-point line for the P_blocking measurement (``gpu.meter.energy``):
    ``first`` is the rank blocked first."""

    def __init__(self, send: Callable[[Any], object], recv: Callable[[Any], object], first: bool, peer: str) -> None:
        self.send, self.recv, self.first, self.peer = send, recv, first, peer


def done(value: Any) -> "Future[Any]":
    future: Future[Any] = Future()
    future.set_result(value)
    return future


@contextmanager
def collective_errors(what: str, timeout_s: float | None) -> Iterator[None]:
    """gloo's error (a RuntimeError, often many lines long) → one ``CollectiveError`` line."""
    try:
        yield
    except RuntimeError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        limit = f" (timeout {timeout_s:g} s)" if timeout_s else ""
        raise CollectiveError(f"{what} with the other ranks failed{limit}: {first}") from None


class Collective:
    """The flat control plane: one gloo group over the whole job (or the caller's group): flag
    broadcast, agreement, gather to rank 0, all-gather of floats, per-rank bytes from rank 0.
    Without torch.distributed, the local one (every call returns the local value).

    ``timeout_s`` bounds every collective of the group created here; a gloo ``process_group``
    given by the caller is reused as it is, with the timeout it was created with. Every rank
    connects to every other: fine for a few dozen ranks, not for thousands
    (``perseus.runtime.plane.hierarchy`` is the default above one process; docs/runtime.md).
    """

    design: str = ControlPlaneDesign.FLAT.value
    overlapped = False  # the job check's answer is ready at the check that asked for it

    def __init__(self, process_group: Any = None, timeout_s: float | None = None) -> None:
        self.group: Any = None
        self.rank = 0
        self.size = 1
        self.timeout_s = timeout_s
        self.sent_bytes = 0  # plan bytes this rank sent (rank 0: every other rank's slice)
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return
        timeout = timedelta(seconds=timeout_s) if timeout_s else None
        self._owned = process_group is None or dist.get_backend(process_group) != "gloo"
        if process_group is not None and dist.get_backend(process_group) == "gloo":
            self.group = process_group
            self.timeout_s = None  # unknown: the caller's group keeps its own
        elif process_group is not None:
            ranks = dist.get_process_group_ranks(process_group)
            self.group = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout)
        else:
            self.group = dist.new_group(backend="gloo", timeout=timeout)
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        self._root = dist.get_global_rank(self.group, 0)

    @property
    def distributed(self) -> bool:
        return self.group is not None

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def broadcast_int(self, value: int) -> int:
        """Rank 0's value on every rank (the per-step 'is the plan ready?' flag)."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        with collective_errors("a broadcast", self.timeout_s):
            dist.broadcast(t, src=self._root, group=self.group)
        return int(t.item())

    def all_true(self, flag: bool) -> bool:
        """True only if every rank passes True."""
        if not self.distributed:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int64)
        with collective_errors("an agreement (all-reduce)", self.timeout_s):
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return bool(t.item())

    def all_gather_floats(self, values: list[float]) -> list[list[float]]:
        """Every rank's fixed-length float vector, in rank order."""
        if not self.distributed:
            return [list(values)]
        local = torch.tensor(values, dtype=torch.float64)
        out = [torch.empty_like(local) for _ in range(self.size)]
        with collective_errors("an all-gather", self.timeout_s):
            dist.all_gather(out, local, group=self.group)
        return [t.tolist() for t in out]

    def gather_to_root(self, obj: Any) -> list[Any] | None:
        """All ranks' objects on rank 0 (None elsewhere)."""
        if not self.distributed:
            return [obj]
        out: list[Any] | None = [None] * self.size if self.is_root else None
        with collective_errors("a gather to rank 0", self.timeout_s):
            dist.gather_object(obj, out, dst=self._root, group=self.group)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's object on every rank."""
        if not self.distributed:
            return obj
        box = [obj if self.is_root else None]
        with collective_errors("a broadcast", self.timeout_s):
            dist.broadcast_object_list(box, src=self._root, group=self.group)
        return box[0]

    def _scatter_bytes(self, payloads: list[bytes] | None) -> bytes:
        """Rank i's own bytes ``payloads[i]`` from rank 0, point to point: each rank receives only
        its own (a length, then the bytes); rank 0 keeps ``payloads[0]``. Only rank 0 passes a list."""
        if not self.distributed:
            assert payloads is not None
            return payloads[0]
        if self.is_root:
            assert payloads is not None and len(payloads) == self.size
            works, keep = [], []
            for r in range(1, self.size):
                dst = dist.get_global_rank(self.group, r)
                size = torch.tensor([len(payloads[r])], dtype=torch.int64)
                data = torch.frombuffer(bytearray(payloads[r]), dtype=torch.uint8)
                keep += [size, data]
                self.sent_bytes += len(payloads[r]) + 8
                works.append(dist.isend(size, dst=dst, group=self.group, tag=_TAG_SIZE))
                works.append(dist.isend(data, dst=dst, group=self.group, tag=_TAG_DATA))
            with collective_errors("sending the stage plans", self.timeout_s):
                for work in works:
                    if work is not None:  # isend's None: a rank outside the group; the root is in it
                        work.wait()
            return payloads[0]
        size = torch.empty(1, dtype=torch.int64)
        with collective_errors("receiving this stage's plan", self.timeout_s):
            dist.recv(size, src=self._root, group=self.group, tag=_TAG_SIZE)
            data = torch.empty(int(size.item()), dtype=torch.uint8)
            dist.recv(data, src=self._root, group=self.group, tag=_TAG_DATA)
        return data.numpy().tobytes()

    # ---------------------------------------------------------------- the control plane's operations
    # (``HierarchicalCollective`` overrides each along the job's grid)

    def vote_any(self, flags: Sequence[float]) -> list[bool]:
        """Element i is True where any rank's ``flags[i]`` is non-zero."""
        rows = self.all_gather_floats([float(f) for f in flags])
        return [any(row[i] for row in rows) for i in range(len(flags))]

    def deliver_stage(self, stage_bytes: Callable[[int], bytes] | None, stage: int) -> bytes:
        """This rank's stage's bytes from rank 0 (which alone passes ``stage_bytes``): ranks tell
        rank 0 their stage, rank 0 sends every rank its stage's bytes point to point (each
        stage's bytes made once)."""
        stages = self.gather_to_root(stage)
        payloads: list[bytes] | None = None
        if self.is_root:
            assert stages is not None and stage_bytes is not None
            encoded: dict[int, bytes] = {}
            for s in stages:
                if s not in encoded:
                    encoded[s] = stage_bytes(s)
            payloads = [encoded[s] for s in stages]
        return self._scatter_bytes(payloads)

    def pipeline_rows(self, dp: int, natural_s: float, energy_j: float, diverged: bool) -> list[PipelineRow]:
        """Every data-parallel pipeline's row (``PipelineRow``), by ``dp``, from every rank's own."""
        rows = self.all_gather_floats([float(dp), natural_s, energy_j, 1.0 if diverged else 0.0])
        out: dict[int, PipelineRow] = {}
        for d, t, e, x in rows:
            prev = out.get(int(d))
            out[int(d)] = PipelineRow(int(d), t, e, bool(x)) if prev is None else \
                PipelineRow(int(d), max(prev.natural_s, t), prev.energy_j + e, prev.diverged or bool(x))
        return [out[d] for d in sorted(out)]

    def start_pipeline_rows(self, dp: int, natural_s: float, energy_j: float,
                            diverged: bool) -> "Future[list[PipelineRow]]":
        """``pipeline_rows``, here done before it returns (``overlapped`` is False)."""
        return done(self.pipeline_rows(dp, natural_s, energy_j, diverged))

    def gather_measurements(self, mine: Any, grid: Sequence[int]) -> list[Any] | None:
        """The profiling sweep's measurements (``aggregate.RankMeasurements``) on rank 0, for
        ``aggregate_profile``: here every rank's."""
        return self.gather_to_root(mine)

    def blocking_channel(self) -> PairChannel | None:
        """This rank's partner for the P_blocking measurement (ranks in pairs: 0-1, 2-3, ...);
        None alone."""
        if not self.distributed or self.rank ^ 1 >= self.size:
            return None
        group, peer = self.group, dist.get_global_rank(self.group, self.rank ^ 1)
        return PairChannel(lambda t: dist.send(t, dst=peer, group=group), lambda t: dist.recv(t, src=peer, group=group),
                           self.rank < self.rank ^ 1, f"rank {peer}")

    def close(self) -> None:
        """Destroy the group this plane created (never a group the caller passed)."""
        if self.group is not None and getattr(self, "_owned", False) and dist is not None and dist.is_initialized():
            try:
                dist.destroy_process_group(self.group)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
        self.group = None


def encode_frontier(frontier: Frontier) -> dict[str, Any]:
    """Compact, picklable form of a frontier: its version 2 file document (clocks packed)."""
    return encode_frontier_json(frontier)


def decode_frontier(data: dict[str, Any]) -> Frontier:
    """The frontier ``encode_frontier`` sent; a version 1 document is read as well."""
    return frontier_from_json_dict(data, "frontier received from rank 0")
