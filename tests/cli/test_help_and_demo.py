"""Help texts carry runnable examples; the demo command reports framework problems in one line."""

from __future__ import annotations

import pytest

from perseus.cli import main


@pytest.mark.parametrize(
    "command, example",
    [
        ("plan", "perseus plan --example --out frontier.json"),
        ("show", "perseus show frontier.json"),
        ("plot", "perseus plot frontier.json --timeline"),
        ("export", "perseus export frontier.json --format zeus"),
        ("emulate", "perseus emulate --example --gpus 1024"),
    ],
)
def test_subcommand_help_has_examples(command, example, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert example in capsys.readouterr().out


def test_demo_help_and_framework_errors(capsys, monkeypatch):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--help"])
    assert exc.value.code == 0
    assert "--framework" in capsys.readouterr().out
    # A framework whose package is missing: one line saying what to install, exit 2.
    import perseus_demo.cli

    monkeypatch.setitem(perseus_demo.cli.FRAMEWORKS, "megatron", "perseus_no_such_module.demo")
    assert main(["demo", "--framework", "megatron"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install" in err[0] and "[megatron]" in err[0]
