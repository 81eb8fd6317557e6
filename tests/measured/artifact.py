"""Where the public Perseus artifact's measured runs are, for tests in any folder.

They live in ../shared beside the checkout (``$PERSEUS_ARTIFACT_DATA`` elsewhere) and are never
copied in: a test unpacks them into a temporary directory and skips where they are absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DATA = Path(os.environ.get("PERSEUS_ARTIFACT_DATA",
                           Path(__file__).resolve().parents[2].parent / "shared" / "data" / "perseus-sosp24"))
TARBALL = DATA / "measured-a100.tar.xz"


def unpack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The measured runs unpacked into a new temporary directory; skips the test where they are absent."""
    if not TARBALL.exists():
        pytest.skip("measured A100 runs (measured-a100.tar.xz) not present")
    from perseus.measured import extract_archive

    return extract_archive(TARBALL, tmp_path_factory.mktemp("measured-a100"))


def workload_dir(root: Path, model: str) -> Path:
    """Perseus's (not EnvPipe's) workload directory of ``model`` (``gpt3-xl``) under the unpacked root."""
    from perseus.measured import find_workload_dirs, parse_workload_name

    return next(d for d in find_workload_dirs(root) if parse_workload_name(d.name).model == model)
