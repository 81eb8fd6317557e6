"""``perseus demo --megatron-lm PATH``: wiring and report (the real run is in test_megatron_lm_pretrain_gpt.py)."""

from __future__ import annotations

import argparse

import pytest

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


def test_missing_requirements_are_named_before_anything_is_launched(tmp_path, monkeypatch, capsys):
    """Megatron-LM's training code imports six, regex and yaml; without them the demo says what to
    pip install, in one line, and starts no torchrun."""
    import perseus_demo.megatron_lm_cpu as runner
    from megatron_lm_archive import release_for_installed_core, unpack
    from perseus.cli import main as perseus_main

    checkout = unpack(release_for_installed_core(), tmp_path)
    hidden = {"six", "yaml"}
    real = runner._importable
    monkeypatch.setattr(runner, "_importable", lambda module: module not in hidden and real(module))
    monkeypatch.setattr(runner.subprocess, "run", lambda *a, **k: pytest.fail("launched despite missing packages"))
    assert perseus_main(["demo", "--megatron-lm", str(checkout), "--out", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not installed: six, pyyaml; run: pip install six pyyaml" in err[0], err
    assert runner.missing_requirements(checkout) == ["six", "pyyaml"]
    hidden.clear()
    assert runner.missing_requirements(checkout) == []  # this suite's install has them (the dev extra)


def test_failed_launch_is_one_line_with_the_cause_and_the_log(tmp_path, monkeypatch, capsys):
    """A real torchrun of pretrain_gpt.py that fails (a bad --perseus-mode, refused before Megatron
    loads): the CLI prints the cause and the full log's path on one line, not a traceback."""
    import perseus_demo.megatron_lm_cpu as runner
    from megatron_lm_archive import release_for_installed_core, unpack
    from perseus.cli import main as perseus_main

    checkout = unpack(release_for_installed_core(), tmp_path)
    real_launch = runner.launch

    def bad_launch(checkout, out_dir, **kwargs):
        return real_launch(checkout, out_dir, **{**kwargs, "extra_args": [*kwargs["extra_args"], "--perseus-mode", "x"]})

    monkeypatch.setattr(runner, "launch", bad_launch)
    out = tmp_path / "demo"
    assert perseus_main(["demo", "--megatron-lm", str(checkout), "--stages", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert "argument --perseus-mode: invalid choice: 'x'" in err[0]
    assert err[0].endswith(f"full log: {out.resolve() / 'pretrain_gpt.log'}")
    assert "invalid choice" in (out / "pretrain_gpt.log").read_text()


def test_failure_line_is_the_ranks_exception_not_torchruns_summary():
    from perseus_demo.megatron_lm_cpu import failure_line

    log = "\n".join([
        "W1125 torch/distributed/run.py: Setting OMP_NUM_THREADS environment variable for each process to be 1",
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "pretrain_gpt.py", line 12, in <module>',
        "[rank0]:     import six",
        "[rank0]: ModuleNotFoundError: No module named 'six'",
        "Traceback (most recent call last):",
        '  File "torch/distributed/run.py", line 9, in main',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "Root Cause (first observed failure):",
        "  exitcode  : 1 (pid: 42)",
    ])
    assert failure_line(log) == "ModuleNotFoundError: No module named 'six'"
    assert failure_line("ok\nall fine\n") is None
    assert failure_line("x\nprog.py: error: unrecognized arguments: --bad\n") == "prog.py: error: unrecognized arguments: --bad"


def test_the_install_extras_bring_what_megatron_lm_training_imports():
    """The README's install (the dev extra) and the megatron extra carry every package the demo checks for."""
    import ast

    from megatron_lm_archive import REPO
    from perseus_demo.megatron_lm_cpu import TRAINING_REQUIREMENTS

    tree = ast.parse((REPO / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    extras = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "extras_require"))
    for extra in ("megatron", "dev"):
        names = {req.split(">")[0].split("<")[0].split("=")[0].strip().lower() for req in extras[extra]}
        assert set(TRAINING_REQUIREMENTS.values()) <= names, (extra, set(TRAINING_REQUIREMENTS.values()) - names)
