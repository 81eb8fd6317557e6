"""benchmarks/bench_artifact.py: its JSON's shape, from a directory and from a tarball."""

import json
import shutil
import tarfile

import bench_artifact

FIELDS = {"name": str, "stages": int, "microbatches": int, "schedules": int, "describable": bool}
ERRORS = ("time_error_median", "time_error_max", "energy_error_median", "energy_error_max")


def _json(capsys, argv):
    assert bench_artifact.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _check_entry(entry, directory):
    for key, kind in FIELDS.items():
        assert isinstance(entry[key], kind), key
    assert entry["name"] == directory.name
    assert entry["schedules"] == len(list(directory.glob("*.sched.json")))
    for key in ERRORS:
        value = entry[key]
        assert (value is None) if not entry["describable"] else (isinstance(value, float) and 0 <= value < 1), key
    assert isinstance(entry["measured_best_saving_0p5"], float)
    assert isinstance(entry["why"], list) and entry["why"]


def test_json_shape_on_a_directory_of_workloads(workload_dirs, tmp_path, capsys):
    source = workload_dirs["wide-resnet101_8"]
    runs = tmp_path / "runs"
    shutil.copytree(source, runs / source.name)
    result = _json(capsys, ["--runs", str(runs), "--json"])
    assert list(result) == ["workloads"] and len(result["workloads"]) == 1
    entry = result["workloads"][0]
    _check_entry(entry, source)
    assert (entry["stages"], entry["microbatches"], entry["describable"]) == (4, 24, False)
    assert isinstance(entry["planned_saving"], float) and 0 < entry["planned_saving"] < 0.3


def test_a_tarball_is_unpacked_and_read(workload_dirs, tmp_path, capsys):
    source = workload_dirs["bert-huge-uncased"]
    tarball = tmp_path / "runs.tar.xz"
    with tarfile.open(tarball, "w:xz", preset=0) as tar:
        tar.add(source, arcname=f"sosp24_data/perseus/A100/dp1+pp4+tp1/{source.name}")
    result = _json(capsys, ["--runs", str(tarball), "--json", "--no-plan"])
    (entry,) = result["workloads"]
    _check_entry(entry, source)
    assert entry["describable"] and entry["planned_saving"] is None
    assert entry["time_error_median"] <= 0.01 and entry["energy_error_median"] <= 0.01


def test_table_for_people(workload_dirs, tmp_path, capsys):
    source = workload_dirs["wide-resnet101_8"]
    assert bench_artifact.main(["--runs", str(source), "--no-plan"]) == 0
    out = capsys.readouterr().out
    assert "wide-resnet101_8" in out and "describable" in out and "drifts" in out


def test_a_missing_path_is_one_line(tmp_path, capsys):
    assert bench_artifact.main(["--runs", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_plan_at_half_a_percent_and_the_default_run_measured_and_predicted(workload_dirs, tmp_path, capsys):
    source = workload_dirs["wide-resnet101_8"]
    (entry,) = _json(capsys, ["--runs", str(source), "--json"])["workloads"]
    assert entry["planned_saving_0p5"] >= entry["planned_saving"]
    run = entry["default_run"]
    assert isinstance(run["schedule"], int) and run["schedule"] not in entry["baseline_schedules"]
    for key in ("measured_slowdown", "predicted_slowdown", "measured_saving", "predicted_saving"):
        assert isinstance(run[key], float) and abs(run[key]) < 0.5, key
