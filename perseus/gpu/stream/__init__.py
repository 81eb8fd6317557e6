"""Acting and timing in the GPU's own time: ``follow`` (``StreamFollower``: a thread acts when the GPU
reaches a recorded event), ``clocks`` (``StreamClocks``: planned clocks requested to land as each
instruction starts) and ``gpu_time`` (``GPUStepTimer``: steps as the GPU ran them, never synced)."""
