"""Measuring instruments: ``energy`` (``EnergyPoller`` on the coarse energy counter, blocking power),
``counter`` (what the counter's updates measure), ``attribution`` and ``power_split`` (per-key
energy from the counter's intervals, believed only as far as the data support it), ``read_failures``
(failed counter reads: retries with backoff, unmeasured gaps, a dead counter), ``timing``
(per-instruction timers: host clock, simulated kernels or CUDA events) and ``clock_samples`` (the
SM clock a card sustains under a load)."""
