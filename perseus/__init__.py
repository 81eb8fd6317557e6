"""Perseus: remove energy bloat from pipeline-parallel training with per-instruction GPU frequencies."""

__version__ = "0.1.0"
