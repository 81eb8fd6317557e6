"""CUDA parts of ``gpu_check.py``: loads for the sustained clock, and a small GPT-like pipeline
stage run in 1F1B order to measure the CUDA event timer, its anchor, the host's run-ahead, how
quickly a host thread can follow the stream, and energy attribution against direct measurement.

Nothing here changes a clock or a power limit; NVML is only read, through the sampler passed in.
GPU times are mapped onto the host clock through an anchor event recorded right after a device
synchronize (the GPU is idle then, so the event completes within microseconds of its host time).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

import torch
from gpu_check_analysis import (
    Instruction,
    Kind,
    attribute_power,
    boundary_delays,
    one_f_one_b_order,
    own_clock_shares,
    power_between,
    run_ahead,
    summary,
)
from torch import nn
from torch.nn import functional as F

SWITCH_LATENCIES_S = (0.0, 0.010)


@dataclass(frozen=True)
class StageConfig:
    """The GPT-like stage: ``layers`` transformer blocks, one pipeline stage's 1F1B order."""

    layers: int = 4
    hidden: int = 4096
    heads: int = 32
    seq: int = 2048
    microbatch: int = 2
    microbatches: int = 8
    warmup: int = 3
    tail_repeats: int = 20  # optimizer-like passes over the parameters after each step


class Block(nn.Module):
    """Pre-norm transformer block (causal attention through SDPA, GELU MLP)."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Stage:
    """One pipeline stage: inputs as if received from the previous stage, outputs' gradients as if
    from the next; ``run`` executes one 1F1B instruction."""

    def __init__(self, cfg: StageConfig, device: torch.device, dtype: torch.dtype) -> None:
        self.cfg = cfg
        with torch.device(device):  # initialised where it runs: no slow CPU init of ~1 G parameters
            self.model = nn.Sequential(*[Block(cfg.hidden, cfg.heads) for _ in range(cfg.layers)]).to(dtype)
        shape = (cfg.microbatch, cfg.seq, cfg.hidden)
        self.inputs = [torch.randn(shape, device=device, dtype=dtype).requires_grad_() for _ in range(cfg.microbatches)]
        self.grad_out = torch.randn(shape, device=device, dtype=dtype) * 1e-3
        self.outputs: dict[int, torch.Tensor] = {}
        self.params: list[torch.Tensor] = list(self.model.parameters())
        self.order = one_f_one_b_order(cfg.microbatches, cfg.warmup)

    def run(self, inst: Instruction) -> None:
        if inst.kind is Kind.FORWARD:
            self.outputs[inst.microbatch] = self.model(self.inputs[inst.microbatch])
        else:
            self.outputs.pop(inst.microbatch).backward(self.grad_out)

    def tail(self) -> None:
        """Optimizer-like GPU work after the last instruction (not an instruction)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        with torch.no_grad():
            for _ in range(self.cfg.tail_repeats):
                torch._foreach_add_(self.params, grads, alpha=-1e-12)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        for x in self.inputs:
            x.grad = None


class HostClock:
    """Maps CUDA events onto ``perf_counter`` through an anchor recorded right after a sync."""

    def __init__(self) -> None:
        torch.cuda.synchronize()
        self.anchor = torch.cuda.Event(enable_timing=True)
        self.t0 = time.perf_counter()
        self.anchor.record()

    def host_s(self, ev: torch.cuda.Event) -> float:
        return self.t0 + self.anchor.elapsed_time(ev) / 1e3


class Follow(str, Enum):
    """How a host thread learns that the GPU reached an instruction boundary."""

    NONE = "none"  # events recorded, nobody waits: the baseline for the step time
    SPIN = "event.synchronize (spin)"
    BLOCKING = "blocking-sync events"
    QUERY = "event.query every 50 us"


class Follower:
    """A thread that waits on each boundary event in order and notes when it saw it complete."""

    def __init__(self, how: Follow, poll_s: float = 50e-6) -> None:
        self.how, self.poll_s = how, poll_s
        self.q: queue.SimpleQueue[tuple[int, torch.cuda.Event] | None] = queue.SimpleQueue()
        self.seen: dict[int, float] = {}
        self.cpu_s = 0.0
        self._thread = threading.Thread(target=self._run, name="gpu-check-follower", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        c0 = time.thread_time()
        while (item := self.q.get()) is not None:
            i, ev = item
            if self.how is Follow.QUERY:
                while not ev.query():
                    time.sleep(self.poll_s)
            else:
                ev.synchronize()
            self.seen[i] = time.perf_counter()
        self.cpu_s = time.thread_time() - c0

    def close(self) -> None:
        self.q.put(None)
        self._thread.join(timeout=30.0)


@dataclass
class StepRecord:
    """One step's host and GPU times (host clock, seconds)."""

    order: list[Instruction]
    t0: float
    t_end: float  # host time after the final synchronize (what a resolve() after a sync sees)
    hook_s: list[float] = field(default_factory=list)
    begin_s: list[float] = field(default_factory=list)
    end_s: list[float] = field(default_factory=list)
    event_ms: list[float] = field(default_factory=list)  # begin→end elapsed per instruction
    sync_ms: list[float] = field(default_factory=list)  # synchronized host reference per instruction
    record_us: list[float] = field(default_factory=list)  # host cost of begin+end records
    seen_s: list[float] = field(default_factory=list)  # follower's observation of each end
    follower_cpu_s: float = 0.0

    @property
    def step_s(self) -> float:
        return self.t_end - self.t0


def run_step(stage: Stage, *, events: bool = True, sync_each: bool = False, follow: Follow | None = None,
             tail: bool = False) -> StepRecord:
    """One 1F1B step. ``events``: begin/end events per instruction (no host sync inside the step);
    ``sync_each``: a device sync around each instruction (the reference); ``follow``: a follower
    thread waiting on each end event; ``tail``: optimizer-like work after the last instruction."""
    order = stage.order
    blocking = follow is Follow.BLOCKING
    follower = Follower(follow) if follow not in (None, Follow.NONE) else None
    clock = HostClock()
    rec = StepRecord(order, clock.t0, math.nan)
    pairs = []
    for i, inst in enumerate(order):
        rec.hook_s.append(time.perf_counter())
        if sync_each:
            torch.cuda.synchronize()
            t = time.perf_counter()
            stage.run(inst)
            torch.cuda.synchronize()
            rec.sync_ms.append((time.perf_counter() - t) * 1e3)
            continue
        if not events:
            stage.run(inst)
            continue
        c = time.perf_counter()
        b = torch.cuda.Event(enable_timing=True, blocking=blocking)
        b.record()
        cost = time.perf_counter() - c
        stage.run(inst)
        c = time.perf_counter()
        e = torch.cuda.Event(enable_timing=True, blocking=blocking)
        e.record()
        if follower is not None:
            follower.q.put((i, e))
        rec.record_us.append((cost + time.perf_counter() - c) * 1e6)
        pairs.append((b, e))
    if tail:
        stage.tail()
    torch.cuda.synchronize()
    rec.t_end = time.perf_counter()
    if follower is not None:
        follower.close()
        rec.seen_s = [follower.seen[i] for i in range(len(order))]
        rec.follower_cpu_s = follower.cpu_s
    for b, e in pairs:
        rec.begin_s.append(clock.host_s(b))
        rec.end_s.append(clock.host_s(e))
        rec.event_ms.append(b.elapsed_time(e))
    stage.zero_grad()
    return rec


def _by_kind(order: Sequence[Instruction], values: Sequence[float]) -> dict[Kind, list[float]]:
    out: dict[Kind, list[float]] = {k: [] for k in Kind}
    for inst, v in zip(order, values):
        out[inst.kind].append(v)
    return out


def _median(xs: Sequence[float]) -> float:
    return float(sorted(xs)[len(xs) // 2]) if xs else math.nan


def timer_and_run_ahead(stage: Stage, steps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The event timer against a synchronized reference, and how far the host runs ahead."""
    timed = [run_step(stage) for _ in range(steps)]
    ref = [run_step(stage, events=False, sync_each=True) for _ in range(steps)]
    plain, with_events = [], []
    for _ in range(steps):  # alternated, so drift in the card's clock hits both alike
        plain.append(run_step(stage, events=False).step_s)
        with_events.append(run_step(stage).step_s)
    ev = _by_kind(stage.order, [x for r in timed for x in r.event_ms])
    rf = _by_kind(stage.order, [x for r in ref for x in r.sync_ms])
    timer: dict[str, Any] = {k.value: {"event_ms": _median(ev[k]), "sync_reference_ms": _median(rf[k]),
                       "ratio": _median(ev[k]) / _median(rf[k])} for k in Kind}
    timer["step_time_ratio_events_vs_none"] = _median(with_events) / _median(plain)
    timer["host_cost_us_per_begin_end"] = summary([x for r in timed for x in r.record_us])
    timer["step_ms"] = _median(plain) * 1e3
    ahead = [run_ahead(r.hook_s, r.begin_s, r.end_s) for r in timed]
    hook_share = {f"{lat * 1e3:g}ms": _mean_shares(
        [own_clock_shares(r.begin_s, r.end_s, [h + lat for h in r.hook_s]) for r in timed]) for lat in SWITCH_LATENCIES_S}
    last = timed[-1]
    return timer, {"instructions": ahead[-1]["instructions"], "ms": ahead[-1]["ms"],
                   "steps": steps, "order": " ".join(i.short() for i in last.order),
                   "own_clock_share_request_at_hook": hook_share}


def _mean_shares(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def anchor_bias(stage: Stage, steps: int) -> dict[str, Any]:
    """Absolute instruction times anchored at resolve() after a sync vs at an anchor event.

    Anchoring at resolve() assumes the last instruction ended when the host's sync returned, so
    every timestamp shifts late by the GPU work after it (here an optimizer-like tail). A spinning
    follower's observation of the last instruction's end checks the anchor event's own error.
    """
    recs = [run_step(stage, follow=Follow.SPIN, tail=True) for _ in range(steps)]
    return {"resolve_anchor_late_ms": summary([r.t_end - r.end_s[-1] for r in recs], 1e3),
            "anchor_event_vs_observed_ms": summary([r.seen_s[-1] - r.end_s[-1] for r in recs], 1e3),
            "tail_repeats": stage.cfg.tail_repeats, "steps": steps}


def switching(stage: Stage, rounds: int) -> dict[str, Any]:
    """Delay from the GPU reaching each instruction boundary to a host thread seeing it, per
    mechanism, with the step time against events alone and the share of instructions a clock
    request sent at that moment would put at their own clock."""
    steps: dict[Follow, list[StepRecord]] = {f: [] for f in Follow}
    for _ in range(rounds):
        for how in Follow:
            steps[how].append(run_step(stage, follow=how))
    base = _median([r.step_s for r in steps[Follow.NONE]])
    out: dict[str, Any] = {"rounds": rounds, "boundaries": len(stage.order) * rounds, "chosen": Follow.QUERY.value}
    for how in Follow:
        if how is Follow.NONE:
            continue
        recs = steps[how]
        delays = [d for r in recs for d in boundary_delays(r.end_s, r.seen_s)]
        shares = {}
        for lat in SWITCH_LATENCIES_S:
            # the request for instruction i+1 goes out when the follower sees instruction i end
            shares[f"{lat * 1e3:g}ms"] = _mean_shares([
                own_clock_shares(r.begin_s, r.end_s, [-math.inf] + [s + lat for s in r.seen_s[:-1]]) for r in recs])
        out[how.value] = {"delay_us": summary(delays, 1e6),
                          "step_time_ratio": _median([r.step_s for r in recs]) / base,
                          "cpu_cores": sum(r.follower_cpu_s for r in recs) / sum(r.step_s for r in recs),
                          "own_clock_share": shares}
    return out


def attribution(stage: Stage, sampler_factory: Callable[[], Any], seconds: float,
                direct_seconds: float) -> dict[str, Any]:
    """Forward/backward power attributed from counter intervals over 1F1B steps (with an
    optimizer-like tail), anchored both ways, against each measured directly in a sustained loop."""
    out: dict[str, Any] = {}
    with sampler_factory() as s:
        recs = []
        t_stop = time.perf_counter() + seconds
        while time.perf_counter() < t_stop:
            recs.append(run_step(stage, tail=True))
    updates = s.updates()
    for name, shift in (("anchor_event", lambda r: 0.0), ("resolve_after_sync", lambda r: r.t_end - r.end_s[-1])):
        spans = [(i.kind.value, b + shift(r), e + shift(r)) for r in recs
                 for i, b, e in zip(r.order, r.begin_s, r.end_s)]
        out[name] = attribute_power(updates, spans)
    out["steps"] = len(recs)
    out["counter_updates"] = len(updates)
    # the data themselves, so an attribution method can be judged offline against the direct powers
    out["raw"] = {"updates": [[t, e] for t, e in updates],
                  "spans": [[i.kind.value, b, e] for r in recs for i, b, e in zip(r.order, r.begin_s, r.end_s)],
                  "steps": [[r.begin_s[0], r.end_s[-1], r.t_end] for r in recs]}
    direct = {}
    for kind in Kind:
        direct[kind.value] = _direct_power(stage, kind, sampler_factory, direct_seconds)
    out["direct"] = direct
    for name in ("anchor_event", "resolve_after_sync"):
        out[name]["error_vs_direct"] = {k.value: out[name][k.value]["power_w"] / direct[k.value]["power_w"] - 1
                                        for k in Kind}
    return out


def _direct_power(stage: Stage, kind: Kind, sampler_factory: Callable[[], Any], seconds: float) -> dict[str, Any]:
    """Power of forwards (or backwards) back to back, from counter updates after a warm-up (0.5 s,
    or a third of a shorter run)."""
    x = stage.inputs[0]
    out_t = stage.model(x) if kind is Kind.BACKWARD else None
    with sampler_factory() as s:
        t_start = time.perf_counter()
        while time.perf_counter() - t_start < seconds:
            for _ in range(4):
                if out_t is None:
                    stage.model(x)
                else:
                    out_t.backward(stage.grad_out, retain_graph=True)
            torch.cuda.synchronize()
        t_stop = time.perf_counter()
    stage.zero_grad()
    return power_between(s.updates(), t_start + min(0.5, seconds / 3), t_stop)


def _repeats_for(op: Callable[[], Any], target_ms: float) -> int:
    """How many back-to-back ``op`` calls take about ``target_ms`` on the GPU (timed by events)."""
    for _ in range(3):
        op()
    b, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    b.record()
    for _ in range(10):
        op()
    e.record()
    e.synchronize()
    return max(1, round(target_ms / (b.elapsed_time(e) / 10)))


def attribution_split(sampler_factory: Callable[[], Any], seconds: float, direct_seconds: float,
                      forward_ms: float = 40.0, backward_ms: float = 90.0, tail_ms: float = 30.0) -> dict[str, Any]:
    """A stage whose kinds really differ in power: "forward" a memory-bound copy (~400 W on an
    H200), "backward" dense bf16 GEMMs (at the power cap), in 1F1B order of 8 microbatches with
    elementwise work after each step; each kind's span timed by events, the counter's updates kept,
    and each kind's power measured directly in a loop. The raw data let an attribution method be
    judged on a split that is real (the GPT-like stage's kinds both run at the cap)."""
    dev = torch.device("cuda")
    t = {"src": torch.empty(2**27, device=dev, dtype=torch.float32).fill_(1.0),
         "a": torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16), "w": torch.zeros(2**24, device=dev)}
    t |= {"dst": torch.empty_like(t["src"]), "b": torch.randn_like(t["a"]), "c": torch.empty_like(t["a"])}
    ops = {"forward": lambda: t["dst"].copy_(t["src"]), "backward": lambda: torch.matmul(t["a"], t["b"], out=t["c"]),
           "tail": lambda: t["w"].mul_(0.999)}
    reps = {"forward": _repeats_for(ops["forward"], forward_ms), "backward": _repeats_for(ops["backward"], backward_ms),
            "tail": _repeats_for(ops["tail"], tail_ms)}
    order = [k.value for k in (i.kind for i in one_f_one_b_order(8, 3))]

    def run(kind: str) -> None:
        for _ in range(reps[kind]):
            ops[kind]()

    spans: list[list[Any]] = []
    steps: list[list[float]] = []
    with sampler_factory() as s:
        t_stop = time.perf_counter() + seconds
        while time.perf_counter() < t_stop:
            clock = HostClock()
            pairs = []
            for kind in order:
                ev_b, ev_e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev_b.record()
                run(kind)
                ev_e.record()
                pairs.append((kind, ev_b, ev_e))
            t0 = torch.cuda.Event(enable_timing=True)
            t0.record()
            run("tail")
            t1 = torch.cuda.Event(enable_timing=True)
            t1.record()
            t1.synchronize()
            spans += [[k, clock.host_s(eb), clock.host_s(ee)] for k, eb, ee in pairs]
            steps.append([clock.host_s(pairs[0][1]), clock.host_s(t0), clock.host_s(t1)])
    updates = s.updates()
    direct = {}
    for kind in ("forward", "backward"):
        with sampler_factory() as d:
            t_start = time.perf_counter()
            while time.perf_counter() - t_start < direct_seconds:
                run(kind)
                torch.cuda.synchronize()
            t_end = time.perf_counter()
        direct[kind] = power_between(d.updates(), t_start + min(0.5, direct_seconds / 3), t_end)
    t.clear()
    torch.cuda.empty_cache()
    return {"repeats": reps, "steps": len(steps), "counter_updates": len(updates), "direct": direct,
            "raw": {"updates": [[t, e] for t, e in updates], "spans": spans, "steps": steps}}


class Load(str, Enum):
    GEMM = "dense bf16 GEMM"
    MEMORY = "memory-bound copy"
    TINY = "tiny kernels"


def run_load(load: Load, seconds: float) -> tuple[float, float]:
    """Keep the GPU busy with ``load`` for ``seconds``; returns the steady window (after 1 s)."""
    dev = torch.device("cuda")
    if load is Load.GEMM:
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b, c = torch.randn_like(a), torch.empty_like(a)
        op, per_chunk = (lambda: torch.matmul(a, b, out=c)), 10
    elif load is Load.MEMORY:
        a = torch.empty(2**28, device=dev, dtype=torch.float32).fill_(1.0)
        c = torch.empty_like(a)
        op, per_chunk = (lambda: c.copy_(a)), 20
    else:
        a = torch.zeros(1024, device=dev)
        op, per_chunk = (lambda: a.add_(1.0)), 200
    torch.cuda.synchronize()
    t_start = time.perf_counter()
    prev: torch.cuda.Event | None = None
    while time.perf_counter() - t_start < seconds:
        for _ in range(per_chunk):
            op()
        ev = torch.cuda.Event()
        ev.record()
        if prev is not None:
            prev.synchronize()  # at most two chunks queued: the GPU never starves, the host never runs far
        prev = ev
    torch.cuda.synchronize()
    return t_start + min(1.0, seconds / 3), time.perf_counter()


def stage_summary(stage: Stage) -> dict[str, Any]:
    return asdict(stage.cfg) | {"parameters_m": sum(p.numel() for p in stage.params) / 1e6,
                                "dtype": str(stage.params[0].dtype).removeprefix("torch."),
                                "order": " ".join(i.short() for i in stage.order)}


def library_stream(stage: Stage, rounds: int) -> dict[str, Any]:
    """perseus's own stream-following code on this card: ``StreamFollower`` (event.query polled)
    and ``GPUStepTimer`` (timing events anchored by the follower's sighting), against timing
    events recorded beside them (the truth, mapped onto the host clock after a sync).

    Reports the follower's delay from the GPU reaching each instruction's begin to the action,
    the timer's instruction span and first-begin time against the truth, and the training
    thread's cost of the library calls per instruction."""
    from perseus.gpu.stream.gpu_time import CudaTimeline, GPUStepTimer
    from perseus.gpu.stream.follow import CudaEventRecorder, FollowMechanism, StreamFollower

    boundary = CudaEventRecorder()
    timing = CudaEventRecorder(enable_timing=True)
    follower = StreamFollower(FollowMechanism.POLL, clock=time.perf_counter)
    timer = GPUStepTimer(timing, follower, CudaTimeline())
    delays: list[float] = []
    span_ratio: list[float] = []
    begin_err: list[float] = []
    train_us: list[float] = []
    try:
        for _ in range(rounds):
            clock = HostClock()
            seen: dict[int, float] = {}
            truth: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
            cost = 0.0
            timer.step_begin()
            for i, inst in enumerate(stage.order):
                c = time.perf_counter()
                timer.begin(inst)
                follower.follow(boundary.record(), lambda s, i=i, seen=seen: seen.__setitem__(i, s))
                cost += time.perf_counter() - c
                tb = torch.cuda.Event(enable_timing=True)
                tb.record()
                stage.run(inst)
                te = torch.cuda.Event(enable_timing=True)
                te.record()
                c = time.perf_counter()
                timer.end()
                cost += time.perf_counter() - c
                truth.append((tb, te))
            stage.tail()
            timer.step_end()
            torch.cuda.synchronize()
            follower.drain(10.0)
            steps = []
            deadline = time.perf_counter() + 10.0
            while not steps and time.perf_counter() < deadline:
                steps = timer.settled()
                time.sleep(0.001)
            stage.zero_grad()
            if not steps:
                raise RuntimeError("GPUStepTimer settled no step within 10 s of a synchronize")
            g = steps[0]
            tb0 = clock.host_s(truth[0][0])
            te1 = clock.host_s(truth[-1][1])
            span_ratio.append(g.instruction_span_s / (te1 - tb0))
            begin_err.append(g.instructions[0].start_s - tb0)
            delays.extend(seen[i] - clock.host_s(b) for i, (b, _) in enumerate(truth) if i in seen)
            train_us.append(cost / len(stage.order) * 1e6)
    finally:
        follower.close()
    return {"rounds": rounds, "mechanism": "event.query every 50 us (perseus.gpu.stream.follow)",
            "delay_us": summary(delays, 1e6), "instruction_span_ratio": summary(span_ratio),
            "first_begin_error_ms": summary(begin_err, 1e3), "training_thread_us_per_instruction": summary(train_us),
            "follower_error": repr(follower.error) if follower.error else None}


def side_stream(rounds: int = 20, work_ms: float = 10.0) -> dict[str, Any]:
    """Where an instruction's end event must go when a framework's end hook runs under a side stream
    (``perseus.gpu.stream.compute_stream``), measured on this card: the span from a begin event on
    the compute stream to an end event recorded on the current stream (what ``Event.record()`` does),
    on the compute stream only, and by ``ComputeStream`` (both streams, the later counts), against
    the truth (an event after each stream's own work). Two cases: the side stream is idle (the
    compute stream still runs the instruction), and the instruction left longer work on it. Also the
    host costs: reading the current stream (``ComputeStream``, once per hook), an event recorded on
    the current stream and on a named one. Read-only; about a second on a GPU; refuses to run
    without CUDA."""
    if not torch.cuda.is_available():
        raise RuntimeError("side_stream needs a CUDA GPU (torch sees none); it does not run on CPU")
    from perseus.gpu.stream.compute_stream import ComputeStream
    from perseus.gpu.stream.follow import CudaEventRecorder
    from perseus.gpu.stream.gpu_time import CudaTimeline

    compute, side = torch.cuda.current_stream(), torch.cuda.Stream()
    cycles_per_ms = _sleep_cycles_per_ms()
    recorder = CudaEventRecorder(enable_timing=True)
    timeline = CudaTimeline()

    def timed(stream: torch.cuda.Stream) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

    out: dict[str, Any] = {"rounds": rounds, "work_ms": work_ms}
    for case, compute_ms, side_ms in (("idle_side_stream", work_ms, 0.0), ("work_left_on_side_stream", work_ms / 4, work_ms)):
        spans: dict[str, list[float]] = {"current_stream": [], "compute_stream": [], "compute_stream_joined": [], "truth": []}
        for _ in range(rounds):
            torch.cuda.synchronize()
            streams = ComputeStream(recorder)
            streams.instruction_begins()  # the begin hook: the compute stream is current
            begin = streams.record()
            torch.cuda._sleep(int(compute_ms * cycles_per_ms))
            truth = [timed(compute)]
            with torch.cuda.stream(side):  # the framework's end hook runs inside its side stream's block
                if side_ms:
                    torch.cuda._sleep(int(side_ms * cycles_per_ms))
                truth.append(timed(side))
                on_current = recorder.record()
                on_compute = recorder.record(compute)
                streams.ends_here()
                joined = streams.record()
            torch.cuda.synchronize()
            spans["current_stream"].append(begin.elapsed_time(on_current))
            spans["compute_stream"].append(begin.elapsed_time(on_compute))
            spans["compute_stream_joined"].append(timeline.seconds_between(begin, joined) * 1e3)
            spans["truth"].append(max(begin.elapsed_time(t) for t in truth))
        errors = [j - t for j, t in zip(spans["compute_stream_joined"], spans["truth"])]
        out[case] = {name: summary(v) for name, v in spans.items()} | {
            "joined_minus_truth_ms": summary(errors), "right": max(abs(e) for e in errors) < 0.05}
    costs: dict[str, list[float]] = {"current_stream_read_us": [], "record_on_current_us": [], "record_on_named_us": []}
    ev = torch.cuda.Event(enable_timing=True)
    for _ in range(200):
        for name, call in (("current_stream_read_us", recorder.current_stream),
                           ("record_on_current_us", ev.record), ("record_on_named_us", lambda: ev.record(compute))):
            t = time.perf_counter()
            call()
            costs[name].append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    out |= {name: summary(v) for name, v in costs.items()}
    out["right"] = all(out[c]["right"] for c in ("idle_side_stream", "work_left_on_side_stream"))
    return out


def _sleep_cycles_per_ms() -> float:
    """``torch.cuda._sleep``'s cycles per millisecond on this card (a spin kernel of known length)."""
    cycles = 10_000_000
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles // 10)  # warm-up: the first launch pays for loading the kernel
    a.record()
    torch.cuda._sleep(cycles)
    b.record()
    b.synchronize()
    return cycles / a.elapsed_time(b)
