"""Real Megatron-LM source archives for tests: where they are, unpacking, and pure-Python pieces.

The archives (sparse Megatron-LM checkouts at core release tags, NVIDIA's code, not ours) live
outside the repository, in ``../shared/clients`` next to the repository root, or wherever
``$PERSEUS_MEGATRON_CLIENTS`` points. Tests that need one skip when it is absent. Unpacked trees
go to pytest's temporary directories and are never committed.
"""

from __future__ import annotations

import ast
import os
import tarfile
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENTS_ENV = "PERSEUS_MEGATRON_CLIENTS"
# Release lines with an archive: version -> archive file name.
RELEASES = {version: f"megatron-lm-core_v{version}.tar.gz" for version in ("0.16.1", "0.17.1", "0.18.2", "0.19.0")}


def clients_dir() -> Path:
    """``$PERSEUS_MEGATRON_CLIENTS``, else ``../shared/clients`` beside the checkout (CI's layout: a
    clone with ``shared`` beside it), else beside the main checkout when this one is a git worktree
    (its ``.git`` is a file naming ``<main>/.git/worktrees/<name>``)."""
    if os.environ.get(CLIENTS_ENV):
        return Path(os.environ[CLIENTS_ENV])
    beside = REPO.parent / "shared" / "clients"
    git = REPO / ".git"
    if not beside.is_dir() and git.is_file():
        text = git.read_text().strip()
        if text.startswith("gitdir:"):
            main = Path(text.removeprefix("gitdir:").strip()).resolve().parents[2]
            if (main.parent / "shared" / "clients").is_dir():
                return main.parent / "shared" / "clients"
    return beside


def release_for_installed_core() -> str:
    """The archived Megatron-LM release that matches the installed megatron-core's line: 0.19.0 on
    the Python 3.12 line (megatron-core 0.19.x), 0.16.1 otherwise. A checkout's own ``megatron/core``
    shadows the installed one when its ``pretrain_gpt.py`` runs, so the pair must be of one line."""
    from importlib.metadata import version

    major, minor = (int(part) for part in version("megatron-core").split(".")[:2])
    return "0.19.0" if (major, minor) >= (0, 19) else "0.16.1"


def archive_path(version: str) -> Path:
    """The archive of one release, or skip the calling test."""
    path = clients_dir() / RELEASES[version]
    if not path.is_file():
        pytest.skip(f"Megatron-LM {version} archive not found at {path} (set ${CLIENTS_ENV})")
    return path


def unpack(version: str, dest: Path) -> Path:
    """Unpack one release into ``dest`` and return the checkout root (has ``pretrain_gpt.py``)."""
    root = dest / f"megatron-lm-{version}"
    if not (root / "pretrain_gpt.py").exists():
        root.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive_path(version)) as tar:
            tar.extractall(root, filter="data")
    tops = [p for p in root.iterdir() if (p / "pretrain_gpt.py").exists()]
    return tops[0] if tops else root


def read_member(version: str, relative: str) -> str:
    """Text of one file of a release, read straight from the archive (no unpacking)."""
    with tarfile.open(archive_path(version)) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 1)
            if member.isfile() and len(parts) == 2 and parts[1] == relative:
                data = tar.extractfile(member)
                assert data is not None
                return data.read().decode()
    raise FileNotFoundError(f"{relative} is not in the {version} archive")


def function_sources(source: str, names: set[str]) -> dict[str, ast.FunctionDef]:
    """Top-level function definitions of a module's source, by name."""
    tree = ast.parse(source)
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names}


def load_functions(source: str, names: set[str], namespace: dict[str, Any] | None = None) -> dict[str, Callable]:
    """Execute only the named top-level functions of ``source`` (its imports do not run)."""
    found = function_sources(source, names)
    missing = names - set(found)
    if missing:
        raise LookupError(f"functions not found: {sorted(missing)}")
    module = ast.Module(body=list(found.values()), type_ignores=[])
    scope: dict[str, Any] = {"Optional": typing.Optional, "P2PCommunicator": object, **(namespace or {})}
    exec(compile(module, "<megatron-lm archive>", "exec"), scope)  # NVIDIA's pure-Python helpers
    return {name: scope[name] for name in names}


def schedule_oracle(version: str) -> SimpleNamespace:
    """megatron-core's own order helpers of one release, runnable without torch.

    ``get_pp_rank_microbatches`` reads the pipeline size and rank from ``parallel_state``; the
    returned ``set_rank(pp, rank, vp)`` sets what it reads.
    """
    state = SimpleNamespace(pp=1, rank=0, vp=None)
    parallel_state = SimpleNamespace(
        get_pipeline_model_parallel_world_size=lambda: state.pp,
        get_pipeline_model_parallel_rank=lambda: state.rank,
        get_virtual_pipeline_model_parallel_world_size=lambda: state.vp,
    )
    schedules = load_functions(
        read_member(version, "megatron/core/pipeline_parallel/schedules.py"),
        {"get_schedule_table", "get_pp_rank_microbatches"},
        {"parallel_state": parallel_state},
    )
    graphs = load_functions(read_member(version, "megatron/core/transformer/cuda_graphs.py"),
                            {"convert_schedule_table_to_order"})

    def set_rank(pp: int, rank: int, vp: int | None) -> None:
        state.pp, state.rank, state.vp = pp, rank, vp

    return SimpleNamespace(set_rank=set_rank, **schedules, **graphs)


def order_test_grid(version: str) -> list[dict[str, Any]]:
    """The parameter grid of the release's ``test_get_pipeline_parallel_order`` (read from its decorators)."""
    source = read_member(version, "tests/unit_tests/pipeline_parallel/test_schedules.py")
    node = function_sources(source, {"test_get_pipeline_parallel_order"})["test_get_pipeline_parallel_order"]
    axes: list[list[dict[str, Any]]] = []
    for deco in node.decorator_list:
        if isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize":
            names = [n.strip() for n in ast.literal_eval(deco.args[0]).split(",")]
            values = ast.literal_eval(deco.args[1])
            axes.append([dict(zip(names, v if len(names) > 1 else (v,))) for v in values])
    grid: list[dict[str, Any]] = [{}]
    for axis in axes:
        grid = [{**g, **a} for g in grid for a in axis]
    return grid
