"""Reading back the scalars a TensorBoard writer wrote (Megatron's own, or one a test made)."""

from __future__ import annotations

from pathlib import Path


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in ``log_dir``'s event files: [(step, value), ...] in write order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
