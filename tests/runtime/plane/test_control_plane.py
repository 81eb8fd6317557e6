"""The hierarchical control plane makes the flat one's decisions (issue 29).

Eight real gloo processes (data-parallel 2 × pipeline 2 × tensor-parallel 2), in a rank order that
is not megatron-core's, run the runtime's control-plane operations on both designs: agreement,
broadcasts, the sweep's votes, each stage's plan, the job check, the profile (aggregated by
``aggregate_profile`` as the runtime does) and the cache key's stage fingerprints. The answers
must be the same; the hierarchical plane's peers must be its axes', not the job's.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from plane_ranks import grid_job, run_ranks

from perseus.errors import ConfigError
from perseus.profile.aggregate import (ClockPoint, RankMeasurements, _combine, aggregate_profile, replica_vector,
                                       replicas_mean)
from perseus.runtime.plane.layout import Coordinates, GridShape, exchange_peers

GRID = [1410, 1260, 1110]
DP, PP, TP = 2, 2, 2


def _measurements(rank: int, stage: int) -> RankMeasurements:
    """Different numbers on every rank; rank 5 misses one clock (kept out of the profile everywhere)."""
    per = {}
    for chunk, kind in ((0, "forward"), (0, "backward")):
        per[(chunk, kind)] = {f: ClockPoint(0.01 * (1 + stage) * 1410 / f * (1 + 0.003 * rank), 2.0 + 0.1 * rank + f / 1e3,
                                            3 + rank % 2, 1e-4 * (rank + 1), 1e-5 * (rank + 1), 1.9 + 0.05 * rank)
                              for f in GRID if not (rank == 5 and f == 1260 and kind == "forward")}
    return RankMeasurements(stage, 0, 0, per, 40.0 + rank, "Sim A100")


def _scenario(rank: int, world: int, design: str) -> dict:
    from perseus.runtime.plane.design import open_control_plane
    from perseus.runtime.supply.sources import stage_models

    job = grid_job(rank, DP, PP, TP)
    job = type(job)(**{**job.__dict__, "stage_fingerprint": f"stage{job.stage}-params"})
    plane = open_control_plane(job, None, 20.0, design)
    out: dict = {"design": plane.design, "root": plane.is_root}
    out["agree_all"] = plane.all_true(True)
    out["agree_one_no"] = plane.all_true(rank != 6)
    out["broadcast_int"] = plane.broadcast_int(1234 if plane.is_root else -1)
    out["broadcast_object"] = plane.broadcast_object({"plan": "ready", "from": rank} if plane.is_root else None)
    out["votes"] = plane.vote_any([1.0 if (rank == 3 and i == 1) or (rank == 7 and i == 4) else 0.0 for i in range(6)])
    before = plane.sent_bytes
    mine = plane.deliver_stage((lambda s: f"stage {s} plan".encode() * (s + 1)) if plane.is_root else None, job.stage)
    out["plan_bytes"] = plane.sent_bytes - before
    out["delivered_ok"] = mine == f"stage {job.stage} plan".encode() * (job.stage + 1)
    natural = 0.1 + 0.01 * rank + (0.05 if job.dp_rank == 1 else 0.0)
    rows = plane.pipeline_rows(job.dp_rank, natural, 10.0 + rank, diverged=(rank == 2))
    out["rows"] = [[r.dp, r.natural_s, r.energy_j, r.diverged] for r in rows]
    later = plane.start_pipeline_rows(job.dp_rank, natural, 10.0 + rank, False).result()
    out["rows_overlapped"] = [[r.dp, r.natural_s, r.energy_j, r.diverged] for r in later]
    m = _measurements(rank, job.stage)
    m = RankMeasurements(job.stage, job.tp_rank, job.dp_rank, m.measurements, m.p_blocking_w, m.gpu_name)
    gathered = plane.gather_measurements(m, GRID)
    if plane.is_root:
        profile = aggregate_profile(gathered, PP, TP, grid=GRID)
        out["profile"] = {f"{k}": [list(e.freqs_mhz), list(e.times_s), list(e.energies_j)] for k, e in sorted(profile.entries.items())}
        out["p_blocking"] = profile.p_blocking_w
    out["stage_models"] = stage_models(plane, job)
    channel = plane.blocking_channel()
    out["peers"] = plane.peer_count() if hasattr(plane, "peer_count") else plane.size - 1
    if channel is not None:
        import torch
        t = torch.tensor([float(rank)])
        if channel.first:
            channel.send(t)
            channel.recv(t)
        else:
            got = torch.zeros(1)
            channel.recv(got)
            channel.send(torch.tensor([float(rank)]))
            t = got
        out["pair_heard"] = int(t.item())
    plane.close()
    return out


@pytest.fixture(scope="module")
def both() -> dict[str, list[dict]]:
    return {design: run_ranks(_scenario, DP * PP * TP, design) for design in ("flat", "hierarchical")}


def _ok(results: list[dict]) -> list[dict]:
    for r in results:
        assert "ok" in r, r.get("traceback", r)
    return [r["ok"] for r in results]


def test_hierarchical_plane_answers_as_the_flat_one(both):
    flat, hier = _ok(both["flat"]), _ok(both["hierarchical"])
    assert {r["design"] for r in hier} == {"hierarchical"} and {r["design"] for r in flat} == {"flat"}
    for f, h in zip(flat, hier):
        for key in ("root", "agree_all", "agree_one_no", "broadcast_int", "broadcast_object", "votes", "delivered_ok",
                    "stage_models"):
            assert f[key] == h[key], (key, f[key], h[key])
        for a, b in zip(f["rows"] + f["rows_overlapped"], h["rows"] + h["rows_overlapped"]):
            assert a[0] == b[0] and a[1] == b[1] and a[3] == b[3]  # pipeline, its time and divergence: exact
            assert a[2] == pytest.approx(b[2], rel=1e-12)  # energy: a sum in another order
    assert flat[0]["agree_one_no"] is False and flat[0]["votes"] == [False, True, False, False, True, False]
    assert flat[0]["broadcast_object"]["plan"] == "ready" and all(r["delivered_ok"] for r in hier)


def test_hierarchical_profile_is_the_flat_profile(both):
    flat = next(r["ok"] for r in both["flat"] if r["ok"]["root"])
    hier = next(r["ok"] for r in both["hierarchical"] if r["ok"]["root"])
    assert flat["profile"].keys() == hier["profile"].keys()
    for key, (freqs, times, energies) in flat["profile"].items():
        h_freqs, h_times, h_energies = hier["profile"][key]
        assert freqs == h_freqs, key  # the same clocks kept (rank 5's missing one dropped on both)
        assert times == pytest.approx(h_times, rel=1e-12) and energies == pytest.approx(h_energies, rel=1e-12)
    assert flat["p_blocking"] == pytest.approx(hier["p_blocking"], rel=1e-12)


def test_hierarchical_peers_are_the_axes_and_rank0_sends_each_stage_once(both):
    flat, hier = _ok(both["flat"]), _ok(both["hierarchical"])
    assert all(r["peers"] == DP * PP * TP - 1 for r in flat)
    assert all(r["peers"] == (DP - 1) + (PP - 1) + (TP - 1) for r in hier)
    root_flat = next(r for r in flat if r["root"])
    root_hier = next(r for r in hier if r["root"])
    # Flat: one slice per other rank (3 of stage 0's, 4 of stage 1's); hierarchical: stage 1's once,
    # stage 0's to its one other replica and its one tensor-parallel partner.
    stage0, stage1 = len(b"stage 0 plan") + 8, 2 * len(b"stage 1 plan") + 8
    assert root_flat["plan_bytes"] == 3 * stage0 + 4 * stage1
    assert root_hier["plan_bytes"] == stage1 + 2 * stage0
    assert all(r.get("pair_heard") is not None for r in hier)  # every rank has a P_blocking partner


def _timeout_scenario(rank: int, world: int) -> dict:
    from perseus.runtime.plane.collective import CollectiveError
    from perseus.runtime.plane.design import open_control_plane

    plane = open_control_plane(grid_job(rank, DP, PP, TP), None, 3.0, "hierarchical")
    assert plane.all_true(True)
    if rank == 5:
        time.sleep(12.0)  # hangs: never joins the next agreement
        return {"skipped": True}
    t0 = time.monotonic()
    try:
        plane.all_true(True)
    except CollectiveError as exc:
        return {"error_line": str(exc), "after_s": time.monotonic() - t0}
    return {"error_line": None}


def test_a_collective_times_out_on_every_rank_with_one_line():
    """Rank 5 stops taking part: every other rank's agreement gives up (its axes' peers first,
    the rest as their partners give up), each with one CollectiveError line."""
    results = _ok(run_ranks(_timeout_scenario, DP * PP * TP))
    for rank, r in enumerate(results):
        if rank == 5:
            continue
        assert r["error_line"] and "\n" not in r["error_line"] and "agreement" in r["error_line"], r
        assert r["after_s"] < 60  # a hang guard, not a latency limit: three axes × the 3 s timeout at most


# ---------------------------------------------------------------- pure pieces


def test_exchange_finds_axis_peers_in_any_rank_order_and_refuses_twins():
    import torch.distributed as dist

    shape = GridShape(2, 3, 2)
    store = dist.HashStore()
    jobs = [grid_job(r, 2, 3, 2, order="dp-tp-pp") for r in range(12)]
    found: dict[int, object] = {}

    def one(r: int) -> None:
        j = jobs[r]
        found[r] = exchange_peers(store, shape, Coordinates(j.dp_rank, j.stage, j.tp_rank), r, 10.0)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    coords = {r: (j.dp_rank, j.stage, j.tp_rank) for r, j in enumerate(jobs)}
    for r, peers in found.items():
        d, s, t = coords[r]
        assert [coords[x] for x in peers.ranks["pp"]] == [(d, k, t) for k in range(3)]
        assert [coords[x] for x in peers.ranks["dp"]] == [(k, s, t) for k in range(2)]
        assert [coords[x] for x in peers.ranks["tp"]] == [(d, s, k) for k in range(2)]
        assert peers.peer_count() == 1 + 2 + 1
    with pytest.raises(ConfigError, match="both say they are"):
        exchange_peers(store, shape, Coordinates(0, 0, 0), 99, 1.0)


def test_replica_sum_reduction_is_aggregate_profiles_mean():
    keys = [(0, "backward"), (0, "forward")]
    parts = [_measurements(r, 1).measurements for r in (0, 5, 3)]
    total = [sum(v) for v in zip(*(replica_vector(p, keys, GRID) for p in parts))]
    mean = replicas_mean(total, 3, keys, GRID)
    want = _combine(parts, "mean", "mean")
    assert set(mean[(0, "forward")]) == set(want[(0, "forward")]) == {1410, 1110}
    for key in keys:
        for f, point in want[key].items():
            for a, b in zip(mean[key][f], point):
                assert a == pytest.approx(b, rel=1e-12), (key, f)
