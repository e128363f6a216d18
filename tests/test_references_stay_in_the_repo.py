"""Docs and docstrings point only at files in the repository (they once named SPEC.md and
../shared, which a clone does not have)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

OUTSIDE = ("SPEC.md", "/work/shared", "../shared", "mps-facts")


def test_docs_and_docstrings_point_only_at_files_in_the_repository() -> None:
    files = [p for p in (REPO / "remotemac").rglob("*") if p.suffix in (".py", ".json", ".md")]
    files += [p for p in (REPO / "scripts").iterdir() if p.is_file()]
    files += [p for p in (REPO / "tests").glob("*.py") if p.name != Path(__file__).name]
    files += [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    bad = []
    for path in files:
        text = path.read_text(errors="replace")
        bad += [f"{path.relative_to(REPO)}: {word}" for word in OUTSIDE if word in text]
        for ref in set(re.findall(r"\bdocs/[\w-]+\.md\b", text)):
            if not (REPO / ref).is_file():
                bad.append(f"{path.relative_to(REPO)}: {ref} does not exist")
    assert bad == []
