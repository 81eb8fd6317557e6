"""The default sweep on the simulated GPU's real curve (early stop, coarse to fine, interpolation)
and a run that ends while profiling: its clocks are kept and the next run resumes the sweep."""

from __future__ import annotations

import json
import logging

from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.dvfs import get_preset
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.store.cache import RunCache
from perseus.runtime.measure.clock_sweep import ClockSweep

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)
MODEL = get_preset("A100-SXM")
T_MAX = {"forward": 0.003, "backward": 0.006}


def sim(tmp_path):
    return SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)


def config(tmp_path, **kw):
    """Default sweep settings (the point of these tests); a small, quiet client."""
    return PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                    "sim_gpu": {"state_dir": str(tmp_path / "sim")}, "mode": "profile",
                                    "p_blocking_w": MODEL.p_blocking_w, "log_every_steps": 0, **kw})


def train(rt, steps):
    """Instructions with a nominal max-clock time (``pad``), so host noise does not blur the curve."""
    for _ in range(steps):
        rt.on_step_begin()
        for inst in rt.schedule.stages[0]:
            rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
            rt.sim_kernels.pad(T_MAX[inst.kind])
            rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
        rt.on_step_end()


def profile_to_end(rt, limit=200):
    for _ in range(limit):  # hang guard
        if rt.phase.value != "warmup" and rt.phase.value != "profiling":
            return
        train(rt, 1)
    raise AssertionError(f"still {rt.phase.value} after {limit} steps")


def energy_minimum_mhz():
    return min(MODEL.supported_sm_clocks(), key=lambda f: MODEL.kernel_energy_j(1.0, f, 1.0, 0.8))


def test_default_sweep_stops_where_energy_stops_falling_and_interpolates_the_rest(tmp_path):
    sim(tmp_path)
    with PerseusRuntime(JOB, config(tmp_path)) as rt:
        profile_to_end(rt)
        s = rt.summary()
        profile = rt.supply.profile
    measured = s["profiled_clocks_mhz"]
    lowest = energy_minimum_mhz()  # 1050 MHz on the simulated A100
    assert s["sweep_stopped_early"], "the early stop triggers on the simulated GPU's curve"
    assert min(measured) >= lowest - 2 * 90 and min(measured) > 240 + 600, measured
    assert min(measured) < lowest, "it measured past the minimum to see energy stop falling (twice: patience 2)"
    assert len(set(measured)) <= 7 + 2, measured  # coarse pass 2 clocks past the minimum, at most 2 refinements
    assert s["profiling_iterations"] <= 2 + 3 * 9 + 2 * 3, s["profiling_iterations"]
    # Every candidate clock from the top to the lowest measured one is in the profile; the ones
    # not measured were interpolated where the model predicted the measured ones.
    entry = profile.get(0, "forward")
    q = profile.quality[(0, 0, "forward")]
    interpolated = [f for f, i in zip(entry.freqs_mhz, q["interpolated"]) if i]
    assert interpolated and set(entry.freqs_mhz) >= set(measured)
    for f, t in zip(entry.freqs_mhz, entry.times_s):
        assert t >= T_MAX["forward"] * MODEL.slowdown(f, 0.8) * (1 - 1e-3), (f, t)
        assert t <= T_MAX["forward"] * MODEL.slowdown(f, 0.8) * 1.05, (f, t)
    assert all(a <= b for a, b in zip(entry.times_s, entry.times_s[1:])), "time never falls as the clock drops"
    overhead = s["profiling_overhead"]
    assert overhead["iterations"] == s["profiling_iterations"] - 2
    assert overhead["extra_time_s"] > 0, "lower clocks make profiling steps slower than the warm-up's"


def test_sweep_state_round_trips_and_skips_visited_clocks():
    sweep = ClockSweep([1410, 1320, 1230, 1140], iters_per_freq=2, patience=1)
    for _ in range(2):
        sweep.count_iteration()
    sweep.next_frequency(False)
    again = ClockSweep([1410, 1320, 1230, 1140], iters_per_freq=2, patience=1)
    again.restore(json.loads(json.dumps(sweep.state())))
    assert again.visited == [1410] and again.current_mhz == 1320 and again.first_iteration


def test_a_run_that_ends_while_profiling_keeps_its_clocks_and_the_next_resumes(tmp_path):
    sim(tmp_path)
    with PerseusRuntime(JOB, config(tmp_path)) as rt:
        train(rt, 2 + 3 * 2 + 1)  # warm-up, two whole clocks, one iteration of the third
        assert rt.phase.value == "profiling"
        cache = rt.cache
        first_clocks = list(rt.supply.profiling.sweep.visited)
    assert first_clocks == [1410, 1320]
    partial = json.loads(cache.partial_path.read_text())
    assert partial["sweep"]["visited"] == first_clocks and partial["cache_key"] == cache.hash
    assert not cache.profile_path.exists()

    with PerseusRuntime(JOB, config(tmp_path)) as rt:
        profile_to_end(rt)
        s = rt.summary()
        swept = [r.freq_mhz for r in rt.reporter.records if r.phase.value == "profiling"]
        events = [what for _, what, _ in rt.events]
    assert not set(swept) & set(first_clocks), "the kept clocks are not measured again"
    assert s["profiled_clocks_mhz"][:2] == first_clocks
    assert s["profiling_iterations"] == 2 + len(swept)
    assert "profiled" in events and "profiling_overhead" in events
    profile = RunCache(tmp_path / "cache", cache.key).load_profile()
    assert profile is not None and not cache.partial_path.exists(), "the finished profile replaces the partial one"
    q = profile.quality[(0, 0, "backward")]
    measured = {f for f, i in zip(profile.get(0, "backward").freqs_mhz, q["interpolated"]) if not i}
    assert set(first_clocks) <= measured


def test_a_partial_profile_of_another_key_is_not_resumed(tmp_path, caplog):
    sim(tmp_path)
    with PerseusRuntime(JOB, config(tmp_path)) as rt:
        train(rt, 2 + 3)
        cache = rt.cache
    data = json.loads(cache.partial_path.read_text())
    data["cache_key"] = "0" * 16
    cache.partial_path.write_text(json.dumps(data))
    with PerseusRuntime(JOB, config(tmp_path)) as rt:
        train(rt, 3)
        assert rt.supply.profiling is not None and rt.supply.profiling.resumed_clocks == []
    assert "was written for cache key" in caplog.text


class _Poller:
    interval_s = 0.005

    def updates(self):
        return []

    def counter_period_s(self):
        return None  # no counter period measured: no clock is lengthened for attribution

    def stop(self):
        pass


class _Port:
    """Just what a ProfilingRun asks of the GPU: the clock list and clock changes."""

    supported_mhz = list(range(1410, 209, -15))

    def __init__(self):
        self.applied = []

    def apply(self, mhz):
        self.applied.append(mhz)

    def reset(self):
        self.applied.append("default")

    def energy_poller(self, period_s):
        return _Poller()

    def energy_source(self):
        return _Poller()


def _timed(t0, fwd_times):
    from perseus.gpu.meter.timing import TimedInstruction

    out, t = [], t0
    for d in fwd_times:
        out.append(TimedInstruction((0, "forward"), t, t + d))
        t += d
        out.append(TimedInstruction((0, "backward"), t, t + 2 * d))
        t += 2 * d
    return out, t


def test_noise_larger_than_the_effect_is_measured_again_within_a_bound(caplog):
    """At 1320 MHz the samples scatter by ±20 % around a 3 % effect: the clock is measured
    again, at most remeasure_max times per sweep, with one log line each."""
    from perseus.runtime.plane.collective import Collective
    from perseus.runtime.measure.profiling_run import ProfilingRun

    cfg = PerseusConfig.from_dict({"gpu": "sim", "freq_min_mhz": 1230, "remeasure_max": 2, "cache_dir": None})
    run = ProfilingRun(_Port(), Collective(), cfg, [(0, "backward"), (0, "forward")])
    caplog.set_level(logging.INFO, logger="perseus")
    run.start(80.0)
    t, steps_at = 0.0, {}
    noisy = [[0.0032, 0.0026, 0.0035, 0.0025], [0.0024, 0.0036, 0.0027, 0.0034]]
    for i in range(40):
        clock = run.sweep.current_mhz
        base = 0.003 * MODEL.slowdown(clock, 0.8)
        fwd = [x / 0.003 * base for x in noisy[i % 2]] if clock == 1320 else [base] * 4
        timed, t_end = _timed(t, fwd)
        steps_at[clock] = steps_at.get(clock, 0) + 1
        done = run.step(timed, t_end - t, 10.0 * (t_end - t))
        t = t_end
        if done:
            break
    assert done and run.sweep.remeasured == 2
    assert steps_at[1320] == 3 * 3 and steps_at[1410] == 3, steps_at
    assert caplog.text.count("larger than the clock's effect") == 2


class _CountedPort(_Port):
    """A port whose poller measured a 100 ms counter."""

    def energy_source(self):
        poller = _Poller()
        poller.counter_period_s = lambda: 0.1
        return poller


def test_a_clock_is_measured_until_it_spans_enough_counter_intervals():
    """30 intervals of a 100 ms counter need 3.1 s of steps: 0.5 s steps at 2 iterations per clock
    are lengthened, by whole rounds and at most to 3 x iters_per_freq (the default asks for 10
    intervals, which 2 steps of 0.5 s already span)."""
    from perseus.runtime.measure.profiling_run import ProfilingRun
    from perseus.runtime.plane.collective import Collective

    cfg = PerseusConfig.from_dict({"gpu": "sim", "freq_min_mhz": 1380, "iters_per_freq": 2, "remeasure_max": 0,
                                   "cache_dir": None, "attribution_intervals": 30})
    port = _CountedPort()
    run = ProfilingRun(port, Collective(), cfg, [(0, "forward"), (0, "backward")])
    run.start(100.0)
    steps = 0
    t = 0.0
    while not run.step(_timed(t, [0.1, 0.1])[0], 0.5, 50.0):
        steps += 1
        t += 0.5
        if run.sweep.visited:
            break
    assert run.sweep.visited == [1410] and steps + 1 == 6  # 2, lengthened to 4, then to the bound 6
