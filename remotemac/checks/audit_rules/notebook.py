"""Jupyter notebooks: the code cells, scanned as one module, reported by cell and line.

Cells run top to bottom in one namespace, so they are joined (value flow crosses
cells); each finding is mapped back to its cell (1-based, counting code cells
only, as Jupyter's ``In [n]`` does not survive re-runs) and its line in the cell.
IPython magics and shell escapes (``%``, ``!``) become blank lines; a cell magic
(``%%bash``) or a cell that does not parse is left out.
"""

from __future__ import annotations

import dataclasses
import json

from remotemac.checks.audit_rules.model import Finding
from remotemac.checks.audit_rules.parsing import parse_source
from remotemac.checks.audit_rules.python_rules import PythonScanner


def code_cells(data: bytes) -> list[str] | None:
    """The source of every code cell, or None when the file is not a notebook."""
    try:
        nb = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        return None
    out: list[str] = []
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        out.append("".join(src) if isinstance(src, list) else str(src))
    return out


def _python_lines(source: str) -> list[str] | None:
    lines = source.splitlines()
    if lines and lines[0].lstrip().startswith("%%"):
        return None
    lines = ["" if ln.lstrip().startswith(("%", "!")) else ln for ln in lines]
    try:
        parse_source("\n".join(lines))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return lines


def scan_notebook(file: str, data: bytes) -> list[Finding] | None:
    """Findings for a notebook's code cells; None when it is not valid notebook JSON."""
    cells = code_cells(data)
    if cells is None:
        return None
    joined: list[str] = []
    where: list[tuple[int, int]] = []  # joined line index → (cell, line in cell)
    for number, source in enumerate(cells, 1):
        lines = _python_lines(source)
        if lines is None:
            continue
        for i, line in enumerate(lines, 1):
            joined.append(line)
            where.append((number, i))
    text = "\n".join(joined).encode()
    if not text.strip():
        return []
    tree = parse_source(text, filename=file)
    findings = PythonScanner(file, text, None).run(tree)
    return [
        dataclasses.replace(f, cell=where[f.line - 1][0], line=where[f.line - 1][1])
        for f in findings
    ]
