"""The Megatron patches apply to the real files of each release line and do what they say.

For every archived release (Megatron-LM core_v0.16.1, core_v0.17.1, core_v0.18.2 and core_v0.19.0) the checkout is unpacked
to a temporary directory; both patches must pass ``git apply --check`` and apply with ``patch -p1``
without offset or fuzz, and must equal what ``scripts/make_megatron_patches.py`` generates from
the file with the patcher (``python -m perseus_megatron.patch``), so they cannot drift from it. Then:

- the patched ``schedules.py`` compiles, carries the five hooks and passes the hook-point check
  (the 0.16 one is also imported and trained through in ``test_megatron_single_process.py``);
- the patched ``pretrain_gpt.py``'s own ``__main__`` block runs with Megatron's functions replaced
  by recorders: Megatron's parser gets the ``--perseus`` flags next to the script's own provider,
  and Perseus is enabled (real hooks on the installed megatron-core) only with ``--perseus``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from megatron_lm_archive import REPO, unpack
from perseus_megatron import compat, hooks

LINES = {"0.16.1": "0.16", "0.17.1": "0.17", "0.18.2": "0.18", "0.19.0": "0.19"}
SCHEDULES = "megatron/core/pipeline_parallel/schedules.py"


def _generator():
    spec = importlib.util.spec_from_file_location("make_megatron_patches", REPO / "scripts" / "make_megatron_patches.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", params=sorted(LINES))
def patched(request, tmp_path_factory) -> tuple[str, Path]:
    """(release line, checkout with both patches applied)."""
    version = request.param
    line = LINES[version]
    root = unpack(version, tmp_path_factory.mktemp(f"mlm-{version}"))
    names = _generator().patch_names(line)
    patches = [REPO / "patches" / names[path] for path in (SCHEDULES, "pretrain_gpt.py")]
    if shutil.which("git"):
        for patch in patches:
            check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=root, capture_output=True, text=True)
            assert check.returncode == 0, check.stderr
    if shutil.which("patch") is None:
        pytest.skip("the patch program is not installed")
    for patch in patches:
        applied = subprocess.run(["patch", "-p1", "--forward", "-i", str(patch)], cwd=root, capture_output=True, text=True)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert "offset" not in applied.stdout and "fuzz" not in applied.stdout, applied.stdout
    return line, root


@pytest.mark.parametrize("version", sorted(LINES))
def test_committed_patches_are_what_the_generator_makes_from_the_real_files(version, tmp_path):
    root = unpack(version, tmp_path)
    generated = _generator().make_patches(root, LINES[version])
    assert len(generated) == 2
    for name, text in generated.items():
        assert (REPO / "patches" / name).read_text() == text, f"patches/{name} is stale; rerun scripts/make_megatron_patches.py"


def test_patched_schedules_carry_the_hooks(patched):
    _, root = patched
    source = (root / SCHEDULES).read_text()
    compile(source, str(root / SCHEDULES), "exec")
    assert compat.missing_hook_points_in_source(source) == []
    tree = ast.parse(source)
    decorated = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "_perseus_hook" for d in node.decorator_list)
    }
    assert decorated == set(compat.HOOK_POINTS)


class _Names(dict):
    """Namespace for the ``__main__`` block: recorders given explicitly, a mock for anything else."""

    def __missing__(self, key: str) -> Any:
        value = mock.MagicMock(name=key)
        self[key] = value
        return value


def _run_patched_main(root: Path, argv: list[str]) -> dict[str, Any]:
    source = (root / "pretrain_gpt.py").read_text()
    tree = ast.parse(source)
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    record: dict[str, Any] = {}

    def parse(extra_args_provider=None, args_defaults=None, **_: Any) -> argparse.Namespace:
        parser = argparse.ArgumentParser(allow_abbrev=False)
        parser.add_argument("--num-layers", type=int)
        if extra_args_provider is not None:
            parser = extra_args_provider(parser)
        record["args_defaults"] = args_defaults
        return parser.parse_args(argv)

    def pretrain(*args: Any, extra_args_provider=None, args_defaults=None, **kwargs: Any) -> None:
        record["args"] = parse(extra_args_provider, args_defaults) if extra_args_provider else record["args"]
        record["hooks_active"] = hooks.active_handle() is not None
        record["pretrain_kwargs"] = sorted(kwargs)

    def parse_and_validate_args(**kwargs: Any) -> argparse.Namespace:
        record["args"] = parse(**kwargs)
        return record["args"]

    names = _Names(
        pretrain=pretrain, parse_and_validate_args=parse_and_validate_args, has_nvidia_modelopt=False,
        inprocess_restart=mock.MagicMock(maybe_wrap_for_inprocess_restart=lambda fn: (fn, "store")),
    )
    saved = sys.argv
    sys.argv = ["pretrain_gpt.py", *argv]
    try:
        exec(compile(ast.Module(body=main.body, type_ignores=[]), "pretrain_gpt.__main__", "exec"), {}, names)
    finally:
        sys.argv = saved
    record["enabled_after"] = hooks.active_handle() is not None
    return record


def test_patched_pretrain_gpt_main_accepts_perseus_flags_and_enables_perseus(patched):
    line, root = patched
    record = _run_patched_main(root, ["--num-layers", "2", "--perseus", "--perseus-gpu", "sim", "--perseus-mode", "profile"])
    args = record["args"]
    assert args.num_layers == 2 and args.perseus and args.perseus_gpu == "sim" and args.perseus_mode == "profile"
    assert record["args_defaults"] == {"tokenizer_type": "GPT2BPETokenizer"}
    assert record["hooks_active"]  # enabled before pretrain ran
    assert not record["enabled_after"]  # and closed after it returned
    assert "get_embedding_ranks" in record["pretrain_kwargs"]


def test_patched_pretrain_gpt_main_without_perseus_enables_nothing(patched):
    _, root = patched
    record = _run_patched_main(root, ["--num-layers", "2"])
    assert not record["args"].perseus and not record["hooks_active"]
