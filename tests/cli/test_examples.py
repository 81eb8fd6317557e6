"""The shipped example profile: reproducible and physically shaped."""

from __future__ import annotations

import numpy as np

from perseus.examples import EXAMPLE_P_BLOCKING_W, example_profile_path, load_example_profile
from perseus.examples.synthetic import example_csv_text


def test_shipped_file_is_the_generator_output():
    assert example_profile_path().read_text() == example_csv_text()


def test_example_profile_shape():
    profile = load_example_profile()
    assert profile.num_stages == 4 and profile.p_blocking_w == EXAMPLE_P_BLOCKING_W
    for p in profile.entries.values():
        assert len(p.freqs_mhz) == 20
        times, power = np.array(p.times_s), np.array(p.energies_j) / np.array(p.times_s)
        assert np.all(np.diff(times) > 0)  # fastest clock first: time grows as the clock drops
        assert np.all(np.diff(power) < 0)  # and power falls
        assert power[0] > EXAMPLE_P_BLOCKING_W  # computing draws more than blocking
    last = profile.get(3, "forward").times_s[0]
    assert all(profile.get(s, "forward").times_s[0] < last for s in range(3))
    assert all(profile.get(s, "backward").times_s[0] > profile.get(s, "forward").times_s[0] for s in range(4))
