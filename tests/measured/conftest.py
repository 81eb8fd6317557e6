import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))

# The public Perseus artifact's data live in ../shared beside the checkout (never copied in).
DATA = Path(os.environ.get("PERSEUS_ARTIFACT_DATA", HERE.resolve().parents[1].parent / "shared" / "data" / "perseus-sosp24"))
TARBALL = DATA / "measured-a100.tar.xz"
MODELS = ("bert-huge-uncased", "bloom-3b", "gpt3-xl", "t5-3b", "wide-resnet101_8")


@pytest.fixture(scope="session")
def artifact_root(tmp_path_factory):
    """The measured runs, unpacked once per session into a temporary directory."""
    if not TARBALL.exists():
        pytest.skip("measured A100 runs (measured-a100.tar.xz) not present")
    from perseus.measured import extract_archive

    return extract_archive(TARBALL, tmp_path_factory.mktemp("measured-a100"))


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
