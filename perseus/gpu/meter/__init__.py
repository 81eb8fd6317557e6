"""Measuring instruments: ``energy`` (``EnergyPoller`` on the coarse energy counter, per-key energy
attribution, blocking power), ``read_failures`` (failed counter reads: retries with backoff,
unmeasured gaps, a dead counter), ``timing`` (per-instruction timers: host clock, simulated kernels
or CUDA events) and ``clock_samples`` (the SM clock a card sustains under a load)."""
