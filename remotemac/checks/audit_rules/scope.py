"""What ``audit`` reads: the walk of a project tree, file kinds and zones.

One walk (honouring .gitignore and ``--exclude``, skipping .git, virtual
environments, binaries and huge files) decides what is read, so the detectors
never touch the disk. Each file also gets a zone: code under tests/, test
fixtures, CI and packaging scripts, and docs are reported apart from the
project's own code and do not count in the verdict (66 of 73 notes on one real
project came from its CI scripts).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MAX_SOURCE_BYTES = 2_000_000
MAX_LOCK_BYTES = 50_000_000
ALWAYS_SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        "node_modules",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        "site-packages",
        ".ipynb_checkpoints",
    }
)
ENV_MARKERS = ("pyvenv.cfg", "conda-meta")  # a directory holding one is an environment

# --------------------------------------------------------------------------- .gitignore


def _translate(pattern: str) -> str:
    """A gitignore glob as a regex body: ``*``/``?`` stay within one path component."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                at_start = i == 0 or pattern[i - 1] == "/"
                if at_start and pattern.startswith("**/", i):
                    out.append("(?:.*/)?")
                    i += 3
                    continue
                out.append(".*")
                i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 2)
            if j == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class IgnorePattern:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def compile_gitignore(text: str) -> list[IgnorePattern]:
    """The common gitignore syntax: comments, ``!``, trailing ``/``, anchoring, ``**``."""
    patterns: list[IgnorePattern] = []
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if not line.strip() or line.startswith("#"):
            continue
        while line.endswith(" ") and not line.endswith("\\ "):
            line = line[:-1]
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        elif line.startswith("\\"):
            line = line[1:] if line[1:2] in ("#", "!") else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = _translate(line.lstrip("/"))
        regex = "^" + body + "$" if anchored else "^(?:.*/)?" + body + "$"
        patterns.append(IgnorePattern(re.compile(regex), negate, dir_only))
    return patterns


class IgnoreStack:
    """Patterns from every .gitignore between the root and the current directory.

    Later (deeper, then lower in the file) patterns win, as in git; an ignored
    directory is not entered, so nothing inside it can be re-included.
    """

    def __init__(self) -> None:
        self.layers: list[tuple[str, list[IgnorePattern]]] = []

    def ignored(self, rel: str, is_dir: bool) -> bool:
        for base, patterns in reversed(self.layers):
            if base:
                if not rel.startswith(base + "/"):
                    continue
                sub = rel[len(base) + 1 :]
            else:
                sub = rel
            for p in reversed(patterns):
                if p.dir_only and not is_dir:
                    continue
                if p.regex.match(sub):
                    return not p.negate
        return False


# --------------------------------------------------------------------------- file kinds

_BY_NAME = {
    "setup.py": "setup.py",
    "pyproject.toml": "pyproject",
    "Pipfile": "pipfile",
    "poetry.lock": "toml-lock",
    "uv.lock": "toml-lock",
    "pdm.lock": "toml-lock",
    "Pipfile.lock": "json-lock",
    "setup.cfg": "setup.cfg",
    "Makefile": "build",
    "makefile": "build",
    "GNUmakefile": "build",
    "CMakeLists.txt": "build",
}
_BY_SUFFIX = {
    ".py": "python",
    ".cu": "cuda",
    ".cuh": "cuda",
    ".c": "cxx",
    ".cc": "cxx",
    ".cpp": "cxx",
    ".cxx": "cxx",
    ".h": "cxx",
    ".hh": "cxx",
    ".hpp": "cxx",
    ".cmake": "build",
    ".sh": "build",
    ".bash": "build",
    ".ipynb": "notebook",
}


def classify(name: str, parent: str) -> str | None:
    """Which detector reads a file, from its name alone (no I/O)."""
    kind = _BY_NAME.get(name)
    if kind:
        return kind
    low = name.lower()
    if low.endswith((".txt", ".in")) and (
        low.startswith(("requirements", "constraints"))
        or "requirements" in parent.lower()
        or "-requirements" in low
        or "_requirements" in low
    ):
        if "conda" in low or "explicit" in low:
            return "conda-explicit"
        return "requirements"
    if low.endswith(("conda-lock.yml", "conda-lock.yaml")):
        return "conda-lock"
    if low.endswith((".yml", ".yaml")) and low.startswith(("environment", "conda", "env")):
        return "conda-env"
    if low.endswith(".lock") and "conda" in low:
        return "conda-explicit"
    if low.startswith("dockerfile") or low.endswith(".dockerfile"):
        return "build"
    return _BY_SUFFIX.get(os.path.splitext(low)[1])


# --------------------------------------------------------------------------- zones

PROJECT = "project"
#: a directory name anywhere in the path → the zone of everything under it
_ZONE_DIRS = {
    "fixtures": "fixtures",
    "testdata": "fixtures",
    "test_data": "fixtures",
    "tests": "tests",
    "test": "tests",
    "testing": "tests",
    ".github": "ci",
    ".gitlab": "ci",
    ".circleci": "ci",
    ".buildkite": "ci",
    "ci": "ci",
    ".ci": "ci",
    ".azure-pipelines": "ci",
    "conda": "ci",
    "recipe": "ci",
    "packaging": "ci",
    "docs": "docs",
    "doc": "docs",
}
_CI_FILES = frozenset(
    {
        ".gitlab-ci.yml",
        ".travis.yml",
        "azure-pipelines.yml",
        "jenkinsfile",
        "noxfile.py",
        "tox.ini",
        "appveyor.yml",
    }
)
ZONES = ("fixtures", "tests", "ci", "docs")


def zone(rel: str) -> str:
    """Where a file sits: the project's own code, or tests / fixtures / ci / docs."""
    parts = rel.split("/")
    dirs = [_ZONE_DIRS[d.lower()] for d in parts[:-1] if d.lower() in _ZONE_DIRS]
    if "fixtures" in dirs:
        return "fixtures"
    if dirs:
        return dirs[0]
    name = parts[-1].lower()
    if name in _CI_FILES:
        return "ci"
    if (
        name.startswith("test_")
        and name.endswith(".py")
        or name.endswith("_test.py")
        or (name == "conftest.py")
    ):
        return "tests"
    return PROJECT


# --------------------------------------------------------------------------- walk


@dataclass
class WalkCounts:
    """What the walk saw and why it skipped what it did not read."""

    files_seen: int = 0
    skipped: Counter[str] = field(default_factory=Counter)


def walk(
    root: Path,
    counts: WalkCounts,
    excludes: list[IgnorePattern] | None = None,
) -> Iterator[tuple[str, str, str]]:
    """Yield (absolute path, relative posix path, kind) for every file to read.

    ``excludes`` (from ``--exclude``) apply like a .gitignore at the root that
    nothing can override.
    """
    ignores = IgnoreStack()
    excluded = IgnoreStack()
    excluded.layers.append(("", excludes or []))
    stack: list[tuple[str, str, int]] = [(str(root), "", 0)]  # (dir, rel, ignore depth)
    while stack:
        directory, rel_dir, depth = stack.pop()
        del ignores.layers[depth:]
        try:
            entries = list(os.scandir(directory))
        except OSError:
            counts.skipped["unreadable"] += 1
            continue
        names = {e.name for e in entries}
        if rel_dir and any(m in names for m in ENV_MARKERS):
            counts.skipped["environment"] += 1
            continue
        if ".gitignore" in names:
            try:
                text = Path(directory, ".gitignore").read_text("utf-8", "replace")
                ignores.layers.append((rel_dir, compile_gitignore(text)))
            except OSError:
                counts.skipped["unreadable"] += 1
        subdirs: list[tuple[str, str, int]] = []
        for e in sorted(entries, key=lambda e: e.name):
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            try:
                if e.is_symlink():
                    counts.skipped["symlink"] += 1
                    continue
                is_dir = e.is_dir()
                if not is_dir and not e.is_file():
                    continue
            except OSError:
                counts.skipped["unreadable"] += 1
                continue
            reason = _skip_reason(e.name, rel, is_dir, ignores, excluded)
            if reason:
                counts.skipped[reason] += 1
                continue
            if is_dir:
                subdirs.append((e.path, rel, len(ignores.layers)))
                continue
            counts.files_seen += 1
            kind = classify(e.name, rel_dir.rsplit("/", 1)[-1])
            if kind is None:
                continue
            try:
                size = e.stat().st_size
            except OSError:
                counts.skipped["unreadable"] += 1
                continue
            limit = MAX_LOCK_BYTES if kind.endswith("lock") else MAX_SOURCE_BYTES
            if size > limit:
                counts.skipped["huge"] += 1
                continue
            yield e.path, rel, kind
        stack.extend(reversed(subdirs))


def _skip_reason(
    name: str, rel: str, is_dir: bool, ignores: IgnoreStack, excluded: IgnoreStack
) -> str:
    if is_dir and name in ALWAYS_SKIP_DIRS:
        return "tool-dir"
    if excluded.ignored(rel, is_dir):
        return "excluded"
    if ignores.ignored(rel, is_dir):
        return "gitignored"
    return ""
