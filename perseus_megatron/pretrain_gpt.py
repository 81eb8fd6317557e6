"""Run Megatron-LM's ``pretrain_gpt.py`` with ``--perseus`` flags, without editing the checkout.

    torchrun ... -m perseus_megatron.pretrain_gpt --megatron-lm /path/to/Megatron-LM \\
        <usual pretrain_gpt.py arguments> --perseus --perseus-cache-dir /ckpt/perseus

Stock ``pretrain_gpt.py`` passes its own ``extra_args_provider`` from ``__main__``, so it cannot
accept new flags. This launcher imports the checkout's ``pretrain_gpt`` module (its functions
only), then does what its ``__main__`` does — with the checkout's provider and ours composed —
after enabling Perseus from the command line. Written for the core 0.16-era ``__main__``
(``partial(model_provider, gpt_builder)``, in-process restart ``store``); older layouts without
``gpt_builder`` / ``store`` are handled by looking at what the module and ``pretrain`` provide.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

from perseus.errors import PerseusError
from perseus_megatron.args import add_perseus_args, compose_providers, config_from_argv

CHECKOUT_FLAG = "--megatron-lm"
CHECKOUT_ENV = "MEGATRON_LM"
_REQUIRED = ("train_valid_test_datasets_provider", "model_provider", "forward_step", "pretrain", "ModelType")


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
            "clone it with: git clone -b core_r0.16.0 https://github.com/NVIDIA/Megatron-LM"
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


def load_pretrain_gpt(path: Path) -> ModuleType:
    """Import the checkout's ``pretrain_gpt`` as a module (its ``__main__`` block does not run)."""
    check_checkout(path)
    root = str(path)
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        import pretrain_gpt
    except ImportError as exc:
        raise LauncherError(f"importing {path / 'pretrain_gpt.py'} failed: {exc}") from exc
    missing = [name for name in _REQUIRED if not hasattr(pretrain_gpt, name)]
    if missing:
        raise LauncherError(
            f"{path / 'pretrain_gpt.py'} lacks {', '.join(missing)}; this Megatron-LM version is not supported by "
            "the launcher (use the core 0.16-era checkout, or apply patches/megatron-lm-pretrain_gpt.patch)"
        )
    return pretrain_gpt


def pretrain_call(module: ModuleType) -> tuple[Any, tuple, dict[str, Any]]:
    """The ``pretrain`` function and arguments the checkout's ``__main__`` would use, plus our flags."""
    pretrain = module.pretrain
    accepted = set(inspect.signature(pretrain).parameters)
    if "extra_args_provider" not in accepted:
        raise LauncherError(
            "this Megatron-LM's pretrain() takes no extra_args_provider (newer than core 0.16?); "
            "add perseus_megatron.add_perseus_args to its argument parsing and call perseus_megatron.enable()"
        )
    store = None
    restart = getattr(module, "inprocess_restart", None)
    if restart is not None and hasattr(restart, "maybe_wrap_for_inprocess_restart"):
        pretrain, store = restart.maybe_wrap_for_inprocess_restart(pretrain)
    model_provider = module.model_provider
    if hasattr(module, "gpt_builder"):
        model_provider = partial(model_provider, module.gpt_builder)
    theirs = getattr(module, "add_modelopt_args", None) if getattr(module, "has_nvidia_modelopt", False) else None
    kwargs: dict[str, Any] = {
        "args_defaults": {"tokenizer_type": "GPT2BPETokenizer"},
        "extra_args_provider": compose_providers(theirs, add_perseus_args),
    }
    if "store" in accepted:
        kwargs["store"] = store
    if "get_embedding_ranks" in accepted and hasattr(module, "get_embedding_ranks"):
        kwargs["get_embedding_ranks"] = module.get_embedding_ranks
    args = (module.train_valid_test_datasets_provider, model_provider, module.ModelType.encoder_or_decoder,
            module.forward_step)
    return pretrain, args, kwargs


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m perseus_megatron.pretrain_gpt``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    main_entry = time.time()
    try:
        checkout, rest = split_checkout(argv)
        module = load_pretrain_gpt(checkout)
        config = config_from_argv(rest)
        sys.argv = [str(checkout / "pretrain_gpt.py"), *rest]  # Megatron parses sys.argv itself
        pretrain, args, kwargs = pretrain_call(module)
    except PerseusError as exc:
        print(f"perseus_megatron.pretrain_gpt: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if hasattr(module, "set_startup_timestamps") and hasattr(module, "_PROGRAM_START_TIME"):
        module.set_startup_timestamps(program_start=module._PROGRAM_START_TIME, main_entry=main_entry)
    module.train_valid_test_datasets_provider.is_distributed = True
    handle = None
    if config.enabled:
        from perseus_megatron.integration import enable

        handle = enable(config)
    try:
        pretrain(*args, **kwargs)
    finally:
        if handle is not None:
            handle.close()


if __name__ == "__main__":
    main()
