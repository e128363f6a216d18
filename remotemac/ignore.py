"""Which files of a project to upload: .gitignore rules plus the playbook's ``exclude``.

A small gitignore matcher (stdlib only): patterns with ``*``, ``**``, ``?``,
character classes, a leading ``/`` anchor, a trailing ``/`` for directories and
``!`` negation, read from every .gitignore in the tree. Good enough for project
uploads; git itself is not required on the laptop.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ALWAYS_SKIP = {
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".venv",
    "venv",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".tox",
    "node_modules",
}


@dataclass(frozen=True)
class Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    base: str  # posix dir of the .gitignore, relative to the root ("" at top)


def _translate(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j == -1:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1 : j].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def parse_rules(lines: list[str], base: str = "") -> list[Rule]:
    rules = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        line = line.lstrip("/")
        body = _translate(line)
        regex = re.compile(("^" if anchored else "^(?:.*/)?") + body + "$")
        rules.append(Rule(regex, negate, dir_only, base))
    return rules


def is_ignored(rel: str, is_dir: bool, rules: list[Rule]) -> bool:
    ignored = False
    for rule in rules:
        if rule.base:
            if not rel.startswith(rule.base + "/"):
                continue
            sub = rel[len(rule.base) + 1 :]
        else:
            sub = rel
        if rule.dir_only and not is_dir:
            continue
        if rule.regex.match(sub):
            ignored = not rule.negate
    return ignored


def walk_project(root: Path, extra_excludes: list[str] | None = None) -> Iterator[str]:
    """Yield posix paths (relative to ``root``) of the files to upload, sorted per dir."""
    root = Path(root)
    rules = parse_rules(list(extra_excludes or []))
    stack: list[tuple[str, list[Rule]]] = [("", rules)]
    while stack:
        rel_dir, inherited = stack.pop()
        full = root / rel_dir
        local = list(inherited)
        gi = full / ".gitignore"
        if gi.is_file():
            local += parse_rules(
                gi.read_text(encoding="utf-8", errors="replace").splitlines(), rel_dir
            )
        try:
            entries = sorted(os.scandir(full), key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if entry.is_symlink():
                continue  # never upload what a link points at
            if entry.is_dir():
                if entry.name in ALWAYS_SKIP or is_ignored(rel, True, local):
                    continue
                subdirs.append(rel)
            elif entry.is_file() and not is_ignored(rel, False, local):
                yield rel
        stack.extend((d, local) for d in reversed(subdirs))
