"""Jupyter notebooks: the code cells, scanned as one module, reported by cell and line.

Cells run top to bottom in one namespace, so they are joined (value flow crosses
cells); each finding is mapped back to its cell (1-based, counting code cells
only, as Jupyter's ``In [n]`` does not survive re-runs) and its line in the cell.
IPython magics and shell escapes (``%``, ``!``) become blank lines for the Python
parse, and are read as shell: ``!pip install -U bitsandbytes``, ``%pip install …`` and
the lines of a ``%%bash`` cell install packages as a requirements file would, so a
CUDA-only package or index installed there is found (``shellcmds``). ``%%capture``
cells are Python below their first line; other cell magics, and cells that do not
parse, are left out.
"""

from __future__ import annotations

import dataclasses
import json

from remotemac.checks.audit_rules.model import Finding
from remotemac.checks.audit_rules.parsing import parse_source
from remotemac.checks.audit_rules.python_rules import PythonScanner
from remotemac.checks.audit_rules.shellcmds import scan_shell_line

_SHELL_CELLS = ("%%bash", "%%sh", "%%script bash", "%%script sh", "%%system")


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
    if lines and lines[0].lstrip().startswith("%%capture"):
        lines = [""] + lines[1:]  # output capture only: the cell is Python
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
    shell: list[Finding] = []
    for number, source in enumerate(cells, 1):
        shell.extend(_shell_findings(file, number, source))
        lines = _python_lines(source)
        if lines is None:
            continue
        for i, line in enumerate(lines, 1):
            joined.append(line)
            where.append((number, i))
    text = "\n".join(joined).encode()
    if not text.strip():
        return shell
    tree = parse_source(text, filename=file)
    findings = PythonScanner(file, text, None).run(tree)
    return shell + [
        dataclasses.replace(f, cell=where[f.line - 1][0], line=where[f.line - 1][1])
        for f in findings
    ]


def _shell_findings(file: str, cell: int, source: str) -> list[Finding]:
    """The cell's shell lines (``!…``, ``%pip``/``%conda``, a ``%%bash`` cell) read as shell."""
    lines = source.splitlines()
    whole = bool(lines) and lines[0].strip().startswith(_SHELL_CELLS)
    out: list[Finding] = []
    for i, line in enumerate(lines, 1):
        text = line.strip()
        if whole and i > 1:
            command = text
        elif text.startswith(("!", "%pip ", "%conda ", "%mamba ", "%uv ")):
            command = text[1:]
        else:
            continue
        out.extend(
            dataclasses.replace(f, cell=cell, line=i) for f in scan_shell_line(file, command, i)
        )
    return out
