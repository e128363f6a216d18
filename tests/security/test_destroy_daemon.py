"""Issue 31 item 13: a daemon the workload started in a new session (setsid), whose
argv names the run's out/ dir, is stopped by the wipe and by cleanup; cleanup never
says "clean, verified" while it runs; the cleanup dry run counts each byte once.

As the user meets it: the real CLI on the local host, a real workload that starts a
real daemon with ``start_new_session=True`` (what ``setsid`` or a double fork does;
the runner's kill of the job's process group never reaches it).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import remotemac

DAEMON = (
    "python3 -c \"import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
    "'import time; time.sleep(300)', '--out', sys.argv[1]], start_new_session=True, "
    'stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)" '
    "{output_dir} && python3 emit.py --device {device} --out {output_dir} --lines 3 "
    "--seconds 0.1"
)


def naming(path: Path) -> list[int]:
    """Live (not zombie) processes whose command line names ``path``, but a tmux server:
    it keeps the argv of the client that started it (``tmux new-session … runner.py
    <run dir>``), and it is the home of every job, never a daemon of the job's."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        argv = raw.replace(b"\0", b" ").decode()
        if Path(raw.split(b"\0")[0].decode()).name.startswith("tmux"):
            continue
        if str(path) in argv and state not in ("Z", "X") and " -m pytest" not in argv:
            found.append(int(name))
    return found


def wait_gone(path: Path, seconds: float = 10) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := naming(path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture
def daemon_book(make_preinstalled_playbook, rm_home: Path, tmp_path: Path):
    def make(**extra):
        return make_preinstalled_playbook(
            "daemon",
            workload={"command": DAEMON, "reference": None, "target": {"device": "cpu"}},
            outputs={"path": ".", "compare": []},
            **extra,
        )

    yield make
    for pid in naming(tmp_path / "host-root"):  # never leave one behind
        os.kill(pid, 9)


def test_the_wipe_stops_a_setsid_daemon_that_names_the_runs_out_dir(daemon_book, tmp_path):
    root = tmp_path / "host-root"
    proc = remotemac("run", str(daemon_book()), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "✓ wipe" in proc.stdout, proc.stdout
    assert wait_gone(root) == [], "the daemon outlived the wipe"


def test_cleanup_stops_the_daemon_and_only_then_says_verified(daemon_book, tmp_path):
    root = tmp_path / "host-root"
    proc = remotemac(
        "run", str(daemon_book(wipe="manual")), "--out", str(tmp_path / "out"), cwd=tmp_path
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    time.sleep(0.5)
    assert naming(root), "the workload's daemon should be running (wipe: manual)"
    dry = remotemac("cleanup", "local", "--remote-root", str(root), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    to_free = json.loads(dry.stdout.splitlines()[-1])["bytes_to_free"]
    done = remotemac("cleanup", "local", "--remote-root", str(root), "--yes", "--json")
    record = json.loads(done.stdout.splitlines()[-1])
    assert wait_gone(root, 2) == [], "the daemon outlived cleanup"
    assert done.returncode == 0 and record["verified"], done.stdout + done.stderr
    # the dry run counted a root and its children once: what it says is what goes
    assert to_free <= record["bytes_freed"] * 1.05 + 4096, (to_free, record["bytes_freed"])
