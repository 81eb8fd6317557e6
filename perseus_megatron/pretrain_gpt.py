"""Run Megatron-LM's ``pretrain_gpt.py`` with ``--perseus`` flags, without editing the checkout.

    torchrun ... -m perseus_megatron.pretrain_gpt --megatron-lm /path/to/Megatron-LM \\
        <usual pretrain_gpt.py arguments> --perseus --perseus-cache-dir /ckpt/perseus

Stock ``pretrain_gpt.py`` builds its argument parser in its own ``__main__`` and cannot accept
new flags. Both generations of that ``__main__`` build the parser through
``megatron.training.arguments.parse_args``, which calls the module-level
``add_megatron_arguments(parser)``:

- core ≤ 0.17: ``pretrain(..., extra_args_provider=...)`` → ``initialize_megatron`` → ``parse_args``;
- core ≥ 0.18: ``parse_and_validate_args(extra_args_provider=...)`` → ``parse_args``, then
  ``pretrain(full_config, ...)``.

The launcher therefore (1) enables Perseus from the ``--perseus*`` flags, (2) makes
``add_megatron_arguments`` also add the Perseus flag group, and (3) runs the checkout's own
``pretrain_gpt.py`` as ``__main__`` — its ``__main__`` block, whichever generation, unchanged.
A ``pretrain_gpt.py`` that already sets Perseus up (the ``patches/`` edit) is only run.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

from perseus.errors import PerseusError
from perseus_megatron.args import add_perseus_args, config_from_argv

CHECKOUT_FLAG = "--megatron-lm"
CHECKOUT_ENV = "MEGATRON_LM"
_MARK = "__perseus_flags__"


class LauncherError(PerseusError):
    """The Megatron-LM checkout or the launcher's own arguments are unusable."""


def split_checkout(argv: Sequence[str]) -> tuple[Path, list[str]]:
    """Take ``--megatron-lm PATH`` (or ``$MEGATRON_LM``) out of the command line."""
    rest: list[str] = []
    checkout: str | None = None
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == CHECKOUT_FLAG:
            if i + 1 >= len(args):
                raise LauncherError(f"{CHECKOUT_FLAG} needs a path to a Megatron-LM checkout")
            checkout = args[i + 1]
            i += 2
            continue
        if arg.startswith(CHECKOUT_FLAG + "="):
            checkout = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    checkout = checkout or os.environ.get(CHECKOUT_ENV)
    if not checkout:
        raise LauncherError(
            f"say where Megatron-LM is: {CHECKOUT_FLAG} /path/to/Megatron-LM (or set ${CHECKOUT_ENV}); "
            "clone it with: git clone -b core_v0.16.1 https://github.com/NVIDIA/Megatron-LM"
        )
    return Path(checkout).expanduser().resolve(), rest


def check_checkout(path: Path) -> None:
    """A Megatron-LM checkout has ``pretrain_gpt.py`` and ``megatron/training/`` at its root."""
    missing = [p for p in ("pretrain_gpt.py", "megatron/training") if not (path / p).exists()]
    if missing:
        raise LauncherError(
            f"{path} is not a Megatron-LM checkout (missing {', '.join(missing)}); pass the repository root "
            f"of https://github.com/NVIDIA/Megatron-LM with {CHECKOUT_FLAG}"
        )


def put_checkout_first(path: Path) -> None:
    """The checkout's ``megatron`` package (training and its in-tree core) wins over installed ones."""
    root = str(path)
    if root in sys.path:
        sys.path.remove(root)
    sys.path.insert(0, root)


def entry_generation(arguments: ModuleType) -> str:
    """``"parse_and_validate_args"`` (core ≥ 0.18) or ``"extra_args_provider"`` (core ≤ 0.17)."""
    return "parse_and_validate_args" if hasattr(arguments, "parse_and_validate_args") else "extra_args_provider"


def accept_perseus_flags() -> ModuleType:
    """Make Megatron-LM's argument parser accept the ``--perseus*`` flags; returns its arguments module.

    Wraps ``megatron.training.arguments.add_megatron_arguments``, which ``parse_args`` calls at
    run time in every Megatron-LM generation this supports (0.16–0.19 and main). Idempotent.
    """
    try:
        from megatron.training import arguments
    except ImportError as exc:
        raise LauncherError(f"cannot import megatron.training.arguments from the checkout ({exc})") from exc
    current = getattr(arguments, "add_megatron_arguments", None)
    if not callable(current) or not callable(getattr(arguments, "parse_args", None)):
        raise LauncherError(
            "megatron.training.arguments has no add_megatron_arguments/parse_args; this Megatron-LM is not supported "
            "by the launcher: add perseus_megatron.add_perseus_args to its extra_args_provider instead (docs/megatron.md)"
        )
    if getattr(current, _MARK, False):
        return arguments

    @functools.wraps(current)
    def add_megatron_and_perseus_arguments(parser: Any, *args: Any, **kwargs: Any) -> Any:
        parser = current(parser, *args, **kwargs)
        if not any(getattr(a, "dest", None) == "perseus" for a in getattr(parser, "_actions", ())):
            add_perseus_args(parser)
        return parser

    setattr(add_megatron_and_perseus_arguments, _MARK, True)
    arguments.add_megatron_arguments = add_megatron_and_perseus_arguments
    return arguments


def sets_up_perseus_itself(script: Path) -> bool:
    """True for a ``pretrain_gpt.py`` carrying ``patches/megatron-lm-*-pretrain_gpt.patch`` (or a
    similar edit): it adds the flags and enables Perseus itself, so the launcher must not."""
    return "perseus_megatron" in script.read_text()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m perseus_megatron.pretrain_gpt``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        checkout, rest = split_checkout(argv)
        check_checkout(checkout)
        config = config_from_argv(rest)
        put_checkout_first(checkout)
        script = checkout / "pretrain_gpt.py"
        patched = sets_up_perseus_itself(script)
        if not patched:
            accept_perseus_flags()
    except PerseusError as exc:
        print(f"perseus_megatron.pretrain_gpt: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.argv = [str(script), *rest]  # Megatron parses sys.argv itself
    handle = None
    if config.enabled and not patched:
        from perseus_megatron.integration import enable

        handle = enable(config)
        # Perseus's energy and saving in Megatron's own iteration log line (observability.py);
        # megatron.training.training was imported with megatron.training.arguments above.
        handle.add_to_iteration_log()
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        if handle is not None:
            handle.close()


if __name__ == "__main__":
    main()
