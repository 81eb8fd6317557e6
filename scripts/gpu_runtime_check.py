"""Read-only, measure-only check of the runtime's GPU-time machinery on a real GPU (issue 33).

    python scripts/gpu_runtime_check.py [--index 0] [--steps 16]

Prints one JSON object with the keys of ``benchmarks/bench_fidelity.py --json`` that a real card
can measure, for a GPT-like pipeline stage (``gpu_check_cuda.Stage``) run in 1F1B order, the host
never synchronizing inside a step:

- ``step_time_ratio``: the runtime's step time (its ``StepNumbers.time_s``: first instruction
  begin to the step's end event) over the same span timed by CUDA events of this script;
- ``energy_step_ratio``: the runtime's per-step energy (the poller's counter updates, read as the
  step ends: the last interval's power past the last update, corrected at the next step) summed
  over the steps, over the NVML counter interpolated offline over the same GPU windows;
- ``training_thread_nvml_reads``: energy-counter reads made on the training thread (0);
- ``training_thread_us_per_instruction``: the training thread's CPU time in the runtime's
  instruction hooks as a deployed plan runs them (a clock request hung on the stream, one
  recycled event per instruction);
- ``own_clock_share``: the share of instructions whose planned clock was the last one the runtime
  *would* have sent before the GPU began them (requests go to a recording sink; no clock changes),
  judged by CUDA events mapped to the host clock through an anchor recorded after a device sync.

Nothing here changes a clock, a power limit, persistence or compute mode: NVML is opened through
``perseus.gpu.nvml.readonly.ReadOnlyNVML``, which refuses every set/reset call. The runtime's
``perseus.runtime`` package needs pydantic; this script loads only the runtime module that holds
the GPU timeline (``perseus/runtime/port/gpu_timeline.py``, which imports the GPU layer only) and
wires it as ``GPUPort.open_timeline`` does: ``CudaEventRecorder(enable_timing=True)``,
``CudaTimeline``, the port's ``EnergyPoller`` (20 polls per counter period) and a request sink.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
for _p in (str(SCRIPTS.parent), str(SCRIPTS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from perseus.gpu.nvml.readonly import ReadOnlyNVML  # noqa: E402 - after the sys.path lines above

PLANNED_CLOCKS = (1980, 1755, 1530, 1305)  # labels only: nothing is ever set


def load_gpu_timeline() -> Any:
    """``perseus/runtime/port/gpu_timeline.py`` as a module of its own (``perseus.runtime``'s
    package needs pydantic, which the device may not have)."""
    path = SCRIPTS.parent / "perseus" / "runtime" / "port" / "gpu_timeline.py"
    spec = importlib.util.spec_from_file_location("perseus_gpu_timeline_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def runtime_importable() -> str:
    try:
        import perseus.runtime  # noqa: F401 - imported to see whether it can be
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"no ({type(exc).__name__}: {exc})"
    return "yes"


class ReadOnlyEnergy:
    """The energy counter through read-only NVML, counting reads per thread."""

    def __init__(self, nv: ReadOnlyNVML, handle: Any) -> None:
        self._nv, self._handle = nv, handle
        self.reads: Counter[int] = Counter()
        self.name = "nvml"

    def total_energy_j(self) -> float:
        self.reads[threading.get_ident()] += 1
        return float(self._nv.nvmlDeviceGetTotalEnergyConsumption(self._handle)) / 1e3

    def energy_counter_reading(self) -> tuple[float, float | None]:
        """What the poller reads (``GPUDevice.energy_counter_reading``): a real counter has no stamp."""
        return self.total_energy_j(), None


class SyncAnchoredTimeline:
    """CUDA events on the host clock through one anchor event recorded right after a device sync
    (the truth for judging; the runtime's ``CudaTimeline`` anchors on the follower's sighting)."""

    def __init__(self, torch: Any) -> None:
        torch.cuda.synchronize()
        self.anchor = torch.cuda.Event(enable_timing=True)
        self.anchor.record()
        self.anchor.synchronize()
        self.t0 = time.monotonic()

    def host(self, event: Any) -> float:
        return self.t0 + float(self.anchor.elapsed_time(event)) / 1e3

    def anchor_time(self, anchor: Any, seen_s: float) -> float:
        return self.host(anchor)

    def seconds_between(self, earlier: Any, later: Any) -> float:
        return float(earlier.elapsed_time(later)) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=int, default=0, help="CUDA device index")
    ap.add_argument("--steps", type=int, default=16, help="steps per part (two parts)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=4096, help="a small stage (e.g. 256) is host-bound: the launch "
                    "queue never fills, so the hooks' cost is theirs alone, not the wait for queue space")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--mechanism", choices=("poll", "block"), default="poll",
                    help="how the follower waits: event.query() every 50 µs, or event.synchronize()")
    ap.add_argument("--blocking-events", action="store_true",
                    help="events created with blocking=True (a synchronize sleeps instead of spinning)")
    args = ap.parse_args()
    out: dict[str, Any] = {"runtime_importable": runtime_importable()}
    try:
        import torch
    except ImportError as exc:
        print(json.dumps({**out, "error": f"torch is needed ({exc})"}))
        return 2
    if not torch.cuda.is_available():
        print(json.dumps({**out, "error": "no CUDA device visible to torch"}))
        return 2
    import pynvml

    import gpu_check_nvml as nvml_parts
    from gpu_check_cuda import Stage, StageConfig

    from perseus.gpu.stream.gpu_time import CudaTimeline, SimTimeline  # noqa: F401 - the runtime's timelines
    from perseus.gpu.meter.energy import AfterLast, EnergyPoller, counter_period_s, energy_at, poll_interval_s
    from perseus.gpu.stream.follow import CudaEventRecorder

    gt = load_gpu_timeline()
    nv = ReadOnlyNVML(pynvml)
    nv.nvmlInit()
    try:
        handle, nvml_index = nvml_parts.open_handle(nv, args.index)
        out["device"] = nvml_parts.identity(nv, handle, nvml_index)
        torch.cuda.set_device(args.index)
        dev = torch.device("cuda", args.index)
        stage = Stage(StageConfig(layers=args.layers, hidden=args.hidden, heads=max(1, args.hidden // 128), seq=args.seq),
                      dev, torch.bfloat16)
        order = stage.order
        energy = ReadOnlyEnergy(nv, handle)
        poller = EnergyPoller(energy, poll_interval_s(0.1), clock=time.monotonic).start()  # type: ignore[arg-type]  # ReadOnlyEnergy reads the counter as the poller's source does
        sent: list[tuple[float, int]] = []
        from perseus.gpu.stream.follow import FollowMechanism

        mechanism = FollowMechanism.BLOCK if args.mechanism == "block" else FollowMechanism.POLL
        out["mechanism"] = f"{args.mechanism}{' with blocking-sync events' if args.blocking_events else ''}"

        def recorder() -> Any:
            rec = CudaEventRecorder(enable_timing=True)
            if args.blocking_events:  # the pool's new events sleep in synchronize() instead of spinning
                rec._event_cls = lambda enable_timing: torch.cuda.Event(enable_timing=enable_timing, blocking=True)
            return rec
        split: dict[str, list[float]] = {"clock": [], "begin": [], "end": []}

        def sink(mhz: int, at: float | None) -> None:  # the controller the runtime would have: records only
            sent.append((time.monotonic(), mhz))

        def step(timeline: Any, plan: list[int] | None, planned_s: list[float] | None, each: bool,
                 hook_cpu: list[float], begins: list[float] | None = None) -> Any:
            timeline.step_begin()
            for i, inst in enumerate(order):
                if begins is not None:
                    begins.append(time.monotonic())
                c0 = time.thread_time()
                if plan is not None:
                    nxt = plan[i + 1] if i + 1 < len(plan) else plan[0]  # handed one ahead, as the runtime does
                    timeline.clock(plan[i], planned_s[i] if planned_s is not None else None, nxt)
                cc = time.thread_time()
                timeline.begin(inst.kind.value, each)
                c1 = time.thread_time()
                stage.run(inst)
                c2 = time.thread_time()
                timeline.end(each)
                c3 = time.thread_time()
                hook_cpu.append((c1 - c0) + (c3 - c2))
                split["clock"].append(cc - c0)
                split["begin"].append(c1 - cc)
                split["end"].append(c3 - c2)
            if plan is not None:
                timeline.ahead(plan[0])
            stage.tail()
            numbers = timeline.step_end()
            stage.zero_grad()
            return numbers

        # warm-up: planned durations per kind, as a profile would give them
        warm = gt.GPUTimeline(recorder(), CudaTimeline(), poller, sink,
                              instructions=len(order), mechanism=mechanism)
        durations: dict[str, list[float]] = {}
        for _ in range(3):
            n = step(warm, None, None, True, [])
            for t in n.instructions if n is not None else ():
                if t.key in ("forward", "backward"):
                    durations.setdefault(t.key, []).append(t.duration_s)
        warm.close()
        typical = {k: statistics.median(v) for k, v in durations.items()}
        rng = random.Random(0)
        plan = [rng.choice(PLANNED_CLOCKS) for _ in order]
        planned_s = [typical[inst.kind.value] for inst in order]

        # part 1: a deployed plan's hot path as the runtime runs it; step time and energy
        timeline = gt.GPUTimeline(recorder(), CudaTimeline(), poller, sink,
                                  instructions=len(order), mechanism=mechanism)
        hook_cpu: list[float] = []
        truth: list[tuple[Any, Any]] = []
        steps: list[Any] = []
        for s in range(args.steps):
            t0 = torch.cuda.Event(enable_timing=True)
            t1 = torch.cuda.Event(enable_timing=True)
            t0.record()
            if s == args.steps // 4:
                hook_cpu.clear()  # the event pool has filled
                for v in split.values():
                    v.clear()
            n = step(timeline, plan, planned_s, False, hook_cpu)
            # t1 after the step: its end event is the runtime's; this one follows it at once
            t1.record()
            truth.append((t0, t1))
            steps.append(n)
        torch.cuda.synchronize()
        time.sleep(0.25)  # the counter's next updates, for the offline reading
        updates = poller.updates()
        ratios, rt_e, nvml_e = [], 0.0, 0.0
        for (t0, t1), n in list(zip(truth, steps))[2:]:
            if n is None:
                continue
            ratios.append(n.time_s / (t0.elapsed_time(t1) / 1e3))
            rt_e += n.energy_j
            nvml_e += energy_at(updates, n.start_s + n.time_s, AfterLast.EXTEND) - energy_at(updates, n.start_s, AfterLast.EXTEND)
        timeline.close()
        out["step_time_ratio"] = statistics.median(ratios) if ratios else None
        out["hook_split_us"] = {k: statistics.mean(v) * 1e6 for k, v in split.items() if v}
        out["counter_period_s"] = counter_period_s(updates)

        # part 2: where the requests the runtime would send land, judged by sync-anchored events
        anchored = SyncAnchoredTimeline(torch)
        judged = gt.GPUTimeline(recorder(), anchored, poller, sink,
                                instructions=len(order), mechanism=mechanism)
        sent.clear()
        own = total = 0
        ahead: list[int] = []
        for _ in range(args.steps):
            begins: list[float] = []
            n = step(judged, plan, planned_s, True, [], begins)
            if n is None:
                continue
            gpu_begins = [t.start_s for t in n.instructions if t.key in ("forward", "backward")]
            times = [t for t, _ in sent]
            for i, (b, mhz) in enumerate(zip(gpu_begins, plan)):
                k = max((j for j, t in enumerate(times) if t <= b), default=None)
                own += k is not None and sent[k][1] == mhz
                total += 1
                ahead.append(sum(1 for g in gpu_begins[:i] if g > begins[i]))
        judged.close()
        poller.stop()
        out.update({
            "own_clock_share": own / total if total else None,
            "energy_step_ratio": rt_e / nvml_e if nvml_e > 0 else None,
            "training_thread_nvml_reads": energy.reads[threading.get_ident()],
            "training_thread_us_per_instruction": statistics.mean(hook_cpu) * 1e6 if hook_cpu else None,
            "host_ahead_instructions_median": statistics.median(ahead) if ahead else None,
            "steps": args.steps,
            "planned_instruction_ms": {k: v * 1e3 for k, v in typical.items()},
        })
        try:  # part 3 must not lose parts 1 and 2
            # part 3: the step's host time with the deployed hot path against none (host-bound: the cost)
            bare: list[float] = []
            hooked: list[float] = []
            cost_tl = gt.GPUTimeline(recorder(), CudaTimeline(), poller, sink,
                                     instructions=len(order), mechanism=mechanism)
            for s in range(2 * args.steps):
                torch.cuda.synchronize()
                w0 = time.perf_counter()
                if s % 2:
                    step(cost_tl, plan, planned_s, False, [])
                else:
                    for inst in order:
                        stage.run(inst)
                    stage.tail()
                    stage.zero_grad()
                torch.cuda.synchronize()
                (hooked if s % 2 else bare).append(time.perf_counter() - w0)
            cost_tl.close()
            out["step_wall_with_hooks_vs_without"] = statistics.median(hooked) / statistics.median(bare)
            out["step_wall_ms_without_hooks"] = statistics.median(bare) * 1e3
        except Exception as exc:  # noqa: BLE001 - recorded in the JSON; the rest still runs
            out["step_wall_error"] = f"{type(exc).__name__}: {exc}"
        out["hot_path_breakdown_us"] = hot_path_breakdown(torch)
    finally:
        nv.nvmlShutdown()
    print(json.dumps(out))
    return 0


def hot_path_breakdown(torch: Any, n: int = 2000) -> dict[str, float]:
    """Host CPU time (µs) of the calls the hot path makes, each alone, on an idle stream and with a
    thread polling ``event.query()`` every 50 µs beside it (the follower): what the per-instruction
    cost is made of, and whether the follower's polling (the GIL) inflates it."""
    from perseus.gpu.stream.follow import CudaEventRecorder, FollowMechanism, StreamFollower

    def cpu_us(fn: Any) -> float:
        c = time.thread_time()
        for _ in range(n):
            fn()
        return (time.thread_time() - c) / n * 1e6

    def wall_us(fn: Any) -> float:
        c = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - c) / n * 1e6

    reused = torch.cuda.Event(enable_timing=True)
    plain = torch.cuda.Event()
    pool = CudaEventRecorder(enable_timing=True)
    cases = {
        "new timing event + record": lambda: torch.cuda.Event(enable_timing=True).record(),
        "reused timing event record": reused.record,
        "reused plain event record": plain.record,
        "event query": reused.query,
        "pooled record + recycle": lambda: pool.recycle(pool.record()),
        "perf_counter": time.perf_counter,
    }
    out: dict[str, float] = {}
    torch.cuda.synchronize()
    for name, fn in cases.items():
        out[f"{name} (cpu)"] = cpu_us(fn)
        out[f"{name} (wall)"] = wall_us(fn)
    follower = StreamFollower(FollowMechanism.POLL)
    busy = torch.cuda.Event()
    try:
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        for _ in range(200):  # keep the stream busy so the follower polls a pending event
            x = x @ x
            x = x / x.norm()
        busy.record()
        follower.follow(busy, lambda s: None)
        for name in ("reused timing event record", "perf_counter"):
            out[f"{name} beside a polling follower (cpu)"] = cpu_us(cases[name])
            out[f"{name} beside a polling follower (wall)"] = wall_us(cases[name])
    finally:
        torch.cuda.synchronize()
        follower.close()
    return out


if __name__ == "__main__":
    sys.exit(main())
