"""Profile import, validation and round trips."""

import math

import pytest

from perseus.errors import ProfileError
from perseus.profile import load_csv, load_json, load_profile
from perseus.schedules import build_schedule

HEADER = "stage,instruction,frequency,time,energy\n"


def write_rows(tmp_path, rows, header=HEADER, name="p.csv"):
    path = tmp_path / name
    path.write_text(header + "".join(rows))
    return path


def two_stage_rows():
    rows = []
    for stage in (0, 1):
        for kind, t in (("forward", 0.01), ("backward", 0.02)):
            for f, scale in ((1400, 1.0), (1000, 1.3)):
                rows.append(f"{stage},{kind},{f},{t * scale},{100 * t / scale}\n")
    return rows


def test_csv_is_grouped_by_stage_and_kind_fastest_first(tmp_path):
    p = load_csv(write_rows(tmp_path, reversed(two_stage_rows())), p_blocking_w=80.0)
    fwd = p.get(1, "forward")
    assert fwd.freqs_mhz == (1400, 1000)
    assert fwd.times_s[0] == pytest.approx(0.01)
    assert p.num_stages == 2 and p.p_blocking_w == 80.0


def test_json_round_trip_keeps_everything(tmp_path):
    p = load_csv(write_rows(tmp_path, two_stage_rows()), p_blocking_w=70.0)
    out = tmp_path / "p.json"
    p.save_json(out)
    q = load_json(out)
    assert dict(q.entries) == dict(p.entries)
    assert q.p_blocking_w == 70.0
    assert load_profile(out, p_blocking_w=60.0).p_blocking_w == 60.0


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda rows: rows + ["0,forward,1400,0.01,1.0\n"], r"p.csv:\d+: duplicate row"),
        (lambda rows: rows[:-1] + ["1,backward,1000,nan,1.0\n"], r"p.csv:\d+: time must be a positive"),
        (lambda rows: rows[:-1] + ["1,backward,1000,-0.1,1.0\n"], r"time must be a positive"),
        (lambda rows: rows[:-1] + ["1,backward,1000,0.1,0\n"], r"energy must be a positive"),
        (lambda rows: rows[:-1] + ["1,sideways,1000,0.1,1\n"], r"'forward' or 'backward'"),
        (lambda rows: rows[:-1] + ["1,backward,fast,0.1,1\n"], r"frequency must be an integer"),
        (lambda rows: [r for r in rows if not r.startswith("1,backward")], r"no backward measurements for stage 1"),
        (lambda rows: [r for r in rows if not r.startswith("0,")], r"no forward measurements for stage 0"),
        (lambda rows: [], r"no measurements"),
    ],
)
def test_malformed_csv_names_file_row_and_problem(tmp_path, mutate, message):
    path = write_rows(tmp_path, mutate(two_stage_rows()))
    with pytest.raises(ProfileError, match=message):
        load_csv(path)


def test_missing_columns_and_files_are_clear(tmp_path):
    with pytest.raises(ProfileError, match="lacks column"):
        load_csv(write_rows(tmp_path, ["0,forward,1400,0.1\n"], header="stage,instruction,frequency,time\n"))
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "nope.csv")
    with pytest.raises(ProfileError, match="unknown profile type"):
        load_profile(tmp_path / "p.txt")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="invalid JSON"):
        load_profile(bad)


def test_profile_must_match_the_pipeline(tmp_path):
    p = load_csv(write_rows(tmp_path, two_stage_rows()), p_blocking_w=80.0)
    with pytest.raises(ProfileError, match="2 stages but the pipeline has 4"):
        p.check_matches(build_schedule("1f1b", 4, 4))
    with pytest.raises(ProfileError, match="missing measurements for stage 0 chunk 1"):
        p.check_matches(build_schedule("interleaved", 2, 4, 2))
    p.check_matches(build_schedule("1f1b", 2, 4))


def test_p_blocking_is_required_and_validated(tmp_path):
    p = load_csv(write_rows(tmp_path, two_stage_rows()))
    with pytest.raises(ProfileError, match="--p-blocking"):
        p.require_p_blocking()
    with pytest.raises(ProfileError, match="P_blocking must be a positive"):
        p.with_p_blocking(math.nan)


def test_the_unlocked_card_is_its_measurement_else_the_highest_clock():
    """A plan may name the unlocked card; a profile that measured it answers with that, one that did
    not (a model's, an older file's) with its highest clock, the baseline it always stood for."""
    from perseus.profile import InstructionProfile
    from perseus.profile.unlocked import UNLOCKED_MHZ, Unlocked

    plain = InstructionProfile((1410, 1200), (0.010, 0.012), (2.0, 1.8))
    assert plain.at(UNLOCKED_MHZ) == (0.010, 2.0)
    measured = InstructionProfile((1410, 1200), (0.010, 0.012), (2.0, 1.8), Unlocked(0.0095, 2.1, 1530))
    assert measured.at(UNLOCKED_MHZ) == (0.0095, 2.1)
