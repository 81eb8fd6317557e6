"""Perseus demos and CPU runners: real framework pipelines on CPU with simulated GPUs.

Nothing here is needed on a GPU machine. It sits above the library and the adapters (it imports
them; they never import it):

- ``common``: the demo loop shared by both frameworks (phases, A/B/A re-baseline, results table)
  and ``SimulatedCompute``, which pads each instruction's simulated kernel (the runtime makes every
  instruction one on a simulated GPU) to a nominal time and records the clock it ran at;
- ``megatron_demo`` / ``deepspeed_demo``: one torchrun rank of each framework's demo;
- ``tiny_gpt`` / ``tiny_pipe``: the small models they train;
- ``megatron_cpu`` / ``deepspeed_cpu``: what lets megatron-core and DeepSpeed run on CPU (gloo);
- ``cli``: ``perseus demo``, added to the ``perseus`` command through an entry point.
"""
