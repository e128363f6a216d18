"""Python imports: CUDA-only libraries, optional imports, and the project's import graph."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from remotemac.checks.audit_rules import pyguards
from remotemac.checks.audit_rules.deps_rules import IMPORT_RULES
from remotemac.checks.audit_rules.mixin import ScannerMixin
from remotemac.checks.audit_rules.model import NOTE

_IMPORT_ERRORS = frozenset(
    {"ImportError", "ModuleNotFoundError", "Exception", "OSError", "BaseException", "RuntimeError"}
)


@dataclass
class ImportLog:
    """Imports between a project's modules: (importer, module, eager, line), and every
    Python file's text (an import the scanner did not visit is found by name there)."""

    edges: list[tuple[str, str, bool, int]] = field(default_factory=list)
    texts: dict[str, bytes] = field(default_factory=dict)


class ImportRules(ScannerMixin):
    """Import statements and ``try/except ImportError`` blocks."""

    def _import_rule(self, module: str) -> str | None:
        for key in (module, module.split(".")[0]):
            if key in IMPORT_RULES:
                return IMPORT_RULES[key]
        for prefix, rule in IMPORT_RULES.items():
            if "." in prefix and module.startswith(prefix + "."):
                return rule
        return None

    def _import_hit(self, rule: str, node: ast.AST) -> None:
        if self.optional:
            self.hit(
                rule,
                node,
                severity=NOTE,
                why_suffix="Here the import is optional (try/except ImportError).",
            )
        elif self.guard:
            self.hit(
                rule, node, severity=NOTE, why_suffix="Here the import sits behind a CUDA check."
            )
        else:
            self.hit(rule, node)

    def _log_import(self, module: str, node: ast.AST) -> None:
        if self.imports is not None:
            eager = not (self.depth or self.guard or self.optional)
            self.imports.edges.append((self.file, module, eager, getattr(node, "lineno", 1)))

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._log_import(a.name, node)
            rule = self._import_rule(a.name)
            if rule:
                self._import_hit(rule, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.file.split("/")[:-1]
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            prefix = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                self._log_import(prefix, node)
                self._log_import(f"{prefix}.{a.name}", node)
            return
        if not node.module:
            return
        self._log_import(node.module, node)
        for a in node.names:
            self._log_import(f"{node.module}.{a.name}", node)
        rule = self._import_rule(node.module)
        if node.module.startswith("torch.cuda.amp") and not self.guard:
            self.hit("cuda-amp", node)
        for a in node.names:
            rule = rule or self._import_rule(f"{node.module}.{a.name}")
        if rule:
            self._import_hit(rule, node)

    def visit_Try(self, node: ast.Try) -> None:
        optional = any(self._catches_import_error(h) for h in node.handlers)
        self.optional += optional
        self.visit_block(node.body)
        self.optional -= optional
        # try: torch.amp … except: torch.cuda.amp …: the handler is an old torch's fallback
        fallback = pyguards.uses_new_api(node.body, self.dotted)
        self.guard += fallback
        self.visit_all(node.handlers)
        self.guard -= fallback
        self.visit_block(node.orelse)
        self.visit_block(node.finalbody)

    visit_TryStar = visit_Try

    def _catches_import_error(self, handler: ast.ExceptHandler) -> bool:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        return any((self.dotted(t) or "").split(".")[-1] in _IMPORT_ERRORS for t in types)
