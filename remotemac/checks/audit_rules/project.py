"""Passes over the whole project's findings, after every file has been read.

Two facts only show across files:

- an optional CUDA build (``cpu-kernels-only`` from setup.py or CMake) means the
  ``.cu`` sources and CUDA C++ are skipped on macOS, so they are not blockers;
- a module (a Triton kernel file, say) that the rest of the project imports
  only inside functions is needed only on that path: importing the package on
  a Mac does not run it, so its findings are notes.
"""

from __future__ import annotations

import dataclasses

from remotemac.checks.audit_rules.model import BLOCKER, NOTE, Finding
from remotemac.checks.audit_rules.python_rules import ImportLog

_OPTIONAL_BUILD_NOTE = (
    "This project's CUDA build is optional, so macOS builds the CPU "
    "kernels without it (see cpu-kernels-only)."
)
_BUILD_RULES = ("cuda-source", "cuda-cxx", "nvcc")


def downgrade_optional_cuda(findings: list[Finding]) -> list[Finding]:
    """CUDA sources of an optional CUDA build are notes, not blockers.

    Only when the build is optional everywhere: one unconditional CUDAExtension
    or CMake CUDA language (a blocker) keeps every CUDA source a blocker.
    """
    optional = any(f.rule == "cpu-kernels-only" for f in findings)
    required = any(
        f.rule in ("cuda-extension", "cmake-cuda") and f.severity == BLOCKER for f in findings
    )
    if not optional or required:
        return findings
    return [
        dataclasses.replace(f, severity=NOTE, why=f"{f.why} {_OPTIONAL_BUILD_NOTE}")
        if f.rule in _BUILD_RULES and f.severity == BLOCKER
        else f
        for f in findings
    ]


def module_names(rel: str) -> set[str]:
    """Dotted names a file may be imported as: ``src/pkg/mod.py`` → pkg.mod, src.pkg.mod."""
    parts = rel[:-3].split("/") if rel.endswith(".py") else rel.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return {".".join(parts[i:]) for i in range(len(parts)) if len(parts) - i >= 2 or i == 0}


def downgrade_lazy_modules(findings: list[Finding], log: ImportLog) -> list[Finding]:
    """Findings in a module the project imports only lazily (inside a function) become
    notes: importing the package on a Mac does not run that module."""
    lazy_targets: dict[str, list[tuple[str, int]]] = {}
    for src, mod, eager, line in log.edges:
        if not eager:
            lazy_targets.setdefault(mod, []).append((src, line))
    if not lazy_targets:
        return findings
    lazy_where: dict[str, str] = {}
    for rel in {
        f.file for f in findings if f.severity != NOTE and f.file.endswith(".py") and f.cell is None
    }:
        names = module_names(rel)
        if any(n in lazy_targets for n in names):
            where = _only_lazy(rel, names, log)
            if where:
                lazy_where[rel] = where
    out = []
    for f in findings:
        where = lazy_where.get(f.file)
        if where and f.severity != NOTE:
            f = dataclasses.replace(
                f,
                severity=NOTE,
                why=f"{f.why} Here the module is imported only inside a "
                f"function ({where}), so only that path needs it.",
            )
        out.append(f)
    return out


def _only_lazy(rel: str, names: set[str], log: ImportLog) -> str | None:
    """Where ``rel`` is imported lazily, if the project never imports it eagerly."""
    stem = rel.rsplit("/", 1)[-1][:-3].encode()
    lazy: str | None = None
    for importer, text in log.texts.items():
        if importer == rel or stem not in text:
            continue
        edges = [
            (eager, line) for src, mod, eager, line in log.edges if src == importer and mod in names
        ]
        if not edges or any(eager for eager, _ in edges):
            return None  # an eager import, or a mention whose import was not seen
        lazy = lazy or f"{importer}:{edges[0][1]}"
    return lazy
