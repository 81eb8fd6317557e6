"""The simulated GPU: a ``GPUDevice`` whose clocks really slow the work down, for machines
without a GPU (tests, demos, CI).

- ``device``: ``SimulatedGPU``, the device contract over the shared state;
- ``kernels``: its kernels, busy sections the clock in force stretches;
- ``integrator``: how its state advances in time (power, energy, the coarse counter, clock changes);
- ``params``: its parameters, checked, defaulted and matched against the state file;
- ``state``: the shared, crash-safe state file every process of one simulated GPU sees;
- ``dvfs``: the frequency → time, power, energy model and the GPU presets ("H200-hostile": what real
  cards add, a part-time late meter, target-dependent switches, a step tail, spinning waits; the
  replay preset, ``replay_preset``: one stage of measured A100 runs);
- ``stream``: the asynchronous mode, a bounded stream a device thread runs, events with GPU timestamps;
- ``virtual_clock``: ``VirtualClock``, time that passes only when slept, for deterministic tests;
- ``faults``: ``SimFaults``, the faults real cards show, on demand (stored in the state file).

In the GPU layer only ``perseus.gpu`` (its re-exports) and ``perseus.gpu.factory`` (which opens one
by kind) import it. Above it, the runtime's ``port`` room reaches the simulated GPU under a device
(``gpu_port``, ``clock_trace``, ``sim_kernels``: it makes each instruction a kernel), and
``perseus_demo``, tests and benchmarks build simulated GPUs on purpose.
"""

from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.dvfs import PRESETS, DVFSModel, get_preset
from perseus.gpu.sim.state import SimState, read_sim_state, state_path
from perseus.gpu.sim.virtual_clock import VirtualClock

__all__ = ["DVFSModel", "PRESETS", "SimState", "SimulatedGPU", "VirtualClock", "get_preset", "read_sim_state", "state_path"]
