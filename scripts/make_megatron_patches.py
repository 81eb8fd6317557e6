#!/usr/bin/env python
"""Regenerate the Megatron patches in ``patches/`` from real Megatron-LM files.

    python scripts/make_megatron_patches.py /path/to/Megatron-LM 0.19   # writes patches/*0.19*.patch
    python scripts/make_megatron_patches.py "$SITE" 0.18 --out .       # schedules.py of an installed wheel

Each patch is what ``python -m perseus_megatron.patch`` would do to that checkout, as a unified diff
that applies with ``git apply`` / ``patch -p1`` at the repository root (the schedules patch also in
an installed wheel's site-packages). The places are found by the patcher from the code's structure;
a checkout where one is missing fails here with the patcher's one-line error, and nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perseus.errors import PerseusError
from perseus_megatron.patch import plan_patch, unified_diff
from perseus_megatron.source_patch import PRETRAIN_GPT, SCHEDULES


def patch_names(line: str) -> dict[str, str]:
    return {SCHEDULES: f"megatron-core-{line}-schedules.patch",
            PRETRAIN_GPT: f"megatron-lm-core_v{line}-pretrain_gpt.patch"}


def make_patches(checkout: Path, line: str) -> dict[str, str]:
    """Patch file name -> patch text for one unpatched checkout of release line ``line`` (e.g. "0.16")."""
    names = patch_names(line)
    out = {}
    for plan in plan_patch(checkout):
        if plan.after is None:
            raise PerseusError(f"{plan.path} is already patched; make patches from an unmodified checkout")
        out[names[plan.path]] = unified_diff(plan)
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
    except (PerseusError, OSError) as exc:
        print(f"make_megatron_patches: {exc}", file=sys.stderr)
        return 1
    for name, text in patches.items():
        (args.out / name).write_text(text)
        print(args.out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
