"""Issue 15: wipe and cleanup signal only processes remotemac started (items 4 and 6).

Real processes, a real tmux server (private TMUX_TMPDIR) and a real dead-man
sleeper; the LaunchAgent of item 4 is a plist file in a private HOME (Simulation:
the launchd side only needs the plist to be found, no launchctl is called).
"""

from __future__ import annotations

import json
import os
import plistlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remotemac.agent import cleanupops, deadman, hostagent, procid, wipeops
from tests.hostlayout import make_run, mark_root

AGENT = str(Path(__file__).resolve().parents[2] / "remotemac" / "agent")

SUBS = ("data", "tmp", "cache", "out", "logs", "status", "project")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(")")[-1].split()[0] != "Z"


@pytest.fixture
def old_and_bystander():
    """The workload the runner started (gone now), then an unrelated process group
    leader that got its pid's place in the status (the user's editor, after a reboot)."""
    old = subprocess.Popen(["sleep", "300"], start_new_session=True)
    recorded = {
        "child_start": procid.identity(old.pid),
        "child_argv": ["sleep", "300"],
        "child_cmdline": procid.cmdline(old.pid),
    }
    old.kill()
    old.wait()
    time.sleep(0.05)  # start times count clock ticks (10 ms): a later process has a later one
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield recorded, proc
    proc.kill()
    proc.wait()


def test_item06_stale_child_pid_never_kills_a_reused_pid(tmp_path: Path, old_and_bystander):
    """PID reuse: the status names the workload the runner started (its start time and
    command line recorded), but that process is gone and the pid is someone else's
    with the very same command line."""
    recorded, bystander = old_and_bystander
    root = mark_root(tmp_path / "root")
    run_id = "p-20260101-000000-eeee"
    run_dir = make_run(root, run_id, SUBS)
    (run_dir / "status" / "cpu.json").write_text(
        json.dumps(
            dict(recorded, state="running", runner_pid=bystander.pid, child_pid=bystander.pid)
        )
    )
    # written by hand or an older runner: a pid and nothing to tell who it is
    (run_dir / "status" / "mps.json").write_text(
        json.dumps({"state": "running", "child_pid": bystander.pid})
    )
    answer = wipeops.wipe_run_data({"root": str(root), "run_id": run_id})
    time.sleep(0.3)
    assert _alive(bystander.pid), "wipe killed a process remotemac did not start"
    left = " | ".join(answer["remaining"])
    assert f"process:{bystander.pid} (left alone: started at another time" in left
    assert "left alone: no start time recorded" in left
    assert "left alone: its command line is not this run's runner" in left
    cleanupops.op_cleanup_host({"roots": [str(root)], "run_ids": [run_id]})
    assert _alive(bystander.pid), "cleanup killed a process remotemac did not start"


@pytest.mark.slow
def test_item06_the_job_remotemac_started_is_still_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The other side of the check: the runner records who it started, and wipe stops it."""
    monkeypatch.setenv("REMOTEMAC_NO_TMUX", "1")
    root = mark_root(tmp_path / "root")
    run_id = "q-20260101-000000-ffff"
    run_dir = make_run(root, run_id, SUBS)
    hostagent.op_launch(
        {
            "run_dir": str(run_dir),
            "device": "cpu",
            "session": "unused",
            "command": "sleep 120; echo done",
            "skip_access_check": True,
        }
    )
    status = {}
    for _ in range(100):
        status = json.loads((run_dir / "status" / "cpu.json").read_text())
        if status.get("child_pid"):
            break
        time.sleep(0.05)
    child, runner = status["child_pid"], status["runner_pid"]
    assert status["child_start"] and status["runner_start"] and status["child_argv"]
    answer = wipeops.wipe_run_data({"root": str(root), "run_id": run_id})
    assert f"process:{runner}" in answer["removed"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_alive(child) or _alive(runner)):
        time.sleep(0.1)
    assert not _alive(child) and not _alive(runner)


def test_item04_cleanup_of_a_root_spares_the_root_named_like_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Roots ``…/rr`` and ``…/rr2``: cleaning rr leaves rr2's tmux job, its dead-man
    sleeper and its LaunchAgent alone."""
    tmux_dir = tmp_path / "tmux"
    tmux_dir.mkdir(mode=0o700)
    home = tmp_path / "machome"
    agents = home / "Library" / "LaunchAgents"
    agents.mkdir(parents=True)
    monkeypatch.setenv("TMUX_TMPDIR", str(tmux_dir))
    monkeypatch.setenv("HOME", str(home))
    rr, rr2 = mark_root(tmp_path / "rr"), mark_root(tmp_path / "rr2")
    other = "o-20260101-000000-abab"
    run2 = make_run(rr2, other, SUBS)
    session = "remotemac-" + other + "-cpu"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, f"sleep 300 # {run2}/status/cpu.spec.json"],
        check=True,
    )
    job = deadman.schedule(
        {"root": str(rr2), "run_id": other, "deadline": time.time() + 3600}, platform="linux"
    )
    plist = agents / f"{deadman.LABEL_PREFIX}{other}.plist"
    plist.write_bytes(
        plistlib.dumps(
            {
                "Label": deadman.LABEL_PREFIX + other,
                "ProgramArguments": [
                    sys.executable,
                    "deadman.py",
                    "fire",
                    f"{rr2}/deadman/{other}.json",
                ],
            }
        )
    )
    try:
        assert deadman.find_jobs([str(rr)]) == []
        answer = cleanupops.op_cleanup_host({"roots": [str(rr)], "run_ids": []})
        assert answer["roots"][0]["verified"] is True and not rr.exists()
        alive = subprocess.run(["tmux", "has-session", "-t", "=" + session])
        assert alive.returncode == 0, "cleanup of rr killed rr2's tmux job"
        assert _alive(job["pid"]), "cleanup of rr killed rr2's dead-man sleeper"
        assert plist.exists(), "cleanup of rr removed rr2's LaunchAgent"
    finally:
        subprocess.run(["tmux", "kill-server"], capture_output=True)
        os.kill(job["pid"], signal.SIGKILL)
