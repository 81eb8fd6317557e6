"""``python -m perseus_megatron.patch`` finds its places by structure, on real and on altered code.

On the four archived releases (core_v0.16.1, core_v0.17.1, core_v0.18.2, core_v0.19.0, both
``pretrain_gpt.py`` generations; skipped when the archives are absent), the real command patches
both files, a second run changes no byte, and ``--revert`` gives back the archive's files byte for
byte. Synthetic variants of each file follow the ways upstream code moves: a decorator added above
the hooked functions (``@_otel_trace_fn(...)`` on Megatron-LM main), arguments reflowed,
``pretrain(full_config, ...)`` on one line, functions renamed around the places. Each variant is
still patched correctly or fails with one line that names what is missing, and then nothing is
written. The patched code is also run: the hooks decorate the functions megatron-core exports,
and the ``__main__`` block hands Megatron's parser the ``--perseus`` flags. A real
``pretrain_gpt.py`` run through the patched schedules is
``test_megatron_lm_pretrain_gpt.py::test_patched_checkout_restarts_from_the_cache_without_profiling``.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from megatron_lm_archive import REPO, RELEASES, read_member, unpack
from perseus_megatron import hooks, patch
from perseus_megatron.args import with_perseus_args
from perseus_megatron.compat import HOOK_POINTS
from perseus_megatron.source_patch import (
    PRETRAIN_GPT,
    SCHEDULES,
    PatchSiteError,
    is_patched,
    patched_text,
    pretrain_gpt_insertions,
    revert,
    schedules_insertions,
)

FILES = (SCHEDULES, PRETRAIN_GPT)


def _digests(root: Path) -> dict[str, str]:
    return {path: hashlib.sha256((root / path).read_bytes()).hexdigest() for path in FILES if (root / path).exists()}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perseus_megatron.patch", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)


def _decorators(source: str) -> dict[str, list[str]]:
    tree = ast.parse(source)
    return {n.name: [ast.unparse(d) for d in n.decorator_list] for n in tree.body if isinstance(n, ast.FunctionDef)}


# ------------------------------------------------------------------------------ real releases


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_patch_repatch_and_revert_every_release(version, tmp_path):
    root = unpack(version, tmp_path)
    original = _digests(root)
    assert set(original) == set(FILES)

    check = _cli(str(root), "--check")
    assert check.returncode == 0, check.stderr
    assert "would patch" in check.stdout and _digests(root) == original  # --check writes nothing

    first = _cli(str(root))
    assert first.returncode == 0, first.stderr
    patched = _digests(root)
    assert all(patched[path] != original[path] for path in FILES)
    schedules = (root / SCHEDULES).read_text()
    assert all(decos[0] == f"_perseus_hook('{name}')" for name, decos in _decorators(schedules).items()
               if name in HOOK_POINTS)
    assert "with_perseus_args" in (root / PRETRAIN_GPT).read_text()

    again = _cli(str(root))
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already patched, nothing to do") == 2
    assert _digests(root) == patched  # a second run is a no-op

    back = _cli(str(root), "--revert")
    assert back.returncode == 0, back.stderr
    assert _digests(root) == original  # byte for byte
    assert _cli(str(root), "--revert").stdout.count("not patched, nothing to do") == 2


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_entry_generation_is_recognised(version):
    """core ≤ 0.17 parse in pretrain(...); core ≥ 0.18 in parse_and_validate_args(...) first."""
    source = read_member(version, PRETRAIN_GPT)
    text = patched_text(PRETRAIN_GPT, source)
    new_generation = version >= "0.18"
    assert ("parse_and_validate_args = with_perseus_args(parse_and_validate_args)" in text) is new_generation
    assert ("pretrain = with_perseus_args(pretrain)" in text) is not new_generation
    assert ("perseus = enable_from_args(args)" in text) is new_generation
    assert revert(text) == source


# ------------------------------------------------------------------------------ run the result


def _run_main(source: str, argv: list[str], generation: str) -> dict[str, Any]:
    """The patched ``__main__`` block, run with recorders for Megatron's parse/pretrain."""
    tree = ast.parse(source)
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    record: dict[str, Any] = {}

    def parse(extra_args_provider=None, args_defaults=None):
        parser = argparse.ArgumentParser(allow_abbrev=False)
        parser.add_argument("--num-layers", type=int)
        if extra_args_provider is not None:
            parser = extra_args_provider(parser)
        return parser.parse_args(argv)

    def parse_and_validate_args(extra_args_provider=None, ignore_unknown_args=False,
                                args_defaults={}):  # noqa: B006 - Megatron's own signature
        record["args"] = parse(extra_args_provider, args_defaults)
        return record["args"]

    def pretrain(*args, extra_args_provider=None, args_defaults=None, **kwargs):
        if generation == "old":
            record["args"] = parse(extra_args_provider, args_defaults)
        record["hooks_active"] = hooks.active_handle() is not None

    namespace = {"pretrain": pretrain, "parse_and_validate_args": parse_and_validate_args, "full_config": object(),
                 "provider": None, "cfg": lambda args: None}
    saved = sys.argv
    sys.argv = ["pretrain_gpt.py", *argv]
    try:
        exec(compile(ast.Module(body=main.body, type_ignores=[]), "pretrain_gpt.__main__", "exec"), namespace)
    finally:
        sys.argv = saved
    record["enabled_after"] = hooks.active_handle() is not None
    return record


OLD_MAIN = '''import os


def model_provider():
    return None


if __name__ == "__main__":
    pretrain(
        1,
        2,
        extra_args_provider=provider,
        args_defaults={"tokenizer_type": "GPT2BPETokenizer"},
    )
'''

NEW_MAIN = '''import os


if __name__ == "__main__":
    args = parse_and_validate_args(
        extra_args_provider=provider,
        args_defaults={"tokenizer_type": "GPT2BPETokenizer"},
    )
    config = cfg(args)
    pretrain(full_config,
        1,
        2,
    )
'''


@pytest.mark.parametrize("source, generation", [
    (OLD_MAIN, "old"),
    (OLD_MAIN.replace('pretrain(\n        1,\n        2,\n        extra_args_provider=provider,\n        args_defaults='
                      '{"tokenizer_type": "GPT2BPETokenizer"},\n    )',
                      'pretrain(1, 2, extra_args_provider=provider, args_defaults={"tokenizer_type": "x"})'), "old"),
    (NEW_MAIN, "new"),
    (NEW_MAIN.replace("args = parse_and_validate_args(\n        extra_args_provider=provider,\n        args_defaults="
                      '{"tokenizer_type": "GPT2BPETokenizer"},\n    )',
                      "args = parse_and_validate_args(extra_args_provider=provider,\n"
                      "                               args_defaults={})"), "new"),
    (NEW_MAIN.replace("    pretrain(full_config,\n        1,\n        2,\n    )\n", "    pretrain(full_config, 1, 2)\n"),
     "new"),
    # renamed around the places: a helper above the block, a statement between parse and pretrain
    (NEW_MAIN.replace("    config = cfg(args)\n", "    config = cfg(args)\n    cfg2 = cfg\n"), "new"),
    (OLD_MAIN.replace("def model_provider", "def gpt_model_provider"), "old"),
    # the entry point inside a nested block, its call reflowed
    ('if __name__ == "__main__":\n    if True:\n        pretrain(1, 2,\n                 extra_args_provider=provider)\n',
     "old"),
], ids=["old", "old-one-line", "new", "new-parse-reflowed", "new-pretrain-one-line", "new-statement-between",
        "old-neighbour-renamed", "old-nested-block"])
def test_patched_main_variants_accept_the_flags_and_enable_perseus(source, generation):
    ast.parse(source)
    text = patched_text(PRETRAIN_GPT, source)
    assert revert(text) == source and is_patched(text)
    on = _run_main(text, ["--num-layers", "2", "--perseus", "--perseus-gpu", "sim", "--perseus-mode", "profile"],
                   generation)
    assert on["args"].num_layers == 2 and on["args"].perseus and on["args"].perseus_gpu == "sim"
    assert on["hooks_active"] and not on["enabled_after"]  # enabled before pretrain, closed after it
    off = _run_main(text, ["--num-layers", "2"], generation)
    assert not off["args"].perseus and not off["hooks_active"]


@pytest.mark.parametrize("source, missing", [
    (OLD_MAIN.replace("    pretrain(", "    run_pretraining("), "no pretrain(...) call"),
    (NEW_MAIN.replace("parse_and_validate_args(", "parse_args_and_validate("),
     "calls neither parse_and_validate_args(...) before pretrain(...) nor pretrain(..., extra_args_provider=...)"),
    (OLD_MAIN.replace('if __name__ == "__main__":', "def main():"), 'one top-level `if __name__ == "__main__":` block'),
    (NEW_MAIN.replace("    args = parse_and_validate_args(", "    args.x = parse_and_validate_args("),
     "is not assigned to one name"),
    (NEW_MAIN.replace("    config = cfg(args)\n", "    config = cfg(args)\n    pretrain(full_config)\n"),
     "calls pretrain(...) more than once"),
    (NEW_MAIN.replace("    config = cfg(args)\n    pretrain(", "    config = cfg(args); pretrain("),
     "shares its line with another statement"),
], ids=["pretrain-renamed", "parse-renamed", "no-main-block", "parse-not-a-name", "pretrain-twice", "semicolon"])
def test_pretrain_gpt_variants_that_cannot_be_patched_fail_in_one_line(source, missing):
    with pytest.raises(PatchSiteError) as info:
        pretrain_gpt_insertions(source)
    message = str(info.value)
    assert missing in message and "\n" not in message and message.startswith(PRETRAIN_GPT)


# ------------------------------------------------------------------------------ schedules.py


def _fake_schedules(decorator: str = "", one_line_args: bool = False) -> str:
    """A schedules.py with megatron-core's five hook points (their real parameters), runnable without torch."""
    deco = f"{decorator}\n" if decorator else ""
    fwd_args = ("forward_step_func, data_iterator, model, num_microbatches, input_tensor, forward_data_store, config,"
                " current_microbatch=None, vp_stage=None")
    fwd = (f"def forward_step({fwd_args}):" if one_line_args
           else "def forward_step(\n    " + ",\n    ".join(a.strip() for a in fwd_args.split(",")) + ",\n):")
    schedule = ("(\n    *,\n    forward_step_func,\n    data_iterator,\n    model,\n    num_microbatches,\n"
                "    seq_length,\n    micro_batch_size,\n    forward_only=False,\n):")
    return "\n".join([
        '"""schedules."""',
        "import functools",
        "from typing import List, Union",
        "try:",
        "    from .other import helper",
        "except ImportError:",
        "    helper = None",
        "",
        "",
        "def _otel_trace_fn(name):",
        "    def decorate(fn):",
        "        @functools.wraps(fn)",
        "        def traced(*args, **kwargs):",
        "            return fn(*args, **kwargs)",
        "        return traced",
        "    return decorate",
        "",
        "",
        "Shape = Union[List[int], int]",
        "",
        "",
        "def get_forward_backward_func(pp_size=None):",
        "    return forward_backward_no_pipelining",
        "",
        "",
        f"{deco}{fwd}",
        "    return 'forward'",
        "",
        "",
        f"{deco}def backward_step(input_tensor, output_tensor, output_tensor_grad, config):",
        "    return 'backward'",
        "",
        "",
        f"def forward_backward_no_pipelining{schedule}",
        "    return 'no pipelining'",
        "",
        "",
        f"def forward_backward_pipelining_with_interleaving{schedule}",
        "    return 'interleaved'",
        "",
        "",
        f"def forward_backward_pipelining_without_interleaving{schedule}",
        "    return '1f1b'",
        "",
    ])


def _exec_schedules(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "fake_schedules"}
    exec(compile(source.replace("from .other import helper", "from nowhere_at_all import helper"),
                 "schedules.py", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("variant", [
    {},
    {"decorator": '@_otel_trace_fn("pipeline.step")'},  # upstream main's decorator line
    {"decorator": '@_otel_trace_fn(\n    "pipeline.step",\n)'},  # a reflowed decorator
    {"one_line_args": True},  # arguments reflowed onto one line
])
def test_schedules_variants_are_patched_and_their_hooks_are_the_exported_functions(variant):
    source = _fake_schedules(**variant)
    text = patched_text(SCHEDULES, source)
    assert revert(text) == source
    for name in HOOK_POINTS:
        assert _decorators(text)[name][0] == f"_perseus_hook('{name}')"  # outermost, above theirs
    module = _exec_schedules(text)
    for name in HOOK_POINTS:
        assert hooks.is_hooked(module[name], name), name  # what install_hooks recognises
    assert module["backward_step"](None, "out", None, None) == "backward"  # inert until enabled


@pytest.mark.parametrize("rename, found", [
    (("def forward_step(", "def forward_step_impl("), "no top-level function forward_step (renamed or moved?)"),
    (("def backward_step(input_tensor, output_tensor,", "def backward_step(input_tensor, output,"),
     "parameter(s) output_tensor of schedules.backward_step not found (changed signature)"),
    (("current_microbatch=None", "microbatch=None"), "parameter(s) current_microbatch of schedules.forward_step"),
])
def test_schedules_variants_without_a_hook_point_fail_in_one_line(rename, found):
    source = _fake_schedules(one_line_args=True).replace(*rename)
    with pytest.raises(PatchSiteError) as info:
        schedules_insertions(source)
    message = str(info.value)
    assert found in message and "\n" not in message and message.startswith(SCHEDULES)


def test_schedules_neighbours_renamed_still_found():
    source = (_fake_schedules(decorator='@_otel_trace_fn("x")').replace("get_forward_backward_func", "pick_schedule")
              .replace("Shape = ", "TensorShape = "))
    text = patched_text(SCHEDULES, source)
    module = _exec_schedules(text)
    assert all(hooks.is_hooked(module[name], name) for name in HOOK_POINTS)


def test_crlf_file_round_trips():
    source = _fake_schedules().replace("\n", "\r\n")
    text = patched_text(SCHEDULES, source)
    assert "\r\n# <<< perseus-patch\r\n" in text and "\n" not in text.replace("\r\n", "")
    assert revert(text) == source


# ------------------------------------------------------------------------------ the command


def _fake_checkout(root: Path, schedules: str, pretrain_gpt: str | None) -> Path:
    (root / SCHEDULES).parent.mkdir(parents=True)
    (root / SCHEDULES).write_text(schedules)
    if pretrain_gpt is not None:
        (root / PRETRAIN_GPT).write_text(pretrain_gpt)
        (root / PRETRAIN_GPT).chmod(0o755)
    return root


def test_command_fails_in_one_line_and_writes_nothing(tmp_path):
    """schedules.py could be patched, pretrain_gpt.py cannot: neither is written."""
    root = _fake_checkout(tmp_path, _fake_schedules(), OLD_MAIN.replace("    pretrain(", "    run_pretraining("))
    before = _digests(root)
    for args in ((), ("--check",)):
        result = _cli(str(root), *args)
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and "no pretrain(...) call" in result.stderr, result.stderr
        assert _digests(root) == before


def test_command_patches_a_site_packages_folder_and_keeps_permissions(tmp_path):
    root = _fake_checkout(tmp_path / "site", _fake_schedules(), None)
    result = _cli(str(root))
    assert result.returncode == 0 and "patched" in result.stdout, result.stderr
    assert is_patched((root / SCHEDULES).read_text())
    exe = _fake_checkout(tmp_path / "exe", _fake_schedules(), OLD_MAIN)
    assert _cli(str(exe)).returncode == 0
    assert (exe / PRETRAIN_GPT).stat().st_mode & 0o777 == 0o755


def test_command_refuses_foreign_and_edited_patches(tmp_path):
    old_style = _fake_schedules().replace("def forward_step(", '@_perseus_hook("forward_step")\ndef forward_step(')
    root = _fake_checkout(tmp_path / "a", old_style, None)
    result = _cli(str(root))
    assert result.returncode == 2 and "without the patcher's markers" in result.stderr
    edited = _fake_checkout(tmp_path / "b", _fake_schedules(), None)
    assert _cli(str(edited)).returncode == 0
    text = (edited / SCHEDULES).read_text()
    (edited / SCHEDULES).write_text(text.replace('@_perseus_hook("backward_step")  # perseus-patch\n', ""))
    result = _cli(str(edited))
    assert result.returncode == 2 and "carries a different Perseus patch" in result.stderr
    assert _cli(str(edited), "--revert").returncode == 0
    assert (edited / SCHEDULES).read_text() == _fake_schedules()


def test_command_names_a_folder_that_is_not_a_checkout(tmp_path):
    result = _cli(str(tmp_path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "no megatron/core/pipeline_parallel/schedules.py" in result.stderr


def test_unterminated_block_is_named():
    text = patched_text(SCHEDULES, _fake_schedules()).replace("# <<< perseus-patch\n", "", 1)
    with pytest.raises(PatchSiteError, match="never closed"):
        revert(text, SCHEDULES)


def test_plan_reports_every_place(tmp_path):
    (plan,) = patch.plan_patch(_fake_checkout(tmp_path, _fake_schedules(), None))
    assert len(plan.notes) == 1 + len(HOOK_POINTS) and plan.after is not None


# ------------------------------------------------------------------------------ with_perseus_args


def test_with_perseus_args_composes_a_positional_or_keyword_provider():
    seen = []

    def pretrain(a, b, c, d, process_non_loss_data_func=None, extra_args_provider=None,
                 args_defaults={}):  # noqa: B006 - Megatron's own signature
        parser = argparse.ArgumentParser()
        parser = extra_args_provider(parser)
        seen.append(parser.parse_args(["--perseus", "--x", "1"]))

    def theirs(parser):
        parser.add_argument("--x")
        return parser

    wrapped = with_perseus_args(pretrain)
    wrapped(1, 2, 3, 4, None, theirs)  # positional
    wrapped(1, 2, 3, 4, extra_args_provider=theirs)  # keyword
    assert [(ns.perseus, ns.x) for ns in seen] == [(True, "1"), (True, "1")]
    assert with_perseus_args(wrapped) is wrapped

    def no_provider(a):
        return a

    with pytest.raises(Exception, match="takes no extra_args_provider"):
        with_perseus_args(no_provider)
