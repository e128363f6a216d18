"""The audit's one parser survives CPython 3.11.7's spurious AST SystemError."""

from __future__ import annotations

import ast
import gc

import pytest

from remotemac.checks.audit_rules import parsing


def test_a_spurious_depth_mismatch_is_retried_once_and_gc_is_restored(monkeypatch):
    real = ast.parse
    calls = []

    def flaky(source, filename="<unknown>"):
        calls.append(gc.isenabled())
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=126, after=147)")
        return real(source, filename=filename)

    monkeypatch.setattr(parsing, "_parse", flaky)
    assert gc.isenabled()
    tree = parsing.parse_source("import torch\ntorch.cuda.synchronize()\n", "t.py")
    assert isinstance(tree, ast.Module) and len(calls) == 2
    assert calls == [False, False], "the collector is paused while the tree is built"
    assert gc.isenabled()


def test_other_system_errors_and_syntax_errors_are_not_swallowed(monkeypatch):
    with pytest.raises(SyntaxError):
        parsing.parse_source("def (:\n")
    monkeypatch.setattr(
        parsing, "_parse", lambda *a, **k: (_ for _ in ()).throw(SystemError("other"))
    )
    with pytest.raises(SystemError, match="other"):
        parsing.parse_source("x = 1\n")
    assert gc.isenabled()
