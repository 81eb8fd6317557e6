"""How a simulated GPU's state advances in time: clocks, power, energy, counter, kernel progress.

Why one place: every change of power state (a clock request, a kernel beginning or ending, a new
power limit) first settles the integrators up to its moment, and reading the counter or timing a
kernel needs the same arithmetic. These are pure functions of a ``SimState`` (no file, no clock,
no sleeping), so the device and its kernels apply one model.

Power is constant between settles, so energy is (energy at ``t_ref``) + power · elapsed. The
readable counter advances only at update-period boundaries (``phase + k · period``), each step
with its own deterministic noise draw, as A100/H100 NVML counters do. A clock change requested
with a switch latency lands at its time (``pending_at``), possibly in the middle of a kernel.

A model with a part-time meter (``meter_sampled_fraction`` < 1) books for each period the mean
power of its sampled first part × the period, as A100/H100 do; work in the rest of the period is
not in the counter. With ``meter_lag_s`` each update appears a deterministic 0 to ``meter_lag_s``
after its boundary. The true integral stays ``true_energy``.
"""

from __future__ import annotations

import math
import random

from perseus.gpu.sim.dvfs import DVFSModel
from perseus.gpu.sim.state import SimParams, SimState

_NOISY_BOUNDARIES = 64  # per read, at most this many counter updates get their own noise draw


class StateIntegrator:
    """The physics of one simulated GPU, applied to its ``SimState``."""

    def __init__(self, model: DVFSModel, *, energy_update_period_s: float, counter_phase_s: float,
                 noise: float, seed: int, switch_latency_s: float) -> None:
        self.model = model
        self.energy_update_period_s = energy_update_period_s
        self.counter_phase_s = counter_phase_s
        self.noise = noise
        self.seed = seed
        self.switch_latency_s = switch_latency_s
        period = energy_update_period_s
        self._window_s = model.meter_sampled_fraction * period  # the sampled part of each period
        self._sampled = period > 0 and model.meter_sampled_fraction < 1
        self._lag_s = min(model.meter_lag_s, 0.999 * period) if period > 0 else 0.0

    @classmethod
    def from_params(cls, params: SimParams) -> StateIntegrator:
        """The integrator of the GPU whose state file records ``params``."""
        return cls(DVFSModel(**params["model"]),
                   energy_update_period_s=float(params["energy_update_period_s"]),
                   counter_phase_s=float(params["counter_phase_s"]),
                   noise=float(params["noise"]),
                   seed=int(params["seed"]),
                   switch_latency_s=float(params.get("switch_latency_s", 0.0)))

    # -- clocks -----------------------------------------------------------------------------
    def set_clock(self, st: SimState) -> int:
        """The clock set: the locked one, else the default (max)."""
        return st.locked_mhz if st.locked else self.model.sm_max_mhz

    def effective_clock(self, st: SimState) -> int:
        """The clock a kernel of ``st.activity`` runs at (the set one, throttled to the power limit)."""
        return self.model.throttled_clock(self.set_clock(st), st.activity, st.power_limit_w)

    def switch_latency(self, target_mhz: int) -> float:
        """How long a switch to ``target_mhz`` takes: the GPU's constant ``switch_latency_s`` where
        set, else the model's, which depends on the target (0 for the plain presets)."""
        return self.switch_latency_s if self.switch_latency_s > 0 else self.model.switch_latency_s(target_mhz)

    def request_clock(self, st: SimState, locked: int, mhz: int, now: float) -> None:
        """A clock change takes effect its switch latency after the request (at once when 0);
        a newer request replaces one still on its way, as the driver applies the latest."""
        self.settle(st, now)
        latency = self.switch_latency(mhz if locked else self.model.sm_max_mhz)
        if latency > 0:
            st.pending, st.pending_locked, st.pending_mhz = 1, locked, mhz
            st.pending_at = now + latency
            return
        st.pending = 0
        st.locked, st.locked_mhz = locked, mhz
        st.applied_at = now
        self.refresh_power(st)

    # -- energy -----------------------------------------------------------------------------
    def true_energy(self, st: SimState, t: float) -> float:
        return st.energy_j + st.power_w * max(0.0, t - st.t_ref)

    def boundary(self, k: int) -> float:
        """When the counter's ``k``-th update happens."""
        return self.counter_phase_s + k * self.energy_update_period_s

    def _eps(self, k: int) -> float:
        if self.noise == 0:
            return 0.0
        e = random.Random(self.seed * 1_000_003 + k).gauss(0.0, self.noise)
        return max(-0.5, min(0.5, e))

    def _lag(self, k: int) -> float:
        """How long after boundary ``k`` its update appears (deterministic per boundary)."""
        return random.Random(f"lag/{self.seed}/{k}").uniform(0.0, self._lag_s) if self._lag_s > 0 else 0.0

    def _sampled_energy(self, st: SimState) -> float:
        """What a part-time meter books for the period after boundary ``st.counter_k``: its sampled
        part's energy scaled to the whole period (power constant since t_ref)."""
        w_end = self.boundary(st.counter_k) + self._window_s
        sampled = st.window_j + st.power_w * max(0.0, w_end - st.t_ref) - st.counter_true_j
        return sampled * self.energy_update_period_s / self._window_s

    def _counters_at(self, st: SimState, k: int) -> tuple[float, float]:
        """Readable counter at boundaries ``k`` (> st.counter_k) and ``k`` − 1; power is constant since
        t_ref, so only the first period's sampled part can differ from the true energy."""
        value, before, prev = st.counter_j, st.counter_prev_j, st.counter_true_j
        last_noisy = min(k, st.counter_k + _NOISY_BOUNDARIES)
        for j in range(st.counter_k + 1, last_noisy + 1):
            e = self.true_energy(st, self.boundary(j))
            booked = self._sampled_energy(st) if self._sampled and j == st.counter_k + 1 else e - prev
            before, value = value, value + booked * (1.0 + self._eps(j))
            prev = e
        if k > last_noisy:
            before = value + self.true_energy(st, self.boundary(k - 1)) - prev
            value += self.true_energy(st, self.boundary(k)) - prev
        return value, before

    def counter_reading(self, st: SimState, now: float) -> tuple[float, float]:
        """(readable counter at ``now``, time of its last update); a period of 0 is a continuous
        counter, exact and updated now. An update not yet out (``meter_lag_s``) is not read."""
        if self.energy_update_period_s <= 0:
            return self.true_energy(st, now), now
        k = math.floor((now - self.counter_phase_s) / self.energy_update_period_s)
        if self._lag_s > 0 and now < self.boundary(k) + self._lag(k):
            k -= 1
            if k < st.counter_k:  # the state has settled past a boundary whose update is not out yet
                return st.counter_prev_j, self.boundary(k) + self._lag(k)
        value = st.counter_j if k <= st.counter_k else self._counters_at(st, k)[0]
        k = max(k, st.counter_k)
        return value, self.boundary(k) + self._lag(k)

    def refresh_power(self, st: SimState) -> None:
        """Power from now on: busy power at the effective clock during a kernel, else P_blocking."""
        st.power_w = (self.model.busy_power_w(self.effective_clock(st), st.activity)
                      if st.busy else self.model.p_blocking_w)

    # -- advancing time ---------------------------------------------------------------------
    def settle(self, st: SimState, now: float) -> None:
        """Advance the integrators to ``now`` before any change of power state; a clock change
        on its way (switch latency) takes effect at its time on the way."""
        if st.pending and st.pending_at <= now:
            self._settle_segment(st, st.pending_at)
            st.locked, st.locked_mhz = st.pending_locked, st.pending_mhz
            st.pending, st.applied_at = 0, st.pending_at
            self.refresh_power(st)
        self._settle_segment(st, now)

    def _settle_segment(self, st: SimState, now: float) -> None:
        now = max(now, st.t_ref)
        period = self.energy_update_period_s
        if period > 0:
            k = math.floor((now - self.counter_phase_s) / period)
            if k > st.counter_k:
                st.counter_j, st.counter_prev_j = self._counters_at(st, k)
                st.counter_true_j = self.true_energy(st, self.boundary(k))
                st.counter_k = k
            if self._sampled and st.t_ref < (w_end := self.boundary(st.counter_k) + self._window_s):
                st.window_j = self.true_energy(st, min(now, w_end))
        dt = now - st.t_ref
        if st.busy:
            slow = self.model.slowdown(self.effective_clock(st), st.compute_fraction)
            st.slow_integral += slow * dt
            st.busy_progress += dt / slow
        st.energy_j += st.power_w * dt
        st.t_ref = now

    def rewind_idle(self, st: SimState, t: float) -> None:
        """Take back idle time integrated past ``t`` (a late-waking stream thread settled it), so a
        kernel can start at ``t``; only while no counter update and no clock change lies after ``t``."""
        if st.busy or st.pending or t >= st.t_ref or st.applied_at > t:
            return
        if self.energy_update_period_s > 0 and self.boundary(st.counter_k) > t:
            return
        st.energy_j -= st.power_w * (st.t_ref - t)
        st.t_ref = t
        if self._sampled and t < self.boundary(st.counter_k) + self._window_s:
            st.window_j = st.energy_j

    def kernel_end(self, st: SimState, now: float, work_left: float) -> float:
        """When ``work_left`` max-clock seconds are done, from ``now``, at the clock in force and
        the one on its way (settles ``st`` to ``now``)."""
        self.settle(st, now)
        if work_left <= 0:
            return now
        slow = self.model.slowdown(self.effective_clock(st), st.compute_fraction)
        end = now + work_left * slow
        if st.pending and st.pending_at < end:
            work_left -= (st.pending_at - now) / slow
            nxt = SimState(**vars(st))
            nxt.locked, nxt.locked_mhz = nxt.pending_locked, nxt.pending_mhz
            end = st.pending_at + work_left * self.model.slowdown(self.effective_clock(nxt), st.compute_fraction)
        return end
