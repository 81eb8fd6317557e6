"""GPU layer: one device interface (``device``) with two backends (``nvml``, and the simulator in
``sim/``), chosen in one place (``factory``); an asynchronous frequency controller process
(``controller``, ``controller_proc``); per-instruction time/energy measurement (``measurement``,
``timing``).

Nothing here imports torch or pynvml at import time (numpy/scipy only, scipy lazily), so planning code and CPU-only machines can
import it freely.
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
