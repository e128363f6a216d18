"""Issue 34: the in-process harness counts forked DataLoader workers' shared pages once.

Real: the harness (remotemac/agent/harness.py) runs as the host runs it, a script, over
real torch (CPU) and the vision-trainer reproduction (tests/fixtures/projects/vision:
memory-mapped images, two forked DataLoader workers, AMP, ``last.pth.tar``). The kernel's
own PSS (``/proc/<pid>/smaps_rollup``) is what is read; nothing is simulated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from remotemac.engine.record import memory_samples, read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "remotemac" / "agent" / "harness.py"
VISION = ROOT / "tests" / "fixtures" / "projects" / "vision" / "train.py"


@pytest.mark.timeout(600)
def test_two_forked_workers_starting_is_not_memory_growth(tmp_path: Path) -> None:
    """When the two workers start, the summed RSS jumps by hundreds of MiB (each maps the
    parent's pages); the tree's own memory (PSS) moves by far less, and it is what the
    record judges the trend on (was: this process's RSS alone, workers unseen)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    metrics = logs / "cpu-target.metrics.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(HARNESS), "--device", "cpu", "--obs", str(tmp_path / "obs.json")]
    cmd += ["--metrics", str(metrics), "--interval", "0.5", "--", str(VISION)]
    cmd += ["--device", "cpu", "--output", str(tmp_path / "out"), "--amp", "--workers", "2"]
    cmd += ["--cache", str(tmp_path / "cache")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=580, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "last.pth.tar").exists()
    rows = read_jsonl(metrics)
    before = [r for r in rows if r["processes"] == 1]
    workers = [r for r in rows if r["processes"] >= 3]  # the trainer and its two workers
    assert before and workers, [(r["t"], r["processes"]) for r in rows]
    assert {r.get("own_kind") for r in rows} == {"pss"}
    rss_jump = max(r["rss_bytes"] for r in workers) - max(r["rss_bytes"] for r in before)
    own_jump = max(r["own_bytes"] for r in workers) - max(r["own_bytes"] for r in before)
    # summed RSS counts the shared pages again in each worker; PSS once
    assert rss_jump > 100 * 2**20 and own_jump < 0.5 * rss_jump, (rss_jump, own_jump)
    samples, source = memory_samples(logs, "cpu-target")
    assert source == "process-tree-pss"
    assert [b for _t, b in samples] == [float(r["own_bytes"]) for r in rows]
    obs = json.loads((tmp_path / "obs.json").read_text())
    assert obs["peak_own_bytes"] == max(r["own_bytes"] for r in rows)
    # the peak of this process's own RSS, not the tree's sum
    assert obs["peak_rss_bytes"] < max(r["rss_bytes"] for r in workers)
