"""The simulated GPU: a ``GPUDevice`` whose clocks really slow the work down, for machines
without a GPU (tests, demos, CI).

- ``device``: ``SimulatedGPU`` (and ``VirtualClock`` for deterministic tests);
- ``state``: the shared, crash-safe state file every process of one simulated GPU sees;
- ``dvfs``: the frequency → time, power, energy model and the GPU presets.

Nothing outside this package imports it except ``perseus.gpu.factory`` (which opens one by kind)
and code that builds simulated GPUs on purpose.
"""

from perseus.gpu.sim.device import SimulatedGPU, VirtualClock
from perseus.gpu.sim.dvfs import PRESETS, DVFSModel, get_preset
from perseus.gpu.sim.state import SimState, read_sim_state, state_path

__all__ = ["DVFSModel", "PRESETS", "SimState", "SimulatedGPU", "VirtualClock", "get_preset", "read_sim_state", "state_path"]
