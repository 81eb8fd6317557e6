"""Measuring instruments: ``energy`` (``EnergyPoller`` on the coarse energy counter, per-key energy
attribution, blocking power), ``timing`` (per-instruction timers: host clock, simulated kernels or
CUDA events) and ``clock_samples`` (the SM clock a card sustains under a load)."""
