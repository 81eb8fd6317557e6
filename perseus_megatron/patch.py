"""Patch a Megatron-LM checkout for Perseus, revert it, or check that it can be patched.

    python -m perseus_megatron.patch /path/to/Megatron-LM            # patch (again: nothing to do)
    python -m perseus_megatron.patch /path/to/Megatron-LM --check    # say what it would do
    python -m perseus_megatron.patch /path/to/Megatron-LM --revert   # remove exactly what it inserted

The files are ``megatron/core/pipeline_parallel/schedules.py`` and ``pretrain_gpt.py``. The
second is skipped when absent, as in an installed megatron-core's ``site-packages``. The places
are found in the code's structure (``perseus_megatron.source_patch``), so the patcher works on
releases it has never seen as long as the functions it hooks exist. Either every file is
changed or none is: when one place cannot be found, the command writes nothing, prints one line
naming it and exits with status 2. The launcher, ``python -m perseus_megatron.pretrain_gpt``,
needs no patch and is the preferred route (docs/megatron.md, "Which route").
"""

from __future__ import annotations

import argparse
import difflib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from perseus.atomic import write_atomic
from perseus.errors import PerseusError
from perseus_megatron.source_patch import PLANNERS, PRETRAIN_GPT, edit, is_patched, patched_text, revert

OPTIONAL = (PRETRAIN_GPT,)  # an installed megatron-core (site-packages) has schedules.py only


@dataclass(frozen=True)
class FilePlan:
    """What the command does to one file: ``after`` is ``None`` when nothing changes."""

    path: str  # relative to the checkout
    before: str
    after: str | None
    notes: tuple[str, ...]


def _read(root: Path, path: str) -> str | None:
    file = root / path
    if not file.exists():
        if path in OPTIONAL:
            return None
        raise PerseusError(f"{root}: no {path}; give the root of a Megatron-LM checkout (or the site-packages folder "
                           "of an installed megatron-core)")
    try:
        with open(file, encoding="utf-8", newline="") as handle:  # keep \r\n as it is
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PerseusError(f"cannot read {file}: {exc}") from None


def plan_patch(root: Path) -> list[FilePlan]:
    """The patch of every file; raises ``PerseusError`` (one line) if a place cannot be found."""
    plans = []
    for path in PLANNERS:
        text = _read(root, path)
        if text is None:
            continue
        if is_patched(text, path):
            if patched_text(path, revert(text, path)) != text:
                raise PerseusError(f"{path}: carries a different Perseus patch (another version of the patcher, or "
                                   "edited by hand); run with --revert, then patch again")
            plans.append(FilePlan(path, text, None, ("already patched",)))
            continue
        insertions, after = edit(path, text)
        plans.append(FilePlan(path, text, after, tuple(i.what for i in sorted(insertions, key=lambda i: i.before))))
    return plans


def plan_revert(root: Path) -> list[FilePlan]:
    """The revert of every file: the lines the patcher inserted, removed."""
    plans = []
    for path in PLANNERS:
        text = _read(root, path)
        if text is None:
            continue
        if not is_patched(text, path):
            plans.append(FilePlan(path, text, None, ("not patched",)))
            continue
        after = revert(text, path)
        removed = len(text.splitlines()) - len(after.splitlines())
        plans.append(FilePlan(path, text, after, (f"remove the {removed} inserted lines",)))
    return plans


def unified_diff(plan: FilePlan) -> str:
    """The plan as a patch for ``git apply`` / ``patch -p1`` at the checkout's root."""
    if plan.after is None:
        return ""
    lines = difflib.unified_diff(plan.before.splitlines(keepends=True), plan.after.splitlines(keepends=True),
                                 fromfile=f"a/{plan.path}", tofile=f"b/{plan.path}", n=3)
    return "".join(lines)


def apply(root: Path, plans: list[FilePlan]) -> None:
    """Write the files that change (each one atomically, keeping its permissions)."""
    for plan in plans:
        if plan.after is not None:
            file = root / plan.path
            mode = file.stat().st_mode & 0o7777
            write_atomic(file, plan.after.encode("utf-8"))
            file.chmod(mode)


def _report(plans: list[FilePlan], verb: str) -> list[str]:
    lines = []
    for plan in plans:
        if plan.after is None:
            lines.append(f"{plan.path}: {plan.notes[0]}, nothing to do")
        else:
            lines.append(f"{plan.path}: {verb}: " + "; ".join(plan.notes))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perseus_megatron.patch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path, help="Megatron-LM checkout root (has pretrain_gpt.py), or the "
                        "site-packages folder of an installed megatron-core (schedules.py only)")
    parser.add_argument("--check", action="store_true", help="say what would change and write nothing")
    parser.add_argument("--revert", action="store_true", help="remove what the patcher inserted")
    args = parser.parse_args(argv)
    root = args.checkout.expanduser()
    try:
        plans = plan_revert(root) if args.revert else plan_patch(root)
        if not args.check:
            apply(root, plans)
    except (PerseusError, OSError) as exc:
        print(f"perseus_megatron.patch: error: {exc}", file=sys.stderr)
        return 2
    verb = ("would revert" if args.check else "reverted") if args.revert else ("would patch" if args.check else "patched")
    for line in _report(plans, verb):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
