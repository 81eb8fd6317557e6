"""Help texts carry runnable examples; demo says plainly that it is not there yet."""

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


def test_demo_is_not_available_yet(capsys):
    assert main(["demo"]) == 1
    assert "not available yet" in capsys.readouterr().out
