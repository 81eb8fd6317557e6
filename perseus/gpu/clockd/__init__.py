"""``perseus clockd``: a per-node privileged daemon that sets clocks for unprivileged trainers, its wire protocol and the trainer's client."""
