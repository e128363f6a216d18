"""No test lends the host the test runner's Python as the workload's, unless it says so.

Why: a rented Mac's only Python is 3.9.6, so remotemac matches or brings an interpreter
and builds the workload's venv (docs/contract.md, "The workload's Python"). A test that
hands the host ``sys.executable`` as ``environment.python`` (or as an agent op's
``python``) runs the workload in what the test venv lends it, and proves nothing about
that path. Such a use is allowed only inside a function or class whose name says
``preinstalled`` (conftest's ``make_preinstalled_playbook``): the others build the
environment on the host (tests/harness/hostbuilt.py) or name one of the host's own
interpreters (``hostbuilt.host_python``).

What is looked at (the shapes the suite used): ``{"python": sys.executable}``,
``python=sys.executable`` / ``venv_python=sys.executable`` in a call (not a
``str.format``), and a parameter ``python`` whose default is ``sys.executable``. The
laptop's own CLI (``sys.executable -m remotemac``) and the agent's interpreter
(``agent_argv(sys.executable, ...)``) are not the workload's and are not looked at.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
KEYS = {"python", "venv_python"}


def _is_sys_executable(node: ast.AST | None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "executable"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def lent_pythons(source: str, name: str = "<test>") -> list[str]:
    """``file:line in function`` of each lent interpreter not in a "preinstalled" scope."""
    found: list[str] = []

    def visit(node: ast.AST, scopes: tuple[str, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scopes = (*scopes, node.name)
        hits: list[int] = []
        if isinstance(node, ast.Dict):
            hits += [
                v.lineno
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and k.value in KEYS and _is_sys_executable(v)
            ]
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Attribute) and node.func.attr == "format"
        ):
            hits += [
                k.value.lineno
                for k in node.keywords
                if k.arg in KEYS and _is_sys_executable(k.value)
            ]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
            pairs = [
                *zip(positional, defaults, strict=True),
                *zip(args.kwonlyargs, args.kw_defaults, strict=True),
            ]
            hits += [a.lineno for a, d in pairs if a.arg in KEYS and _is_sys_executable(d)]
        if hits and not any("preinstalled" in s.lower() for s in scopes):
            where = scopes[-1] if scopes else "<module>"
            found.extend(f"{name}:{line} in {where}" for line in hits)
        for child in ast.iter_child_nodes(node):
            visit(child, scopes)

    visit(ast.parse(source), ())
    return found


def test_no_test_hands_the_host_its_own_python_unless_named_preinstalled():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if "fixtures" in path.relative_to(TESTS).parts:
            continue  # the workloads themselves (their own sys.executable is the venv's)
        found += lent_pythons(path.read_text(), str(path.relative_to(TESTS)))
    assert found == [], (
        "the workload's Python is the test runner's; build it on the host "
        "(tests/harness/hostbuilt.py) or name the test/fixture 'preinstalled': " + ", ".join(found)
    )


def test_the_check_finds_each_shape_and_spares_a_preinstalled_scope():
    source = """
import sys
def make_book():
    return {"environment": {"python": sys.executable, "venv": False}}
def call():
    op(venv_python=sys.executable)
    "{python}".format(python=sys.executable)
def run(tmp, python: str = sys.executable):
    pass
def make_preinstalled_book():
    return {"python": sys.executable}
class PreinstalledHost:
    def book(self):
        return {"python": sys.executable}
"""
    assert lent_pythons(source) == [
        "<test>:4 in make_book",
        "<test>:6 in call",
        "<test>:8 in run",
    ]
