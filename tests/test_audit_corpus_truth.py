"""The corpus benchmark's truth file parses and names only real rules (the benchmark itself
downloads from PyPI, so it never runs in the test suite)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from remotemac.checks.audit_rules import RULES

REPO = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_audit_corpus", REPO / "scripts" / "bench_audit_corpus.py"
    )
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_truth_file_parses_and_covers_every_package() -> None:
    bench = _bench()
    rows = bench.load_truth()
    assert len(rows) >= 50
    assert {t.rule for t in rows} <= set(RULES)
    packages = {name for name, _v, _k in bench.PACKAGES}
    assert len(packages) >= 8 and packages >= bench.HELD_OUT
    assert {t.package for t in rows} <= packages
    assert {"blocker", "needs-refactor", "note"} <= {t.severity for t in rows}
    assert all(t.why for t in rows)


def test_scoring_counts_false_and_missed_findings() -> None:
    from remotemac.checks.audit_rules import make

    bench = _bench()
    truth = bench.load_truth()
    row = next(t for t in truth if t.severity == "blocker" and t.line is not None)
    right = make(row.rule, row.file, row.line, "x")
    wrong = make("flash-attn", "nowhere.py", 1, "import flash_attn")
    table, misses = bench.score({row.package: [right, wrong]}, truth)
    tp, n, matched, rows = table["blocker"]
    assert (tp, n, matched) == (1, 2, 1) and rows > 1
    assert any(m.startswith("false blocker") and "nowhere.py" in m for m in misses)
