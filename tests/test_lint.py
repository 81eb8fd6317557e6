"""Every suppression names what it suppresses and says why, so none outlives its reason unseen.

ruff (PGH003/PGH004, RUF100) and mypy (ignore-without-code, warn_unused_ignores) already reject a
blanket marker or one that suppresses nothing; what they cannot check is the reason. Here a
``# type: ignore[code]`` must be followed by ``# reason`` and a ``# noqa: CODE`` by ``- reason``
(or ``# reason``), on the same line. docs/development.md gives the rule set.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = [p for p in ROOT.iterdir() if p.is_dir() and p.name.startswith("perseus")] + [
    ROOT / "scripts", ROOT / "benchmarks", ROOT / "tests"]

_CODES = r"[A-Za-z0-9_-]+(?:\s*,\s*[A-Za-z0-9_-]+)*"
TYPE_IGNORE = re.compile(r"type:\s*ignore")
TYPE_IGNORE_EXPLAINED = re.compile(rf"type:\s*ignore\[{_CODES}\]\s*#\s*\w")
NOQA = re.compile(r"\bnoqa\b", re.IGNORECASE)
NOQA_EXPLAINED = re.compile(rf"noqa:\s*{_CODES}\s*(?:-|—|#|\()\s*\w")


def unexplained(source: str) -> list[tuple[int, str]]:
    """(line, comment) of every suppression comment in the source without a code and a reason."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        text = token.string
        if TYPE_IGNORE.search(text) and not TYPE_IGNORE_EXPLAINED.search(text):
            found.append((token.start[0], text))
        elif NOQA.search(text) and not NOQA_EXPLAINED.search(text):
            found.append((token.start[0], text))
    return found


def test_the_check_tells_explained_from_bare():
    bare = ["x = f()  # type: ignore\n", "x = f()  # type: ignore[arg-type]\n", "import a  # noqa\n",
            "import a  # noqa: F401\n", "import a  # NOQA:F401\n"]
    explained = ["x = f()  # type: ignore[arg-type]  # the stub says int, the C code takes any index\n",
                 "x = f()  # type: ignore[misc, assignment]  # torch.cuda patched for the CPU\n",
                 "import a  # noqa: F401 - imported for its side effect\n",
                 "import a  # noqa: E402,F401  (after the sys.path line)\n",
                 "s = 'not a # noqa marker'\n"]
    assert [bool(unexplained(line)) for line in bare] == [True] * len(bare)
    assert [unexplained(line) for line in explained] == [[]] * len(explained)


def test_every_suppression_names_its_code_and_reason():
    files = sorted(p for d in CHECKED for p in d.rglob("*.py"))
    assert len(files) > 100, "the checked directories were not found"
    bad = [f"{p.relative_to(ROOT)}:{line}: {text}" for p in files for line, text in unexplained(p.read_text())]
    assert bad == [], "suppressions without a code and a reason after it:\n" + "\n".join(bad)
