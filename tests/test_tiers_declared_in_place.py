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


def handed_out_tiers(source: str, name: str = "conftest.py") -> list[str]:
    """Where ``source`` hands out a central tier: ``mark.e2e``/``mark.slow`` anywhere, or
    ``"e2e"``/``"slow"`` given to a call (``add_marker("slow")``, ``getattr(pytest.mark,
    "e2e")``). Reading a test's own markers (``m.name == "e2e"``, to order the files by
    cost) hands nothing out."""
    tree = ast.parse(source)
    found = [
        f"{name}:{node.lineno}: mark.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in CENTRAL_TIERS
    ]
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        given = [*call.args, *(k.value for k in call.keywords)]
        found += [
            f"{name}:{arg.lineno}: {arg.value!r}"
            for top in given
            for arg in ast.walk(top)
            if isinstance(arg, ast.Constant) and arg.value in CENTRAL_TIERS
        ]
    return found


@pytest.mark.parametrize("path", HOOK_FILES, ids=lambda p: str(p.relative_to(TESTS)))
def test_no_hook_hands_out_e2e_or_slow(path: Path) -> None:
    found = handed_out_tiers(path.read_text(encoding="utf-8"), path.name)
    assert found == [], "e2e and slow are declared where the test is defined"


@pytest.mark.parametrize(
    "source",
    [
        "def h(item):\n    item.add_marker(pytest.mark.e2e)",
        'def h(item):\n    item.add_marker("slow")',
        'def h(item):\n    item.add_marker(getattr(pytest.mark, "e2e"))',
        'def h(item):\n    item.add_marker(marker=getattr(pytest.mark, "slow"))',
    ],
)
def test_the_check_finds_a_hook_that_hands_out_a_tier(source: str) -> None:
    assert handed_out_tiers(source) != []


def test_the_check_lets_a_hook_read_a_tests_own_tiers() -> None:
    source = 'def cost(item):\n    names = {m.name for m in item.iter_markers()}\n    return "e2e" in names'
    assert handed_out_tiers(source) == []
