"""Ctrl-C during ``run`` on ``local``: the journal says what is true afterwards.

A user pressed Ctrl-C while the target ran, then ``remotemac status`` said
``follow:target failed`` with a ``finished`` time, next to ``live cpu-target:
running``. Nothing had failed and nothing had finished: the follower stopped, the
job went on. Now the phase is ``interrupted``, the run has no finished time, and
``attach`` goes on from there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import as_in_a_terminal, remotemac

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(240)
def test_status_after_ctrl_c_says_interrupted_not_failed_or_finished(
    make_preinstalled_playbook, rm_home: Path, tmp_path: Path
):
    pb = make_preinstalled_playbook(
        workload={
            "command": "python3 emit.py --device {device} --data {data_dir} "
            "--out {output_dir} --lines 40 --seconds 6 --torch",
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "remotemac", "run", str(pb), "--out", str(tmp_path / "o"), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ,
        preexec_fn=as_in_a_terminal,  # or SIGINT below finds it ignored (a `&` job)
    )
    assert proc.stdout is not None
    run_id = None
    for line in proc.stdout:
        event = json.loads(line)
        run_id = event.get("run_id") or run_id
        if event["event"] == "phase_started" and event.get("phase") == "follow:target":
            break
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    status = json.loads(remotemac("status", run_id, "--json").stdout)
    assert status["state"] == "interrupted"
    assert status["finished_at"] is None, status
    assert status["phases"]["follow:target"]["state"] == "interrupted", status["phases"]
    assert "failed" not in {p["state"] for p in status["phases"].values()}, status["phases"]
    human = remotemac("status", run_id).stdout
    assert "failed" not in human, human
    assert next(x for x in human.splitlines() if x.startswith("finished")).split() == [
        "finished",
        "—",
    ], human
    done = remotemac("attach", run_id, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    after = json.loads(remotemac("status", run_id, "--json").stdout)
    assert after["state"] == "finished" and after["finished_at"] is not None
    assert after["phases"]["follow:target"]["state"] == "done"
