"""No RAM store (``/dev/shm/remotemac-<run id>``) outlives the test that made it.

/dev/shm is machine-global and outlives a test: runs left unwiped on purpose (``wipe:
manual``, a lost host) had piled up 1.3 GB of decrypted test data on the CI machine.
These tests use the real CLI on the embedded host ``local`` and the real sshd lab's
host dirs; see tests/harness/ramstores.py for how a test's own runs are found.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import remotemac
from tests.harness import lab, ramstores


def _store(run_id: str) -> Path:
    return ramstores.SHM / f"remotemac-{run_id}"


def _only_run(rm_home: Path) -> str:
    ids = {i for i in ramstores.run_ids_under(rm_home) if ramstores.GENERATED_ID.match(i)}
    assert len(ids) == 1, ids
    return ids.pop()


@pytest.mark.e2e
def test_a_manual_wipe_run_keeps_its_store_and_the_local_teardown_finds_it(
    make_preinstalled_playbook, rm_home: Path, tmp_path: Path
):
    """``wipe: manual`` keeps the RAM store after the run (by design); the run's id is
    found from what the test made (its journal and its host root's ``runs/``), and
    removing the stores of those ids (make_preinstalled_playbook's teardown) leaves nothing."""
    out = tmp_path / "out"
    proc = remotemac("run", str(make_preinstalled_playbook(wipe="manual")), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    run_id = _only_run(rm_home)
    assert run_id in ramstores.run_ids_under(tmp_path / "host-root")
    assert _store(run_id).is_dir(), "wipe: manual keeps the plaintext in RAM"
    assert ramstores.remove_stores(ramstores.run_ids_under(tmp_path), {os.geteuid()}) == [
        f"remotemac-{run_id}"
    ]
    assert not os.path.lexists(_store(run_id))


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_lost_jobs_run_keeps_its_data_for_attach_and_its_wipe_removes_the_ram_store(
    make_preinstalled_playbook, rm_home: Path, tmp_path: Path
):
    """The job's tmux server killed mid-run: ``job-lost``, exit 4 ("attach, or run
    again": the run's data stays on the host for that, its RAM store included, as after
    Ctrl-C). The product's own ``remotemac wipe RUN`` of that lost run then removes the
    RAM store with the rest (the leftover seen on CI was such a run no one wiped)."""
    pb = make_preinstalled_playbook(
        workload={
            "command": "python3 emit.py --device {device} --data {data_dir} "
            "--out {output_dir} --lines 2000 --seconds 60",
            "reference": None,
        },
    )
    out = tmp_path / "out"
    env = {"REMOTEMAC_HEARTBEAT_STALE_S": "3"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "remotemac", "run", str(pb), "--out", str(out)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list((out / "logs").glob("*.log")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        run_id = _only_run(rm_home)
        assert _store(run_id).is_dir()
        tmux_env = {**os.environ, "TMUX_TMPDIR": str(tmp_path / "tmux")}
        subprocess.run(["tmux", "kill-server"], env=tmux_env, check=True)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 4, stdout + stderr
    assert "job was lost" in stdout + stderr
    # the user is told the data waits on the host, and how to remove it
    assert f"its data stays on the host until `remotemac wipe {run_id}`" in stdout, stdout
    assert (_store(run_id) / "one.csv").exists(), "kept for attach, as the contract says"
    wiped = remotemac("wipe", run_id, "--yes", timeout=120)
    assert wiped.returncode == 0, wiped.stdout + wiped.stderr
    assert not os.path.lexists(_store(run_id)), "the lost run's wipe left its RAM store"


def test_a_lab_hosts_teardown_removes_the_ram_stores_of_its_runs(fresh_host_lab):
    """A lab host's dirs removed (the sshd's teardown): the RAM store of a run under its
    root, the lab user's, is gone with them; a store of the same user whose run is not
    under that host (another test's, another session's) stays."""
    dirs = lab.HostDirs.create()
    uid, gid = lab.lab_ids()
    mine, other = (f"tidy-{os.getpid()}-{secrets.token_hex(3)}" for _ in range(2))
    try:
        run = dirs.home / "host-root" / "runs" / mine
        run.mkdir(parents=True)
        for run_id in (mine, other):
            _store(run_id).mkdir(mode=0o700)
            (_store(run_id) / "one.csv").write_text("plaintext")
            os.chown(_store(run_id), uid, gid)
        dirs.remove()
        assert not dirs.top.exists()
        assert not os.path.lexists(_store(mine)), "the host's run kept its RAM store"
        assert (_store(other) / "one.csv").exists(), "another run's RAM store was removed"
    finally:
        ramstores.remove_stores({mine, other}, {uid})


def test_the_session_guard_names_only_this_sessions_runs(tmp_path: Path):
    """The guard's sweep over a session's temp dir: a journal's run of the generated
    shape and a host root's run dir are found and their stores removed; a fixed test id
    (``r1``-like, which another session may use for its own store) is left alone."""
    from remotemac.journal import Journal, new_run_id

    home, root = tmp_path / "w0" / "rmhome", tmp_path / "w0" / "host-root"
    home.mkdir(parents=True)
    journal = Journal(home / "journal.sqlite3")
    in_journal, in_root = new_run_id("guard"), new_run_id("guard")
    journal.create_run(
        in_journal,
        name="guard",
        host="local",
        playbook_path=None,
        playbook={},
        out_dir=str(tmp_path / "out"),
        options={},
    )
    journal.close()
    fixed = f"r{os.getpid()}"
    for run_id in (in_root, fixed):
        (root / "runs" / run_id).mkdir(parents=True)
    try:
        for run_id in (in_journal, in_root, fixed):
            _store(run_id).mkdir(mode=0o700)
        left = ramstores.remove_escaped(tmp_path, {os.geteuid()})
        assert sorted(left) == sorted([f"remotemac-{in_journal}", f"remotemac-{in_root}"])
        assert not os.path.lexists(_store(in_journal)) and not os.path.lexists(_store(in_root))
        assert _store(fixed).is_dir(), "a fixed id's store may be another session's"
    finally:
        ramstores.remove_stores({in_journal, in_root, fixed}, {os.geteuid()})
