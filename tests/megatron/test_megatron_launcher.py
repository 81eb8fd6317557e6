"""``python -m perseus_megatron.pretrain_gpt`` against fake minimal Megatron-LM checkouts of both generations.

The fakes copy only the entry shape of each ``pretrain_gpt.py`` generation (core <= 0.17:
``pretrain(..., extra_args_provider=...)``; core >= 0.18: ``parse_and_validate_args(...)`` then
``pretrain(full_config, ...)``) and record what Megatron parsed into a JSON file. The real
checkouts run in ``test_megatron_lm_pretrain_gpt.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perseus_megatron.pretrain_gpt import LauncherError, check_checkout, main, split_checkout

REPO = Path(__file__).resolve().parents[2]

FAKE_ARGUMENTS = '''
import argparse, sys

def add_megatron_arguments(parser):
    parser.add_argument("--num-layers", type=int)
    return parser

def parse_args(extra_args_provider=None, ignore_unknown_args=False):
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser = add_megatron_arguments(parser)
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    return parser.parse_args(sys.argv[1:])
'''

FAKE_ARGUMENTS_NEW = FAKE_ARGUMENTS + '''
def parse_and_validate_args(extra_args_provider=None, ignore_unknown_args=False, args_defaults={}):
    args = parse_args(extra_args_provider, ignore_unknown_args)
    args.args_defaults = args_defaults
    return args
'''

FAKE_RECORD = '''
import json, os, sys

def record(args, **extra):
    from perseus_megatron import hooks
    data = {"argv0": sys.argv[0], "args": vars(args), "hooks_installed": hooks.active_handle() is not None,
            **extra}
    with open(os.environ["FAKE_PRETRAIN_OUT"], "w") as f:
        json.dump(data, f)
'''

# core <= 0.17: pretrain() parses the arguments with the script's extra_args_provider.
FAKE_TRAINING_OLD = FAKE_RECORD + '''
def pretrain(train_valid_test_dataset_provider, model_provider, model_type, forward_step_func,
             extra_args_provider=None, args_defaults={}, store=None):
    from megatron.training.arguments import parse_args
    args = parse_args(extra_args_provider)
    record(args, generation="old", model_provider=model_provider(), store=store)
'''

FAKE_PRETRAIN_GPT_OLD = '''
from functools import partial
from megatron.training import pretrain

def add_modelopt_args(parser):
    parser.add_argument("--modelopt-flag", action="store_true")
    return parser

def model_provider(builder=None):
    return "built with " + (builder() if builder else "nothing")

if __name__ == "__main__":
    pretrain(None, partial(model_provider, lambda: "gpt"), "encoder_or_decoder", None,
             extra_args_provider=add_modelopt_args, args_defaults={"tokenizer_type": "GPT2BPETokenizer"},
             store="fake-store")
'''

# core >= 0.18: the script parses first, then pretrain(full_config, ...) takes no provider.
FAKE_TRAINING_NEW = FAKE_RECORD + '''
def pretrain(cfg_container, train_valid_test_dataset_provider, model_type, forward_step_func, store=None):
    record(cfg_container["args"], generation="new", store=store, defaults=cfg_container["args"].args_defaults)
'''

FAKE_PRETRAIN_GPT_NEW = '''
from megatron.training import pretrain
from megatron.training.arguments import parse_and_validate_args

def add_modelopt_args(parser):
    parser.add_argument("--modelopt-flag", action="store_true")
    return parser

if __name__ == "__main__":
    args = parse_and_validate_args(extra_args_provider=add_modelopt_args,
                                   args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
    pretrain({"args": args}, None, "encoder_or_decoder", None, store="fake-store")
'''


def _fake_checkout(root: Path, training: str, arguments: str, script: str) -> Path:
    package = root / "megatron" / "training"
    package.mkdir(parents=True)  # no megatron/__init__.py: megatron.core still resolves to the wheel
    (package / "__init__.py").write_text(textwrap.dedent(training))
    (package / "arguments.py").write_text(textwrap.dedent(arguments))
    (root / "pretrain_gpt.py").write_text(textwrap.dedent(script))
    return root


@pytest.fixture(params=["old", "new"])
def fake_checkout(request, tmp_path: Path) -> Path:
    root = tmp_path / f"Megatron-LM-{request.param}"
    if request.param == "old":
        return _fake_checkout(root, FAKE_TRAINING_OLD, FAKE_ARGUMENTS, FAKE_PRETRAIN_GPT_OLD)
    return _fake_checkout(root, FAKE_TRAINING_NEW, FAKE_ARGUMENTS_NEW, FAKE_PRETRAIN_GPT_NEW)


def _run(args: list[str], out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               FAKE_PRETRAIN_OUT=str(out))
    return subprocess.run([sys.executable, "-m", "perseus_megatron.pretrain_gpt", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_launcher_runs_the_checkouts_own_main_with_perseus_flags_added(fake_checkout, tmp_path):
    out = tmp_path / "record.json"
    proc = _run(["--num-layers", "4", "--megatron-lm", str(fake_checkout), "--modelopt-flag",
                 "--perseus", "--perseus-mode", "profile", "--perseus-gpu", "sim"], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["argv0"].endswith("pretrain_gpt.py")
    assert record["generation"] == fake_checkout.name.rsplit("-", 1)[1]
    args = record["args"]
    assert args["num_layers"] == 4 and args["modelopt_flag"]  # their provider still applies
    assert args["perseus"] and args["perseus_mode"] == "profile" and args["perseus_gpu"] == "sim"
    assert "megatron_lm" not in args  # the launcher's own flag never reaches Megatron
    assert record["store"] == "fake-store"
    if record["generation"] == "old":
        assert record["model_provider"] == "built with gpt"
    else:
        assert record["defaults"] == {"tokenizer_type": "GPT2BPETokenizer"}
    assert record["hooks_installed"]


def test_launcher_without_perseus_installs_nothing(fake_checkout, tmp_path):
    out = tmp_path / "record.json"
    proc = _run([f"--megatron-lm={fake_checkout}", "--num-layers", "2"], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert not record["hooks_installed"] and not record["args"]["perseus"]


def test_unknown_flag_is_still_refused_by_megatrons_parser(fake_checkout, tmp_path):
    proc = _run([f"--megatron-lm={fake_checkout}", "--perseus-no-such-flag"], tmp_path / "record.json")
    assert proc.returncode == 2 and "unrecognized arguments: --perseus-no-such-flag" in proc.stderr


FAKE_PRETRAIN_GPT_PATCHED = '''
from megatron.training import pretrain

if __name__ == "__main__":
    from perseus_megatron import add_perseus_args, compose_providers, enable_from_argv
    perseus = enable_from_argv()
    pretrain(None, lambda: "gpt", "encoder_or_decoder", None,
             extra_args_provider=compose_providers(None, add_perseus_args), store="fake-store")
    if perseus is not None:
        perseus.close()
'''


def test_patched_pretrain_gpt_is_run_as_is(tmp_path):
    """A pretrain_gpt.py carrying the patch adds the flags and enables Perseus itself; adding them
    twice would be an argparse conflict, enabling twice HooksAlreadyInstalled."""
    root = _fake_checkout(tmp_path / "patched", FAKE_TRAINING_OLD, FAKE_ARGUMENTS, FAKE_PRETRAIN_GPT_PATCHED)
    out = tmp_path / "record.json"
    proc = _run([f"--megatron-lm={root}", "--num-layers", "3", "--perseus", "--perseus-gpu", "sim"], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["args"]["perseus"] and record["args"]["num_layers"] == 3 and record["hooks_installed"]


def test_checkout_without_add_megatron_arguments_is_a_clear_error(tmp_path):
    root = _fake_checkout(tmp_path / "odd", FAKE_TRAINING_OLD, "def parse_args(*a, **k):\n    pass\n",
                          FAKE_PRETRAIN_GPT_OLD)
    proc = _run([f"--megatron-lm={root}", "--perseus"], tmp_path / "record.json")
    assert proc.returncode == 2 and "add_megatron_arguments" in proc.stderr


def test_bad_checkout_path_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "pretrain_gpt.py").write_text("")
    with pytest.raises(SystemExit) as exc:
        main(["--megatron-lm", str(tmp_path), "--perseus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "is not a Megatron-LM checkout" in err and "megatron/training" in err


def test_missing_checkout_flag_explains_what_to_pass(monkeypatch):
    monkeypatch.delenv("MEGATRON_LM", raising=False)
    with pytest.raises(LauncherError, match="--megatron-lm"):
        split_checkout(["--perseus"])
    with pytest.raises(LauncherError, match="needs a path"):
        split_checkout(["--perseus", "--megatron-lm"])


def test_checkout_from_environment_and_flag_removed_from_argv(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGATRON_LM", str(tmp_path))
    path, rest = split_checkout(["--num-layers", "2", "--perseus"])
    assert path == tmp_path.resolve() and rest == ["--num-layers", "2", "--perseus"]
    path, rest = split_checkout(["--megatron-lm", "/x/y", "--lr", "1"])
    assert path == Path("/x/y").resolve() and rest == ["--lr", "1"]


def test_check_checkout_accepts_a_checkout_layout(fake_checkout):
    check_checkout(fake_checkout)
