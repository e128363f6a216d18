"""The user's own remotemac is never a stray of the root it names.

As a normal user the lab's host login is the user (same machine, same uid), and the
host ``local`` is always so: the laptop's ``remotemac cleanup HOST --remote-root ROOT``
names the root in its command line, and the host's stray scan listed it as "still
running: its command line names remote_root", so every cleanup there ended "not
clean" (11 sshd tests failed as a normal user). Real processes here: one shaped as the
laptop's CLI, one as a job left behind; only the second is a stray.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from remotemac.agent import wipeops

SLEEP = "import time; time.sleep(60)"


def test_the_laptops_cli_naming_the_root_is_not_a_stray_and_a_job_is(tmp_path: Path):
    root = str(tmp_path / "remotemac")
    driver = subprocess.Popen(
        [sys.executable, "-c", SLEEP, "-m", "remotemac", "cleanup", "h", "--remote-root", root]
    )
    job = subprocess.Popen([sys.executable, "-c", SLEEP, f"{root}/runs/r1/project/train.py"])
    try:
        time.sleep(0.3)  # both exec'd: their command lines are the ones given
        found = wipeops.strays_naming([root])
        assert job.pid in found, found
        assert driver.pid not in found, found
    finally:
        for proc in (driver, job):
            proc.kill()
            proc.wait()


def test_what_counts_as_the_remotemac_cli():
    assert wipeops.is_remotemac_cli(["/home/u/.venv/bin/remotemac", "cleanup", "h"])
    assert wipeops.is_remotemac_cli(["python3", "-m", "remotemac", "run", "pb.yaml"])
    assert not wipeops.is_remotemac_cli(["python3", "train.py", "--out", "remotemac"])
    assert not wipeops.is_remotemac_cli(["python3", "-m", "remotemac_fork"])
