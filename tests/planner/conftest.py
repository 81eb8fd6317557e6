import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))

# The public Perseus artifact's profiles live in ../shared beside the checkout (never copied in).
DATA = Path(os.environ.get("PERSEUS_ARTIFACT_DATA", HERE.resolve().parents[1].parent / "shared" / "data" / "perseus-sosp24"))
A100_CSV = DATA / "gpt3-175b+a100_sxm_bf16.csv"
A100_P_BLOCKING = 83.64


@pytest.fixture
def a100_slice():
    """The last ``n`` stages of the real GPT-3 175B A100 profile, renumbered from 0 (LM head last)."""
    if not A100_CSV.exists():
        pytest.skip("real A100 profile not present")
    from perseus.profile import Profile, load_profile

    full = load_profile(A100_CSV, A100_P_BLOCKING)

    def make(num_stages: int) -> Profile:
        first = full.num_stages - num_stages
        entries = {(s - first, c, k): v for (s, c, k), v in full.entries.items() if s >= first}
        return Profile(entries, A100_P_BLOCKING, "A100-SXM", source=str(A100_CSV))

    return make
