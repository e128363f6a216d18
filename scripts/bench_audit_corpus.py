"""Check ``remotemac audit`` against real packages: precision and recall per severity.

Downloads the source distributions of the pinned packages below from PyPI with
pip (``pip download --no-deps --no-binary :all:``), caches them in
~/.cache/remotemac-audit-corpus, audits each one and compares the findings of the
project's own code (tests/CI/docs are set apart and not scored) with
scripts/audit_corpus_truth.tsv, written by reading each package's code.

A finding matches a truth row when package, file and rule agree and the line
equals the row's line (or the finding's text matches the row's ``/regex/``).
Precision for a severity: of the findings with that severity, the share that
match a row with the same severity. Recall: of the rows with that severity, the
share matched by a finding with the same severity. Goals (issue 18): blocker
precision 1.0 and recall >= 0.95, needs-refactor precision >= 0.9.

    python scripts/bench_audit_corpus.py [--cache DIR] [--show-misses]

Network: the first run downloads about 0.7 MB; later runs read the cache.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tarfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from remotemac.checks.audit import audit_project  # noqa: E402
from remotemac.checks.audit_rules import SEVERITIES, Finding  # noqa: E402

TRUTH = Path(__file__).with_name("audit_corpus_truth.tsv")
CACHE = Path.home() / ".cache" / "remotemac-audit-corpus"

#: (distribution, version, what kind of project it is)
PACKAGES = (
    ("torch-scatter", "2.1.2", "extension, optional CUDA (setup.py + CMake option)"),
    ("torch-cluster", "1.6.3", "extension, optional CUDA (setup.py + CMake option)"),
    ("torch-sparse", "0.6.18", "extension, optional CUDA (setup.py + CMake option)"),
    ("torch-spline-conv", "1.2.2", "extension, optional CUDA (setup.py + CMake option)"),
    ("torch-points-kernels", "0.7.0", "extension, optional CUDA (if WITH_CUDA in setup.py)"),
    ("causal-conv1d", "1.7.0", "CUDA-only kernels"),
    ("x-transformers", "2.31.10", "pure PyTorch, optional flash-attn"),
    ("lion-pytorch", "0.2.5", "pure PyTorch, optional Triton kernel"),
    ("rotary-embedding-torch", "0.9.1", "pure PyTorch, optional Triton kernels"),
    ("ring-attention-pytorch", "0.5.20", "pure PyTorch, lazily imported Triton path"),
    ("ema-pytorch", "0.8.3", "pure PyTorch"),
    # held out: truth written from reading the code before audit ever ran on them
    ("chamferdist", "1.0.3", "held out: extension, CUDAExtension if CUDA else CppExtension"),
    ("denoising-diffusion-pytorch", "2.3.4", "held out: pure PyTorch"),
    ("vit-pytorch", "1.26.11", "held out: pure PyTorch"),
    ("torch-ema", "0.3", "held out: pure PyTorch"),
)
HELD_OUT = frozenset({"chamferdist", "denoising-diffusion-pytorch", "vit-pytorch", "torch-ema"})

#: setup.py of CUDA-only packages refuses to build metadata without nvcc unless told
_SKIP_CUDA = {"CAUSAL_CONV1D_SKIP_CUDA_BUILD": "TRUE", "FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE"}


@dataclass(frozen=True)
class Truth:
    package: str
    file: str
    line: int | None
    pattern: re.Pattern[str] | None
    rule: str
    severity: str
    why: str

    def matches(self, package: str, f: Finding) -> bool:
        if (package, f.file, f.rule) != (self.package, self.file, self.rule):
            return False
        if self.line is not None:
            return f.line == self.line
        return bool(self.pattern and self.pattern.search(f.text))


def load_truth(path: Path = TRUTH) -> list[Truth]:
    """The truth file: package, file, line or /regex/, rule, severity, why (tab-separated)."""
    rows: list[Truth] = []
    with path.open(newline="") as fh:
        for n, row in enumerate(csv.reader(fh, delimiter="\t"), 1):
            if not row or row[0].startswith("#"):
                continue
            if len(row) != 6:
                raise ValueError(f"{path.name}:{n}: want 6 tab-separated fields, got {len(row)}")
            package, file, where, rule, severity, why = row
            if severity not in SEVERITIES:
                raise ValueError(f"{path.name}:{n}: unknown severity {severity!r}")
            if not why.strip():
                raise ValueError(f"{path.name}:{n}: say why")
            if where.startswith("/") and where.endswith("/") and len(where) > 2:
                rows.append(
                    Truth(package, file, None, re.compile(where[1:-1]), rule, severity, why)
                )
            else:
                rows.append(Truth(package, file, int(where), None, rule, severity, why))
    return rows


def fetch(name: str, version: str, cache: Path) -> Path:
    """The unpacked sdist of name==version, downloaded once with pip."""
    cache.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-{version}".replace("-", "_").lower() + "."

    def cached() -> list[Path]:
        return [
            p for p in cache.glob("*.tar.gz") if p.name.lower().replace("-", "_").startswith(stem)
        ]

    found = cached()
    if not found:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(cache),
            f"{name}=={version}",
        ]
        env = {**os.environ, **_SKIP_CUDA}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:  # setup.py that imports torch: build in this environment
            done = subprocess.run(
                [*cmd, "--no-build-isolation"], env=env, capture_output=True, text=True
            )
        if done.returncode != 0:
            raise SystemExit(
                f"pip download {name}=={version} failed: {done.stderr.strip().splitlines()[-1:]}"
            )
        found = cached()
    archive = found[0]
    target = cache / "src" / archive.name[: -len(".tar.gz")]
    if not target.exists():
        with tarfile.open(archive) as tar:
            tar.extractall(cache / "src", filter="data")
    return target


def score(
    results: dict[str, list[Finding]], truth: list[Truth]
) -> tuple[dict[str, tuple[int, int, int, int]], list[str]]:
    """Per severity: (true positives, findings, matched truth rows, truth rows); misses."""
    out: dict[str, tuple[int, int, int, int]] = {}
    misses: list[str] = []
    for sev in SEVERITIES:
        rows = [t for t in truth if t.severity == sev]
        found = [(pkg, f) for pkg, fs in results.items() for f in fs if f.severity == sev]
        tp = 0
        for pkg, f in found:
            if any(t.matches(pkg, f) for t in rows):
                tp += 1
            else:
                misses.append(f"false {sev}: {pkg} {f.file}:{f.line} {f.rule} | {f.text}")
        matched = 0
        for t in rows:
            if any(t.matches(pkg, f) for pkg, f in found):
                matched += 1
            else:
                where = t.line if t.line is not None else t.pattern.pattern  # type: ignore[union-attr]
                misses.append(f"missed {sev}: {t.package} {t.file}:{where} {t.rule}")
        out[sev] = (tp, len(found), matched, len(rows))
    return out, misses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--show-misses", action="store_true")
    args = ap.parse_args()
    truth = load_truth()
    results: dict[str, list[Finding]] = {}
    verdicts: dict[str, str] = {}
    elapsed = 0.0
    for name, version, _kind in PACKAGES:
        src = fetch(name, version, args.cache)
        start = time.perf_counter()
        report = audit_project(src)
        elapsed += time.perf_counter() - start
        results[name] = report.findings
        verdicts[name] = report.verdict
    table, misses = score(results, truth)
    print(
        f"{len(PACKAGES)} sdists, {sum(len(v) for v in results.values())} findings in "
        f"their own code, {len(truth)} truth rows, audit time {elapsed:.2f} s"
    )
    for name, _v, kind in PACKAGES:
        c = Counter(f.severity for f in results[name])
        print(
            f"  {name:24} {verdicts[name]:26} {c['blocker']:3} B {c['needs-refactor']:3} R "
            f"{c['note']:3} N   ({kind})"
        )
    print(f"{'severity':16}{'precision':>12}{'recall':>12}")
    for sev, (tp, n, matched, rows) in table.items():
        p = tp / n if n else 1.0
        r = matched / rows if rows else 1.0
        print(
            f"{sev:16}{p:>12.3f}{r:>12.3f}   ({tp}/{n} findings right, {matched}/{rows} "
            "expected found)"
        )
    held, _ = score(
        {k: v for k, v in results.items() if k in HELD_OUT},
        [t for t in truth if t.package in HELD_OUT],
    )
    print(
        "held out only: "
        + ", ".join(f"{sev} P {tp}/{n} R {m}/{rows}" for sev, (tp, n, m, rows) in held.items())
    )
    b_tp, b_n, b_m, b_rows = table["blocker"]
    r_tp, r_n, _, _ = table["needs-refactor"]
    ok = (
        b_tp == b_n
        and (b_m / b_rows if b_rows else 1.0) >= 0.95
        and (r_tp / r_n if r_n else 1.0) >= 0.9
    )
    print(
        "goals (blocker P = 1.0, R >= 0.95; needs-refactor P >= 0.9):", "met" if ok else "NOT met"
    )
    if args.show_misses or not ok:
        for m in misses:
            print("  " + m)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
