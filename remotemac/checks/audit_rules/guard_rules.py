"""Python control flow: which code runs only with CUDA, and which code demands it."""

from __future__ import annotations

import ast

from remotemac.checks.audit_rules import pyguards
from remotemac.checks.audit_rules.mixin import ScannerMixin
from remotemac.checks.audit_rules.model import NOTE


class GuardRules(ScannerMixin):
    """``if``/ternary/``and``/``assert`` guards, early exits and MPS branches."""

    def visit_block(self, body: list[ast.stmt]) -> None:
        """Statements in order; after ``if not cuda: return``, the rest is the CUDA path."""
        added = 0
        for stmt in body:
            self.visit(stmt)
            if (
                isinstance(stmt, ast.If)
                and not stmt.orelse
                and pyguards.is_negated_guard(stmt.test, self.dotted)
                and pyguards.terminates(stmt.body, self.dotted)
            ) or (
                isinstance(stmt, ast.Assert)
                and self.depth
                and self._is_guard(stmt.test, strong=True)
            ):
                self.guard += 1
                added += 1
        self.guard -= added

    def _is_guard(self, test: ast.AST, *, strong: bool = False) -> bool:
        return pyguards.is_guard(test, self.dotted, strong=strong)

    def _guarded(self, node: ast.If | ast.IfExp, body: list, orelse: list) -> None:
        self.visit(node.test)
        guard = self._is_guard(node.test)
        branch = isinstance(node, ast.If) and not guard and not pyguards.is_main_check(node.test)
        self.branch += branch
        if guard:
            self.guard += 1
            if (
                pyguards.selects_cuda_device(body)
                and self._is_guard(node.test, strong=True)
                and not self._scope_picks_mps()
                and not pyguards.picks_mps(orelse)
            ):
                self.hit("no-mps-branch", node)
        probe = pyguards.api_probe(node.test, self.dotted)
        old_body = probe is False  # `if not hasattr(torch, "autocast"):` is the old torch's
        if old_body and not guard:
            self.guard += 1
        if isinstance(node, ast.If):
            self.visit_block(body)
        else:
            self.visit_all(body)
        if guard or old_body:
            self.guard -= 1
        old_orelse = probe is True
        self.guard += old_orelse
        if isinstance(node, ast.If):
            self.visit_block(orelse)
        else:
            self.visit_all(orelse)
        self.guard -= old_orelse
        self.branch -= branch

    def _requires_cuda(self, node: ast.AST) -> None:
        """Code that refuses to run without CUDA; on an opt-in branch, or in an
        implementation named for CUDA (``RingFlashAttentionCUDAFunction``,
        ``kernels_cuda.py``), it is only a note: the portable path routes around it."""
        named = self._cuda_named()
        if named:
            self.hit(
                "cuda-required",
                node,
                severity=NOTE,
                why_suffix=f"Here inside a CUDA-specific implementation ({named}), "
                "which a portable path routes around.",
            )
        elif self.branch:
            self.hit(
                "cuda-required",
                node,
                severity=NOTE,
                why_suffix="Here only on a conditional path, which a Mac run can avoid.",
            )
        else:
            self.hit("cuda-required", node)

    def _cuda_named(self) -> str | None:
        """The file, class or function whose name says it is the CUDA implementation."""
        return next((n for n in reversed(self.names) if "cuda" in n.lower()), None)

    def _in_function(self, name: str) -> bool:
        """Inside ``def cuda(self)``: the method that implements an explicit ``.cuda()``."""
        scope = self.scopes[-1]
        return isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and scope.name == name

    def _scope_picks_mps(self) -> bool:
        """An early-return chain (if cuda: return …; if mps: return …) is fine."""
        scope = self.scopes[-1]
        key = id(scope)
        if key not in self._mps_scope:
            self._mps_scope[key] = b"mps" in self.data.lower() and pyguards.picks_mps(
                [scope], own_code_only=isinstance(scope, ast.Module)
            )
        return self._mps_scope[key]

    def visit_If(self, node: ast.If) -> None:
        if not self.guard and pyguards.refuses_without_cuda(node, self.dotted):
            self._requires_cuda(node)
        self._guarded(node, node.body, node.orelse)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._guarded(node, [node.body], [node.orelse])

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        """``torch.cuda.is_available() and torch.cuda.f()``: f only runs with CUDA."""
        added = 0
        for value in node.values:
            self.visit(value)
            if isinstance(node.op, ast.And) and self._is_guard(value):
                self.guard += 1
                added += 1
        self.guard -= added

    def visit_Assert(self, node: ast.Assert) -> None:
        if self._is_guard(node.test, strong=True) and not self.guard:
            self._requires_cuda(node)
        self.generic_visit(node)
