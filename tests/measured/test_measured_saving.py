"""Savings: the best measured one recomputed from the raw JSON, and the project's planned one."""

import json
import statistics

import pytest

from perseus.measured import fit_model, measured_baseline, measured_best_saving, planned_saving


def _raw_schedules(directory):
    """(time, energy, all clocks equal to the top clock) per schedule, straight from the files:
    per iteration the slowest rank's time and the ranks' summed energy, medians after the first."""
    out = {}
    for prof_path in directory.glob("*.prof.json"):
        n = int(prof_path.name.split(".")[0])
        ranks = json.loads(prof_path.read_text())
        times = [max(r["iter_time"][i] for r in ranks) for i in range(len(ranks[0]["iter_time"]))]
        energies = [sum(r["iter_energy"][i] for r in ranks) for i in range(len(ranks[0]["iter_energy"]))]
        clocks = {c for r in json.loads((directory / f"{n}.sched.json").read_text()) for c in r["power_states"]}
        out[n] = (statistics.median(times[1:]), statistics.median(energies[1:]), clocks)
    top = max(c for _, _, clocks in out.values() for c in clocks)
    return {n: (t, e, clocks == {top}) for n, (t, e, clocks) in out.items()}


@pytest.mark.parametrize("model", ["gpt3-xl", "bert-huge-uncased"])
def test_best_measured_saving_within_half_a_percent_matches_the_raw_json(workload_dirs, workloads, model):
    raw = _raw_schedules(workload_dirs[model])
    base = [(t, e) for t, e, all_max in raw.values() if all_max]
    assert len(base) == 2
    base_t, base_e = statistics.mean(t for t, _ in base), statistics.mean(e for _, e in base)
    expected = max(1 - e / base_e for t, e, _ in raw.values() if t <= base_t * 1.005)
    assert measured_best_saving(workloads[model], 0.005) == pytest.approx(expected, abs=1e-12)
    baseline = measured_baseline(workloads[model])
    assert (baseline.time_s, baseline.energy_j, baseline.schedules) == (pytest.approx(base_t), pytest.approx(base_e), (0, 1))


def test_measured_savings_agree_with_what_was_read_from_these_runs_before(workloads):
    """GPT-3 XL saves about 13 % within 0.5 %, Wide-ResNet about 4.4 %, T5 nothing (its fastest
    plan is 1.25 % slower); the baseline choice moves each by about 0.1 point."""
    assert measured_best_saving(workloads["gpt3-xl"]) == pytest.approx(0.131, abs=0.002)
    assert measured_best_saving(workloads["wide-resnet101_8"]) == pytest.approx(0.044, abs=0.002)
    assert measured_best_saving(workloads["t5-3b"]) == pytest.approx(0.0, abs=0.002)
    assert measured_best_saving(workloads["t5-3b"], 0.05) == pytest.approx(0.142, abs=0.002)


def test_planned_saving_on_the_smallest_workload(workloads):
    workload = workloads["wide-resnet101_8"]
    model = fit_model(workload)
    planned = planned_saving(model, workload)
    base = measured_baseline(workload)
    assert planned.baseline_time_s == pytest.approx(base.time_s)  # the non-compute time is calibrated on it
    assert planned.time_s <= base.time_s * (1 + 1e-9)
    assert 0.0 < planned.saving < 0.3
    assert planned.energy_j == pytest.approx(planned.baseline_energy_j * (1 - planned.saving))


def test_the_plan_for_a_slowdown_target_counts_the_non_compute_time(workloads):
    """The model's frontier carries its non-compute time, so a +0.5 % target is the job's: the
    predicted iteration, non-compute time included, is at most 0.5 % slower than the all-max one,
    and the saving is a share of the iteration's energy, the non-compute energy included."""
    from perseus.measured import model_frontier

    workload = workloads["wide-resnet101_8"]
    model = fit_model(workload)
    frontier = model_frontier(model)
    assert frontier.non_compute.time_s == pytest.approx(model.overhead_s) and model.overhead_s > 0
    at_zero, at_half = (planned_saving(model, workload, max_slowdown=x, frontier=frontier) for x in (0.0, 0.005))
    assert at_half.max_slowdown == 0.005 and at_half.slowdown <= 0.005 + 1e-12
    assert at_half.saving >= at_zero.saving
    alone = 1 - frontier.default_point().energy_j / frontier.baseline_energy_j
    assert at_zero.saving < alone  # the non-compute energy is in the iteration's, a plan saves none of it
