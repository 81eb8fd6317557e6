"""The NVML backend: ``NVMLGPU`` on a real NVIDIA GPU, a read-only NVML for checks on a GPU that is not yours, and CUDA_VISIBLE_DEVICES resolution."""
