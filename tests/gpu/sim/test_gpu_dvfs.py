"""The simulated GPU's DVFS model has the shape of real measurements."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest

from perseus.gpu import PRESETS, DVFSModel, GPUInvalidArgumentError, get_preset

# The public Perseus artifact's profiles, in ../shared beside the checkout when present.
DATA = Path(os.environ.get("PERSEUS_ARTIFACT_DATA", Path(__file__).resolve().parents[3].parent / "shared" / "data" / "perseus-sosp24"))


def _energy_curve(m: DVFSModel, alpha: float = 0.8) -> tuple[list[int], np.ndarray]:
    fs = m.supported_sm_clocks()
    e = np.array([m.kernel_energy_j(1.0, m.throttled_clock(f, 1.0, m.tdp_w), 1.0, alpha) for f in fs])
    return fs, e


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_energy_minimum_is_at_a_mid_frequency(name):
    m = get_preset(name)
    fs, e = _energy_curve(m)
    f_best = fs[int(e.argmin())]
    assert m.sm_min_mhz + 300 < f_best < m.sm_max_mhz - 150
    assert e[-1] > 1.3 * e.min()  # the minimum clock wastes energy (static power for longer)
    assert e.min() < 0.85 * e[0]  # and slowing down from max really saves energy
    # power is monotone in frequency, time is monotone decreasing
    p = [m.busy_power_w(f) for f in fs]
    t = [m.kernel_time_s(1.0, f) for f in fs]
    assert p == sorted(p, reverse=True) and t == sorted(t)


def test_equations():
    m = get_preset("A100-SXM")
    assert m.kernel_time_s(0.1, 705, compute_fraction=0.6) == pytest.approx(0.1 * (0.6 * 2 + 0.4))
    assert m.busy_power_w(1410, 0.5) == pytest.approx(100 + 0.5 * 290)
    # above the knee, dynamic power scales as f^gamma
    assert m.busy_power_w(1200) - 100 == pytest.approx(290 * (1200 / 1410) ** 3)
    # below the knee the voltage is at its floor: power falls only linearly with f
    ratio = (m.busy_power_w(500) - 100) / (m.busy_power_w(1000) - 100)
    assert ratio == pytest.approx(0.5)
    assert m.supported_sm_clocks()[:2] == [1410, 1395] and len(m.supported_sm_clocks()) == 81
    assert m.nearest_clock(1001) == 1005 and m.nearest_clock(5) == 210


def test_power_limit_throttles_the_a40_top_clocks():
    m = get_preset("A40")
    top = m.throttled_clock(1740, 1.0, m.tdp_w)
    assert 1400 < top < 1740 and m.busy_power_w(top) <= 300
    assert m.throttled_clock(1740, 0.3, m.tdp_w) == 1740  # light kernels are not throttled
    assert m.throttled_clock(1200, 1.0, m.tdp_w) == 1200


def test_invalid_models_and_presets():
    with pytest.raises(GPUInvalidArgumentError, match="choose one of"):
        get_preset("V100")
    base = PRESETS["A100-SXM"].to_dict()
    with pytest.raises(GPUInvalidArgumentError, match="knee"):
        DVFSModel(**{**base, "knee_mhz": 100})
    with pytest.raises(GPUInvalidArgumentError, match="step"):
        DVFSModel(**{**base, "sm_step_mhz": 7})


def _measured(fn: str) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    path = DATA / fn
    if not path.exists():
        pytest.skip(f"{path} not available")
    rows = list(csv.DictReader(path.open()))
    out = {}
    for key in {(r["stage"], r["instruction"]) for r in rows}:
        rr = sorted(((int(r["frequency"]), float(r["time"]), float(r["energy"])) for r in rows
                     if (r["stage"], r["instruction"]) == key), reverse=True)
        out[key] = tuple(np.array(c) for c in zip(*rr))
    return out


def test_a100_model_matches_measured_profile_shape():
    """Normalized E(f)/E(f_max) and t(f)/t(f_max) within 6 % of the real A100 GPT-3 profile."""
    m = get_preset("A100-SXM")
    for (_stage, _kind), (f, t, e) in _measured("gpt3-175b+a100_sxm_bf16.csv").items():
        me = np.array([m.kernel_energy_j(1.0, x) for x in f])
        mt = np.array([m.kernel_time_s(1.0, x) for x in f])
        assert np.abs(me / me[0] - e / e[0]).max() < 0.06
        assert np.abs(mt / mt[0] - t / t[0]).max() < 0.06
        assert abs(f[me.argmin()] - f[e.argmin()]) <= 60


def test_a40_model_matches_measured_forward_shape():
    m = get_preset("A40")
    for (_stage, kind), (f, _t, e) in _measured("gpt3-175b+a40_bf16.csv").items():
        if kind != "forward":
            continue
        me = np.array([m.kernel_energy_j(1.0, m.throttled_clock(int(x), 1.0, m.tdp_w)) for x in f])
        assert np.abs(me / me[0] - e / e[0]).max() < 0.06
        assert abs(f[me.argmin()] - f[e.argmin()]) <= 90
