"""``remotemac audit PATH``: what ties a project to CUDA, and what to do about it.

The cheapest Mac rental is the one you learn you do not need, so this runs on
the laptop in seconds: one walk of the tree (honouring .gitignore, skipping
.git, virtual environments, binaries and huge files), each relevant file read
once, a substring pre-filter before any ``ast`` parse, and a verdict from fixed
decision rules. Rules and detectors live in ``audit_rules``.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remotemac.checks import audit_rules as ar
from remotemac.checks.audit_rules import BLOCKER, NEEDS_REFACTOR, NOTE, RULES, Finding
from remotemac.errors import BadInput

MAX_SOURCE_BYTES = 2_000_000
MAX_LOCK_BYTES = 50_000_000
ALWAYS_SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".tox",
                              ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                              "site-packages", ".ipynb_checkpoints"})
ENV_MARKERS = ("pyvenv.cfg", "conda-meta")  # a directory holding one is an environment

VERDICTS = ("keep-linux", "dual-track", "refactor-for-portability", "portable")


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
                body = pattern[i + 1:j]
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
                sub = rel[len(base) + 1:]
            else:
                sub = rel
            for p in reversed(patterns):
                if p.dir_only and not is_dir:
                    continue
                if p.regex.match(sub):
                    return not p.negate
        return False


# --------------------------------------------------------------------------- file kinds

Scanner = Callable[[str, bytes], "list[Finding] | None"]


def _text(fn: Callable[[str, str], list[Finding]]) -> Scanner:
    return lambda rel, data: fn(rel, data.decode("utf-8", "replace"))


_TOML_NAMES_ARE_KEYS = ("packages", "dev-packages")
SCANNERS: dict[str, Scanner] = {
    "python": ar.scan_python,
    "setup.py": lambda rel, data: ar.scan_python(rel, data, force=True),
    "cuda": _text(ar.scan_cuda_source),
    "cxx": _text(ar.scan_cxx),
    "build": _text(ar.scan_build_script),
    "requirements": _text(ar.scan_requirements),
    "pyproject": _text(ar.scan_toml),
    "pipfile": _text(lambda rel, t: ar.scan_toml(rel, t, names_are_keys=_TOML_NAMES_ARE_KEYS)),
    "toml-lock": _text(lambda rel, t: ar.scan_toml(rel, t, lock=True)),
    "json-lock": _text(ar.scan_json_lock),
    "setup.cfg": _text(ar.scan_setup_cfg),
    "conda-env": _text(ar.scan_conda),
    "conda-lock": _text(lambda rel, t: ar.scan_conda(rel, t, lock=True)),
    "conda-explicit": _text(ar.scan_conda_explicit),
}
_BY_NAME = {
    "setup.py": "setup.py", "pyproject.toml": "pyproject", "Pipfile": "pipfile",
    "poetry.lock": "toml-lock", "uv.lock": "toml-lock", "pdm.lock": "toml-lock",
    "Pipfile.lock": "json-lock", "setup.cfg": "setup.cfg", "Makefile": "build",
    "makefile": "build", "GNUmakefile": "build", "CMakeLists.txt": "build",
}
_BY_SUFFIX = {
    ".py": "python", ".cu": "cuda", ".cuh": "cuda", ".c": "cxx", ".cc": "cxx", ".cpp": "cxx",
    ".cxx": "cxx", ".h": "cxx", ".hh": "cxx", ".hpp": "cxx", ".cmake": "build", ".sh": "build",
    ".bash": "build",
}


def classify(name: str, parent: str) -> str | None:
    """Which detector reads a file, from its name alone (no I/O)."""
    kind = _BY_NAME.get(name)
    if kind:
        return kind
    low = name.lower()
    if low.endswith((".txt", ".in")) and (
            low.startswith(("requirements", "constraints")) or "requirements" in parent.lower()
            or "-requirements" in low or "_requirements" in low):
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


# --------------------------------------------------------------------------- report

@dataclass
class AuditReport:
    """Everything ``audit`` found, plus what it skipped and how long it took."""

    path: str
    files_scanned: int = 0
    files_seen: int = 0
    elapsed_s: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    unparsed: list[str] = field(default_factory=list)
    verdict: str = "portable"
    reasons: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        c = Counter(f.severity for f in self.findings)
        return {s: c.get(s, 0) for s in ar.SEVERITIES}

    def summary(self) -> str:
        c = self.counts()
        return (f"{c[BLOCKER]} blocker(s), {c[NEEDS_REFACTOR]} needing refactor, "
                f"{c[NOTE]} note(s) in {self.files_scanned} file(s) read "
                f"({self.files_seen} seen) in {self.elapsed_s:.2f} s; verdict: {self.verdict}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "files_scanned": self.files_scanned,
            "files_seen": self.files_seen,
            "elapsed_s": round(self.elapsed_s, 4),
            "findings": [f.to_dict() for f in self.findings],
            "verdict": self.verdict,
            "verdict_reasons": self.reasons,
            "counts": self.counts(),
            "skipped": dict(sorted(self.skipped.items())),
            "unparsed": self.unparsed,
            "summary": self.summary(),
        }


def decide(findings: list[Finding]) -> tuple[str, list[str]]:
    """The decision rules, in order.

    1. a blocker with no portable alternative (custom kernels, flash_attn, …)
       → keep-linux;
    2. blockers that do have an alternative, or multi-GPU training machinery
       (DeepSpeed, NCCL) → dual-track: keep the Linux pipeline, add a macOS track;
    3. only needs-refactor findings → refactor-for-portability;
    4. nothing, or notes only → portable.
    """
    def rules_of(fs: list[Finding]) -> str:
        return ", ".join(sorted({f.rule for f in fs}))

    blockers = [f for f in findings if f.severity == BLOCKER]
    hard = [f for f in blockers if not RULES[f.rule].replaceable]
    if hard:
        return "keep-linux", [f"{len(hard)} blocker(s) with no portable alternative "
                              f"({rules_of(hard)}): run this project on Linux/CUDA."]
    pipeline = [f for f in findings if RULES[f.rule].linux_pipeline and f.severity != NOTE]
    if blockers or pipeline:
        reasons = []
        if blockers:
            reasons.append(f"{len(blockers)} blocker(s) with a portable alternative "
                           f"({rules_of(blockers)}): keep them on the Linux track, use the "
                           "alternative on macOS.")
        if pipeline:
            reasons.append(f"multi-GPU training machinery ({rules_of(pipeline)}) stays on "
                           "Linux; the single-device path must also run on macOS.")
        return "dual-track", reasons
    refactor = [f for f in findings if f.severity == NEEDS_REFACTOR]
    if refactor:
        return "refactor-for-portability", [
            f"{len(refactor)} CUDA-only code path(s) or pin(s) ({rules_of(refactor)}) with "
            "known portable replacements: fix them, then test on MPS."]
    notes = len(findings)
    return "portable", ["nothing ties this project to CUDA" + (
        f" ({notes} note(s) to read)." if notes else ".")]


# --------------------------------------------------------------------------- walk

def _walk(root: Path, report: AuditReport) -> Iterator[tuple[str, str, str, int]]:
    """Yield (absolute path, relative posix path, kind, size) for every file to read."""
    ignores = IgnoreStack()
    stack: list[tuple[str, str, int]] = [(str(root), "", 0)]  # (dir, rel, ignore depth)
    while stack:
        directory, rel_dir, depth = stack.pop()
        del ignores.layers[depth:]
        try:
            entries = list(os.scandir(directory))
        except OSError:
            report.skipped["unreadable"] += 1
            continue
        names = {e.name for e in entries}
        if rel_dir and any(m in names for m in ENV_MARKERS):
            report.skipped["environment"] += 1
            continue
        if ".gitignore" in names:
            try:
                text = Path(directory, ".gitignore").read_text("utf-8", "replace")
                ignores.layers.append((rel_dir, compile_gitignore(text)))
            except OSError:
                report.skipped["unreadable"] += 1
        subdirs: list[tuple[str, str, int]] = []
        for e in sorted(entries, key=lambda e: e.name):
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            try:
                if e.is_symlink():
                    report.skipped["symlink"] += 1
                    continue
                if e.is_dir():
                    if e.name in ALWAYS_SKIP_DIRS:
                        report.skipped["tool-dir"] += 1
                    elif ignores.ignored(rel, True):
                        report.skipped["gitignored"] += 1
                    else:
                        subdirs.append((e.path, rel, len(ignores.layers)))
                    continue
                if not e.is_file():
                    continue
            except OSError:
                report.skipped["unreadable"] += 1
                continue
            if ignores.ignored(rel, False):
                report.skipped["gitignored"] += 1
                continue
            report.files_seen += 1
            kind = classify(e.name, rel_dir.rsplit("/", 1)[-1])
            if kind is None:
                continue
            try:
                size = e.stat().st_size
            except OSError:
                report.skipped["unreadable"] += 1
                continue
            limit = MAX_LOCK_BYTES if kind.endswith("lock") else MAX_SOURCE_BYTES
            if size > limit:
                report.skipped["huge"] += 1
                continue
            yield e.path, rel, kind, size
        stack.extend(reversed(subdirs))


def audit_project(path: Path) -> AuditReport:
    """Audit a project directory (or one file); never imports the project or torch."""
    start = time.perf_counter()
    path = Path(path)
    if not path.exists():
        raise BadInput(f"audit: {path} does not exist",
                       hint="give the project directory to scan")
    root = path.resolve()
    report = AuditReport(path=str(path))
    if root.is_file():
        kind = classify(root.name, root.parent.name)
        if kind is None:
            raise BadInput(f"audit: {path} is not a source or dependency file audit reads",
                           hint="give the project directory to scan")
        files: Iterator[tuple[str, str, str, int]] = iter(
            [(str(root), root.name, kind, root.stat().st_size)])
        report.files_seen = 1
    elif root.is_dir():
        files = _walk(root, report)
    else:
        raise BadInput(f"audit: {path} is neither a file nor a directory",
                       hint="give the project directory to scan")
    for abspath, rel, kind, _size in files:
        try:
            with open(abspath, "rb") as fh:
                data = fh.read()
        except OSError:
            report.skipped["unreadable"] += 1
            continue
        if b"\0" in data[:8192]:
            report.skipped["binary"] += 1
            continue
        report.files_scanned += 1
        found = SCANNERS[kind](rel, data)
        if found is None:
            report.unparsed.append(rel)
            continue
        report.findings.extend(found)
    order = {s: i for i, s in enumerate(ar.SEVERITIES)}
    report.findings.sort(key=lambda f: (order[f.severity], f.file, f.line, f.rule))
    report.verdict, report.reasons = decide(report.findings)
    report.elapsed_s = time.perf_counter() - start
    return report


# --------------------------------------------------------------------------- output

_STYLE = {BLOCKER: "bold red", NEEDS_REFACTOR: "yellow", NOTE: "dim"}
_VERDICT_STYLE = {"keep-linux": "bold red", "dual-track": "bold magenta",
                  "refactor-for-portability": "bold yellow", "portable": "bold green"}


def _hang(text: str, width: int, indent: str = "  ") -> str:
    """Indented, continuation lines two more spaces, broken between words only."""
    import textwrap

    return "\n".join(textwrap.wrap(text, max(20, width - 1), initial_indent=indent,
                                    subsequent_indent=indent + "  ", break_long_words=False,
                                    break_on_hyphens=False)) or indent + text


def render(report: AuditReport, console: Any) -> None:
    """Findings one block each (where on its own line, so a path is never split), then the
    verdict once, its reasons and the timing; reads the same at 80 columns as at 200."""
    from rich.text import Text

    if report.findings:
        console.print(Text(f"CUDA audit of {report.path}", style="bold"))
        for f in report.findings:
            head = Text(f"{f.severity:<15}", style=_STYLE[f.severity])
            head.append(f"{f.file}:{f.line}")
            console.print(head)
            for label, value in (("match", f.text), ("why", f.why), ("fix", f.alternative)):
                console.print(Text(_hang(f"{label}: {value}", console.width)))
    else:
        console.print(Text(f"No CUDA ties found in {report.path}.", style="green"))
    verdict = Text("verdict: ")
    verdict.append(report.verdict, style=_VERDICT_STYLE[report.verdict])
    console.print(verdict)
    for reason in report.reasons:
        console.print(Text(_hang(reason, console.width)))
    if report.unparsed:
        console.print(Text(f"  {len(report.unparsed)} Python file(s) did not parse and were "
                           f"not checked: {', '.join(report.unparsed[:5])}", style="yellow"))
    c = report.counts()
    console.print(Text(_hang(f"{c[BLOCKER]} blocker(s), {c[NEEDS_REFACTOR]} needing refactor, "
                       f"{c[NOTE]} note(s) in {report.files_scanned} file(s) read "
                       f"({report.files_seen} seen) in {report.elapsed_s:.2f} s;", console.width, ""),
                       style="dim"))


def main_audit(path: Path, as_json: bool, console: Any = None) -> int:
    """CLI entry for ``remotemac audit PATH [--json]``: 0 whenever the audit ran.

    Findings do not fail the command (the verdict is the answer); a missing path
    raises BadInput (exit code 2). rich is imported here, not at module import.
    """
    report = audit_project(Path(path))
    if console is None:
        from rich.console import Console

        console = Console()
    if as_json:
        console.out(json.dumps(report.to_dict(), indent=2), highlight=False)
    else:
        render(report, console)
    return 0
