"""How much a MoE pipeline stage's time varies across iterations on CPU (expert-load imbalance).

A tiny megatron-core GPT (2 stages, every layer 4 experts, top-2, alltoall dispatch over 2
expert-parallel ranks, so 2 data-parallel pipelines: 4 gloo ranks) trains ``--iterations``
iterations unpadded (no simulated kernels: the CPU work is the time), hooked by perseus_megatron
with a listener that times every instruction; a forward hook on each router counts the tokens it
sends to each expert. The same model with dense MLPs runs in the same launch as the reference: its
variation is the machine's noise, what the MoE run shows beyond it is routing.

Per stage: each iteration's busy time (sum of its forwards and backwards) on each rank, its
coefficient of variation, interquartile range over the median (robust to the scheduler's outliers
on a busy machine) and max/min over iterations; per iteration the load of the busiest
expert-parallel rank against the mean (tokens its local experts receive); and the rank correlation
(Spearman) between a rank's busy time and its own experts' load across iterations: how much of the
variation routing explains. Last, what that variation does to the runtime's straggler check (a
check every ``straggler_period_steps`` = 10 iterations compares the window's median with the
expected time and acts after ``straggler_patience`` = 2 checks in a row above
``straggler_threshold`` = 5 %): windows of 10 drawn from each rank's measured iterations
(bootstrap, independent draws), the share above 5 %, and its square, the false alarms per check.

    python benchmarks/bench_moe_imbalance.py                  # 30 iterations each
    python benchmarks/bench_moe_imbalance.py --iterations 60 --microbatches 8
"""

from __future__ import annotations

import argparse
import json
import random
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES, EP, EXPERTS = 2, 2, 4


class Timer:
    """An InstructionListener that times each instruction of each step (perf_counter)."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self._begin = 0.0

    def on_step_begin(self) -> None:
        self.steps.append(0.0)

    def on_step_end(self) -> None:
        pass

    def on_instruction_begin(self, kind, microbatch, chunk=0, backward=None) -> None:
        self._begin = time.perf_counter()

    def on_instruction_end(self, kind, microbatch, chunk=0, backward=None) -> None:
        self.steps[-1] += time.perf_counter() - self._begin


def worker(out_dir: str, iterations: int, microbatches: int) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    from perseus_demo.megatron_cpu import moe_cpu_execution
    from perseus_demo.tiny_gpt import TinyGPTShape, TinyGPTTrainer, initialize_parallel
    from perseus_megatron.hooks import install_hooks

    rank = int(os.environ["RANK"])
    results = {}
    with moe_cpu_execution():
        initialize_parallel(STAGES, expert_parallel=EP)
        for name, experts in (("dense", 0), ("moe", EXPERTS)):
            torch.manual_seed(1234)
            shape = TinyGPTShape(num_layers=2 * STAGES, hidden_size=64, seq_length=64, micro_batch_size=4,
                                 num_experts=experts, expert_parallel=EP if experts else 1)
            trainer = TinyGPTTrainer(shape, STAGES)
            counts: list[list[int]] = []
            for module in trainer.model[0].modules():
                router = getattr(module, "router", None)
                if router is not None:
                    router.register_forward_hook(lambda m, args, out, counts=counts: counts[-1].__setitem__(
                        slice(None), [a + int(b) for a, b in zip(counts[-1], out[1].sum(0).tolist())]))
            timer = Timer()
            handle = install_hooks(timer)
            try:
                for _ in range(iterations + 2):
                    counts.append([0] * EXPERTS)
                    trainer.step(microbatches)
            finally:
                handle.uninstall()
            results[name] = {"busy_s": timer.steps[2:], "counts": counts[2:] if experts else []}
        stage = parallel_state.get_pipeline_model_parallel_rank()
        ep_rank = parallel_state.get_expert_model_parallel_rank()
    row = {"rank": rank, "stage": stage, "ep_rank": ep_rank, **results}
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, row)
    if rank == 0:
        Path(out_dir, "results.json").write_text(json.dumps(gathered))
    dist.destroy_process_group()


def _ranks(values: list[float]) -> list[int]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0] * len(values)
    for position, index in enumerate(order):
        ranks[index] = position
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = _ranks(a), _ranks(b)
    return statistics.correlation(ra, rb) if len(set(ra)) > 1 and len(set(rb)) > 1 else float("nan")


def own_load(rows: list[dict], row: dict) -> list[int]:
    """Tokens ``row``'s local experts receive per iteration from every rank of its stage."""
    group = [r for r in rows if r["stage"] == row["stage"]]
    per_ep = EXPERTS // EP
    first = row["ep_rank"] * per_ep
    return [sum(r["moe"]["counts"][i][e] for r in group for e in range(first, first + per_ep))
            for i in range(len(row["moe"]["counts"]))]


def false_alarm(busy: list[float], period: int = 10, threshold: float = 0.05, draws: int = 20000) -> float:
    """Share of ``period``-iteration windows (drawn with replacement) whose median is more than
    ``threshold`` above the series' median: one straggler check's false positive rate."""
    rng = random.Random(0)
    middle = statistics.median(busy)
    return sum(statistics.median(rng.choices(busy, k=period)) > middle * (1 + threshold) for _ in range(draws)) / draws


def report(rows: list[dict]) -> str:
    lines = [f"{'run':<6}{'stage':>6}{'rank':>5}{'median busy':>13}{'CV':>7}{'IQR/med':>9}{'max/min':>9}"
             f"{'time~load':>11}{'check >5%':>11}{'2 in a row':>12}"]
    for name in ("dense", "moe"):
        for row in sorted(rows, key=lambda r: (r["stage"], r["rank"])):
            busy = row[name]["busy_s"]
            cv = statistics.pstdev(busy) / statistics.mean(busy)
            q = statistics.quantiles(busy, n=4)
            corr = f"{spearman(busy, own_load(rows, row)):>11.2f}" if name == "moe" else f"{'':>11}"
            alarm = false_alarm(busy)
            lines.append(f"{name:<6}{row['stage']:>6}{row['rank']:>5}{1e3 * statistics.median(busy):>11.1f}ms"
                         f"{100 * cv:>6.1f}%{100 * (q[2] - q[0]) / statistics.median(busy):>8.1f}%"
                         f"{max(busy) / min(busy):>9.2f}{corr}{100 * alarm:>10.1f}%{100 * alarm ** 2:>11.2f}%")
    lines.append("\nexpert load per iteration (tokens the rank's local experts receive, from every rank of its "
                 "expert-parallel group): busiest rank / mean")
    per_ep = EXPERTS // EP
    for stage in sorted({r["stage"] for r in rows}):
        group = [r for r in rows if r["stage"] == stage]
        # expert-parallel groups: ranks of one stage sharing experts (here all of the stage's ranks)
        iterations = len(group[0]["moe"]["counts"])
        ratios = []
        for i in range(iterations):
            load = [sum(r["moe"]["counts"][i][e] for r in group) for e in range(EXPERTS)]
            per_rank = [sum(load[k * per_ep:(k + 1) * per_ep]) for k in range(EP)]
            ratios.append(max(per_rank) / statistics.mean(per_rank))
        lines.append(f"  stage {stage}: median {statistics.median(ratios):.3f}, max {max(ratios):.3f} "
                     f"over {iterations} iterations")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))
        return
    out = tempfile.mkdtemp(prefix="perseus-moe-")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={STAGES * EP}",
           str(Path(__file__).resolve()), "--worker", out, str(args.iterations), str(args.microbatches)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    rows = json.loads(Path(out, "results.json").read_text())
    print(f"megatron-core tiny GPT, {STAGES} stages x {args.microbatches} microbatches, {EXPERTS} experts top-2, "
          f"EP {EP} (alltoall over gloo), {args.iterations} iterations each, 4 CPU ranks, unpadded")
    print(report(rows))


if __name__ == "__main__":
    main()
