"""A runner that has exited but is not reaped yet (a zombie) is gone, not "left alone".

The quickstart's first run ended "wipe 6 removed, 4 remaining", the first of them
``local:process:11620 (left alone: its command line is not this run's runner)``: the
target's runner had written its final status and exited a moment before the wipe,
and its parent (tmux, or init once tmux had quit) had not reaped it. A zombie has no
command line, so the ownership check said "not ours" and the record listed a process
that did not exist. Real processes here: a child that exits and is not waited for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from remotemac.agent import procid, wipeops


def zombie(tmp_path: Path) -> subprocess.Popen:
    """A real process that exited and that nobody reaped (this test is its parent)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        raw = Path(f"/proc/{proc.pid}/stat").read_text()
        if raw.rsplit(")", 1)[1].split()[0] == "Z":
            return proc
        time.sleep(0.02)
    raise AssertionError("the child never became a zombie")


def test_a_zombie_runner_is_not_listed_as_left_alone(tmp_path: Path):
    proc = zombie(tmp_path)
    try:
        assert procid.is_zombie(proc.pid)
        run_dir = tmp_path / "root" / "runs" / "r1"
        (run_dir / "status").mkdir(parents=True)
        (run_dir / "status" / "cpu.json").write_text(
            json.dumps(
                {
                    "state": "finished",
                    "runner_pid": proc.pid,
                    "child_pid": None,
                    "runner_start": {"start": "linux:x:1"},
                }
            )
        )
        left: list[str] = []
        steps: list[dict] = []
        stopped = wipeops.stop_run_processes(str(run_dir), steps, left)
        assert left == [] and stopped == [] and steps == [], (left, stopped, steps)
    finally:
        proc.wait()
    assert not procid.is_zombie(proc.pid)  # reaped: gone


def test_a_live_process_is_no_zombie():
    assert not procid.is_zombie(os.getpid())
    assert not procid.is_zombie(None) and not procid.is_zombie(1 << 30)
