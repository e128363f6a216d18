"""``remotemac audit PATH``: what ties a project to CUDA, and what to do about it.

The cheapest Mac rental is the one you learn you do not need, so this runs on
the laptop in seconds: one walk of the tree (``audit_rules.scope``), each
relevant file read once, a substring pre-filter before any ``ast`` parse, and a
verdict from fixed decision rules whose reasons name the decision and why.
Rules and detectors live in ``audit_rules``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remotemac.checks import audit_rules as ar
from remotemac.checks.audit_rules import BLOCKER, NEEDS_REFACTOR, NOTE, RULES, Finding
from remotemac.checks.audit_rules.notebook import scan_notebook
from remotemac.checks.audit_rules.project import downgrade_lazy_modules, downgrade_optional_cuda
from remotemac.checks.audit_rules.python_rules import ImportLog, scan_python
from remotemac.checks.audit_rules.refpaths import reference_paths, verdict_reasons
from remotemac.checks.audit_rules.scope import (
    PROJECT,
    ZONES,
    WalkCounts,
    classify,
    compile_gitignore,
    walk,
    zone,
)
from remotemac.errors import BadInput

VERDICTS = ("keep-linux", "dual-track", "refactor-for-portability", "portable")


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
    "notebook": scan_notebook,
}
# --------------------------------------------------------------------------- report


@dataclass
class AuditReport:
    """Everything ``audit`` found, plus what it skipped and how long it took.

    ``findings`` are the project's own code (they decide the verdict);
    ``set_apart`` are those in tests, fixtures, CI/packaging and docs.
    """

    path: str
    files_scanned: int = 0
    files_seen: int = 0
    elapsed_s: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    set_apart: list[Finding] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    unparsed: list[str] = field(default_factory=list)
    verdict: str = "portable"
    reasons: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        c = Counter(f.severity for f in self.findings)
        return {s: c.get(s, 0) for s in ar.SEVERITIES}

    def apart_counts(self) -> dict[str, int]:
        c = Counter(f.zone for f in self.set_apart)
        return {z: c[z] for z in ZONES if c.get(z)}

    def summary(self) -> str:
        c = self.counts()
        apart = self.apart_counts()
        aside = (
            (" (+ " + ", ".join(f"{n} in {z}" for z, n in apart.items()) + ", set apart)")
            if apart
            else ""
        )
        return (
            f"{c[BLOCKER]} blocker(s), {c[NEEDS_REFACTOR]} needing refactor, "
            f"{c[NOTE]} note(s){aside} in {self.files_scanned} file(s) read "
            f"({self.files_seen} seen) in {self.elapsed_s:.2f} s; verdict: {self.verdict}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "files_scanned": self.files_scanned,
            "files_seen": self.files_seen,
            "elapsed_s": round(self.elapsed_s, 4),
            "findings": [f.to_dict() for f in self.findings],
            "set_apart": [f.to_dict() for f in self.set_apart],
            "verdict": self.verdict,
            "verdict_reasons": self.reasons,
            "counts": self.counts(),
            "set_apart_counts": self.apart_counts(),
            "skipped": dict(sorted(self.skipped.items())),
            "unparsed": self.unparsed,
            "summary": self.summary(),
        }


def _rules_of(fs: list[Finding]) -> str:
    return ", ".join(sorted({f.rule for f in fs}))


def decide(findings: list[Finding]) -> tuple[str, list[str]]:
    """The decision rules, in order; each reason names the decision, then why.

    1. a blocker with no portable alternative (custom kernels, flash_attn, …)
       → keep-linux;
    2. blockers that do have an alternative, or multi-GPU training machinery
       (DeepSpeed, NCCL) → dual-track: keep the Linux pipeline, add a macOS track;
    3. only needs-refactor findings → refactor-for-portability (an optional CUDA
       build, "CPU kernels only on macOS", gets its own reason);
    4. nothing, or notes only → portable.
    """
    blockers = [f for f in findings if f.severity == BLOCKER]
    hard = [f for f in blockers if not RULES[f.rule].replaceable]
    cpu_only = [f for f in findings if f.rule == "cpu-kernels-only" and f.severity != NOTE]
    refs = verdict_reasons(findings)  # a pure-PyTorch path beside the kernels: say so
    if hard:
        return "keep-linux", [
            f"Keep this project on Linux/CUDA: {len(hard)} blocker(s) "
            f"({_rules_of(hard)}) have no macOS build and no drop-in "
            "replacement" + ("; a pure-PyTorch path beside them is named below." if refs else ".")
        ] + refs
    pipeline = [f for f in findings if RULES[f.rule].linux_pipeline and f.severity != NOTE]
    other = [
        f
        for f in findings
        if f.severity == NEEDS_REFACTOR
        and f.rule != "cpu-kernels-only"
        and not RULES[f.rule].linux_pipeline
    ]
    refactor = (
        f"{len(other)} CUDA-only code path(s) or pin(s) ({_rules_of(other)}) have "
        "portable replacements."
    )
    if blockers or pipeline:
        reasons: list[str] = []
        if blockers:
            reasons.append(
                f"Run on both tracks: {len(blockers)} blocker(s) "
                f"({_rules_of(blockers)}) stay on Linux/CUDA; use their portable "
                "alternative on macOS."
            )
        if pipeline:
            reasons.append(
                f"Keep the multi-GPU machinery ({_rules_of(pipeline)}) on Linux; "
                "make the single-device path run on macOS."
            )
        if other:
            reasons.append(f"For the macOS track, refactor: {refactor}")
        return "dual-track", reasons + _cpu_only_reason(cpu_only) + refs
    if other or cpu_only:
        reasons = [f"Refactor, then run on a Mac: {refactor}"] if other else []
        return "refactor-for-portability", reasons + _cpu_only_reason(cpu_only)
    notes = len(findings)
    return "portable", [
        "Run it on a Mac as it is: nothing ties this project to CUDA"
        + (f" ({notes} note(s) to read)." if notes else ".")
    ]


def _cpu_only_reason(cpu_only: list[Finding]) -> list[str]:
    if not cpu_only:
        return []
    where = ", ".join(f.where() for f in cpu_only[:3])
    return [
        f"On macOS it builds its CPU kernels only (optional CUDA build: {where}): its "
        "ops on mps tensors fail, so move those tensors to CPU around them (a refactor) "
        "or keep that work on Linux/CUDA."
    ]


def audit_project(path: Path, exclude: tuple[str, ...] | list[str] = ()) -> AuditReport:
    """Audit a project directory (or one file); never imports the project or torch.

    ``exclude`` holds gitignore-style patterns (``--exclude``) of paths not to read.
    """
    start = time.perf_counter()
    path = Path(path)
    if not path.exists():
        raise BadInput(f"audit: {path} does not exist", hint="give the project directory to scan")
    root = path.resolve()
    report = AuditReport(path=str(path))
    counts = WalkCounts()
    if root.is_file():
        kind = classify(root.name, root.parent.name)
        if kind is None:
            raise BadInput(
                f"audit: {path} is not a source or dependency file audit reads",
                hint="give the project directory to scan",
            )
        files: Iterator[tuple[str, str, str]] = iter([(str(root), root.name, kind)])
        counts.files_seen = 1
    elif root.is_dir():
        files = walk(root, counts, compile_gitignore("\n".join(exclude)))
    else:
        raise BadInput(
            f"audit: {path} is neither a file nor a directory",
            hint="give the project directory to scan",
        )
    found_all: list[Finding] = []
    log = ImportLog()
    for abspath, rel, kind in files:
        try:
            with open(abspath, "rb") as fh:
                data = fh.read()
        except OSError:
            counts.skipped["unreadable"] += 1
            continue
        if b"\0" in data[:8192]:
            counts.skipped["binary"] += 1
            continue
        report.files_scanned += 1
        if kind in ("python", "setup.py"):
            found = scan_python(rel, data, force=kind == "setup.py", imports=log)
        else:
            found = SCANNERS[kind](rel, data)
        if found is None:
            report.unparsed.append(rel)
            continue
        z = zone(rel)
        found_all.extend(found if z == PROJECT else [dataclasses.replace(f, zone=z) for f in found])
    report.files_seen, report.skipped = counts.files_seen, counts.skipped
    order = {s: i for i, s in enumerate(ar.SEVERITIES)}

    def key(f: Finding) -> tuple[int, str, int, int, str]:
        return order[f.severity], f.file, f.cell or 0, f.line, f.rule

    own = [f for f in found_all if f.zone == PROJECT]
    own += reference_paths(log.texts, {rel for rel in log.texts if zone(rel) == PROJECT})
    report.findings = sorted(downgrade_lazy_modules(downgrade_optional_cuda(own), log), key=key)
    report.set_apart = sorted([f for f in found_all if f.zone != PROJECT], key=key)
    report.verdict, report.reasons = decide(report.findings)
    report.elapsed_s = time.perf_counter() - start
    return report
