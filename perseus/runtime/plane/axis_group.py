"""One small gloo group along one axis of the job's grid, with the few operations the
hierarchical control plane needs on it (tensors of a few floats, pickled objects, bytes).

It is a standalone ``ProcessGroupGloo`` on a store prefix of its own, not a group registered with
torch.distributed: only its members build it (no world-wide ``new_group`` call), its name can
never clash with an earlier run's, and it works beside an NCCL or gloo training backend alike.
gloo connects every pair of a group, so a rank's connections are its axes' sizes, not the job's.
"""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any, Protocol, Sequence, cast

import torch
import torch.distributed as dist

_TAG_SIZE, _TAG_DATA, _TAG_PAIR = 7311, 7312, 7321


class _Work(Protocol):
    def wait(self) -> object: ...


class _GlooOps(Protocol):
    """The operations used here of a ``ProcessGroupGloo``. It has them at run time (as every c10d
    backend does), but torch's stubs declare them on ``ProcessGroup`` only, not on ``Backend``."""

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> _Work: ...

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions) -> _Work: ...

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor]) -> _Work: ...

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> _Work: ...

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> _Work: ...


class AxisGroup:
    """Members are global ranks ordered by the axis coordinate; ``index`` is this rank's."""

    def __init__(self, store: dist.Store, members: Sequence[int], index: int, timeout_s: float) -> None:
        self.members = tuple(members)
        self.index = index
        self.size = len(self.members)
        self.sent_bytes = 0  # what this rank sent as a root or sender: the benchmark's rank-0 bytes
        self._backend = dist.ProcessGroupGloo(store, index, self.size, timedelta(seconds=timeout_s))
        self._pg = cast(_GlooOps, self._backend)

    # ---------------------------------------------------------------- tensors

    def broadcast(self, tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        self._pg.broadcast([tensor], opts).wait()
        if self.index == root:
            self.sent_bytes += tensor.numel() * tensor.element_size() * (self.size - 1)
        return tensor

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType) -> torch.Tensor:
        """``op``: ``dist.ReduceOp.SUM``, ``MIN``, ..."""
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(op)  # what assigning ``op`` converts it to
        self._pg.allreduce([tensor], opts).wait()
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        out = [[torch.empty_like(tensor) for _ in range(self.size)]]
        self._pg.allgather(out, [tensor]).wait()
        return out[0]

    def send_tensor(self, tensor: torch.Tensor, dst: int) -> None:
        self._pg.send([tensor], dst, _TAG_PAIR).wait()

    def recv_tensor(self, tensor: torch.Tensor, src: int) -> None:
        self._pg.recv([tensor], src, _TAG_PAIR).wait()

    # ---------------------------------------------------------------- bytes and objects

    def send_bytes(self, payload: bytes, dst: int) -> None:
        size = torch.tensor([len(payload)], dtype=torch.int64)
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)
        self._pg.send([size], dst, _TAG_SIZE).wait()
        if payload:
            self._pg.send([data], dst, _TAG_DATA).wait()
        self.sent_bytes += len(payload) + 8

    def recv_bytes(self, src: int) -> bytes:
        size = torch.empty(1, dtype=torch.int64)
        self._pg.recv([size], src, _TAG_SIZE).wait()
        n = int(size.item())
        if not n:
            return b""
        data = torch.empty(n, dtype=torch.uint8)
        self._pg.recv([data], src, _TAG_DATA).wait()
        return data.numpy().tobytes()

    def broadcast_bytes(self, payload: bytes | None, root: int = 0) -> bytes:
        """``root``'s bytes on every member (a length, then the bytes)."""
        size = torch.tensor([len(payload) if self.index == root and payload else 0], dtype=torch.int64)
        self.broadcast(size, root)
        n = int(size.item())
        if not n:
            return b""
        if self.index == root:
            assert payload is not None
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        else:
            data = torch.empty(n, dtype=torch.uint8)
        self.broadcast(data, root)
        return data.numpy().tobytes()

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        payload = pickle.dumps(obj) if self.index == root else None
        return pickle.loads(self.broadcast_bytes(payload, root))

    def gather_objects(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Every member's object on ``root`` in axis order (None elsewhere), point to point."""
        if self.index != root:
            self.send_bytes(pickle.dumps(obj), root)
            return None
        return [obj if i == root else pickle.loads(self.recv_bytes(i)) for i in range(self.size)]

    def close(self) -> None:
        shutdown = getattr(self._backend, "shutdown", None)  # not in every torch version
        if shutdown is not None:
            try:
                shutdown()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
