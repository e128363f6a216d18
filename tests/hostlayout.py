"""Build a host's remote_root by hand the way the agent leaves it: with ownership markers.

Tests that fake a host's state (what provision, sync and a workload would have
left) use these so that wipe and cleanup, which delete only directories carrying
remotemac's marker, treat them as remotemac's own.
"""

from __future__ import annotations

from pathlib import Path

from remotemac.agent import safefs

ROOT_ID = "0123456789abcdef"


def mark_root(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    safefs.mark_dir(str(root), {"kind": "root", "root_id": ROOT_ID})
    return root


def mark(path: Path, kind: str, run_id: str | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    safefs.mark_dir(str(path), {"kind": kind, "run_id": run_id, "root_id": ROOT_ID})
    return path


def make_run(root: Path, run_id: str, subs=("project", "data", "logs", "status", "out")) -> Path:
    """``root/runs/<run_id>`` with its marker (the root is marked too) and ``subs``."""
    if safefs.marker_of(str(root)) is None:
        mark_root(root)
    run_dir = mark(root / "runs" / run_id, "run", run_id)
    for sub in subs:
        (run_dir / sub).mkdir(exist_ok=True)
    return run_dir
