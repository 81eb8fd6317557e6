"""The hierarchical control plane: the runtime's collectives along the job's grid, never over
the whole job at once.

A job of ``dp × pp × tp`` ranks has three kinds of small groups (``layout.py``): a replica's
tensor-parallel ranks, a pipeline's stages (one per tensor-parallel index), a stage's data-parallel
replicas. Rank (dp 0, stage 0, tp 0) is the root. Every operation walks those groups:

- down (broadcasts, each stage's plan): root → the stage leaders along the pipeline of replica 0,
  each → its replicas, each → its tensor-parallel ranks. The root sends each stage's plan once;
- up (gathers, the profile): the reverse, combining on the way where the data allows (the profile:
  tensor-parallel max/sum at a replica's first rank, the replicas' mean by a sum reduction);
- across (agreement flags, votes): all-reduces along the three axes in turn;
- the periodic job check: reductions within each pipeline, then one all-gather of a row per
  pipeline across the replicas, on the control thread (``control_thread.py``), its answer used at
  the next check: the training thread only hands it over and picks it up.

A rank connects to ``(tp − 1) + (pp − 1) + (dp − 1)`` peers, never to the job; a failed or
timed-out operation is one ``CollectiveError`` line, as on the flat plane. docs/runtime.md has
the measured growth (benchmarks/bench_control_plane.py).
"""

from __future__ import annotations

import itertools
import zlib
from concurrent.futures import Future
from typing import Any, Callable, Sequence, TypeVar

import torch
import torch.distributed as dist

from perseus.errors import ProfileError
from perseus.profile.aggregate import (RankMeasurements, combine_kinds, combine_tensor_parallel, replica_vector,
                                       replicas_mean)
from perseus.runtime.config import ControlPlaneDesign
from perseus.runtime.plane.axis_group import AxisGroup
from perseus.runtime.plane.collective import DEFAULT_TIMEOUT_S, Collective, PairChannel, PipelineRow, collective_errors
from perseus.runtime.plane.control_thread import ControlThread
from perseus.runtime.job import PipelineJob
from perseus.runtime.plane.layout import AXES, AxisPeers, Coordinates, GridShape, exchange_peers

T = TypeVar("T")
_generations = itertools.count()  # every rank builds its planes in the same order: one store prefix each


class HierarchicalCollective(Collective):
    """``Collective``'s operations along the grid of ``job`` (every rank of the job builds one)."""

    design: str = ControlPlaneDesign.HIERARCHICAL.value
    overlapped = True  # the job check's answer arrives one check later

    def __init__(self, job: PipelineJob, timeout_s: float | None = None) -> None:  # no world group
        self.group = None
        self.timeout_s = timeout_s or DEFAULT_TIMEOUT_S
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        shape = GridShape(job.dp_size, job.num_stages, job.tp_size)
        me = Coordinates(job.dp_rank, job.stage, job.tp_rank)
        store = dist.PrefixStore(f"perseus/plane/{next(_generations)}/", dist.distributed_c10d._get_default_store())
        with collective_errors("finding this rank's control-plane peers", self.timeout_s):
            self.peers: AxisPeers = exchange_peers(store, shape, me, self.rank, self.timeout_s)
        lines = {"tp": f"{me.dp}/{me.stage}", "pp": f"{me.dp}/{me.tp}", "dp": f"{me.stage}/{me.tp}"}
        self._axes: dict[str, AxisGroup] = {}
        with collective_errors("connecting the control plane's groups", self.timeout_s):
            for axis in AXES:
                members = self.peers.ranks[axis]
                if len(members) > 1:
                    self._axes[axis] = AxisGroup(dist.PrefixStore(f"{axis}/{lines[axis]}/", store), members,
                                                 self.peers.index(axis), self.timeout_s)
        self._thread: ControlThread | None = ControlThread()

    # ---------------------------------------------------------------- where this rank is

    @property
    def distributed(self) -> bool:
        return self._thread is not None

    @property
    def is_root(self) -> bool:
        me = self.peers.me
        return me.dp == 0 and me.stage == 0 and me.tp == 0

    @property
    def sent_bytes(self) -> int:  # type: ignore[override]  # Collective's counter; here the axis groups' sum
        return sum(g.sent_bytes for g in self._axes.values())

    def peer_count(self) -> int:
        return self.peers.peer_count()

    def _run(self, what: str, fn: Callable[[], T]) -> T:
        """``fn`` on the control thread, in order with every other operation; gloo's error → one line."""
        assert self._thread is not None, "the control plane is closed"

        def guarded() -> T:
            with collective_errors(what, self.timeout_s):
                return fn()

        return self._thread.call(guarded)

    # ---------------------------------------------------------------- the walks

    def _down(self, value: Any, step: Callable[[AxisGroup, Any], Any]) -> Any:
        """Root → stage leaders → replicas → tensor-parallel ranks; ``step`` broadcasts from index 0."""
        me = self.peers.me
        for axis, mine in (("pp", me.dp == 0 and me.tp == 0), ("dp", me.tp == 0), ("tp", True)):
            group = self._axes.get(axis)
            if mine and group is not None:
                value = step(group, value if group.index == 0 else None)
        return value

    def _across(self, tensor: torch.Tensor, op: Any) -> torch.Tensor:
        for axis in AXES:
            group = self._axes.get(axis)
            if group is not None:
                group.all_reduce(tensor, op)
        return tensor

    # ---------------------------------------------------------------- Collective's operations

    def broadcast_int(self, value: int) -> int:
        def run() -> int:
            t = torch.tensor([value if self.is_root else 0], dtype=torch.int64)
            return int(self._down(t, lambda g, v: g.broadcast(t)).item())
        return self._run("a broadcast", run)

    def broadcast_object(self, obj: Any) -> Any:
        return self._run("a broadcast", lambda: self._down(obj if self.is_root else None,
                                                           lambda g, v: g.broadcast_object(v)))

    def all_true(self, flag: bool) -> bool:
        t = torch.tensor([1 if flag else 0], dtype=torch.int64)
        return bool(self._run("an agreement (all-reduce)", lambda: self._across(t, dist.ReduceOp.MIN)).item())

    def vote_any(self, flags: Sequence[float]) -> list[bool]:
        t = torch.tensor([float(f) for f in flags], dtype=torch.float64)
        return [bool(v) for v in self._run("a vote (all-reduce)", lambda: self._across(t, dist.ReduceOp.MAX)).tolist()]

    def gather_to_root(self, obj: Any) -> list[Any] | None:
        """Every rank's object on the root, stage by stage, replica by replica (not in rank order)."""
        def run() -> list[Any] | None:
            items: list[Any] | None = [obj]
            me = self.peers.me
            for axis, mine in (("tp", True), ("dp", me.tp == 0), ("pp", me.dp == 0 and me.tp == 0)):
                group = self._axes.get(axis)
                if not mine or items is None or group is None:
                    continue
                parts = group.gather_objects(items)
                items = None if parts is None else [x for part in parts for x in part]
            return items if self.is_root else None
        return self._run("a gather to rank 0", run)

    def all_gather_floats(self, values: list[float]) -> list[list[float]]:
        """Every rank's vector in rank order, on every rank: world-sized by nature; the runtime
        asks the grid's own questions instead (``vote_any``, ``pipeline_rows``)."""
        rows = self.gather_to_root((self.rank, list(values)))
        ordered = [v for _, v in sorted(rows)] if rows is not None else None
        return self.broadcast_object(ordered)

    def deliver_stage(self, stage_bytes: Callable[[int], bytes] | None, stage: int) -> bytes:
        """The root sends each stage's bytes once, to that stage's leader along the pipeline of
        replica 0; the leader broadcasts them to its stage's replicas, each to its tensor-parallel ranks."""
        def run() -> bytes:
            me = self.peers.me
            payload: bytes | None = None
            pipeline = self._axes.get("pp")
            if self.is_root:
                assert stage_bytes is not None
                payload = stage_bytes(0)
                if pipeline is not None:
                    for s in range(1, pipeline.size):
                        pipeline.send_bytes(stage_bytes(s), s)
            elif me.dp == 0 and me.tp == 0 and pipeline is not None:
                payload = pipeline.recv_bytes(0)
            for axis, mine in (("dp", me.tp == 0), ("tp", True)):
                group = self._axes.get(axis)
                if mine and group is not None:
                    payload = group.broadcast_bytes(payload if group.index == 0 else None)
            assert payload is not None
            return payload
        return self._run("sending the stage plans", run)

    def _rows(self, dp: int, natural_s: float, energy_j: float, diverged: bool) -> list[PipelineRow]:
        mine = torch.tensor([natural_s, energy_j, 1.0 if diverged else 0.0], dtype=torch.float64)
        for axis in ("tp", "pp"):  # within the pipeline: its slowest rank, its energy, any divergence
            group = self._axes.get(axis)
            if group is not None:
                rows = torch.stack(group.all_gather(mine))
                mine = torch.stack([rows[:, 0].max(), rows[:, 1].sum(), rows[:, 2].max()])
        row = torch.cat([torch.tensor([float(dp)], dtype=torch.float64), mine])
        group = self._axes.get("dp")
        pipelines = group.all_gather(row) if group is not None else [row]
        return [PipelineRow(int(r[0]), float(r[1]), float(r[2]), bool(r[3])) for r in pipelines]

    def pipeline_rows(self, dp: int, natural_s: float, energy_j: float, diverged: bool) -> list[PipelineRow]:
        return self._run("the job check", lambda: self._rows(dp, natural_s, energy_j, diverged))

    def start_pipeline_rows(self, dp: int, natural_s: float, energy_j: float,
                            diverged: bool) -> "Future[list[PipelineRow]]":
        """The job check on the control thread; the training thread goes on (``overlapped``)."""
        assert self._thread is not None, "the control plane is closed"

        def run() -> list[PipelineRow]:
            with collective_errors("the job check", self.timeout_s):
                return self._rows(dp, natural_s, energy_j, diverged)

        return self._thread.submit(run)

    def gather_measurements(self, mine: Any, grid: Sequence[int]) -> list[Any] | None:
        """One entry per stage on the root: a replica's tensor-parallel ranks combined at its first
        rank, the replicas' mean by a sum reduction at replica 0, the stages gathered along its pipeline."""
        return self._run("gathering the profile", lambda: self._measurements(mine, list(grid)))

    def _measurements(self, mine: RankMeasurements, grid: list[int]) -> list[Any] | None:
        me = self.peers.me
        tp = self._axes.get("tp")
        members = tp.gather_objects(mine) if tp is not None else [mine]
        if members is None:
            return None  # the replica's first rank carries it on
        replica = combine_tensor_parallel(members)
        keys = sorted(replica.measurements)
        dp = self._axes.get("dp")
        if dp is not None:
            # Replicas of a stage run the same instructions on the same kind of GPU; if not, say so.
            sign = float(zlib.crc32(repr((keys, replica.gpu_name)).encode()))
            low, high = (dp.all_reduce(torch.tensor([s], dtype=torch.float64), op)
                         for s, op in ((sign, dist.ReduceOp.MIN), (sign, dist.ReduceOp.MAX)))
            if low.item() != high.item():
                raise ProfileError(f"online profile: the data-parallel replicas of stage {me.stage} measured different "
                                   "instructions or GPU kinds; every replica must run the same stage on one GPU kind")
            vector = replica_vector(replica.measurements, keys, grid)
            pb = replica.p_blocking_w
            total = torch.tensor(vector + [pb or 0.0, 1.0 if pb is not None else 0.0], dtype=torch.float64)
            dp.all_reduce(total, dist.ReduceOp.SUM)
            kinds = dp.gather_objects(replica.kinds)  # warm-up's per kind: their mean, as aggregate_profile's
            if dp.index != 0:
                return None
            values = total.tolist()
            replica = RankMeasurements(me.stage, 0, 0, replicas_mean(values[:-2], dp.size, keys, grid),
                                       values[-2] / values[-1] if values[-1] else None, replica.gpu_name,
                                       sustained_mhz=replica.sustained_mhz, reasons=replica.reasons,  # replica 0's
                                       kinds=combine_kinds(kinds or [replica.kinds], "mean"))
        pipeline = self._axes.get("pp")
        stages = pipeline.gather_objects(replica) if pipeline is not None else [replica]
        return stages if self.is_root else None

    def blocking_channel(self) -> PairChannel | None:
        """Pairs along the first axis with two or more ranks (every rank picks the same one)."""
        for axis in ("tp", "dp", "pp"):
            group = self._axes.get(axis)
            if group is None:
                continue
            peer = group.index ^ 1
            if peer >= group.size:
                return None

            def send(t: Any, group: AxisGroup = group, peer: int = peer) -> None:
                self._run("the P_blocking measurement", lambda: group.send_tensor(t, peer))

            def recv(t: Any, group: AxisGroup = group, peer: int = peer) -> None:
                self._run("the P_blocking measurement", lambda: group.recv_tensor(t, peer))

            return PairChannel(send, recv, group.index < peer, f"rank {group.members[peer]}")
        return None

    def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.close()
        for group in self._axes.values():
            group.close()
        self._axes = {}
