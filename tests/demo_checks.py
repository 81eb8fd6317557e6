"""What a framework demo run must show, checked on what does not depend on how busy the machine is.

Each result is one rank's ``rankN.json`` from ``perseus_demo.megatron_demo`` or
``perseus_demo.deepspeed_demo``: per-iteration records (phase label, wall time, energy counter,
and every instruction with the SM clock the simulated GPU held when its work ended) and the
runtime summary (events with the step they took effect).

Wall-clock time and the energy counter depend on everything else running on the machine (four
trainers and four controller processes already share two cores in these tests), so the checks
here are on what the run *decided and did*, and on the simulator's accounting of it:

- the plan deployed is a point of the frontier the runtime planned and cached, and every deployed
  iteration executed exactly that plan's instructions, in order;
- the simulated GPUs really ran at the planned clocks (``APPLIED_SHARE`` of the instructions; the
  clock switch is asynchronous, so an instruction may end before a late switch lands);
- evaluated in ``perseus.timeline.simulator`` on the simulated GPU's own DVFS model (the ground truth the
  measured profile approximates), the deployed plan uses less energy than all-max clocks, and it
  is no slower than its profile allows: a plan no slower than all-max on the measured profile is
  at most ``max(r) / min(r)`` slower on the true one, r being the true/measured time ratios of the
  profiled instructions. (On a quiet machine r is 1 and the bound is tight; on a busy one the
  instructions' CPU work can outlast their nominal kernel time and the bound widens with it.)
- the straggler policy's decisions follow from the slowdowns it observed (replayed through
  ``StragglerPolicy``), it matched the straggler while it lasted and came back after.

Measured savings and iteration times (wall clock, A/B/A) are reported by
``benchmarks/bench_demo.py``, not asserted here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any, Iterable

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.frontier import Frontier, FrontierPoint, load_frontier
from perseus.gpu.sim.dvfs import get_preset
from perseus.planner.handoff import sending_keys, with_handoff
from perseus.profile import InstructionProfile, Profile, load_json
from perseus.profile.unlocked import Unlocked, is_unlocked
from perseus.runtime.port.clock_trace import InstructionTrace, from_dict, kernel_on_model
from perseus.runtime.clocks.straggler import StragglerPolicy
from perseus.timeline.simulator import longest_path_finish, max_frequency_plan, simulate_plan
from perseus_demo.common import DEFAULT_PERSEUS, PROBE_PHASE, DemoSettings

# Share of deployed instructions that must end at their planned clock: the switch is asynchronous,
# so a late one can miss a short instruction (docs/reliability.md has the measured shares); a
# broken request path gives about 1/len(clocks).
APPLIED_SHARE = 0.75
# The deployed plan must save at least this much energy on the true model (measured: 10-20 %)
# where the measured profile describes the simulated GPU: its times within FAITHFUL_PROFILE of the
# true model's (``slowdown_bound``). Beyond that the host's CPU work outlasted the nominal kernel
# times (a busy machine: a loaded suite's MoE profile was 2x off, and its plan saved 2.5-2.8 %):
# the profile describes a host-bound run, whose plan the true model cannot judge; it must still
# save energy there.
MIN_SAVING = 0.03
FAITHFUL_PROFILE = 0.5

# 1.5x for 23 deployed steps (7 checks): a 1.3x straggler for 14 steps went unnoticed once beside
# two busy processes (the noise in the medians reset the patience), which is the policy working.
STRAGGLER = {"dp_rank": 1, "factor": 1.5, "start": 3, "stop": 26, "recovery_steps": 30}
# check every 3 deployed iterations (median of the 3), act after 2 checks in a row
PERSEUS = {**DEFAULT_PERSEUS, "warmup_steps": 4, "straggler_period_steps": 3, "straggler_patience": 2,
           "straggler_threshold": 0.15, "straggler_recover_threshold": 0.08}


def run_truth(cfg: DemoSettings, cache_dir: Path) -> Profile:
    """The true model of the run: ``true_profile`` plus the hand-off between stages the runtime
    measured on its warm-up steps and planned with (the frontier's ``handoff_s``, charged to the
    instructions another stage waits for: ``perseus.planner.handoff``). The demos hand their
    outputs over through gloo and the framework's host code between the hooks, which no
    instruction's kernel contains; a plan judged on a model without it is judged on a pipeline
    that does not exist (a plan no slower with the hand-offs can read +0.1-0.3 % there)."""
    frontier = cached_frontier(cache_dir)
    truth = true_profile(cfg, cached_profile(cache_dir).entries)
    return with_handoff(truth, float(frontier.metadata.get("handoff_s", 0.0)), sending_keys(frontier.schedule))


def true_profile(cfg: DemoSettings, keys: Iterable[tuple[int, int, str]]) -> Profile:
    """The (stage, chunk, kind)s ``keys`` at every clock of the simulated GPU, from its DVFS model.

    What the demo's ``SimulatedCompute`` makes the simulated GPU do, without CPU noise: each
    instruction's max-clock time is its nominal time (``cfg.nominal_s``), stretched and powered
    by the model. ``keys``: the measured profile's, so every framework's kinds and chunks are covered.
    """
    model = get_preset(cfg.sim_gpu["preset"])
    clocks = model.supported_sm_clocks()
    runs = [model.throttled_clock(f, 1.0, model.tdp_w) for f in clocks]
    unlocked_runs = model.throttled_clock(model.sm_max_mhz, 1.0, model.tdp_w)  # no lock: the card's own DVFS
    entries = {}
    for stage, chunk, kind in keys:
        nominal = cfg.nominal_s(stage)[kind]
        entries[(stage, chunk, kind)] = InstructionProfile(
            tuple(clocks), tuple(model.kernel_time_s(nominal, f) for f in runs),
            tuple(model.kernel_energy_j(nominal, f) for f in runs),
            Unlocked(model.kernel_time_s(nominal, unlocked_runs), model.kernel_energy_j(nominal, unlocked_runs),
                     unlocked_runs))
    return Profile(entries, model.p_blocking_w, model.name)


def cached_profile(cache_dir: Path) -> Profile:
    return load_json(next(Path(cache_dir).glob("*/profile.json")))


def cached_frontier(cache_dir: Path) -> Frontier:
    found = sorted(Path(cache_dir).glob("*/frontier.json"))
    assert len(found) == 1, f"expected one cached frontier in {cache_dir}, found {found}"
    return load_frontier(found[0])


def find_point(frontier: Frontier, time_s: float, energy_j: float) -> FrontierPoint:
    """The frontier point (own-pace or paced) with this planned time and energy."""
    for point in [*frontier.points, *frontier.paced_points]:
        if np.isclose(point.time_s, time_s, rtol=1e-9) and np.isclose(point.energy_j, energy_j, rtol=1e-9):
            return point
    raise AssertionError(f"no frontier point at {time_s} s, {energy_j} J")


@dataclass
class Accounting:
    """The deployed plan against all-max clocks on the true model (one pipeline, one iteration)."""

    plan_time_s: float
    plan_energy_j: float
    max_time_s: float
    max_energy_j: float
    applied_share: float
    slowdown_bound: float  # what the measured profile's errors allow (see the module docstring)
    # The same iterations with the clocks the GPUs actually held (median over the steps): late
    # clock switches show up here, host noise (hooks, the controller, a busy machine) does not.
    applied_time_s: float = 0.0
    applied_energy_j: float = 0.0

    @property
    def applied_slowdown(self) -> float:
        return self.applied_time_s / self.max_time_s - 1.0

    @property
    def saving(self) -> float:
        return 1.0 - self.plan_energy_j / self.max_energy_j

    @property
    def slowdown(self) -> float:
        return self.plan_time_s / self.max_time_s - 1.0

    def __str__(self) -> str:
        return (f"true model: plan {self.plan_time_s * 1e3:.2f} ms {self.plan_energy_j:.2f} J vs all-max "
                f"{self.max_time_s * 1e3:.2f} ms {self.max_energy_j:.2f} J (saving {100 * self.saving:.1f} %, "
                f"time {100 * self.slowdown:+.2f} %, profile errors allow {100 * self.slowdown_bound:+.2f} %); "
                f"clocks applied as planned: {100 * self.applied_share:.1f} % (as applied: time "
                f"{100 * self.applied_slowdown:+.2f} %)")


def default_clock_mhz(cfg: DemoSettings) -> int:
    """The clock the simulated GPU reports set with no lock (default clocks): its max clock, which
    its own DVFS then throttles under the power limit, as ``true_profile``'s ``Unlocked`` runs."""
    return get_preset(cfg.sim_gpu["preset"]).sm_max_mhz


def applied_share(results: list[dict[str, Any]], frontier: Frontier, point: FrontierPoint,
                  steps: list[int], default_mhz: int) -> float:
    """Share of the instructions of ``steps`` that ended at ``point``'s planned clock.

    An instruction planned unlocked (``UNLOCKED_MHZ``: default clocks) ran as planned where the GPU
    held no lock: the clock recorded is then the GPU's default one, ``default_mhz``.

    Also checks what is exact: each of those iterations executed the stage plan's instructions
    in the planned order.
    """
    hits = total = 0
    for result in results:
        plan = frontier.stage_plan(point, result["stage"])
        want = [[inst.kind, inst.microbatch, inst.chunk] for inst, _ in plan]
        by_step = {rec["step"]: rec for rec in result["steps"]}
        for step in steps:
            executed = by_step[step]["instructions"]
            assert [i[:3] for i in executed] == want, f"rank {result['rank']} step {step}: executed order differs from the plan"
            hits += sum(i[3] == (default_mhz if is_unlocked(f) else f) for i, (_, f) in zip(executed, plan))
            total += len(plan)
    assert total, "no deployed instructions to check"
    return hits / total


def slowdown_bound(measured: Profile, truth: Profile) -> float:
    """How much slower than all-max a plan that is no slower on ``measured`` can be on ``truth``."""
    ratios = [truth.get(stage, kind, chunk).at(f)[0] / t
              for (stage, chunk, kind), entry in measured.entries.items()
              for f, t in zip(entry.freqs_mhz, entry.times_s)]
    return max(ratios) / min(ratios) - 1.0


def account(results: list[dict[str, Any]], cfg: DemoSettings, cache_dir: Path, point: FrontierPoint,
            steps: list[int]) -> Accounting:
    """Check the plan was executed (order, clocks) in ``steps`` and account it on the true model."""
    frontier = cached_frontier(cache_dir)
    measured = cached_profile(cache_dir)
    truth = run_truth(cfg, cache_dir)
    dag = InstructionDAG.from_schedule(frontier.schedule)
    plan = simulate_plan(dag, truth, point.freqs_mhz)
    base = simulate_plan(dag, truth, max_frequency_plan(dag, truth))
    applied = [simulate_plan(dag, truth, clocks) for clocks in applied_clocks(results, frontier, steps)]
    return Accounting(plan.time_s, plan.energy_j, base.time_s, base.energy_j,
                      applied_share(results, frontier, point, steps, default_clock_mhz(cfg)),
                      slowdown_bound(measured, true_profile(cfg, measured.entries)),
                      median(a.time_s for a in applied), median(a.energy_j for a in applied))


def applied_clocks(results: list[dict[str, Any]], frontier: Frontier, steps: list[int]) -> list[np.ndarray]:
    """Per step, the clock each instruction ended at, in the DAG's stage-major order (one replica)."""
    stages = {r["stage"]: r for r in sorted(results, key=lambda r: r["dp_rank"], reverse=True)}
    out = []
    for step in steps:
        clocks: list[int] = []
        for stage in range(frontier.schedule.num_stages):
            rec = next(x for x in stages[stage]["steps"] if x["step"] == step)
            clocks.extend(i[3] for i in rec["instructions"])
        out.append(np.array(clocks))
    return out


def traced_steps(results: list[dict[str, Any]], phase: str) -> dict[int, list[InstructionTrace]]:
    """The clock-traced instructions (``trace_clocks``) of every step of ``phase`` (the trace's
    label: ``deployed``, ``stopped`` for default clocks again) that every stage traced, in the
    DAG's stage-major node order (one pipeline)."""
    stages: dict[int, dict[int, list[InstructionTrace]]] = {}
    for r in sorted(results, key=lambda r: r["dp_rank"], reverse=True):
        insts, steps = from_dict(r["summary"]["clock_trace"])
        chosen = {st.step for st in steps if st.phase == phase}
        rows: dict[int, list[InstructionTrace]] = {}
        for i in insts:
            if i.step in chosen:
                rows.setdefault(i.step, []).append(i)
        stages[r["stage"]] = rows
    common = set.intersection(*(set(rows) for rows in stages.values()))
    return {step: [i for s in sorted(stages) for i in stages[s][step]] for step in sorted(common)}


def traced_on_model(results: list[dict[str, Any]], cfg: DemoSettings, cache_dir: Path, phase: str) -> tuple[float, float]:
    """Median iteration (time, energy) of ``phase`` on the simulated GPU's own model, from the clock
    traces: each kernel's nominal work at the clocks it really had, a switch landing inside it
    included (``clock_trace.kernel_on_model``), the iteration as the kernels' longest path through
    the schedule's DAG, blocking power while a stage waits. Independent of how busy the machine was,
    except for where the switches landed in the kernels."""
    frontier = cached_frontier(cache_dir)
    dag = InstructionDAG.from_schedule(frontier.schedule)
    truth = run_truth(cfg, cache_dir)
    times, energies = [], []
    for nodes in traced_steps(results, phase).values():
        model = [kernel_on_model(i, truth.get(stage, i.kind, i.chunk).at) for stage, i in zip(dag.node_stage.tolist(), nodes)]
        durations = np.array([t for t, _ in model])
        finish = float(longest_path_finish(dag, durations).max())
        times.append(finish)
        energies.append(sum(e for _, e in model) + truth.p_blocking_w * (dag.schedule.num_stages * finish - durations.sum()))
    assert times, f"no traced steps of phase {phase!r}"
    return median(times), median(energies)


def steps_in(result: dict[str, Any], phase: str) -> list[int]:
    return [rec["step"] for rec in result["steps"] if rec["phase"] == phase]


def check_deployed_demo(results: list[dict[str, Any]], cfg: DemoSettings, cache_dir: Path) -> Accounting:
    """The no-slowdown plan was deployed everywhere, executed as planned, and saves energy on the true model."""
    frontier = cached_frontier(cache_dir)
    point = frontier.default_point()
    for result in results:
        summary = result["summary"]
        assert summary["phase"] == "deployed" and summary["fallback"] is None, summary
        assert find_point(frontier, **summary["point"]) is point, "every rank runs the default (no-slowdown) point"
    deployed = steps_in(results[0], "deployed")  # the plan's steps; the runtime's default-clock probes apart
    probes = steps_in(results[0], PROBE_PHASE)
    assert len(deployed) + len(probes) == cfg.deployed_steps, (deployed, probes)
    assert all(steps_in(r, "deployed") == deployed and steps_in(r, PROBE_PHASE) == probes for r in results)
    acc = account(results, cfg, cache_dir, point, deployed)
    check_accounting(acc)
    return acc


def check_accounting(acc: Accounting) -> None:
    assert acc.applied_share >= APPLIED_SHARE, str(acc)
    assert acc.saving >= (MIN_SAVING if acc.slowdown_bound <= FAITHFUL_PROFILE else 0.0), str(acc)
    assert acc.slowdown <= acc.slowdown_bound + 1e-9, str(acc)


# ---------------------------------------------------------------- data-parallel straggler

def run_straggler_demo(config_cls: Any, launch: Any, tmp_path: Path) -> tuple[list[dict[str, Any]], Any]:
    """A framework demo with 2 stages × DP 2, the full Perseus path, and ``STRAGGLER``."""
    cfg = config_cls(stages=2, microbatches=4, dp_size=2, straggler=STRAGGLER, max_steps=1000, deployed_steps=36,
                     rebaseline_steps=4, perseus={**PERSEUS, "cache_dir": str(tmp_path / "cache"),
                                                  # the straggler's pace is checked on every deployed step:
                                                  # no default-clock probe among them (the guard has its own tests)
                                                  "probe_every_steps": 0})
    return launch(cfg, tmp_path / "run", timeout_s=600), cfg


def replay_policy(events: list[Any], config: dict[str, Any]) -> list[float]:
    """The ratio changes ``StragglerPolicy`` makes on the observed slowdowns, in order."""
    policy = StragglerPolicy(config["straggler_threshold"], config["straggler_recover_threshold"],
                             config["straggler_patience"])
    changes = []
    for _, what, data in events:
        if what == "slowdown_seen":
            before = policy.ratio
            if policy.observe(data) != before:
                changes.append(policy.ratio)
    return changes


def slowdown_by_step(result: dict[str, Any]) -> dict[int, float]:
    """The frontier point's slowdown in force at every recorded iteration of one rank."""
    changes = {step: data["slowdown"] for step, what, data in result["summary"]["events"] if what == "point"}
    current, out = 1.0, {}
    for rec in result["steps"]:
        current = changes.get(rec["step"], current)
        out[rec["step"]] = current
    return out


def check_straggler_run(results: list[dict[str, Any]], cfg: DemoSettings, straggler: dict[str, Any] = STRAGGLER) -> None:
    slow_dp = straggler["dp_rank"]
    others = [r for r in results if r["dp_rank"] != slow_dp]
    stragglers = [r for r in results if r["dp_rank"] == slow_dp]
    assert others and stragglers
    frontier = cached_frontier(Path(cfg.perseus["cache_dir"]))

    # 1. Every decision follows from what the policy observed; the straggler itself never slows.
    for r in results:
        events = r["summary"]["events"]
        decided = [data for _, what, data in events if what == "straggler"]
        assert decided == replay_policy(events, cfg.perseus), events
    # The straggler itself never slows down while it is the slow one. (Outside its window both
    # replicas run alike, and on a busy machine noise can look like a straggler to either: what
    # the policy does with that is the replay above.)
    window = sorted({rec["step"] for rec in stragglers[0]["steps"] if rec["phase"].endswith("(straggler)")})
    for r in stragglers:
        adopted = [(step, ratio) for step, what, ratio in r["summary"]["events"]
                   if what == "straggler" and ratio > 1.0 and window[0] <= step <= window[-1]]
        assert not adopted, f"the straggler itself must not slow down: {adopted}"

    # 2. The other replica matched the 1.5x straggler while it lasted (every rank at the same
    # iterations, after measured evidence), and came back to no slowdown after it recovered.
    window = sorted({rec["step"] for rec in others[0]["steps"] if rec["phase"].endswith("(straggler)")})
    assert len(window) == straggler["stop"] - straggler["start"], window
    slowed = [slowdown_by_step(r) for r in others]
    assert all(s == slowed[0] for s in slowed)
    # (that a switch had evidence is the replay above: decisions follow the observed slowdowns)
    switched = [step for step in window if slowed[0][step] > 1.0]
    assert switched, "the other replica never matched the straggler while it lasted"
    ratios = [data for _, what, data in others[0]["summary"]["events"] if what == "straggler"]
    # the pace it matched: a measured ratio (wall clock), so only a sanity band around the 1.5x
    # straggler (1.24-1.66 seen under load); that it follows the observations is checked above
    assert 1.15 < ratios[0] < 2.5, ratios
    assert ratios[-1] == 1.0 and slowed[0][max(slowed[0])] == 1.0, f"no recovery after the straggler: {ratios}"

    # 3. While matched, the other replica ran the paced point it chose (order and clocks), and that
    # point, held to the straggler's pace, uses less energy than the no-slowdown plan waiting for it.
    matched_at = next(step for step, what, _ in others[0]["summary"]["events"] if what == "point")
    data = next(d for _, what, d in others[0]["summary"]["events"] if what == "point")
    point = find_point(frontier, data["time_s"], data["energy_j"])
    matched = [s for s in window if s >= matched_at and slowed[0][s] == data["slowdown"]]
    assert matched, (matched_at, window)
    share = applied_share(others, frontier, point, matched, default_clock_mhz(cfg))
    assert share >= APPLIED_SHARE, f"matched plan's clocks applied: {100 * share:.1f} %"
    pace = frontier.default_point().time_s * ratios[0]
    assert frontier.paced_energy_j(point, pace) < frontier.paced_energy_j(frontier.default_point(), pace)
    truth = run_truth(cfg, Path(cfg.perseus["cache_dir"]))
    dag = InstructionDAG.from_schedule(frontier.schedule)
    true_pace = simulate_plan(dag, truth, max_frequency_plan(dag, truth)).time_s * straggler["factor"]
    matched_true = simulate_plan(dag, truth, point.freqs_mhz)
    default_true = simulate_plan(dag, truth, frontier.default_point().freqs_mhz)

    def paced(sim: Any) -> float:  # energy of one pipeline's iteration held to the straggler's pace
        return sim.energy_j + truth.p_blocking_w * frontier.schedule.num_stages * max(true_pace - sim.time_s, 0.0)

    assert paced(matched_true) < paced(default_true), (paced(matched_true), paced(default_true))

    # 4. Intrinsic: the no-slowdown plan outside the window, on the true model.
    deployed = [s for s in steps_in(others[0], "deployed") if slowed[0][s] == 1.0]
    acc = account(results, cfg, Path(cfg.perseus["cache_dir"]), frontier.default_point(), deployed)
    check_accounting(acc)
    print(f"straggler matched at ratio {ratios[0]:.3f} (decisions {ratios}); matched-plan clocks applied "
          f"{100 * share:.1f} %; paced energy on the true model {paced(default_true):.3f} -> {paced(matched_true):.3f} J"
          f"/iteration per pipeline; no-slowdown plan: {acc}")
