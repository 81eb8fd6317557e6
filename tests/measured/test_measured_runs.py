"""Reading a workload directory: typed values from good files, one ProfileError line from bad ones."""

import json
import shutil

import numpy as np
import pytest

from perseus.errors import ProfileError
from perseus.measured import find_workload_dirs, read_workload


@pytest.fixture
def small_copy(workload_dirs, tmp_path):
    """Schedules 0 (all-max, with the dummy first entry) and 2 of the smallest workload, copied."""
    source = workload_dirs["wide-resnet101_8"]
    copy = tmp_path / source.name
    copy.mkdir()
    for n in (0, 2):
        for suffix in ("sched", "prof"):
            shutil.copy(source / f"{n}.{suffix}.json", copy / f"{n}.{suffix}.json")
    return copy


def edit(path, change):
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_a_good_copy_reads_into_typed_values(small_copy):
    workload = read_workload(small_copy)
    assert (workload.stages, workload.microbatches, workload.shape.model) == (4, 24, "wide-resnet101_8")
    assert [run.index for run in workload.runs] == [0, 2] and workload.all_max == (0,)
    first = workload.runs[0].ranks[0]
    assert first.forward_s.shape == first.backward_s.shape == (len(first.iter_time_s), 24)
    assert (first.forward_s > 0).all(), "the first iteration's dummy 0.0 entry is dropped"
    raw = json.loads((small_copy / "2.prof.json").read_text())
    run = workload.runs[1]
    per_iteration = np.max([r["iter_time"] for r in raw], axis=0)
    assert run.time_s == pytest.approx(float(np.median(per_iteration[1:])))
    assert run.energy_j == pytest.approx(float(np.median(np.sum([r["iter_energy"] for r in raw], axis=0)[1:])))


def test_find_workload_dirs_takes_perseus_runs_from_the_artifact_root(artifact_root, workload_dirs):
    found = find_workload_dirs(artifact_root)
    assert len(found) == 5 and all("perseus" in p.parts for p in found)
    one = workload_dirs["t5-3b"]
    assert find_workload_dirs(one) == [one]
    assert find_workload_dirs(one.parent) == sorted(p for p in one.parent.iterdir() if p.is_dir())


def _truncate(path):
    path.write_text(path.read_text()[:200])


def _short_power_states(doc):
    doc[1]["power_states"] = doc[1]["power_states"][:-1]


def _bad_energy(doc):
    doc[2]["iter_energy"][3] = -5.0


def _bad_forward(doc):
    doc[0]["time_breakdown"]["forward"][3] = doc[0]["time_breakdown"]["forward"][3][:-2]


def _missing_rank(doc):
    del doc[3]


CASES = [
    ("2.prof.json", "text", _truncate, "not valid JSON"),
    ("2.sched.json", "json", _short_power_states, "rank 1 power_states: 103 clocks, but Merak's 1F1B stream"),
    ("2.prof.json", "json", _bad_energy, "rank 2 iter_energy must be a non-empty list of positive finite numbers"),
    ("2.prof.json", "json", _bad_forward, "rank 0 time_breakdown.forward iteration 3 has 22 entries, expected 24"),
    ("2.sched.json", "json", _missing_rank, "ranks [0, 1, 2], expected one per stage 0..3"),
    ("2.prof.json", "delete", None, "missing (every schedule N needs N.sched.json and N.prof.json)"),
]


@pytest.mark.parametrize("name,how,change,problem", CASES, ids=[c[3][:24] for c in CASES])
def test_a_malformed_file_is_one_line_naming_the_file_and_the_problem(small_copy, name, how, change, problem):
    path = small_copy / name
    if how == "text":
        change(path)
    elif how == "json":
        edit(path, change)
    else:
        path.unlink()
    with pytest.raises(ProfileError) as raised:
        read_workload(small_copy)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ") and problem in message


@pytest.mark.parametrize("name,problem", [
    ("runs", "not a workload directory name"),
    ("merak+gpt3-xl+custom:0,8+dp2+pp4+tp1+mbs8+nmb128+PointSolution", "only dp1 tp1 runs"),
])
def test_a_directory_name_that_is_not_the_artifact_s_is_refused(small_copy, name, problem):
    renamed = small_copy.rename(small_copy.parent / name)
    with pytest.raises(ProfileError, match=problem):
        read_workload(renamed)
