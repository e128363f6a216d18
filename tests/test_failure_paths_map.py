"""docs/failure-paths.md names a test for every failure-path promise (issue 31): each
``tests/…py::name`` it names must be a test function in that file, so the page cannot
keep naming a test that was renamed or removed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "failure-paths.md"
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def named_tests() -> list[tuple[str, str]]:
    return NAMED.findall(PAGE.read_text(encoding="utf-8"))


def test_the_page_names_a_test_for_each_of_the_14_items_and_each_fault():
    text = PAGE.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(r.split("|")[1]) for r in rows] == list(range(1, 15))
    assert all(NAMED.search(r) for r in rows)
    assert len(named_tests()) >= 30


@pytest.mark.parametrize("path,name", named_tests())
def test_every_test_the_page_names_exists(path: str, name: str):
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    defined = {
        n.name
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")
    }
    assert name in defined, f"{path} has no {name}"
