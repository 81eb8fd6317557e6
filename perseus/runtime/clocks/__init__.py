"""Choosing and following the clocks: the deployed plan's hot path, the targets that pick the
frontier point (no slowdown, straggler, grid), and the job check behind the straggler policy."""
