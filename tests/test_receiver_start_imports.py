"""What a sync receiver imports when it starts on the host (agent/dataops.py): every
push starts one per stream, a far one six at once, and on a host with few cores their
Python starts are what the workers wait for (docs/figures.md, "Far push: the time
outside the streams", 2026-12-06). The modules only a cut session's clean-up needs
(agentutil's process tools: procid, subprocess, shutil, signal) are imported when that
runs, not at every start: 5-6 ms of each start on the lab's python3.9."""

from __future__ import annotations

import subprocess
import sys

from remotemac.agent import shared
from remotemac.engine.agentship import AGENT_SRC

#: imported at a receiver's start by nothing it needs before a cut session's clean-up
LATE = ("rmagent.agentutil", "rmagent.procid", "subprocess", "shutil", "signal")


def _imported_at_start(python: str) -> set[str]:
    """The modules of LATE a fresh ``dataops`` (as the host starts it) has imported."""
    probe = (
        "import sys,types,importlib;"
        "p=types.ModuleType('rmagent');p.__path__=[sys.argv[1]];sys.modules['rmagent']=p;"
        "importlib.import_module('rmagent.dataops');importlib.import_module('rmagent.receiver');"
        f"print(' '.join(m for m in {LATE!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [python, "-S", "-c", probe, str(AGENT_SRC)], capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())


def test_a_receiver_starts_without_the_process_tools():
    assert shared.agent_argv("python3", "/a", "dataops")[1] == "-S"  # (the start probed here)
    assert _imported_at_start(sys.executable) == set()


def test_a_cut_sessions_clean_up_still_finds_its_process_tools():
    """other_alive imports pid_alive where it runs: a receiver's pid is alive, a
    finished one is not."""
    from remotemac.agent import datarecords

    done = subprocess.run([sys.executable, "-c", "pass"])
    assert done.returncode == 0
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert datarecords.other_alive(live.pid)
    finally:
        live.kill()
        live.wait()
    assert not datarecords.other_alive(live.pid)
