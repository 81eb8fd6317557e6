#!/usr/bin/env python
"""Regenerate the Megatron patches in ``patches/`` from real Megatron-LM files.

    python scripts/make_megatron_patches.py /path/to/Megatron-LM 0.19   # writes patches/*0.19*.patch
    python scripts/make_megatron_patches.py "$SITE" 0.18 --out .       # schedules.py of an installed wheel

Each patch is a unified diff of the checkout's own file against the same file with the Perseus
edits below applied, so it applies with ``git apply`` / ``patch -p1`` at the repository root (the
schedules patch also in an installed wheel's site-packages). The edits are anchored on lines that
must exist exactly once; a checkout where one is missing fails here, loudly, instead of producing
a patch that does not apply.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

SCHEDULES = "megatron/core/pipeline_parallel/schedules.py"
PRETRAIN_GPT = "pretrain_gpt.py"
HOOKED = ("forward_step", "backward_step", "forward_backward_no_pipelining",
          "forward_backward_pipelining_with_interleaving", "forward_backward_pipelining_without_interleaving")

SCHEDULES_IMPORT = '''
# Perseus energy hooks (perseus_megatron, patches/megatron-core-*-schedules.patch): report every
# training forward/backward step to Perseus once perseus_megatron.enable() is called; inert otherwise.
try:
    from perseus_megatron.hooks import hook as _perseus_hook
except ImportError:  # Perseus not installed: the schedules run unchanged.

    def _perseus_hook(point):
        return lambda fn: fn
'''

PERSEUS_IMPORT = '''    # Perseus GPU energy optimization (patches/megatron-lm-*-pretrain_gpt.patch): accept the
    # --perseus flags and, when --perseus is given, install the schedule hooks.
    from perseus_megatron import add_perseus_args, compose_providers
'''


class AnchorError(RuntimeError):
    pass


def _replace_once(text: str, old: str, new: str, what: str) -> str:
    count = text.count(old)
    if count != 1:
        raise AnchorError(f"{what}: expected exactly one {old!r}, found {count}")
    return text.replace(old, new)


def patch_schedules(text: str) -> str:
    """megatron-core's schedules.py with the five hook decorators and their guarded import."""
    anchor = "Shape = Union[List[int], torch.Size]\n"
    text = _replace_once(text, anchor, anchor + SCHEDULES_IMPORT, SCHEDULES)
    for name in HOOKED:
        text = _replace_once(text, f"\n\ndef {name}(", f'\n\n@_perseus_hook("{name}")\ndef {name}(', SCHEDULES)
    return text


def patch_pretrain_gpt(text: str) -> str:
    """pretrain_gpt.py whose ``__main__`` accepts ``--perseus*`` and enables Perseus when asked."""
    theirs = "extra_args_provider=add_modelopt_args if has_nvidia_modelopt else None,"
    ours = ("extra_args_provider=compose_providers(\n"
            "            add_modelopt_args if has_nvidia_modelopt else None, add_perseus_args\n"
            "        ),")
    main = 'if __name__ == "__main__":\n'
    head, body = text.split(main, 1) if text.count(main) == 1 else (None, None)
    if body is None:
        raise AnchorError(f"{PRETRAIN_GPT}: expected exactly one {main!r}")
    if "parse_and_validate_args(" in body:  # core >= 0.18: parse first, then pretrain(full_config, ...)
        body = _replace_once(body, "    args = parse_and_validate_args(\n",
                             PERSEUS_IMPORT.replace("compose_providers\n", "compose_providers, enable_from_args\n")
                             + "\n    args = parse_and_validate_args(\n", PRETRAIN_GPT)
        body = _replace_once(body, "        " + theirs, "        " + ours, PRETRAIN_GPT)
        body = _replace_once(body, "    pretrain(\n        full_config,",
                             "    perseus = enable_from_args(args)\n    pretrain(\n        full_config,", PRETRAIN_GPT)
    else:  # core <= 0.17: pretrain(..., extra_args_provider=...) parses the arguments
        body = _replace_once(body, "    pretrain(\n",
                             PERSEUS_IMPORT.replace("compose_providers\n", "compose_providers, enable_from_argv\n")
                             + "\n    perseus = enable_from_argv()\n\n    pretrain(\n", PRETRAIN_GPT)
        body = _replace_once(body, "        " + theirs, "        " + ours, PRETRAIN_GPT)
    if not body.endswith("\n"):
        body += "\n"
    body += "    if perseus is not None:\n        perseus.close()\n"
    return head + main + body


def unified(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{path}", n=3)
    return "".join(lines)


def patch_names(line: str) -> dict[str, str]:
    return {SCHEDULES: f"megatron-core-{line}-schedules.patch",
            PRETRAIN_GPT: f"megatron-lm-core_v{line}-pretrain_gpt.patch"}


def make_patches(checkout: Path, line: str) -> dict[str, str]:
    """Patch file name -> patch text for one checkout of release line ``line`` (e.g. "0.16")."""
    names = patch_names(line)
    out = {}
    for path, edit in ((SCHEDULES, patch_schedules), (PRETRAIN_GPT, patch_pretrain_gpt)):
        if path == PRETRAIN_GPT and not (checkout / path).exists():
            continue  # an installed megatron-core wheel (site-packages) has schedules.py only
        before = (checkout / path).read_text()
        out[names[path]] = unified(path, before, edit(before))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path, help="Megatron-LM checkout root (has pretrain_gpt.py), or the "
                        "site-packages folder of an installed megatron-core (schedules patch only)")
    parser.add_argument("line", help="release line the checkout belongs to, e.g. 0.16 or 0.19")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "patches")
    args = parser.parse_args(argv)
    try:
        patches = make_patches(args.checkout, args.line)
    except (AnchorError, OSError) as exc:
        print(f"make_megatron_patches: {exc}", file=sys.stderr)
        return 1
    for name, text in patches.items():
        (args.out / name).write_text(text)
        print(args.out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
