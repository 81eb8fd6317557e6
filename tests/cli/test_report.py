"""perseus report: one self-contained HTML page from a metrics file (or demo results) and the cache.

Inputs are built here: a synthetic metrics JSONL (warm-up, profiling, planning, two deployed
points, a straggler switch) and a frontier planned on the shipped example profile, so no torchrun
is needed. The page is checked structurally: sections, embedded images that decode as PNG and
equal the files next to it, and table numbers equal to what the test computes from the input.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from statistics import median, quantiles

import pytest

from perseus.cli import main
from perseus.examples import load_example_profile
from perseus.frontier import Frontier
from perseus.output.run_data import load_run
from perseus.output.run_stats import used_points
from perseus.planner import PlannerOptions, plan_frontier
from perseus.schedules import build_schedule
from perseus.frontier import save_frontier
from perseus_demo import job_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WARMUP_E = [100.0, 104.0, 98.0, 101.0]
WARMUP_T = [0.200, 0.210, 0.198, 0.202]
DEPLOYED_E = [88.0, 90.5, 87.0, 89.0, 91.0, 86.5]
DEPLOYED_T = [0.203, 0.205, 0.201, 0.204, 0.206, 0.202]
SLOW_E = [84.0, 83.5, 85.0]
SLOW_T = [0.240, 0.238, 0.242]


@pytest.fixture(scope="module")
def frontier() -> Frontier:
    schedule = build_schedule("1f1b", 4, 4)
    return plan_frontier(schedule, load_example_profile(), PlannerOptions(num_anchors=8, num_deadlines=64,
                         improve_sweeps=0, search_time_s=0, beam_width=0))


def _write_cache(root: Path, frontier: Frontier) -> Path:
    entry = root / "cache" / "0123456789abcdef"
    entry.mkdir(parents=True)
    save_frontier(frontier, entry / "frontier.json")
    load_example_profile().save_json(entry / "profile.json")
    return entry


def _step(step, phase, t, e, freq=None, target=None, slowdown=1.0):
    return {"step": step, "phase": phase, "time_s": t, "energy_j": e, "freq_mhz": freq, "target_time_s": target,
            "slowdown": slowdown, "baseline_time_s": None, "baseline_energy_j": None, "saving": None}


def _metrics_lines(frontier: Frontier) -> list[dict]:
    default = frontier.default_point()
    slow = frontier.points[len(frontier.points) // 2]
    lines, step = [], 0
    for t, e in zip(WARMUP_T, WARMUP_E):
        lines.append(_step(step, "warmup", t, e)); step += 1
    lines.append({"event": "phase", "step": step, "data": "profiling"})
    for freq in (1410, 1410, 1200, 1200):
        lines.append(_step(step, "profiling", 0.2 * 1410 / freq, 80.0, freq=freq)); step += 1
    lines.append({"event": "profiled", "step": step, "data": [1410, 1200]})
    lines.append({"event": "phase", "step": step, "data": "planning"})
    for _ in range(2):
        lines.append(_step(step, "planning", 0.2, 101.0)); step += 1
    lines.append({"event": "phase", "step": step, "data": "deployed"})
    for t, e in zip(DEPLOYED_T, DEPLOYED_E):
        lines.append(_step(step, "deployed", t, e, target=default.time_s)); step += 1
    lines.append({"event": "slowdown_seen", "step": step, "data": 1.2})
    lines.append({"event": "straggler", "step": step, "data": 1.2})
    ratio = slow.time_s / default.time_s
    lines.append({"event": "point", "step": step,
                  "data": {"time_s": slow.time_s, "energy_j": slow.energy_j, "slowdown": ratio}})
    for t, e in zip(SLOW_T, SLOW_E):
        lines.append(_step(step, "deployed", t, e, target=slow.time_s, slowdown=ratio)); step += 1
    return lines


@pytest.fixture
def run_dir(tmp_path: Path, frontier: Frontier) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in _metrics_lines(frontier)))
    _write_cache(run, frontier)
    return run


def _cells(page: str, table: str) -> dict[str, float]:
    body = re.search(rf'<table id="{table}">(.*?)</table>', page, re.S)
    assert body, f"no table {table}"
    return {k: float(v) for k, v in re.findall(r'data-key="([^"]+)" data-value="([^"]+)"', body.group(1))}


def _images(page: str) -> dict[str, bytes]:
    found = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="[^"]*" data-file="([^"]+)"', page)
    return {name: base64.b64decode(data, validate=True) for data, name in found}


def test_report_of_a_metrics_file_has_every_section_and_the_numbers_of_the_input(run_dir, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    page = out.read_text()
    for section in ("saving", "iterations", "frontier", "timeline", "phase-table", "events"):
        assert f"id='{section}'" in page, section
    images = _images(page)
    assert set(images) == {"page-iterations.png", "page-frontier.png", "page-timeline.png"}
    for name, png in images.items():
        assert png.startswith(PNG_MAGIC)
        assert (tmp_path / name).read_bytes() == png  # the files next to the page are the embedded ones
    assert "src=\"http" not in page and "<script" not in page  # self-contained

    cells = _cells(page, "comparison")
    deployed_e, deployed_t = DEPLOYED_E + SLOW_E, DEPLOYED_T + SLOW_T
    base_e, base_t = median(WARMUP_E), median(WARMUP_T)
    savings = [1 - e / base_e for e in deployed_e]
    q1, _, q3 = quantiles(savings, n=4, method="inclusive")
    assert cells["baseline_iterations"] == len(WARMUP_E)
    assert cells["deployed_iterations"] == len(deployed_e)
    assert cells["baseline_energy_median_j"] == pytest.approx(base_e)
    assert cells["baseline_time_median_s"] == pytest.approx(base_t)
    assert cells["deployed_energy_median_j"] == pytest.approx(median(deployed_e))
    assert cells["saving_median"] == pytest.approx(1 - median(deployed_e) / base_e)
    assert cells["saving_median"] == pytest.approx(median(savings))
    assert cells["saving_iqr"] == pytest.approx(q3 - q1)
    assert cells["time_change_median"] == pytest.approx(median(deployed_t) / base_t - 1)
    assert cells["deployed_energy_range"] == pytest.approx(max(deployed_e) - min(deployed_e))

    phases = re.findall(r"<tr><td>([a-z ]+)</td><td data-key=\"iterations\" data-value=\"(\d+)\"", page)
    assert phases == [("warmup", "4"), ("profiling", "4"), ("planning", "2"), ("deployed", "9")]
    assert "straggler" in re.search(r'<table id="events">(.*?)</table>', page, re.S).group(1)


def test_the_frontier_marks_the_points_the_run_deployed(run_dir, frontier):
    data = load_run(run_dir)
    used = used_points(data)
    slow = frontier.points[len(frontier.points) // 2]
    assert [(p.time_s, n) for p, n, _ in used] == [(frontier.default_point().time_s, 6), (slow.time_s, 3)]
    assert not data.notes


def test_report_default_output_and_without_a_cache(tmp_path, frontier):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in _metrics_lines(frontier)))
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert set(_images(page)) == {"report-iterations.png"}  # no frontier, no timeline: said so
    assert "no frontier.json" in page and "id='saving'" in page


def _rank_result(rank: int, phases: list[tuple[str, float, float]]) -> dict:
    steps = [{"phase": p, "time_s": t, "energy_j": e, "step": i,
              "instructions": [["forward", 0, 0, 1410 if p != "profiling" else 1200]]}
             for i, (p, t, e) in enumerate(phases)]
    summary = {"events": [[1, "phase", "profiling"], [2, "phase", "deployed"]], "point": None}
    return {"rank": rank, "stage": rank, "dp_rank": 0, "steps": steps, "summary": summary}


def test_report_of_a_demo_directory_sums_energy_and_takes_the_slowest_rank(tmp_path, capsys):
    run = tmp_path / "demo"
    run.mkdir()
    r0 = [("warmup", 0.2, 50.0), ("profiling", 0.25, 40.0), ("deployed", 0.21, 45.0), ("deployed", 0.22, 44.0),
          ("deployed", 0.2, 46.0), ("baseline again", 0.2, 52.0), ("baseline again", 0.19, 51.0)]
    r1 = [(p, t + 0.01 * (i % 2), e + 10) for i, (p, t, e) in enumerate(r0)]
    (run / "rank0.json").write_text(json.dumps(_rank_result(0, r0)))
    (run / "rank1.json").write_text(json.dumps(_rank_result(1, r1)))
    assert main(["report", str(run)]) == 2  # the library reads metrics files only, and says how to convert
    assert "python -m perseus_demo.job_metrics" in _error(capsys)
    assert job_metrics.main([str(run)]) == 0  # what the demo does after every run
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    cells = _cells(page, "comparison")
    base_e = median([a[2] + b[2] for a, b in zip(r0[5:], r1[5:])])  # "baseline again" is the baseline
    plan_e = [a[2] + b[2] for a, b in zip(r0[2:5], r1[2:5])]
    plan_t = [max(a[1], b[1]) for a, b in zip(r0[2:5], r1[2:5])]
    assert cells["baseline_energy_median_j"] == pytest.approx(base_e)
    assert cells["deployed_time_median_s"] == pytest.approx(median(plan_t))
    assert cells["saving_median"] == pytest.approx(1 - median(plan_e) / base_e)
    assert "baseline again" in page and "sum over 2 ranks" in page
    assert load_run(run).steps[1].freq_mhz == 1200  # profiling clock read from the instructions


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("perseus: error: ") and err.count("\n") == 1, err
    return err


def test_report_errors_are_one_line(tmp_path, run_dir, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such directory" in _error(capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert "no metrics file" in _error(capsys)

    metrics = run_dir / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 99, "phase": "deployed", "time_s": 0.2\n')
    assert main(["report", str(run_dir)]) == 2
    assert f"{metrics}:" in _error(capsys)
    assert not (run_dir / "report.html").exists()

    metrics.write_text('{"step": 0, "phase": "warmup", "time_s": "fast", "energy_j": 1.0}\n')
    assert main(["report", str(run_dir)]) == 2
    assert "time_s must be a finite number" in _error(capsys)

    metrics.write_text(json.dumps(_step(0, "warmup", 0.2, 100.0)) + "\n")
    frontier_file = next((run_dir / "cache").glob("*/frontier.json"))
    frontier_file.write_text("{not json")
    assert main(["report", str(run_dir)]) == 2
    assert "frontier.json" in _error(capsys)

    (empty / "rank0.json").write_text("[1, 2]")
    assert job_metrics.main([str(empty)]) == 2
    assert "rank0.json" in _error(capsys)


def test_demo_deployed_steps_follow_the_point_events(tmp_path, frontier):
    run = tmp_path / "demo"
    run.mkdir()
    _write_cache(run, frontier)
    slow = frontier.points[len(frontier.points) // 2]
    phases = [("warmup", 0.2, 50.0), ("deployed", 0.2, 45.0), ("deployed (straggler)", 0.25, 44.0),
              ("deployed (straggler)", 0.25, 43.0), ("deployed", 0.2, 45.0)]
    result = _rank_result(0, phases)
    result["summary"]["events"] = [[2, "straggler", 1.2], [2, "point", {"time_s": slow.time_s, "energy_j": slow.energy_j}],
                                   [4, "point", {"time_s": frontier.default_point().time_s, "energy_j": 1.0}]]
    (run / "rank0.json").write_text(json.dumps(result))
    job_metrics.main([str(run)])
    data = load_run(run)
    default = frontier.default_point().time_s
    assert [s.target_time_s for s in data.steps] == [None, default, slow.time_s, slow.time_s, default]
    assert [(p.time_s, n) for p, n, _ in used_points(data)] == [(default, 2), (slow.time_s, 2)]
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert set(_images(page)) == {"report-iterations.png", "report-frontier.png", "report-timeline.png"}
    assert "deployed (straggler)" in re.search(r'<table id="phases">(.*?)</table>', page, re.S).group(1)


def test_a_shared_cache_gives_the_frontier_that_holds_the_runs_planned_times(run_dir, frontier):
    import os

    from cli_helpers import hand_frontier

    other = run_dir / "cache" / "fedcba9876543210"
    other.mkdir()
    save_frontier(hand_frontier(), other / "frontier.json")  # another job's, and newer
    os.utime(other / "frontier.json", (4e9, 4e9))
    data = load_run(run_dir)
    assert data.frontier_path.parent.name == "0123456789abcdef" and not data.notes
    assert data.frontier.schedule == frontier.schedule


def test_report_help_has_an_example_and_the_module_imports_no_matplotlib(capsys):
    import subprocess
    import sys

    with pytest.raises(SystemExit) as exc:
        main(["report", "--help"])
    assert exc.value.code == 0
    assert "perseus report runs/job42 --cache" in capsys.readouterr().out
    code = "import sys, perseus.output.report_page; print('matplotlib' in sys.modules)"
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == "False"


def test_report_accepts_the_metrics_file_itself(run_dir, capsys):
    assert main(["report", str(run_dir / "metrics.jsonl")]) == 0
    page = (run_dir / "report.html").read_text()  # next to the file; the cache of its directory
    assert set(_images(page)) == {"report-iterations.png", "report-frontier.png", "report-timeline.png"}


def _costly(lines: list[dict]) -> list[dict]:
    """The same run, but every deployed iteration costs 20 % more energy than its warm-up twin."""
    return [dict(line, energy_j=line["energy_j"] * 1.25) if line.get("phase") == "deployed" else line for line in lines]


def _with_id(lines: list[dict], run_id: str) -> list[dict]:
    return [{"run_id": run_id, **line} for line in lines]


def _write(path: Path, *runs: list[dict]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for run in runs for line in run))


def _deployed_saving(lines: list[dict]) -> float:
    warm = median(x["energy_j"] for x in lines if x.get("phase") == "warmup")
    return 1 - median(x["energy_j"] for x in lines if x.get("phase") == "deployed") / warm


def test_an_appended_file_shows_its_latest_run_by_default_and_a_costly_run_reads_more_energy(run_dir, frontier, tmp_path):
    saving, costly = _metrics_lines(frontier), _costly(_metrics_lines(frontier))
    assert _deployed_saving(saving) > 0 > _deployed_saving(costly)
    _write(run_dir / "metrics.jsonl", _with_id(saving, "20261125T100000Z-11-aaaaaa"),
           _with_id(costly, "20261125T110000Z-22-bbbbbb"))

    out = tmp_path / "latest.html"
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    page = out.read_text()
    cells = _cells(page, "comparison")
    assert cells["saving_median"] == pytest.approx(_deployed_saving(costly))  # the latest run only
    assert cells["deployed_iterations"] == 9 and cells["baseline_iterations"] == len(WARMUP_E)
    more = f"{100 * -_deployed_saving(costly):.1f}% more energy"
    assert f'data-value="{cells["saving_median"]!r}">{more}</td>' in page
    assert ">more energy per iteration" in page and "% less energy per iteration" not in page
    assert not re.search(r"-\d+(\.\d+)?% less energy", page)  # never a negative "less"
    assert "run 2 of 2 in the metrics file (20261125T110000Z-22-bbbbbb, the latest)" in page
    assert '<table id="runs-table">' in page and page.count('<tr class="shown">') == 1

    out = tmp_path / "first.html"
    assert main(["report", str(run_dir), "--out", str(out), "--run", "20261125T100000Z-11-aaaaaa"]) == 0
    cells = _cells(out.read_text(), "comparison")
    assert cells["saving_median"] == pytest.approx(_deployed_saving(saving))
    assert f"{100 * _deployed_saving(saving):.1f}% less energy</td>" in out.read_text()
    assert "run 1 of 2" in out.read_text()


def test_run_all_shows_each_run_with_its_own_numbers(run_dir, frontier, tmp_path):
    saving, costly = _metrics_lines(frontier), _costly(_metrics_lines(frontier))
    _write(run_dir / "metrics.jsonl", _with_id(saving, "a"), _with_id(costly, "b"))
    out = tmp_path / "all.html"
    assert main(["report", str(run_dir), "--out", str(out), "--run", "all"]) == 0
    page = out.read_text()
    assert "Showing all 2 runs of the metrics file." in page
    assert _cells(page, "comparison-1")["saving_median"] == pytest.approx(_deployed_saving(saving))
    assert _cells(page, "comparison-2")["saving_median"] == pytest.approx(_deployed_saving(costly))
    assert set(_images(page)) == {"all-run1-iterations.png", "all-run2-iterations.png", "all-frontier.png",
                                  "all-timeline.png"}
    data = load_run(run_dir, run="all")
    slow = frontier.points[len(frontier.points) // 2]
    assert [(p.time_s, n) for p, n, _ in used_points(data)] == [(frontier.default_point().time_s, 12),
                                                                 (slow.time_s, 6)]  # both runs' deployed steps


def test_a_file_without_run_ids_is_split_where_a_run_starts_again(run_dir, frontier, capsys):
    saving, costly = _metrics_lines(frontier), _costly(_metrics_lines(frontier))
    _write(run_dir / "metrics.jsonl", saving, costly)  # written before run ids: steps restart at 0
    data = load_run(run_dir, run="all")
    assert [len(r.steps) for r in data.runs] == [19, 19] and [r.run_id for r in data.runs] == [None, None]
    assert [len(r.events) for r in data.runs] == [len(saving) - 19] * 2  # every event stays with its run
    assert [r.position for r in load_run(run_dir).shown] == [2]  # the latest by default
    assert main(["report", str(run_dir), "--run", "1"]) == 0
    page = (run_dir / "report.html").read_text()
    assert "run 1 of 2 in the metrics file (no run id)" in page
    assert _cells(page, "comparison")["saving_median"] == pytest.approx(_deployed_saving(saving))

    assert main(["report", str(run_dir), "--run", "nope"]) == 2
    err = _error(capsys)
    assert "no run 'nope'" in err and "2 run(s)" in err and "'all'" in err


def test_a_run_with_default_clock_probes_is_compared_with_its_own_counted_probes(tmp_path, frontier):
    """The runtime's probes (``"clocks": "default"``) are the baseline, settle steps on neither side,
    so the page's saving is the same-run A/B the runtime logs, not a warm-up measured earlier."""
    default = frontier.default_point()
    lines, step = [], 0
    for t, e in ((0.30, 300.0), (0.30, 300.0)):  # a warm-up under other load: it must not be the baseline
        lines.append(_step(step, "warmup", t, e)); step += 1
    lines.append({"event": "phase", "step": step, "data": "deployed"})
    deployed = [("plan", False, 0.21, 90.0), ("plan", True, 0.20, 80.0), ("plan", True, 0.20, 80.0),
                ("default", False, 0.25, 130.0), ("default", True, 0.20, 100.0), ("plan", False, 0.22, 95.0),
                ("plan", True, 0.20, 80.0), ("default", False, 0.26, 140.0), ("default", True, 0.20, 100.0)]
    for clocks, counted, t, e in deployed:
        row = _step(step, "deployed", t, e, target=None if clocks == "default" else default.time_s)
        lines.append({**row, "clocks": clocks, "counted": counted}); step += 1
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    data = load_run(run)
    (shown,) = data.runs
    assert shown.baseline_phase == "default-clock probe"
    from perseus.output.run_stats import comparison

    cmp = comparison(shown.steps, shown.baseline_phase)
    assert cmp["baseline_energy"]["median"] == 100.0 and cmp["deployed_energy"]["median"] == 80.0
    assert abs(cmp["saving"]["median"] - 0.2) < 1e-12 and abs(cmp["time_change"]["median"]) < 1e-12


def test_the_page_shows_what_profiling_cost(run_dir, tmp_path):
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    at = next(i for i, line in enumerate(lines) if line.get("event") == "profiled")
    cost = {"iterations": 4, "time_s": 0.9, "energy_j": 320.0, "extra_time_s": 0.1, "extra_energy_j": -20.0,
            "extra_time_ratio": 0.125, "extra_energy_ratio": -0.0588}
    lines.insert(at + 1, {"event": "profiling_overhead", "step": lines[at]["step"], "data": cost})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["report", str(run_dir), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "4 iterations" in page and "of profiling: +12.5% time, -5.9% energy against default clocks" in page


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_a_run_with_a_grid_target_gets_the_carbon_panel(tmp_path, frontier):
    lines = _metrics_lines(frontier)
    carbon = 0.0
    for i, line in enumerate(lines):
        if line.get("phase") == "deployed":
            ci = 200.0 + 10 * i
            carbon = line["energy_j"] * ci / 3.6e6
            line.update(carbon_intensity=ci, carbon_g=carbon, job_power_w=400.0 + i, power_cap_w=450.0)
    plain, grid = tmp_path / "plain", tmp_path / "grid"
    for run, rows in ((plain, _metrics_lines(frontier)), (grid, lines)):
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in rows))
        _write_cache(run, frontier)
        assert main(["report", str(run), "--out", str(run / "page.html")]) == 0
    steps = load_run(grid).runs[0].steps
    deployed = [s for s in steps if s.phase == "deployed"]
    assert deployed and all(s.carbon_intensity is not None and s.power_cap_w == 450.0 for s in deployed)
    assert deployed[-1].carbon_g == pytest.approx(carbon)
    width_plain, height_plain = _png_size(plain / "page-iterations.png")
    width_grid, height_grid = _png_size(grid / "page-iterations.png")
    assert width_grid == width_plain and height_grid > height_plain  # a third panel under the two


def test_a_grid_field_that_is_not_a_number_is_one_line(tmp_path, frontier, capsys):
    lines = _metrics_lines(frontier)
    next(line for line in lines if line.get("phase") == "deployed")["carbon_intensity"] = "high"
    run = tmp_path / "bad"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["report", str(run), "--out", str(run / "page.html")]) == 2
    assert "carbon_intensity must be a finite number" in capsys.readouterr().err


def test_the_page_shows_the_guard_per_pipeline(run_dir, tmp_path):
    """Each guard event (one per probe window) carries every pipeline's statistic, probe share and
    probe energy; the page shows them per pipeline with the decisions that named it."""
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]

    def window(step: int, action: str, slow: list[int], stats: tuple[float, float]) -> dict:
        return {"event": "guard", "step": step, "data": {
            "action": action, "reason": "r", "threshold": 7.0, "slow_pipelines": slow, "next_window": 8,
            "target_scale": 1.0, "pipelines": {str(dp): {"statistic": s, "probe_share": 0.25, "probe_extra_energy_j": 3.5,
                                                         "windows": 1, "alarms": 0} for dp, s in enumerate(stats)}}}
    last = window(16, "keep", [], (0.0, 0.75))
    last["data"]["clock_reasons"] = {"pipeline": 0, "probe_steps": 4, "probe": {"sw_power_cap": 0.5},
                                     "plan_steps": 20, "plan": {"sw_power_cap": 0.9, "hw_thermal_slowdown": 0.1}}
    for event in (window(12, "keep", [], (1.0, 3.25)), window(14, "faster", [1], (0.5, 7.5)),
                  last):  # after the step line of the same step
        at = next(i for i, line in enumerate(lines) if "event" not in line and line["step"] == event["step"])
        lines.insert(at + 1, event)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["report", str(run_dir), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    table = re.search(r'<table id="guard-table">(.*?)</table>', page, re.S)
    assert table, "no guard table"
    rows = re.findall(r"<tr><td>(\d)</td><td>(\d+)</td><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>"
                      r"<td>([^<]*)</td></tr>", table.group(1))
    assert rows == [("0", "3", "kept (no alarm)", "0.00 (alarm at 7)", "25.0%", "+3.5 J",
                     "sw_power_cap 50% (plan steps 90%), hw_thermal_slowdown in plan steps only (10%)"),
                    ("1", "3", "faster at step 14", "0.75 (alarm at 7)", "25.0%", "+3.5 J", "not read")]
