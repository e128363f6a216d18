"""Print the code-shape figures issue 33 sets goals for, each against its goal.

Why a script: the goals (module size, long functions, untyped dicts, magic keys, string
op names, private reach-ins) are easy to lose one edit at a time; a number printed by a
command is what docs/design.md and a review can point at. Exit 1 when a goal is missed
and ``--check`` is given, so CI can hold the line once the figures are reached.

    python scripts/arch_metrics.py            # the table
    python scripts/arch_metrics.py --json     # for scripts
    python scripts/arch_metrics.py --check    # exit 1 if a goal is missed
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "remotemac"
LONG_FUNCTION = 80


@dataclass
class Figure:
    name: str
    value: int
    goal: int
    detail: str = ""

    @property
    def met(self) -> bool:
        return self.value <= self.goal


def _py_files(*subdirs: str) -> list[Path]:
    roots = [PKG / s for s in subdirs] if subdirs else [PKG]
    files: list[Path] = []
    for root in roots:
        files.extend(p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts)
    return files


def _count(pattern: str, files: list[Path]) -> int:
    rx = re.compile(pattern)
    return sum(len(rx.findall(p.read_text(encoding="utf-8"))) for p in files)


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def largest_module() -> Figure:
    sizes = [(len(p.read_text(encoding="utf-8").splitlines()), p) for p in _py_files()]
    n, path = max(sizes)
    return Figure("largest module (lines)", n, 800, _rel(path))


def long_functions() -> Figure:
    long: list[str] = []
    for path in _py_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LONG_FUNCTION:
                    long.append(f"{_rel(path)}:{node.name}({length})")
    return Figure(f"functions over {LONG_FUNCTION} lines", len(long), 8, ", ".join(long))


def private_cross_module() -> Figure:
    """``module._name`` where ``module`` is an imported remotemac module (not self)."""
    hits: list[str] = []
    for path in _py_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("remotemac") or "." not in alias.name:
                        modules.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level or mod.startswith("remotemac"):
                    for alias in node.names:
                        name = alias.asname or alias.name
                        if name.startswith("_"):
                            hits.append(f"{_rel(path)}: from {mod or '.'} import {alias.name}")
                        modules.add(name)
        stdlib = set(sys.stdlib_module_names)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and node.value.id not in stdlib
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                hits.append(f"{_rel(path)}:{node.lineno} {node.value.id}.{node.attr}")
    return Figure("private cross-module access", len(hits), 0, "; ".join(hits[:20]))


def string_op_calls() -> Figure:
    files = _py_files("engine", "checks", "acceptance", "transport")
    files += [*sorted((PKG / "cli").glob("*.py")), PKG / "journal.py"]
    n = _count(r"\.call\(\s*[\"']", files) + _count(
        r"call_in_memory\([^)]*?[\"'][a-z_]+[\"']", files
    )
    return Figure("string op names at call sites", n, 0)


def frame_definitions() -> Figure:
    n = _count(r"Struct\(\s*[\"']>cIQ[\"']\s*\)", _py_files())
    return Figure("frame format definitions", n, 1)


def import_error_in_agent() -> Figure:
    hits = []
    for path in _py_files("agent"):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "except ImportError" in line or "except ModuleNotFoundError" in line:
                hits.append(f"{path.name}:{i}")
    return Figure(
        "except ImportError in the agent (optional probes only)", len(hits), 3, ", ".join(hits)
    )


def sys_path_in_agent() -> Figure:
    """The agent's own dir put on ``sys.path`` (a module finding its siblings by name).

    Two kinds stay and are not counted: the agent runtime's activation (cryptography's
    dir, agentruntime.py) and the traced workload's own path (optrace.py)."""
    hits = []
    for path in _py_files("agent"):
        if path.name in ("agentruntime.py", "optrace.py"):
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"sys\.path\.(insert|append)", line):
                hits.append(f"{path.name}:{i}")
    return Figure("sys.path edits of the agent's own dir", len(hits), 0, ", ".join(hits))


def import_linter_contracts() -> Figure:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    n = text.count("[[tool.importlinter.contracts]]")
    # a goal of "at least 5": report the shortfall as the value
    return Figure("import-linter contracts short of 5", max(0, 5 - n), 0, f"{n} declared")


def figures() -> list[Figure]:
    eng_agent = _py_files("engine", "agent")
    eng_acc = _py_files("engine", "acceptance")
    return [
        largest_module(),
        long_functions(),
        Figure(
            "dict[str, Any] in engine and agent",
            _count(r"\b[Dd]ict\[str,\s*Any\]", eng_agent),
            99,
            # the named JSON-edge alias is shown beside it, so a rename cannot hide a dict
            "{} more annotated JsonObject (JSON edges)".format(
                _count(r"\bJsonObject\b", eng_agent)
            ),
        ),
        Figure('.get("…") in engine and acceptance', _count(r"\.get\(\s*[\"']", eng_acc), 99),
        Figure("ctx.results[ uses", _count(r"ctx\.results\[", _py_files()), 0),
        string_op_calls(),
        frame_definitions(),
        import_error_in_agent(),
        sys_path_in_agent(),
        private_cross_module(),
        import_linter_contracts(),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", action="store_true", help="exit 1 if any goal is missed")
    ap.add_argument("--detail", action="store_true", help="list what each figure counts")
    args = ap.parse_args()
    figs = figures()
    if args.json:
        for f in figs:
            print(json.dumps({**asdict(f), "met": f.met}))
    else:
        for f in figs:
            mark = "ok " if f.met else "MISS"
            print(f"{mark} {f.name:<55} {f.value:>5}  (goal ≤ {f.goal})")
            if args.detail and f.detail:
                print(f"       {f.detail}")
    return 1 if args.check and not all(f.met for f in figs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
