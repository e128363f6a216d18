"""pyproject.toml says each thing once: the version, each requirement, the license."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest

import remotemac

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower()


def test_the_version_is_written_once_in_the_package() -> None:
    assert "version" not in PROJECT["project"] and "version" in PROJECT["project"]["dynamic"]
    attr = PROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "remotemac.__version__" and re.fullmatch(r"\d+\.\d+\.\d+", remotemac.__version__)


def test_every_requirement_is_listed_once() -> None:
    lists = [
        PROJECT["project"]["dependencies"],
        *PROJECT["project"]["optional-dependencies"].values(),
    ]
    names = [_name(r) for deps in lists for r in deps]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert "bcrypt" not in names  # through asyncssh's own extra, which pins what it needs
    assert any(r.startswith("asyncssh[bcrypt]") for r in PROJECT["project"]["dependencies"])


def test_textual_is_pinned_to_the_minor_the_snapshots_were_made_with() -> None:
    spec = next(r for r in PROJECT["project"]["dependencies"] if _name(r) == "textual")
    low = re.search(r">=(\d+)\.(\d+)", spec)
    high = re.search(r"<(\d+)\.(\d+)", spec)
    assert low and high, spec
    assert (int(high[1]), int(high[2])) == (int(low[1]), int(low[2]) + 1), spec
    installed = tuple(int(x) for x in version("textual").split(".")[:2])
    assert installed == (int(low[1]), int(low[2])), (spec, version("textual"))


def test_the_license_file_is_there_and_says_mit() -> None:
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License") and "remotemac developers" in text
    assert PROJECT["project"]["license"] == {"text": "MIT"}
