"""``python -m perseus_megatron.pretrain_gpt`` against a fake minimal Megatron-LM checkout.

The real ``megatron.training`` is not installed here, so the fake checkout's ``pretrain`` records
what the launcher passed it (and parses the command line with the composed provider, as
Megatron-LM's ``parse_args`` does) into a JSON file.
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

FAKE_TRAINING = '''
import argparse, json, os, sys

def pretrain(train_valid_test_dataset_provider, model_provider, model_type, forward_step_func,
             process_non_loss_data_func=None, extra_args_provider=None, args_defaults={},
             get_embedding_ranks=None, store=None):
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--num-layers", type=int)
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    args = parser.parse_args(sys.argv[1:])
    from perseus_megatron import hooks
    handle = hooks.active_handle()
    record = {
        "argv0": sys.argv[0], "args": vars(args), "model_type": model_type, "store": store,
        "args_defaults": args_defaults, "forward_step": forward_step_func.__name__,
        "is_distributed": getattr(train_valid_test_dataset_provider, "is_distributed", False),
        "model_provider": model_provider(), "hooks_installed": handle is not None,
        "get_embedding_ranks": get_embedding_ranks is not None,
    }
    with open(os.environ["FAKE_PRETRAIN_OUT"], "w") as f:
        json.dump(record, f)
'''

FAKE_RESTART = '''
def maybe_wrap_for_inprocess_restart(pretrain):
    return pretrain, "fake-store"
'''

FAKE_PRETRAIN_GPT = '''
from megatron.training import inprocess_restart, pretrain

class ModelType:
    encoder_or_decoder = "encoder_or_decoder"

has_nvidia_modelopt = True

def add_modelopt_args(parser):
    parser.add_argument("--modelopt-flag", action="store_true")
    return parser

def gpt_builder():
    return "gpt"

def model_provider(builder=None):
    return "built with " + (builder() if builder else "nothing")

def forward_step(data_iterator, model):
    raise AssertionError("not called by the fake pretrain")

def train_valid_test_datasets_provider(num_samples):
    raise AssertionError("not called by the fake pretrain")

if __name__ == "__main__":
    raise SystemExit("the launcher must not run pretrain_gpt's __main__")
'''


@pytest.fixture
def fake_checkout(tmp_path: Path) -> Path:
    root = tmp_path / "Megatron-LM"
    training = root / "megatron" / "training"
    training.mkdir(parents=True)  # no megatron/__init__.py: megatron.core still resolves to the wheel
    (training / "__init__.py").write_text(textwrap.dedent(FAKE_TRAINING))
    (training / "inprocess_restart.py").write_text(textwrap.dedent(FAKE_RESTART))
    (root / "pretrain_gpt.py").write_text(textwrap.dedent(FAKE_PRETRAIN_GPT))
    return root


def _run(args: list[str], out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               FAKE_PRETRAIN_OUT=str(out))
    return subprocess.run([sys.executable, "-m", "perseus_megatron.pretrain_gpt", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_launcher_mirrors_pretrain_gpt_main_with_perseus_flags_added(fake_checkout, tmp_path):
    out = tmp_path / "record.json"
    proc = _run(["--num-layers", "4", "--megatron-lm", str(fake_checkout), "--modelopt-flag",
                 "--perseus", "--perseus-mode", "profile", "--perseus-gpu", "sim"], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["argv0"].endswith("pretrain_gpt.py")
    args = record["args"]
    assert args["num_layers"] == 4 and args["modelopt_flag"]  # their provider still applies
    assert args["perseus"] and args["perseus_mode"] == "profile" and args["perseus_gpu"] == "sim"
    assert "megatron_lm" not in args  # the launcher's own flag never reaches Megatron
    assert record["model_provider"] == "built with gpt"  # partial(model_provider, gpt_builder)
    assert record["model_type"] == "encoder_or_decoder" and record["forward_step"] == "forward_step"
    assert record["store"] == "fake-store" and record["is_distributed"]
    assert record["args_defaults"] == {"tokenizer_type": "GPT2BPETokenizer"}
    assert not record["get_embedding_ranks"]  # the fake module has none to pass
    assert record["hooks_installed"]


def test_launcher_without_perseus_installs_nothing(fake_checkout, tmp_path):
    out = tmp_path / "record.json"
    proc = _run([f"--megatron-lm={fake_checkout}", "--num-layers", "2"], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert not record["hooks_installed"] and not record["args"]["perseus"]


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
