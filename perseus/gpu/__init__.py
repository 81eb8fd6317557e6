"""The GPU layer: one device contract, its backends, clock control and measurement, in rooms.

- ``device`` (``GPUDevice``), ``spec``, ``errors``; ``factory`` chooses and opens a backend;
- backends: ``nvml/`` (a real NVIDIA GPU), ``sim/`` (the simulated GPU), ``zeusd/`` (clocks and
  energy through Zeus's zeusd);
- ``clock_service``: the one place that picks the clock path: local controller process, clockd,
  zeusd or measure-only;
- ``control/``: the clock controller process and its never-blocking request path;
  ``clockd/``: the per-node clock daemon for unprivileged trainers;
- ``meter/``: energy, timing and sustained-clock measurement; ``stream/``: acting and timing in
  the GPU's own time on an asynchronous stream.

Importing it imports neither torch nor pynvml (numpy only; scipy lazily), so planning code and
CPU-only machines can import it freely.
"""

from perseus.gpu.control.controller import (
    ClockController,
    ControllerDiedWarning,
    ControllerStats,
    FrequencyController,
    NullController,
    make_controller,
)
from perseus.gpu.device import BusyResult, GPUDevice
from perseus.gpu.errors import (
    GPUError,
    GPUInvalidArgumentError,
    GPULibraryMissingError,
    GPUNotFoundError,
    GPUNotSupportedError,
    GPUPermissionError,
)
from perseus.gpu.factory import open_gpu, open_spec
from perseus.gpu.meter.energy import (
    AttributionResult,
    BlockingPowerResult,
    CounterUpdate,
    EnergyPoller,
    KeyEnergy,
    MeasurementError,
    attribute_energy,
    measure_blocking_power,
    measure_blocking_power_p2p,
)
from perseus.gpu.nvml.device import NVMLGPU
from perseus.gpu.sim import PRESETS, DVFSModel, SimState, SimulatedGPU, VirtualClock, get_preset, read_sim_state, state_path
from perseus.gpu.spec import GPUSpec
from perseus.gpu.meter.timing import (
    CPUInstructionTimer,
    CUDAInstructionTimer,
    InstructionTimer,
    TimedInstruction,
    make_instruction_timer,
)

__all__ = [
    "AttributionResult",
    "BlockingPowerResult",
    "BusyResult",
    "CPUInstructionTimer",
    "CUDAInstructionTimer",
    "ClockController",
    "ControllerDiedWarning",
    "ControllerStats",
    "CounterUpdate",
    "DVFSModel",
    "EnergyPoller",
    "FrequencyController",
    "InstructionTimer",
    "KeyEnergy",
    "MeasurementError",
    "NVMLGPU",
    "NullController",
    "TimedInstruction",
    "attribute_energy",
    "make_controller",
    "make_instruction_timer",
    "measure_blocking_power",
    "measure_blocking_power_p2p",
    "GPUDevice",
    "GPUError",
    "GPUInvalidArgumentError",
    "GPULibraryMissingError",
    "GPUNotFoundError",
    "GPUNotSupportedError",
    "GPUPermissionError",
    "GPUSpec",
    "PRESETS",
    "SimState",
    "SimulatedGPU",
    "VirtualClock",
    "get_preset",
    "open_gpu",
    "open_spec",
    "read_sim_state",
    "state_path",
]
