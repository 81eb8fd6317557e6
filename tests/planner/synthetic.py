"""Synthetic profiles with the shapes measured on real GPUs, for optimality tests.

Time grows as frequency falls, part of the work is clock-bound and part memory-bound
(t = t0·(m + (1 − m)·f_max/f)); power falls super-linearly with frequency
(P = P_static + k·(f/f_max)^3). Multiplicative noise makes some choices dominated and the
(time, effective energy) curve non-convex, as in real measurements.
"""

from __future__ import annotations

import numpy as np

from perseus.profile import InstructionProfile, Profile


def synthetic_profile(
    num_stages: int,
    num_freqs: int,
    seed: int,
    num_chunks: int = 1,
    p_blocking_w: float = 80.0,
    noise: float = 0.01,
    split_backward: bool = False,
    fused: bool = False,
) -> Profile:
    """``split_backward``: zero-bubble kinds, forward, backward_input and backward_weight (each
    about as long as the forward, with their own memory-boundness and power), instead of backward.
    ``fused``: every kind of the overlapped schedules, forward, backward, I, W and the fused
    forward+backward unit (2.4 to 3 forwards long: its own shape, not its parts' sum)."""
    rng = np.random.default_rng(seed)
    freqs = np.linspace(1410, 1410 - 15 * (num_freqs - 1), num_freqs).round().astype(int)
    entries = {}
    for stage in range(num_stages):
        for chunk in range(num_chunks):
            base = rng.uniform(0.04, 0.06)
            kinds = ((("forward", 1.0), ("backward_input", rng.uniform(0.9, 1.1)), ("backward_weight", rng.uniform(0.8, 1.2)))
                     if split_backward else (("forward", 1.0), ("backward", rng.uniform(1.8, 2.2))))
            if fused:
                kinds = (("forward", 1.0), ("backward", rng.uniform(1.8, 2.2)), ("backward_input", rng.uniform(0.9, 1.1)),
                         ("backward_weight", rng.uniform(0.8, 1.2)), ("forward_backward", rng.uniform(2.4, 3.0)))
            for kind, scale in kinds:
                t0 = base * scale
                mem = rng.uniform(0.15, 0.35)
                t = t0 * (mem + (1 - mem) * freqs.max() / freqs)
                power = rng.uniform(60, 90) + rng.uniform(250, 330) * (freqs / freqs.max()) ** 3
                t = t * (1 + noise * rng.standard_normal(num_freqs))
                e = power * t * (1 + noise * rng.standard_normal(num_freqs))
                entries[(stage, chunk, kind)] = InstructionProfile(tuple(freqs.tolist()), tuple(t.tolist()), tuple(e.tolist()))
    return Profile(entries, p_blocking_w, "synthetic")
