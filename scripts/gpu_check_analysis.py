"""Pure analysis for ``gpu_check.py`` (numpy only): what the measurements mean, testable on CPU.

All times are host ``perf_counter`` seconds; GPU times have been mapped onto that clock already.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from dataclasses import dataclass
from enum import Enum

import numpy as np

# nvmlClocksEventReasons bits (nvml.h; "throttle reasons" in older drivers).
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


class Kind(str, Enum):
    """A pipeline instruction's kind in the check's 1F1B stage."""

    FORWARD = "forward"
    BACKWARD = "backward"


@dataclass(frozen=True)
class Instruction:
    kind: Kind
    microbatch: int

    def short(self) -> str:
        return f"{'F' if self.kind is Kind.FORWARD else 'B'}{self.microbatch}"


def one_f_one_b_order(microbatches: int, warmup: int) -> list[Instruction]:
    """One stage's 1F1B order: ``warmup`` forwards, then B/F pairs, then the remaining backwards
    (8 microbatches, warm-up 3: F0 F1 F2 B0 F3 B1 F4 ... B4 F7 B5 B6 B7)."""
    if microbatches < 1 or not 1 <= warmup <= microbatches:
        raise ValueError(f"need 1 <= warmup ({warmup}) <= microbatches ({microbatches})")
    order = [Instruction(Kind.FORWARD, m) for m in range(warmup)]
    for f, b in zip(range(warmup, microbatches), range(microbatches)):
        order += [Instruction(Kind.BACKWARD, b), Instruction(Kind.FORWARD, f)]
    order += [Instruction(Kind.BACKWARD, b) for b in range(microbatches - warmup, microbatches)]
    return order


def summary(xs: Sequence[float], scale: float = 1.0) -> dict[str, float]:
    """Median, p99, min, max and count of ``xs`` (times ``scale``, e.g. 1e3 for ms)."""
    if not xs:
        return {"n": 0}
    a = np.asarray(xs, dtype=float) * scale
    return {"n": int(a.size), "median": float(np.median(a)), "p99": float(np.percentile(a, 99)),
            "min": float(a.min()), "max": float(a.max())}


def decode_reasons(mask: int) -> list[str]:
    """Names of the clock-event reason bits set in ``mask`` (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_REASONS)
    return names + ([hex(rest)] if rest else [])


def reason_shares(masks: Sequence[int]) -> dict[str, float]:
    """Share of samples in which each reason was set."""
    if not masks:
        return {}
    counts: dict[str, int] = {}
    for m in masks:
        for name in decode_reasons(int(m)):
            counts[name] = counts.get(name, 0) + 1
    return {k: v / len(masks) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}


def counter_updates(polls: Sequence[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """(time, value) at each change of a polled counter; ``polls`` are (t_before, t_after, value)
    of each read, and a change is placed midway between the read that saw it and the one before."""
    out: list[tuple[float, float]] = []
    for (_, prev_after, prev_v), (_, after, v) in pairwise(polls):
        if v != prev_v:
            out.append((0.5 * (prev_after + after), v))
    return out


def update_period(updates: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Spacing of counter updates, in ms."""
    return summary([b[0] - a[0] for a, b in pairwise(updates)], 1e3)


def run_ahead(hook_s: Sequence[float], gpu_begin_s: Sequence[float],
              gpu_end_s: Sequence[float]) -> dict[str, dict[str, float]]:
    """How far the host runs ahead of the GPU when it reaches each instruction's hook.

    ``instructions``: earlier instructions not yet finished on the GPU at the hook; ``ms``: from
    the hook to the instruction's GPU begin.
    """
    ahead = [sum(1 for j in range(i) if gpu_end_s[j] > hook_s[i]) for i in range(len(hook_s))]
    ms = [b - h for h, b in zip(hook_s, gpu_begin_s)]
    return {"instructions": summary(ahead), "ms": summary(ms, 1e3)}


def own_clock_shares(gpu_begin_s: Sequence[float], gpu_end_s: Sequence[float],
                     effective_s: Sequence[float], skip_first: int = 1) -> dict[str, float]:
    """Share of instructions that run at their own planned clock.

    Request ``i`` (instruction i's clock) takes effect at ``effective_s[i]``; requests are in
    order, so the clock in force at time t is that of the last request effective by t. An
    instruction counts when at least half of its GPU time runs at its own clock; ``time_share``
    is the share of all instruction time at the own clock. The first ``skip_first`` instructions
    are left out (their request belongs to the step before), and so is the last (the request that
    ends its clock belongs to the step after).
    """
    n = len(gpu_begin_s)
    own, total, counted = 0.0, 0.0, 0
    for i in range(skip_first, n - 1):
        b, e = gpu_begin_s[i], gpu_end_s[i]
        t = max(0.0, min(e, effective_s[i + 1]) - max(b, effective_s[i]))
        own += t
        total += e - b
        counted += t >= 0.5 * (e - b)
    m = n - 1 - skip_first
    return {"instructions": counted / m if m > 0 else math.nan,
            "time_share": own / total if total > 0 else math.nan}


def boundary_delays(gpu_end_s: Sequence[float], action_s: Sequence[float]) -> list[float]:
    """Seconds from the GPU finishing each instruction to the host acting on it."""
    return [a - e for e, a in zip(gpu_end_s, action_s)]


def attribute_power(updates: Sequence[tuple[float, float]],
                    spans: Sequence[tuple[str, float, float]]) -> dict[str, dict[str, float]]:
    """Average power per span kind, plus ``other`` for time no span covers, by least squares over
    the intervals between counter updates (``updates``: (time, joules)). Standard errors from the
    residuals. Needs more intervals than kinds."""
    bounds = np.array([t for t, _ in updates], dtype=float)
    if bounds.size < 2 or np.any(np.diff(bounds) <= 0):
        raise ValueError(f"need increasing counter updates, got {bounds.size}")
    kinds = sorted({k for k, _, _ in spans})
    col = {k: j for j, k in enumerate(kinds)}
    a = np.zeros((bounds.size - 1, len(kinds) + 1))
    for kind, s, e in spans:
        lo = np.clip(s, bounds[:-1], bounds[1:])
        hi = np.clip(e, bounds[:-1], bounds[1:])
        a[:, col[kind]] += np.clip(hi - lo, 0.0, None)
    a[:, -1] = np.clip(np.diff(bounds) - a[:, :-1].sum(axis=1), 0.0, None)
    y = np.diff([e for _, e in updates])
    used = a.sum(axis=0) > 0
    if a.shape[0] <= int(used.sum()):
        raise ValueError(f"{a.shape[0]} counter intervals cannot separate {int(used.sum())} kinds; measure longer")
    p = np.full(a.shape[1], math.nan)
    se = np.full(a.shape[1], math.nan)
    sol, *_ = np.linalg.lstsq(a[:, used], y, rcond=None)
    resid = y - a[:, used] @ sol
    dof = a.shape[0] - int(used.sum())
    cov = float(resid @ resid) / dof * np.linalg.pinv(a[:, used].T @ a[:, used])
    p[used], se[used] = sol, np.sqrt(np.clip(np.diag(cov), 0.0, None))
    names = [*kinds, "other"]
    return {k: {"power_w": float(p[j]), "stderr_w": float(se[j]), "seconds": float(a[:, j].sum())}
            for j, k in enumerate(names)} | {"intervals": {"n": float(a.shape[0])}}


def power_between(updates: Sequence[tuple[float, float]], t_from: float, t_to: float) -> dict[str, float]:
    """Average power from the first to the last counter update inside [t_from, t_to]."""
    inside = [(t, e) for t, e in updates if t_from <= t <= t_to]
    if len(inside) < 2:
        raise ValueError(f"only {len(inside)} counter update(s) in the window; measure longer")
    dt = inside[-1][0] - inside[0][0]
    return {"power_w": (inside[-1][1] - inside[0][1]) / dt, "window_s": dt, "updates": float(len(inside))}
