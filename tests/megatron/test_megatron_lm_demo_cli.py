"""``perseus demo --megatron-lm PATH``: wiring and report (the real run is in test_megatron_lm_pretrain_gpt.py)."""

from __future__ import annotations

import argparse

from perseus_demo.cli import add_demo_command


def main(argv: list[str]) -> int:
    """``perseus demo ...`` (the command is added the way perseus.cli adds it, without entry-point metadata)."""
    parser = argparse.ArgumentParser(prog="perseus")
    add_demo_command(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.handler(args)


def _summary(rank: int, fallback: str | None = None) -> dict:
    return {
        "rank": rank, "stage": rank, "fallback": fallback,
        "phase_history": [[0, "warmup"], [2, "profiling"], [5, "planning"], [7, "deployed"]],
        "phases": {"warmup": {"steps": 2, "time_s": 0.2, "energy_j": 10.0},
                   "profiling": {"steps": 3, "time_s": 0.25, "energy_j": 9.0},
                   "deployed": {"steps": 5, "time_s": 0.21, "energy_j": 8.0}},
    }


def test_demo_megatron_lm_runs_the_checkout_and_reports_phases(tmp_path, monkeypatch, capsys):
    import perseus_demo.megatron_lm_cpu as runner

    calls = []

    def fake_launch(checkout, out_dir, **kwargs):
        calls.append((checkout, out_dir, kwargs))
        return [_summary(0), _summary(1)]

    monkeypatch.setattr(runner, "launch", fake_launch)
    out = tmp_path / "demo"
    assert main(["demo", "--megatron-lm", str(tmp_path), "--stages", "4", "--chunks", "2", "--microbatches", "4",
                 "--out", str(out)]) == 0
    checkout, out_dir, kwargs = calls[0]
    assert checkout == tmp_path.resolve() and out_dir == out
    assert kwargs == {"stages": 4, "chunks": 2, "microbatches": 4, "train_iters": 24,
                      "extra_args": ["--perseus-warmup-steps", "4"]}
    report = capsys.readouterr().out
    assert "Megatron-LM pretrain_gpt.py" in report and "interleaved (2 chunks)" in report
    deployed = next(line for line in report.splitlines() if line.startswith("deployed"))
    assert "210.0ms" in deployed and "16.00 J" in deployed  # slowest rank's time, both ranks' energy
    assert "warmup@0 -> profiling@2 -> planning@5 -> deployed@7" in report


def test_demo_megatron_lm_reports_a_plan_mismatch(monkeypatch):
    import perseus_demo.megatron_lm_cpu as runner

    assert "plan mismatch: order differs" in runner.format_summaries([_summary(0, "order differs")])
    assert "plan mismatch" not in runner.format_summaries([_summary(0)])


def test_demo_megatron_lm_on_a_folder_that_is_no_checkout_is_one_line(tmp_path, capsys):
    from perseus.cli import main as perseus_main

    assert perseus_main(["demo", "--megatron-lm", str(tmp_path), "--out", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a Megatron-LM checkout" in err[0] and "Traceback" not in err[0]
