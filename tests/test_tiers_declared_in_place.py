"""Test tiers are declared where the test is defined, never in a list of test names.

A tier (``e2e``, ``slow``) once came from name lists in tests/conftest.py: a renamed test
silently left its tier and ran in the fast set. Now a module's ``pytestmark`` or a test's
decorator carries it; only ``sshd`` is applied centrally, from the fixtures a test uses.
These checks fail when a list of test names, or a hook that hands out ``e2e``/``slow``,
comes back into the files pytest loads as conftest or plugins.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# conftest files and the plugin modules they load (pytest_plugins)
HOOK_FILES = sorted({*TESTS.rglob("conftest.py"), TESTS / "harness" / "fixtures.py"})
TEST_NAME = re.compile(r"(^|[/:])test_\w+")
CENTRAL_TIERS = ("e2e", "slow")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants (what a docstring says is not a list)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
    ]


@pytest.mark.parametrize("path", HOOK_FILES, ids=lambda p: str(p.relative_to(TESTS)))
def test_no_list_of_test_names_decides_a_tier(path: Path) -> None:
    named = [
        f"{path.name}:{line}: {text!r}" for line, text in _strings(path) if TEST_NAME.search(text)
    ]
    assert named == [], "declare the tier on the test (pytestmark or a decorator), not by name"


@pytest.mark.parametrize("path", HOOK_FILES, ids=lambda p: str(p.relative_to(TESTS)))
def test_no_hook_hands_out_e2e_or_slow(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [
        f"{path.name}:{node.lineno}: mark.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in CENTRAL_TIERS
    ]
    found += [
        f"{path.name}:{line}: {text!r}" for line, text in _strings(path) if text in CENTRAL_TIERS
    ]
    assert found == [], "e2e and slow are declared where the test is defined"
