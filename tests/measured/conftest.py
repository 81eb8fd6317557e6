import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
sys.path.insert(0, str(HERE))

from artifact import unpack

MODELS = ("bert-huge-uncased", "bloom-3b", "gpt3-xl", "t5-3b", "wide-resnet101_8")


@pytest.fixture(scope="session")
def artifact_root(tmp_path_factory):
    """The measured runs, unpacked once per session into a temporary directory."""
    return unpack(tmp_path_factory)


@pytest.fixture(scope="session")
def workload_dirs(artifact_root):
    """Perseus's five workload directories, by model name."""
    from perseus.measured import find_workload_dirs, parse_workload_name

    return {parse_workload_name(d.name).model: d for d in find_workload_dirs(artifact_root)}


@pytest.fixture(scope="session")
def workloads(workload_dirs):
    from perseus.measured import read_workload

    return {model: read_workload(d) for model, d in workload_dirs.items()}


@pytest.fixture(scope="session")
def checks(workloads):
    """Every workload checked leave-one-schedule-out (the slow part: about 10 s on 2 cores)."""
    from perseus.measured import leave_one_out

    return {model: leave_one_out(w) for model, w in workloads.items()}
