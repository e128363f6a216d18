"""Issue 15, "every failure leaves a consistent journal": a wipe that cannot run
still shreds the local data key, and the user is told exactly what is left on the
host. Real OpenSSH sshd; the host goes away between the run and the wipe.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remotemac.journal import Journal
from tests.test_cleanup_sshd import make_target, write_playbook


@pytest.mark.timeout(300)
def test_wipe_that_cannot_run_still_shreds_the_key_and_says_what_is_left(
    tmp_path: Path, sshd_factory, ssh_env
):
    t = make_target(tmp_path, sshd_factory, ssh_env)
    book = write_playbook(tmp_path, t.alias, t.root, "gone", wipe="manual")
    out = tmp_path / "out"
    proc = t.cli("run", str(book), "--out", str(out), "--json")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    [run_id] = [p.name for p in (t.root / "runs").iterdir()]
    run_dir = t.root / "runs" / run_id
    key = t.rm_home / "keys" / f"{run_id}.key"
    assert key.exists() and (run_dir / "data").is_dir()
    t.sshd.stop(kill_sessions=True)

    wiped = t.cli("wipe", run_id, "--yes", timeout=120)
    assert wiped.returncode == 3, wiped.stdout + wiped.stderr
    assert not key.exists(), "the local data key must be shredded even when the host is gone"
    message = wiped.stderr.strip().splitlines()[-1]
    assert "wipe could not run on" in message
    assert "the local data key was crypto-shredded" in message
    for left in (f"{run_dir}/data", f"{run_dir}/tmp", f"RAM store /dev/shm/remotemac-{run_id}"):
        assert left in message, (left, message)
    record = json.loads((out / "acceptance.json").read_text())
    assert record["wipe"]["done"] is False and record["wipe"]["verified"] is False
    assert any(f"{run_dir}/data (wipe could not run)" in r for r in record["wipe"]["remaining"])
    assert any("crypto-shredded" in r for r in record["wipe"]["removed"])
    journal = Journal(t.rm_home / "journal.sqlite3")
    state, result = journal.phase_state(run_id, "wipe")
    journal.close()
    assert state == "failed" and "wipe could not run" in result["error"]
    # the data is still there (the host never answered), but nothing can decrypt it
    assert (run_dir / "data").is_dir()
