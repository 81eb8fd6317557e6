"""The profile's optional measured switch latency (``Profile.switch_latency``): written to the JSON
document's top level with its sample count, read back; a profile without it (an older one, a CSV)
loads with none, and the document's version stays what it was, so older readers take it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from perseus.errors import ProfileError
from perseus.profile import InstructionProfile, Profile, load_json, load_profile
from perseus.profile.model import SwitchLatency


def _profile(**kw: Any) -> Profile:
    entries = {(0, 0, kind): InstructionProfile((1410, 1005), (t, 1.3 * t), (100 * t, 80 * t))
               for kind, t in (("forward", 0.01), ("backward", 0.02))}
    return Profile(entries, 80.0, "H200", **kw)


def test_the_measured_latency_round_trips_with_its_sample_count(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    _profile(switch_latency=SwitchLatency(0.0101, 7)).save_json(path)
    data = json.loads(path.read_text())
    assert data["switch_latency"] == {"seconds": 0.0101, "samples": 7} and data["version"] == 1
    loaded = load_json(path)
    assert loaded.switch_latency == SwitchLatency(0.0101, 7)
    assert load_profile(path, p_blocking_w=60.0).switch_latency == SwitchLatency(0.0101, 7)  # kept by with_p_blocking


def test_a_profile_without_it_loads_with_none_and_writes_none(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    _profile().save_json(path)
    assert "switch_latency" not in json.loads(path.read_text())  # what older profiles look like
    assert load_json(path).switch_latency is None
    csv = tmp_path / "p.csv"
    _profile(switch_latency=SwitchLatency(0.01, 3)).save_csv(csv)  # the CSV has no place for it
    assert load_profile(csv, 80.0).switch_latency is None


def test_a_bad_latency_is_named() -> None:
    from perseus.profile.decode import profile_from_json_dict

    doc = _profile().to_json_dict()
    for bad, message in (({"seconds": -1.0, "samples": 3}, "finite number of seconds"),
                         ({"seconds": 0.01, "samples": 0}, "samples must be an integer >= 1"),
                         ({"seconds": 0.01}, "must be an object with seconds and samples"),
                         (0.01, "must be an object with seconds and samples")):
        with pytest.raises(ProfileError, match=message):
            profile_from_json_dict({**doc, "switch_latency": bad}, "p.json")
    assert replace(_profile(), switch_latency=SwitchLatency(0, 1)).switch_latency == SwitchLatency(0.0, 1)
