"""``job_error_line``: rank 0 says a start-up error once for the job; the others point at it."""

from __future__ import annotations

from perseus.errors import ConfigError
from perseus.gpu.errors import SIM_FIX, GPULibraryMissingError
from perseus.runtime.lifecycle import job_error_line


class Exchange:
    """Stands in for the job's collective: every rank's (rank, message) already gathered."""

    def __init__(self, rank: int, messages: list[str]) -> None:
        self.is_root = rank == 0
        self.messages = [(r, m) for r, m in enumerate(messages)]

    def gather_to_root(self, obj):
        return self.messages if self.is_root else None

    def broadcast_object(self, obj):
        return self.messages


class Broken:
    is_root = False

    def gather_to_root(self, obj):
        raise RuntimeError("gloo timed out")


def test_the_same_error_everywhere_is_one_line_for_the_job():
    error = GPULibraryMissingError("NVML is unavailable")
    messages = [str(error)] * 4
    root = job_error_line(Exchange(0, messages), 0, error)
    assert root.startswith("perseus: all 4 ranks: NVML is unavailable") and SIM_FIX in root
    other = job_error_line(Exchange(2, messages), 2, error)
    assert other == f"perseus: rank 2: stopped by the error rank 0 reports for the job; without a GPU: {SIM_FIX}"


def test_different_errors_name_their_ranks_and_a_rank_with_its_own_says_it():
    nvml = str(GPULibraryMissingError("NVML is unavailable"))
    clocks = "perseus: this process may not change the clocks of X"
    fine = "perseus: another rank could not open its GPU or control its clocks"
    messages = [nvml, clocks, fine, clocks]
    root = job_error_line(Exchange(0, messages), 0, GPULibraryMissingError("NVML is unavailable"))
    assert root.startswith("perseus: rank 0: NVML is unavailable") and " | ranks 1, 3: this process may not" in root
    assert "rank 2" not in root  # the rank that opened its GPU has nothing to report
    assert job_error_line(Exchange(1, messages), 1, ConfigError(clocks)) == "perseus: rank 1: this process may not change the clocks of X"
    assert job_error_line(Exchange(2, messages), 2, ConfigError(fine)).startswith("perseus: rank 2: stopped by")


def test_without_an_exchange_each_rank_says_its_own():
    assert job_error_line(Broken(), 5, ConfigError("perseus: bad")) == "perseus: rank 5: bad"
