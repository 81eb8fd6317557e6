"""The user documentation reads as documentation, not as a lab notebook: README.md, deploy/README.md
and docs/ (outside docs/design/ and docs/benchmarks/, where measurement records carry their machine,
date and commit) name no issue numbers, dates, "this machine" or working sessions. History goes to
CHANGELOG.md; measurements to docs/benchmarks/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ("design", "benchmarks")  # docs/ subdirectories that may carry machines, dates and commits
FORBIDDEN = {
    "an issue number": r"\bissues? #?\d",
    "a date": r"\b20\d\d-[01]\d-[0-3]\d\b",
    "this machine, VM or session": r"\bthis (machine|session|VM|virtual machine)\b",
    "a lent machine": r"\b(was )?lent\b",
    "a working period": r"\bno GPU was\b|\bwhile this (version )?was built\b",
}
PATTERN = re.compile("|".join(f"(?:{p})" for p in FORBIDDEN.values()), re.IGNORECASE)


def user_docs() -> list[Path]:
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md"))
            if p.relative_to(ROOT / "docs").parts[0] not in RECORDS]
    return [ROOT / "README.md", ROOT / "deploy" / "README.md", *docs]


def notebook_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, line) for every line that speaks of issues, dates, machines or sessions."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        match = PATTERN.search(line)
        if match:
            what = next(name for name, p in FORBIDDEN.items() if re.search(p, match.group(0), re.IGNORECASE))
            found.append((number, what, line.strip()))
    return found


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_user_docs_carry_no_lab_notebook_lines(path):
    found = notebook_lines(path.read_text())
    assert not found, "\n".join(f"{path.relative_to(ROOT)}:{n}: {what}: {line[:120]}" for n, what, line in found) + (
        "\nmove the measurement to docs/benchmarks/ and the history to CHANGELOG.md")


@pytest.mark.parametrize("line", [
    "the noisy profile of issue 24 no longer yields a plan", "On the tree that closes issues 33 and 34",
    "Measured on 2026-11-25, one run", "### Measured overhead (this machine: 2 shared CPU cores)",
    "After this session's changes, unloaded", "Results, one lent NVIDIA H100 80GB HBM3",
    "No GPU was available while this version was built", "no GPU was lent to this work",
])
def test_the_check_finds_each_kind_of_notebook_line(line):
    assert notebook_lines(line)


@pytest.mark.parametrize("line", [
    "the daemon starts a new POSIX session (setsid)", "a rank's session of its own", "2026 MHz is not a date",
    "a silent pass-through", "tested with 0.19.8", "the machine's GPUs",
])
def test_technical_text_is_not_taken_for_notebook_lines(line):
    assert not notebook_lines(line)


def test_the_changelog_has_an_unreleased_section():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n")
    assert "\n## [Unreleased]\n" in text
    sections = re.findall(r"^### (\w+)$", text.split("## [Unreleased]", 1)[1].split("\n## ", 1)[0], re.MULTILINE)
    assert sections and set(sections) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
