"""Acting and timing in the GPU's own time: a thread that follows recorded events on the stream, clock requests ahead of each instruction, and steps timed as the GPU ran them."""
