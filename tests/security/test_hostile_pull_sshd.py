"""Issue 15 item 8: a hostile host cannot break pull, over the real sshd fixture.

The job itself is the hostile part: it plants, in its own output dir, a file with a
non-UTF-8 name, a directory chain whose path passes 5,000 characters (with files
at 3,000 and at the bottom), and a file that a background process keeps growing
after the listing. Before the fix the first of these ended the run with "internal
error: UnicodeEncodeError", left it "running" in the journal and never wiped; a
growing file failed its checksum (the download read past the listed size).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path

import pytest
import yaml

from remotemac.engine.pull import pull_dir
from tests.test_cleanup_sshd import make_target, run_ids
from tests.test_pull_sshd import hostile_agent
from tests.test_sync_sshd import host_factory as host_factory  # the fixture, shared
from tests.test_sync_sshd import runtime_dir as runtime_dir  # host_factory needs it

pytestmark = pytest.mark.timeout(300)

HOSTILE_JOB = r"""
import json, os, subprocess, sys, time
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "result.json"), "w") as fh:
    json.dump({"value": 1.0}, fh)
# a name that is not UTF-8
with open(os.path.join(os.fsencode(out), b"bad-\xff\xfe.bin"), "wb") as fh:
    fh.write(b"not utf-8 name\n")
# a chain of 250-character directories, 20 deep: 5,000+ characters of path
fd = os.open(out, os.O_RDONLY)
for i in range(20):
    name = ("d%02d" % i) * 83 + "d"
    os.mkdir(name, dir_fd=fd)
    nfd = os.open(name, os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = nfd
    if i in (11, 19):
        f = os.open("deep-%d.txt" % i, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(f, b"deep\n")
        os.close(f)
os.close(fd)
# a file that keeps growing after the job (and the listing) ended
grow = os.path.join(out, "grow.log")
with open(grow, "wb") as fh:
    fh.write(b"x" * 1000)
subprocess.Popen([sys.executable, "-c",
    "import sys, time\n"
    "end = time.time() + 25\n"
    "while time.time() < end:\n"
    "    open(sys.argv[1], 'ab').write(b'y' * 65536); time.sleep(0.005)\n", grow],
    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(0.5)
print("planted", flush=True)
"""


def hostile_project(tmp_path: Path) -> Path:
    project = tmp_path / "hostile-project"
    (project / "data").mkdir(parents=True)
    (project / "hostile.py").write_text(HOSTILE_JOB)
    (project / "data" / "a.txt").write_text("some data\n")
    return project


def write_book(tmp_path: Path, alias: str, root: Path, project: Path, **extra) -> Path:
    book = {
        "name": "hostile",
        "host": alias,
        "remote_root": str(root),
        "project": {"path": str(project)},
        "environment": {"venv": False},  # the host's own python3: the job needs no torch
        "data": {"path": str(project / "data"), "classification": "public"},
        "workload": {
            "command": "python3 hostile.py {output_dir}",
            "reference": {"device": "cpu"},
            "target": {"device": "cpu"},
            "timeout": "5m",
        },
        "outputs": {"path": "."},
        "stop_when": {"memory_growth": False},
    }
    book.update(extra)
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(book, sort_keys=False))
    return path


def files_outside(tmp_path: Path, skip: tuple[Path, ...]) -> dict[str, bytes]:
    """Every regular file under tmp_path that is not in one of ``skip`` (content too)."""
    found = {}
    for dirpath, _dirs, names in os.walk(tmp_path):
        if any(Path(dirpath) == s or s in Path(dirpath).parents for s in skip):
            continue
        for name in names:
            full = Path(dirpath) / name
            if full.is_file() and not full.is_symlink():
                found[str(full)] = full.read_bytes()
    return found


def journal_row(rm_home: Path, run_id: str) -> dict:
    db = sqlite3.connect(rm_home / "journal.sqlite3")
    db.row_factory = sqlite3.Row
    row = dict(db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone())
    phases = {
        r["phase"]: r["state"]
        for r in db.execute("SELECT phase, state FROM phases WHERE run_id = ?", (run_id,))
    }
    db.close()
    return {**row, "phases": phases}


def test_hostile_names_and_growing_file_are_refused_cleanly_and_the_run_still_wipes(
    tmp_path, sshd_factory, ssh_env
):
    t = make_target(tmp_path, sshd_factory, ssh_env)
    project = hostile_project(tmp_path)
    book = write_book(tmp_path, t.alias, t.root, project)
    out = tmp_path / "out"
    before = files_outside(tmp_path, (out, t.host_home, t.rm_home, t.tmux_dir))
    proc = t.cli("run", str(book), "--out", str(out), "--json")
    text = proc.stdout + proc.stderr
    assert "internal error" not in text and "Traceback" not in text, text[-3000:]
    assert proc.returncode in (0, 1), text[-3000:]
    [run_id] = run_ids(t.root)
    # every hostile name was refused, each with a clean reason
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    skips = [e["message"] for e in events if e.get("code") == "pull-skip"]
    assert any("not valid UTF-8" in m for m in skips), skips
    assert any("too long" in m for m in skips), skips
    assert all("\xff" not in m and "\x1b" not in m for m in skips)
    # the growing file was pulled as it was listed: capped, and its checksum held
    sides = sorted((out / "results").iterdir())
    assert sides
    for side_dir in sides:
        assert sorted(p.name for p in side_dir.iterdir()) == ["grow.log", "result.json"]
        data = (side_dir / "grow.log").read_bytes()
        assert data[:1000] == b"x" * 1000 and set(data[1000:]) <= {ord("y")}
    pulled = list((out / "results").rglob("*"))
    assert pulled and all(out in p.parents for p in pulled)
    # nothing written outside --out on the laptop
    assert files_outside(tmp_path, (out, t.host_home, t.rm_home, t.tmux_dir)) == before
    # the journal is consistent and the run's data was wiped
    row = journal_row(t.rm_home, run_id)
    assert row["state"] == "finished", row
    assert row["phases"].get("pull") == "done" and row["phases"].get("wipe") == "done", row
    run_dir = t.root / "runs" / run_id
    # (out/ may survive: the grower escaped the job's session on purpose and keeps
    # recreating grow.log; stopping such processes is the wipe's own business)
    assert not (run_dir / "data").exists()
    record = json.loads((out / "acceptance.json").read_text())
    assert record["wipe"]["done"] is True


def test_outputs_over_max_bytes_refuse_the_pull_mark_the_run_failed_and_still_wipe(
    tmp_path, sshd_factory, ssh_env
):
    t = make_target(tmp_path, sshd_factory, ssh_env)
    project = hostile_project(tmp_path)
    (project / "hostile.py").write_text(
        "import os, sys\nout = sys.argv[1]\nos.makedirs(out, exist_ok=True)\n"
        "open(os.path.join(out, 'big.bin'), 'wb').write(os.urandom(5 << 20))\n"
    )
    book = write_book(
        tmp_path, t.alias, t.root, project, outputs={"path": ".", "max_bytes": "1MiB"}
    )
    out = tmp_path / "out"
    proc = t.cli("run", str(book), "--out", str(out))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 5, text[-3000:]
    assert "outputs.max_bytes" in proc.stderr and "Traceback" not in text
    assert len([ln for ln in proc.stderr.splitlines() if ln.startswith("remotemac:")]) == 1
    [run_id] = run_ids(t.root)
    assert not list((out / "results").rglob("*.bin")) if (out / "results").exists() else True
    row = journal_row(t.rm_home, run_id)
    assert row["state"] == "failed" and row["failed_phase"] == "pull", row
    assert "outputs.max_bytes" in row["error"] and "wiped after the failure" in row["error"]
    assert row["phases"]["wipe"] == "done"
    run_dir = t.root / "runs" / run_id
    assert not (run_dir / "data").exists()
    assert (run_dir / "out").exists()  # outputs not pulled: kept for a pull by hand
    assert not Path(t.rm_home / "keys" / f"{run_id}.key").exists()


@pytest.mark.asyncio
async def test_a_listing_of_10_bytes_never_pulls_5_mib(sshd, host_factory, tmp_path):
    """The host lists 10 B (with the sha of those 10 B) and serves 5 MiB: 10 B land."""
    payload = os.urandom(5 << 20)
    head = payload[:10]
    host = await host_factory(sshd)
    remote_out = Path(host.run_dir, "out", "cpu")
    remote_out.mkdir(parents=True)
    (remote_out / "lie.bin").write_bytes(payload)
    await host.agent.install()
    host.agent.resident = False  # the lying agent is a one-shot script
    hostile_agent(
        host.agent.agent_dir,
        [
            {
                "path": "lie.bin",
                "kind": "file",
                "size": 10,
                "sha256": hashlib.sha256(head).hexdigest(),
            }
        ],
    )
    dest = tmp_path / "out" / "results" / "cpu"
    try:
        result = (await pull_dir(host.transport, host.agent, str(remote_out), dest)).to_json()
    finally:
        await host.transport.close()
    assert (dest / "lie.bin").read_bytes() == head
    assert result["downloaded"] == 10
