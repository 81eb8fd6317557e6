"""The NVML backend: ``device`` (``NVMLGPU``, pynvml imported lazily, NVML errors typed at the edge),
``readonly`` (an NVML that refuses every set/reset, for checks on a GPU that is not yours) and
``cuda_visible`` (a process's CUDA device index mapped to the physical NVML device, by UUID)."""
