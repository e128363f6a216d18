"""The journal shared by several remotemac processes at once (SPEC: runs may overlap)."""

from __future__ import annotations

import multiprocessing as mp
import traceback
from pathlib import Path

import pytest

from remotemac.journal import Journal


def _open_and_write(path: str, barrier: mp.synchronize.Barrier, tag: int) -> str | None:
    try:
        barrier.wait(timeout=30)
        journal = Journal(Path(path))
        for i in range(5):
            journal.create_run(
                f"r{tag}-{i}",
                name="x",
                host="local",
                playbook_path=None,
                playbook={},
                out_dir="/tmp",
                options={},
            )
        journal.close()
        return None
    except Exception:  # reported to the parent, which fails the test with it
        return traceback.format_exc()


@pytest.mark.slow
def test_processes_opening_a_fresh_journal_at_once_all_succeed(tmp_path: Path):
    """Regression: the first switch to WAL raced and one process died "database is locked"."""
    workers = 6
    ctx = mp.get_context("spawn")
    # One pool for every round: the race is in the first open of a fresh file, which the
    # barrier lines up; spawning 6 interpreters per round only cost time (5 s of 6).
    with ctx.Manager() as manager, ctx.Pool(workers) as pool:
        for round_no in range(8):
            path = tmp_path / f"round{round_no}" / "journal.sqlite"
            path.parent.mkdir()
            barrier = manager.Barrier(workers)
            errors = pool.starmap(
                _open_and_write, [(str(path), barrier, w) for w in range(workers)], chunksize=1
            )
            assert [e for e in errors if e] == []
            assert len(Journal(path).list_runs()) == workers * 5
