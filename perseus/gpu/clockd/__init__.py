"""``perseus clockd``: a per-node privileged daemon that holds clocks for unprivileged trainers on a
Unix socket: ``daemon`` (the serving loop), ``handler`` (what requests do: claims, set, reset,
sync, the token bucket), ``managed_gpu`` (one GPU and its applier thread), ``peers`` (who a peer
is, from the kernel and ``/proc``), ``options`` (the daemon's policy), ``wire`` (the
length-prefixed JSON wire format) and ``client`` (``ClockdController``, the trainer's side)."""
