#!/usr/bin/env python
"""Check a GPU for Perseus. Read-only by default: nothing changes a clock or a power limit.

    python scripts/gpu_check.py                            # read-only, markdown table on stdout
    python scripts/gpu_check.py --json --out DIR           # one JSON object; DIR/gpu_check.{json,md}
    python scripts/gpu_check.py --allow-clock-changes      # also lock latency and a matmul sweep
    python scripts/gpu_check.py --sim --quick              # the clock checks on the simulated GPU

Read-only mode reads NVML through a guard that refuses every set/reset call, and measures:
identity (no UUID or serial), driver/NVML/CUDA versions, supported clocks, power limits, the
energy counter's period, energy/power read latency, the sustained SM clock and clock-event
reasons under three loads, and, on a small GPT-like stage in 1F1B order, the CUDA event timer
against a synchronized reference, the anchor bias, the host's run-ahead, how quickly a host thread
follows the stream, and attributed vs directly measured forward/backward power.

``--allow-clock-changes`` is for a GPU that is yours: its cleanup resets only what it locked.
Each part that fails records its error and the rest still runs; with ``--out`` the JSON is
rewritten after every part, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
for _p in (str(SCRIPTS.parent), str(SCRIPTS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import gpu_check_nvml as nvml_parts  # noqa: E402 - found through the sys.path lines above

from perseus.gpu.nvml.readonly import ReadOnlyNVML  # noqa: E402 - found through the sys.path lines above

SCHEMA = "perseus-gpu-check/2"
NVML_PARTS = ("identity", "versions", "clocks", "power", "read_latency", "counter")
CUDA_PARTS = ("loads", "stage", "timer", "run_ahead", "anchor", "switching", "library_stream", "attribution",
              "side_stream", "attribution_split")


class Check:
    """The results so far; each part runs guarded, and with ``out_dir`` the JSON is rewritten
    after every part."""

    def __init__(self, out_dir: Path | None, mode: str, only: frozenset[str] | None = None) -> None:
        self.out_dir = out_dir
        self.only = only  # run only these parts (``--only``); the others are left out
        self.data: dict[str, Any] = {"schema": SCHEMA, "mode": mode, "elapsed_s": {}, "errors": {}}
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)

    def part(self, name: str, fn: Callable[[], Any]) -> Any:
        if self.only is not None and name not in self.only:
            return None
        t = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - one part's failure must not stop the rest
            line = f"{type(exc).__name__}: {exc}".splitlines()[0]
            value = {"error": line}
            self.data["errors"][name] = line
            print(f"gpu_check: {name} failed: {line}", file=sys.stderr)
            if os.environ.get("GPU_CHECK_TRACEBACK"):
                traceback.print_exc()
        self.data[name] = value
        self.data["elapsed_s"][name] = round(time.perf_counter() - t, 2)
        self.save()
        return value

    def save(self) -> None:
        if self.out_dir is not None:
            tmp = self.out_dir / "gpu_check.json.tmp"
            tmp.write_text(json.dumps(self.data, indent=2, default=str))
            tmp.replace(self.out_dir / "gpu_check.json")


# -- read-only ---------------------------------------------------------------------------------------------
def load_read_only_nvml() -> ReadOnlyNVML:
    import pynvml

    nv = ReadOnlyNVML(pynvml)
    nv.nvmlInit()
    return nv


def cuda_unavailable() -> str | None:
    """Why the CUDA parts cannot run, in one line; None when they can."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not installed ({exc}); install torch with CUDA to run the CUDA parts"
    if not torch.cuda.is_available():
        return (f"no CUDA device visible to torch {torch.__version__} (CUDA build: {torch.version.cuda}); "
                "the CUDA parts were skipped")
    return None


def read_only_check(check: Check, args: argparse.Namespace) -> None:
    nv: ReadOnlyNVML | None = None
    handle: Any = None

    def open_nvml() -> dict[str, Any]:
        nonlocal nv, handle
        nv = load_read_only_nvml()
        handle, index = nvml_parts.open_handle(nv, args.index)
        return nvml_parts.identity(nv, handle, index)

    def need_nvml() -> tuple[ReadOnlyNVML, Any]:
        if nv is None:
            raise RuntimeError("NVML did not open (see 'identity'); this part needs it")
        return nv, handle

    check.part("identity", open_nvml)
    check.part("versions", lambda: host_versions() | (nvml_parts.versions(nv) if nv is not None
                                                       else {"nvml_error": "NVML did not open (see 'identity')"}))
    check.part("clocks", lambda: nvml_parts.clocks(*need_nvml()))
    check.part("power", lambda: nvml_parts.power(*need_nvml()))
    check.part("read_latency", lambda: nvml_parts.read_latency(*need_nvml(), energy_reps=args.energy_reads,
                                                               power_reps=10 * args.energy_reads))
    check.part("counter", lambda: nvml_parts.counter_period(*need_nvml(), updates=args.counter_updates,
                                                            timeout_s=5.0))

    reason = cuda_unavailable()
    check.data["cuda"] = {"available": reason is None, "reason": reason}
    if reason is None:
        cuda_parts(check, args, need_nvml)
    else:
        for name in CUDA_PARTS:
            check.data[name] = None
    check.save()
    if nv is not None:
        check.data["read_only_guard"] = {"refused": list(nv.refused)}
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


def host_versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    with contextlib.suppress(ImportError):
        import torch

        out |= {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    return out


def cuda_parts(check: Check, args: argparse.Namespace, need_nvml: Callable[[], tuple[ReadOnlyNVML, Any]]) -> None:
    import gpu_check_cuda as cu
    import torch

    torch.cuda.set_device(args.index)
    check.part("side_stream", cu.side_stream)  # first: about a second, needs nothing else

    def sampler() -> nvml_parts.Sampler:
        return nvml_parts.Sampler(*need_nvml())

    def loads() -> dict[str, Any]:
        out = {}
        for load in cu.Load:
            with sampler() as s:
                window = cu.run_load(load, args.load_seconds)
            out[load.value] = s.sustained(*window)
            torch.cuda.empty_cache()
        return out

    check.part("loads", loads)
    cfg = cu.StageConfig(layers=args.stage_layers, hidden=args.stage_hidden, heads=args.stage_hidden // 128,
                         seq=args.stage_seq, microbatch=args.stage_microbatch)
    stage_box: list[Any] = []

    def build() -> dict[str, Any]:
        torch.manual_seed(0)
        stage = cu.Stage(cfg, torch.device("cuda", args.index), torch.bfloat16)
        for _ in range(2):
            cu.run_step(stage, tail=True)  # warm-up: kernels chosen, allocator settled
        stage_box.append(stage)
        return cu.stage_summary(stage) | {"device_name": torch.cuda.get_device_name(args.index)}

    def stage() -> Any:
        if not stage_box:
            raise RuntimeError("the GPT-like stage was not built (see 'stage')")
        return stage_box[0]

    check.part("stage", build)
    both: dict[str, Any] = {}

    def timer() -> dict[str, Any]:
        both["timer"], both["run_ahead"] = cu.timer_and_run_ahead(stage(), args.steps)
        return both["timer"]

    check.part("timer", timer)
    check.part("run_ahead", lambda: both.get("run_ahead") or {"error": "measured with 'timer', which failed"})
    check.part("anchor", lambda: cu.anchor_bias(stage(), args.steps))
    check.part("switching", lambda: cu.switching(stage(), args.switch_rounds))
    check.part("library_stream", lambda: cu.library_stream(stage(), args.switch_rounds))
    check.part("attribution", lambda: cu.attribution(stage(), sampler, args.attr_seconds, args.direct_seconds))
    stage_box.clear()
    torch.cuda.empty_cache()
    check.part("attribution_split", lambda: cu.attribution_split(sampler, args.attr_seconds, args.direct_seconds))
    if args.combined_1f1b:  # changes no clock: runs in read-only mode too
        check.part("combined_1f1b", lambda: combined_1f1b_case(args.index, False, args.matrix))


# -- clock-changing (a GPU that is yours, or the simulated one) --------------------------------------------
class ClockChanges:
    """The clock-changing checks' only way to the device: it remembers whether it locked the SM
    clock, and ``restore`` resets that and nothing else (the memory clock is never locked here)."""

    def __init__(self, dev: Any) -> None:
        self.dev = dev
        self.sm_locked = False

    def lock_sm(self, mhz: int) -> None:
        self.sm_locked = True  # before the call: a lock that fails half-way still gets reset
        self.dev.set_locked_sm_clock(mhz)

    def reset_sm(self) -> None:
        self.dev.reset_locked_sm_clock()
        self.sm_locked = False

    def can_lock(self) -> bool:
        """The device's privilege probe, which may itself lock and reset the SM clock."""
        self.sm_locked = True
        ok = bool(self.dev.can_set_clocks())
        self.sm_locked = False
        return ok

    def restore(self) -> str | None:
        """Reset what was locked; the error's text if that failed."""
        if not self.sm_locked:
            return None
        try:
            self.reset_sm()
        except Exception as exc:  # noqa: BLE001 - reported, never raised from cleanup
            return f"could not reset the SM clock: {exc}"
        return None


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def lock_latency(changes: ClockChanges, clocks: list[int], reps: int) -> dict[str, float]:
    """Wall time of one lock call and one reset call (ms), median and p99 over ``reps``."""
    lock, reset = [], []
    for i in range(reps):
        t = time.perf_counter()
        changes.lock_sm(clocks[i % len(clocks)])
        lock.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        changes.reset_sm()
        reset.append((time.perf_counter() - t) * 1e3)
    return {"reps": reps, "lock_median_ms": statistics.median(lock), "lock_p99_ms": _pct(lock, 0.99),
            "reset_median_ms": statistics.median(reset), "reset_p99_ms": _pct(reset, 0.99)}


def device_counter_period(dev: Any, updates: int, poll_s: float = 0.0005, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll a GPUDevice's energy counter until it has changed ``updates`` times; report the spacing."""
    times: list[float] = []
    last = dev.total_energy_j()
    deadline = time.perf_counter() + timeout_s
    prev_t = time.perf_counter()
    while len(times) < updates + 1 and time.perf_counter() < deadline:
        e = dev.total_energy_j()
        t = time.perf_counter()
        if e != last:
            times.append(0.5 * (prev_t + t))
            last = e
        prev_t = t
        time.sleep(poll_s)
    gaps = [(b - a) * 1e3 for a, b in zip(times, times[1:])]
    if not gaps:
        return {"updates": 0, "note": "counter did not change"}
    return {"updates": len(gaps), "median_ms": statistics.median(gaps), "min_ms": min(gaps), "max_ms": max(gaps)}


def _matmul_step_sim(dev: Any, kernel_ms: float) -> Callable[[int], None]:
    """A matmul-like kernel of ``kernel_ms`` at the max clock, stretched and powered by the model
    (not CPU work, whose time would depend on what else runs on the machine)."""
    def run(iters: int) -> None:
        for _ in range(iters):
            dev.run_for(kernel_ms / 1e3, activity=1.0, compute_fraction=0.9)

    return run


def _matmul_step_cuda(index: int, n: int) -> Callable[[int], None]:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"no CUDA device visible to torch {torch.__version__}: the matmul sweep needs one")
    device = torch.device("cuda", index)
    a = torch.randn(n, n, device=device, dtype=torch.float16)
    b = torch.randn(n, n, device=device, dtype=torch.float16)
    c = torch.empty_like(a)

    def run(iters: int) -> None:
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize(device)

    return run


def matmul_sweep(changes: ClockChanges, run: Callable[[int], None], clocks: list[int], seconds: float,
                 can_lock: bool) -> list[dict[str, Any]]:
    """Time, energy and power per matmul iteration at each clock (energy from counter updates)."""
    from perseus.gpu import GPUError
    from perseus.gpu.meter.energy import EnergyPoller, power_from_updates

    dev = changes.dev
    rows = []
    run(3)  # warm-up
    t = time.perf_counter()
    run(5)
    per_iter = max((time.perf_counter() - t) / 5, 1e-6)
    for f in clocks:
        if can_lock:
            changes.lock_sm(f)
        with EnergyPoller(dev, interval_s=0.001) as poller:
            t0 = time.perf_counter()
            iters = 0
            while time.perf_counter() - t0 < seconds:
                k = max(1, int(0.05 / per_iter))
                run(k)
                iters += k
            t1 = time.perf_counter()
        try:
            p, window, _n = power_from_updates(poller.updates(), t0, t1)
        except GPUError:
            p, window = float("nan"), 0.0
        per_iter = (t1 - t0) / iters
        rows.append({"sm_clock_mhz": f if can_lock else None, "iterations": iters,
                     "time_per_iter_ms": per_iter * 1e3, "power_w": p,
                     "energy_per_iter_j": p * per_iter, "energy_window_s": window})
    if can_lock:
        changes.reset_sm()
    return rows


def clock_check(args: argparse.Namespace) -> dict[str, Any]:
    """Lock/reset latency and a matmul sweep over SM clocks: only on a GPU that is yours."""
    from perseus.gpu import GPUDevice, SimulatedGPU, open_gpu

    if args.sim:
        state_dir = os.environ.get("PERSEUS_SIM_GPU_DIR") or tempfile.mkdtemp(prefix="perseus-gpu-check-")
        dev: GPUDevice = SimulatedGPU(args.index, preset=args.preset, state_dir=state_dir,
                                      energy_update_period_s=0.1, reset_state=True)
    else:
        dev = open_gpu("nvml", args.index)
    changes = ClockChanges(dev)
    reps = 20 if args.quick else 200
    out: dict[str, Any] = {"backend": "sim" if args.sim else "nvml"}
    try:
        clocks = dev.supported_sm_clocks_mhz()
        out["device"] = {"name": dev.name, "architecture": dev.architecture, "index": dev.index}
        out["sm_clocks_mhz"] = clocks
        lo, hi = dev.power_limit_range_w()
        out["power"] = {"limit_w": dev.power_limit_w(), "limit_range_w": [lo, hi], "now_w": dev.power_w()}
        can_lock = changes.can_lock()
        out["can_set_clocks"] = can_lock
        test_clocks = [clocks[0]] + [c for c in clocks if c <= clocks[0] * 0.85][:1] + \
                      [c for c in clocks if c <= clocks[0] * 0.7][:1] + [c for c in clocks if c <= clocks[0] * 0.55][:1]
        out["lock_latency"] = lock_latency(changes, test_clocks, reps) if can_lock else None
        out["energy_counter"] = device_counter_period(dev, 5 if args.quick else 50)
        try:
            run = (_matmul_step_sim(dev, args.sim_kernel_ms) if args.sim
                   else _matmul_step_cuda(args.index, args.matrix))
            out["matmul"] = matmul_sweep(changes, run, test_clocks if can_lock else [clocks[0]],
                                         0.4 if args.quick else 3.0, can_lock)
        except Exception as exc:  # noqa: BLE001 - the rest of the section still stands
            out["matmul"] = {"error": f"{type(exc).__name__}: {exc}"}
        if args.combined_1f1b and args.sim:  # on a real GPU it runs with the read-only parts
            out["combined_1f1b"] = combined_1f1b_case(args.index, args.sim, args.matrix)
    finally:
        problem = changes.restore()
        if problem:
            out["cleanup_error"] = problem
            print(f"warning: {problem}", file=sys.stderr)
        dev.close()
    return out


def combined_1f1b_case(index: int, sim: bool, n: int, microbatches: int = 4) -> dict[str, Any]:
    """megatron-core's combined 1F1B (``overlap_moe_expert_parallel_comm``) with perseus_megatron's hooks.

    Runs megatron-core's own ``combined_1f1b_schedule_for_no_pipelining`` with its real
    ``set_streams`` (CUDA streams: what the CPU tests cannot run) and the hooked
    ``combined_forward_backward_step``; each unit's compute is a stand-in, one matmul per part on
    the current stream. Checks the hooks report the ``megatron-combined-1f1b`` order with each
    unit's microbatch pair, and times the three kinds of unit. ``sim``: streams stubbed, CPU matmuls.
    """
    import torch
    from megatron.core.pipeline_parallel import combined_1f1b

    from perseus.runtime.job import RecordingListener
    from perseus.schedules import build_schedule
    from perseus_megatron.hooks import install_hooks
    from perseus_megatron.tracker import StepInfo

    device = torch.device("cpu") if sim else torch.device("cuda", index)
    size = 256 if sim else n
    a = torch.randn(size, size, device=device)
    times: dict[str, list[float]] = {}

    def sync() -> None:
        if not sim:
            torch.cuda.synchronize(device)

    def step(forward_step_func, data_iterator, f_model, num_microbatches, input_tensor, forward_data_store,
             b_model, b_input_tensor, b_output_tensor, b_output_tensor_grad, config, f_model_chunk_id=None,
             pre_forward=None, pre_backward=None, post_forward=None, post_backward=None, collect_non_loss_data=False,
             checkpoint_activations_microbatch=None, is_first_microbatch=False, current_microbatch=None,
             encoder_decoder_xattn=False):
        parts = [p for p in (f_model, b_model) if p is not None]
        kind = "forward_backward" if len(parts) == 2 else "forward" if f_model is not None else "backward"
        t0 = time.perf_counter()
        for _ in parts:
            torch.matmul(a, a)
        sync()
        times.setdefault(kind, []).append(1e3 * (time.perf_counter() - t0))
        return (torch.empty(1, device=device) if f_model is not None else None), 1, None

    saved = combined_1f1b.set_streams, combined_1f1b.combined_forward_backward_step
    combined_1f1b.combined_forward_backward_step = step
    if sim:
        combined_1f1b.set_streams = lambda: None
    listener = RecordingListener()
    handle = install_hooks(listener)
    try:
        with handle.tracker.step(StepInfo("megatron-combined-1f1b", microbatches)):
            combined_1f1b.combined_1f1b_schedule_for_no_pipelining(
                None, None, object(), microbatches, None, None, [], argparse.Namespace(), False, None, False,
                contextlib.nullcontext, 0, lambda first: first)
    finally:
        handle.uninstall()
        combined_1f1b.set_streams, combined_1f1b.combined_forward_backward_step = saved
    want = list(build_schedule("megatron-combined-1f1b", 1, microbatches, 1).stages[0])
    return {"streams": "stubbed (--sim)" if sim else "CUDA", "order_matches": listener.steps == [want],
            "order": [i.short() for i in (listener.steps or [[]])[0]],
            "unit_ms": {kind: statistics.median(ts) for kind, ts in times.items()}}


# -- report ------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--read-only", action="store_true", default=True,
                      help="(default) change nothing on the GPU: NVML through a guard that refuses set/reset calls")
    mode.add_argument("--allow-clock-changes", action="store_true",
                      help="also run the checks that lock SM clocks (only on a GPU that is yours)")
    mode.add_argument("--sim", action="store_true", help="the clock checks on the simulated GPU (no hardware)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the markdown table")
    ap.add_argument("--out", type=Path, help="write gpu_check.json and gpu_check.md into this folder")
    ap.add_argument("--render", type=Path, metavar="JSON",
                    help="only print (and with --out, write) the markdown table of an earlier run's JSON")
    ap.add_argument("--index", type=int, default=0, help="CUDA device index (as this process sees it)")
    ap.add_argument("--quick", action="store_true", help="shorter everything (seconds instead of a minute)")
    ap.add_argument("--only", metavar="PART[,PART]", help="run only these parts (e.g. side_stream); the rest are left out")
    ap.add_argument("--preset", default="A100-SXM", help="simulated GPU preset (with --sim)")
    ap.add_argument("--matrix", type=int, default=8192, help="matmul size of the clock sweep")
    ap.add_argument("--sim-kernel-ms", type=float, default=5.0, help="with --sim: the simulated matmul's time")
    ap.add_argument("--combined-1f1b", action="store_true",
                    help="also megatron-core's combined 1F1B (CUDA streams; stubbed with --sim) with perseus_megatron's hooks")
    g = ap.add_argument_group("read-only sizes")
    g.add_argument("--load-seconds", type=float, default=6.0, help="each sustained-clock load")
    g.add_argument("--steps", type=int, default=4, help="1F1B steps per timer/anchor measurement")
    g.add_argument("--switch-rounds", type=int, default=6, help="rounds of each follower mechanism")
    g.add_argument("--attr-seconds", type=float, default=8.0, help="1F1B steps for energy attribution")
    g.add_argument("--direct-seconds", type=float, default=3.0, help="each direct forward/backward power loop")
    g.add_argument("--energy-reads", type=int, default=200, help="timed energy reads (power reads: 10x)")
    g.add_argument("--counter-updates", type=int, default=12, help="energy counter changes to time")
    g.add_argument("--stage-layers", type=int, default=4)
    g.add_argument("--stage-hidden", type=int, default=4096)
    g.add_argument("--stage-seq", type=int, default=2048)
    g.add_argument("--stage-microbatch", type=int, default=2)
    args = ap.parse_args(argv)
    if args.quick:
        args.load_seconds, args.steps, args.switch_rounds = 2.0, 2, 2
        args.attr_seconds, args.direct_seconds, args.energy_reads, args.counter_updates = 3.0, 1.5, 40, 4

    if args.render is not None:
        text = markdown(json.loads(args.render.read_text()))
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gpu_check.md").write_text(text + "\n")
        print(text)
        return 0
    mode_name = "sim" if args.sim else "allow-clock-changes" if args.allow_clock_changes else "read-only"
    only = frozenset(p.strip() for p in args.only.split(",")) if args.only else None
    unknown = sorted((only or set()) - {*NVML_PARTS, *CUDA_PARTS, "combined_1f1b", "clock_changes"})
    if unknown:
        ap.error(f"--only: no part named {', '.join(unknown)}; parts: {', '.join((*NVML_PARTS, *CUDA_PARTS))}")
    if only is not None and only & set(NVML_PARTS):
        only |= {"identity"}  # it opens NVML for the others
    check = Check(args.out, mode_name, only)
    t = time.perf_counter()
    if not args.sim:
        read_only_check(check, args)
    if args.sim or args.allow_clock_changes:
        check.part("clock_changes", lambda: clock_check(args))
    check.data["total_s"] = round(time.perf_counter() - t, 1)
    check.save()
    text = markdown(check.data)
    if args.out is not None:
        (args.out / "gpu_check.md").write_text(text + "\n")
    print(json.dumps(check.data, indent=2, default=str) if args.json else text)
    return 0


def _fmt(v: Any, unit: str = "", nd: int = 1) -> str:
    if isinstance(v, float):
        return f"{v:,.{nd}f}{unit}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}{unit}"
    return str(v)


def _ms(s: Any, nd: int = 2, unit: str = " ms") -> str:
    """'median / p99' of a summary dict."""
    if not isinstance(s, dict) or not s.get("n"):
        return "–"
    return f"{s['median']:.{nd}f} / {s['p99']:.{nd}f}{unit}"


def markdown(d: dict[str, Any]) -> str:
    """The results as a markdown table for docs/gpu.md; a failed part shows its error."""
    rows: list[tuple[str, str]] = []

    def add(name: str, key: str, render: Callable[[Any], list[tuple[str, str]]]) -> None:
        v = d.get(key)
        if v is None:
            return
        if isinstance(v, dict) and "error" in v:
            rows.append((name, f"**failed**: {v['error']}"))
            return
        try:
            rows.extend(render(v))
        except Exception as exc:  # noqa: BLE001 - a report row must not hide the others
            rows.append((name, f"(cannot render: {type(exc).__name__}: {exc})"))

    add("identity", "identity", lambda v: [("GPU", f"{v['name']} ({v['architecture']}, {_fmt(v['memory_gib'])} GiB)")])
    add("versions", "versions", lambda v: [("driver / NVML / CUDA driver", f"{v.get('driver')} / {v.get('nvml')} / {v.get('cuda_driver')}"),
                                           ("python / torch (CUDA)", f"{v['python']} / {v.get('torch', '–')} ({v.get('torch_cuda', '–')})")])
    add("clocks", "clocks", lambda v: [("supported SM clocks", f"{v['sm_count']}, {v['sm_min_mhz']}–{v['sm_max_mhz']} MHz"),
                                       ("memory clocks", ", ".join(map(str, v["memory_mhz"])) + " MHz")])
    add("power", "power", lambda v: [("power limit (range)", f"{_fmt(v['limit_w'], ' W', 0)} "
                                      f"({_fmt(v['range_w'][0], '', 0)}–{_fmt(v['range_w'][1], ' W', 0)}); idle now {_fmt(v['now_w'], ' W')}")])
    add("counter", "counter", lambda v: [("energy counter update period (idle)",
                                          _ms(v["period_ms"], 1) + f" (median / p99, {v['period_ms'].get('n', 0)} updates)")])
    add("read latency", "read_latency", lambda v: [
        ("energy read (median / p99)", _ms(v["energy_ms"], 3)),
        ("power read (median / p99)", _ms(v["power_ms"], 3)),
        ("instant-power field read (median / p99)", _ms(v["instant_power_ms"], 3))])
    cuda = d.get("cuda") or {}
    if cuda and not cuda.get("available"):
        rows.append(("CUDA parts", f"skipped: {cuda.get('reason')}"))

    def loads(v: dict[str, Any]) -> list[tuple[str, str]]:
        out = []
        for name, s in v.items():
            reasons = ", ".join(f"{k} {x:.0%}" for k, x in s["reasons"].items()) or "none"
            out.append((f"sustained under {name}",
                        f"SM {s['sm_mhz']['median']:.0f} MHz ({s['sm_mhz']['min']:.0f}–{s['sm_mhz']['max']:.0f}), "
                        f"{s['power_w']['median']:.0f} W, max {s['temperature_c_max']} °C; reasons: {reasons}; "
                        f"counter period {_ms(s['counter_period_ms'], 1)}"))
        return out

    add("loads", "loads", loads)
    add("stage", "stage", lambda v: [("GPT-like stage", f"{v['layers']} blocks, hidden {v['hidden']}, seq {v['seq']}, "
                                      f"microbatch {v['microbatch']}, {v['microbatches']} microbatches in 1F1B "
                                      f"({v['parameters_m']:.0f} M parameters, {v['dtype']})")])
    add("timer", "timer", lambda v: [
        ("event timer vs synchronized reference", f"forward {v['forward']['ratio']:.3f} ({v['forward']['event_ms']:.2f} vs "
         f"{v['forward']['sync_reference_ms']:.2f} ms), backward {v['backward']['ratio']:.3f} "
         f"({v['backward']['event_ms']:.2f} vs {v['backward']['sync_reference_ms']:.2f} ms)"),
        ("events' cost", f"step time ×{v['step_time_ratio_events_vs_none']:.4f}; host "
         f"{_ms(v['host_cost_us_per_begin_end'], 0, ' µs')} per begin+end; step {v['step_ms']:.1f} ms")])
    add("anchor", "anchor", lambda v: [
        ("anchor at resolve() after a sync: late by", _ms(v["resolve_anchor_late_ms"], 2)),
        ("anchor event vs spinning observer", _ms(v["anchor_event_vs_observed_ms"], 3))])
    add("run_ahead", "run_ahead", lambda v: [
        ("host run-ahead (no host sync)", f"{v['instructions']['median']:.0f} instructions (max {v['instructions']['max']:.0f}); "
         f"{v['ms']['median']:.1f} ms (max {v['ms']['max']:.1f})"),
        ("own-clock share, request at the hook (0 / 10 ms)", " / ".join(
            f"{s['instructions']:.2f}" for s in v["own_clock_share_request_at_hook"].values()))])

    def switching(v: dict[str, Any]) -> list[tuple[str, str]]:
        out = []
        for name, s in v.items():
            if not isinstance(s, dict):
                continue
            share = " / ".join(f"{x['instructions']:.2f}" for x in s["own_clock_share"].values())
            chosen = " (chosen)" if name == v.get("chosen") else ""
            out.append((f"follower: {name}{chosen}", f"delay {_ms(s['delay_us'], 0, ' µs')}; step ×{s['step_time_ratio']:.4f}; "
                        f"{s['cpu_cores']:.2f} core; own-clock share at 0 / 10 ms: {share}"))
        return out

    add("switching", "switching", switching)
    add("library_stream", "library_stream", lambda v: [
        ("perseus StreamFollower: delay after the GPU reaches a boundary", _ms(v["delay_us"], 0, " µs")),
        ("perseus GPUStepTimer: instruction span / truth", f"{v['instruction_span_ratio']['median']:.4f} "
         f"(first begin off by {v['first_begin_error_ms']['median']:+.3f} ms)"),
        ("perseus hooks' cost on the training thread", f"{v['training_thread_us_per_instruction']['median']:.1f} µs per instruction")])

    def attribution(v: dict[str, Any]) -> list[tuple[str, str]]:
        out = []
        for kind in ("forward", "backward"):
            direct = v["direct"][kind]["power_w"]
            parts = [f"direct {direct:.0f} W"]
            for name in ("anchor_event", "resolve_after_sync"):
                a = v[name][kind]
                parts.append(f"{name} {a['power_w']:.0f} ± {a['stderr_w']:.0f} W ({v[name]['error_vs_direct'][kind]:+.1%})")
            out.append((f"{kind} power: attributed vs direct", "; ".join(parts)))
        out.append(("attribution data", f"{v['steps']} steps, {v['counter_updates']} counter updates"))
        return out

    add("attribution", "attribution", attribution)

    def side_stream(v: dict[str, Any]) -> list[tuple[str, str]]:
        out = []
        for case, label in (("idle_side_stream", "end hook under an idle side stream"),
                            ("work_left_on_side_stream", "end hook under a side stream with the longer work")):
            c = v[case]
            out.append((f"instruction span, {label} (ms)",
                        f"truth {c['truth']['median']:.2f}; on the current stream {c['current_stream']['median']:.2f}, "
                        f"compute stream only {c['compute_stream']['median']:.2f}, perseus (both) "
                        f"{c['compute_stream_joined']['median']:.2f}: {'right' if c['right'] else 'WRONG'}"))
        out.append(("host: current stream read / event on the current / on a named stream", " ; ".join(
            _ms(v[k], 1, " µs") for k in ("current_stream_read_us", "record_on_current_us", "record_on_named_us"))))
        return out

    add("side streams", "side_stream", side_stream)
    add("combined 1F1B", "combined_1f1b", lambda v: [combined_row(v)])
    cc = d.get("clock_changes")
    if isinstance(cc, dict) and "error" not in cc:
        rows.extend(clock_rows(cc))
    elif isinstance(cc, dict):
        rows.append(("clock changes", f"**failed**: {cc['error']}"))
    guard = d.get("read_only_guard")
    if guard is not None:
        rows.append(("read-only guard", f"refused {len(guard['refused'])} call(s)" + (
            f": {', '.join(guard['refused'])}" if guard["refused"] else "")))
    lines = [f"| check ({d['mode']}) | result |", "|---|---|"]
    lines += [f"| {k} | {v.replace('|', '/')} |" for k, v in rows]
    lines.append(f"\n{len(d.get('errors', {}))} part(s) failed; total {d.get('total_s', '?')} s.")
    return "\n".join(lines)


def clock_rows(out: dict[str, Any]) -> list[tuple[str, str]]:
    dv = out["device"]
    sm = out["sm_clocks_mhz"]
    rows = [("clock checks on", f"{dv['name']} ({dv['architecture']}) [{out['backend']}]"),
            ("SM clocks", f"{len(sm)} from {sm[0]} down to {sm[-1]} MHz"),
            ("can set clocks", "yes" if out["can_set_clocks"] else "NO (measure-only mode)")]
    lat = out.get("lock_latency")
    if lat:
        rows.append(("lock / reset latency (median / p99)", f"{lat['lock_median_ms']:.3f} / {lat['lock_p99_ms']:.3f} ms; "
                     f"{lat['reset_median_ms']:.3f} / {lat['reset_p99_ms']:.3f} ms ({lat['reps']} reps)"))
    ec = out["energy_counter"]
    rows.append(("energy counter update period", f"median {ec['median_ms']:.1f} ms ({ec['updates']} updates)"
                 if ec.get("updates") else "did not change"))
    mm = out.get("matmul")
    if isinstance(mm, dict):
        rows.append(("matmul sweep", f"**failed**: {mm['error']}"))
    elif mm:
        rows.append(("matmul sweep (SM MHz: ms/iter, J/iter, W)", "; ".join(
            f"{r['sm_clock_mhz'] or 'default'}: {r['time_per_iter_ms']:.3f}, {r['energy_per_iter_j']:.3f}, {r['power_w']:.1f}"
            for r in mm)))
    if out.get("combined_1f1b"):
        rows.append(combined_row(out["combined_1f1b"]))
    if out.get("cleanup_error"):
        rows.append(("cleanup", out["cleanup_error"]))
    return rows


def combined_row(combined: dict[str, Any]) -> tuple[str, str]:
    units = ", ".join(f"{kind} {ms:.2f} ms" for kind, ms in sorted(combined["unit_ms"].items()))
    return (f"megatron-core combined 1F1B ({combined['streams']} streams)",
            f"hooks report {' '.join(combined['order'])}: "
            f"{'matches' if combined['order_matches'] else 'DIFFERS FROM'} megatron-combined-1f1b; units {units}")


if __name__ == "__main__":
    sys.exit(main())
