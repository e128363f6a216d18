"""Issue 31 item 14: a receiver that has exited but is not reaped yet (a zombie) is
not counted as alive, so its ``*.part-<pid>`` file is debris the next session removes.

After the laptop is SIGKILLed during a sync, the killed session's receiver stays a
zombie for ~2 s (its sshd has not reaped it). The liveness check (``kill(pid, 0)``)
said "alive", so an ``attach`` in that window left ``part-NNN.bin.part-<pid>`` in
``{data_dir}`` for the job to see. Real processes: a child that exits and that this
test (its parent) does not wait for is a real zombie; the receiver's real session
code (``dataops.serve``) runs in this process, as in tests/test_sync_resync.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from remotemac.agent import agentutil, datarecords, procid
from tests.test_sync_resume import _session
from tests.test_sync_resync import _frames, _slice


def _zombie() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if procid.is_zombie(proc.pid):
            return proc
        time.sleep(0.02)
    raise AssertionError("the child never became a zombie")


def test_a_zombie_receivers_part_file_is_removed_by_the_next_session(tmp_path: Path):
    src = str(tmp_path / "data")
    blobs, entries = _slice()
    _session(src, entries, _frames(blobs, entries, only={0, 1}))  # a first, partial sync
    zombie = _zombie()
    try:
        # what the SIGKILLed session left: its in-flight part file and its writing mark
        debris = Path(src, entries[2]["path"] + f".part-{zombie.pid}")
        debris.parent.mkdir(parents=True, exist_ok=True)
        debris.write_bytes(b"half a file")
        mark = Path(src, datarecords.WRITING + str(zombie.pid))
        mark.write_text(json.dumps({"pid": zombie.pid}))
        started = time.monotonic()
        result = _session(src, entries, _frames(blobs, entries, only=set(range(2, 12))))
        took = time.monotonic() - started
        assert result["final"]["result"]["mismatches"] == []
        assert not debris.exists(), sorted(os.listdir(debris.parent))
        assert not mark.exists()
        assert took < 2.5, took  # not the 3 s wait for a "live" receiver to end
        leftover = [p for p in Path(src).rglob("*") if ".part-" in p.name]
        assert leftover == []
    finally:
        zombie.wait()


def test_pid_alive_says_a_zombie_is_gone():
    """The agent's one liveness helper (the journal's run driver uses it too)."""
    zombie = _zombie()
    try:
        assert not agentutil.pid_alive(zombie.pid)
    finally:
        zombie.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert agentutil.pid_alive(live.pid)
    finally:
        live.kill()
        live.wait()
