"""Simulation: whole runs over the Mac-shaped lab host (tests/harness/maclab.py).

The host is a real OpenSSH sshd whose login sees what a rented Mac shows: an HFS+-rules
home and RAM disk (case-insensitive, NFD, 1-second times; a FUSE loopback), no /proc,
BSD ``ps``, a forking ``caffeinate``, launchd as an SSH-only session has it, ``python3``
= a bare 3.9, and the agent on its darwin branches. Only a real Mac settles
DiskArbitration, privacy permissions, real launchd, code signing and MPS itself.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml

from remotemac.phases import Phase
from tests.conftest import REPO, remotemac
from tests.test_detached_ssh import local_lines
from tests.test_faults_sshd import cut_run
from tests.test_resident_sshd import LabHost

pytestmark = [pytest.mark.timeout(600), pytest.mark.e2e]

TRAINER = REPO / "tests" / "fixtures" / "projects" / "trainer"
ODD_NAMES = ("café.csv", "naïve/ü.npy")
MiB = 1 << 20
#: the job of the memory test: it double-forks a child that holds CHILD_MIB (its pages
#: written) and is re-parented once the middle process exits; the job waits for it to
#: let go, and writes its own peak RSS (the job alone) and the child's ids
REPARENTING_JOB = """
import json, os, resource, sys, time

out, mib = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
middle = os.fork()
if middle == 0:
    parent = os.getpid()
    if os.fork() == 0:
        while os.getppid() == parent:  # re-parented when the middle process exits
            time.sleep(0.01)
        held = bytearray(mib << 20)
        for i in range(0, len(held), 4096):  # resident: every page written
            held[i] = 1
        with open(out + "/child.json", "w") as fh:
            json.dump({"ppid": os.getppid(), "pgid": os.getpgid(0), "sid": os.getsid(0)}, fh)
        time.sleep(6)
        open(out + "/child-done", "w").close()
    os._exit(0)
os.waitpid(middle, 0)
end = time.time() + 60
while not os.path.exists(out + "/child-done") and time.time() < end:
    time.sleep(0.05)
alone = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
with open(out + "/metrics.json", "w") as fh:
    json.dump({"final_loss": 1.0, "job_alone_rss_bytes": alone, "middle": middle,
               "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0)}, fh)
"""
CHILD_MIB = 160


@pytest.fixture
def mac_host(mac_sshd_factory, ssh_env, fault_proxy) -> LabHost:
    server = mac_sshd_factory()
    proxy = fault_proxy(server)
    home, cfg, alias = ssh_env(
        server,
        proxy,
        extra={"ServerAliveInterval": "1", "ServerAliveCountMax": "3", "ConnectTimeout": "5"},
    )
    return LabHost(home, cfg, alias, server.home / "root", str(server.tmux_dir), server, proxy)


def nfc(name: str) -> str:
    return unicodedata.normalize("NFC", name)


def make_slice(root: Path, names: tuple[str, ...], *, small: int) -> int:
    """``names`` (NFC, as a Linux laptop's disk gives them) plus ``small`` 4 KiB shards and
    MANIFEST.json with every file's size and SHA-256; returns the file count."""
    manifest: dict[str, Any] = {}

    def put(rel: str, size: int) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        path.write_bytes(data)
        manifest[rel] = {"size": size, "sha256": hashlib.sha256(data).hexdigest()}

    for name in names:
        put(nfc(name), 3000)
    for i in range(small):
        put(f"shards/{i // 50:02d}/shard-{i:04d}.bin", 4096)
    (root / "MANIFEST.json").write_text(json.dumps(manifest, sort_keys=True, ensure_ascii=False))
    return len(manifest) + 1


def playbook(host: LabHost, path: Path, data: Path, *, root: str | None = None) -> Path:
    doc = {
        "name": "mac-trainer",
        "host": host.alias,
        "remote_root": root or str(host.root),
        "project": {"path": str(TRAINER)},
        "environment": {"python": "python3", "venv": False},
        "data": {
            "path": str(data),
            "classification": "sensitive",
            "approved_for_remote": True,
        },
        "workload": {
            "command": "cd src && python3 train.py --device {device} --data {data_dir} "
            "--out {output_dir} --steps 200 --seconds 2",
            "reference": {"device": "cpu"},
            "target": {"device": "cpu"},
            "timeout": "10m",
        },
        "outputs": {"path": ".", "compare": [{"file": "metrics.json", "keys": ["final_loss"]}]},
        "stop_when": {"memory_growth": False},
        "wipe": "after_pull",
        "wipe_deadline": (
            datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
        ).isoformat(timespec="seconds"),
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


def ledger(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]


def test_mac_host_sensitive_slice_with_nfd_names_cut_mid_sync_reaches_the_job_whole(
    mac_host: LabHost, tmp_path: Path
):
    """Simulation: a sensitive slice with café.csv, naïve/ü.npy and 200 shards goes to the
    HFS+-rules RAM disk through cuts of the link while it syncs; the job reads every file
    with the bytes of the manifest, the darwin tools ran (hdiutil, diskutil, caffeinate,
    ps) and nothing read /proc, the ledger shows the hdiutil attach and diskutil
    erasevolume of the cut session that made the RAM disk, and the wipe leaves no volume."""
    data = tmp_path / "slice"
    files = make_slice(data, ODD_NAMES, small=200)
    pb = playbook(mac_host, tmp_path / "pb.yaml", data)
    out = tmp_path / "out"
    ctx, code, cutter = cut_run(mac_host, pb, out, phase="sync", step=40, unit="verified")
    assert cutter.during("sync"), cutter.cuts
    (synced,) = ctx.result(Phase.SYNC).hosts.values()
    assert synced.files == files, synced
    lines = local_lines(out, "cpu")
    assert any(line.startswith(f"data: {files - 1} files,") for line in lines), lines
    assert "every sha256 matches" in next(ln for ln in lines if ln.startswith("data:")), lines
    record = ctx.result(Phase.RECORD)
    # the trainer is stdlib only: no torch observed, so the verdict is "incomplete";
    # the results compared, as in a clean run
    assert record.verdict == "incomplete", record.verdict
    assert "1 of 1 files within tolerance" in (out / "acceptance.md").read_text()
    rows = ledger(out)
    entries = [e for e in rows if e.get("via") == "agent"]
    commands = [e["command"] for e in entries]
    # the RAM disk was made by the first session, which the cut ended before its answer
    # arrived: the session that reused it returned the maker's steps; they are in the
    # ledger once, marked as made by an earlier session, at the time they ran
    made = [
        e
        for e in entries
        if e["command"].startswith(("hdiutil attach ", "diskutil erasevolume HFS+ "))
    ]
    assert [e["command"].split()[:2] for e in made] == [
        ["hdiutil", "attach"],
        ["diskutil", "erasevolume"],
    ], commands
    assert {e["op"] for e in made} == {"ramstore:earlier-session"}, made
    assert all(e["exit_code"] == 0 for e in made), made
    # at the host's time they ran: before a later session's channel, listed above them
    before = [e["time"] for e in rows[: rows.index(made[0])] if e["op"] == "sync-data"]
    assert made[0]["time"] <= made[1]["time"] < max(before), (made, before)
    for tool in (
        "launchctl bootstrap gui/",
        "launchctl bootstrap user/",
        "hdiutil detach",
    ):
        assert any(tool in c for c in commands), (tool, commands)
    assert not any("/proc" in c for c in commands), commands
    server = mac_host.sshd
    mac = server.mac  # type: ignore[attr-defined]
    caffeinated = [json.loads(x) for x in mac.read_state("caffeinate.log").splitlines()]
    assert any(e.get("argv", [])[:2] == ["-i", "-w"] for e in caffeinated), caffeinated
    ps_calls = [json.loads(x)["argv"] for x in mac.read_state("ps.log").splitlines()]
    assert ["-A", "-o", "pid=,ppid=,pgid=,rss="] in ps_calls, ps_calls[:5]
    assert server.run_as_user(["ls", "/Volumes"]).stdout.strip() == ""


def test_mac_host_slice_with_a_csv_and_A_csv_is_refused_in_one_line_before_anything_moves(
    mac_host: LabHost, tmp_path: Path
):
    """Simulation: on a Mac ``A.csv`` and ``a.csv`` are one file (the second overwrote the
    first, or the run was accepted without its bytes): the laptop refuses the slice with
    one line naming both, exit 2, and nothing reaches the host."""
    data = tmp_path / "slice"
    make_slice(data, ("A.csv", "a.csv"), small=3)
    pb = playbook(mac_host, tmp_path / "pb.yaml", data)
    proc = remotemac(
        "--home",
        str(mac_host.home),
        "--ssh-config",
        str(mac_host.ssh_config),
        "run",
        str(pb),
        "--out",
        str(tmp_path / "out"),
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("remotemac: error: "), proc.stderr
    assert "'A.csv' and 'a.csv' are one file on a Mac" in lines[0], lines
    listing = mac_host.sshd.run_as_user(["ls", "-A", str(mac_host.sshd.home)])  # type: ignore[attr-defined]
    assert "root" not in listing.stdout.split(), listing.stdout


def _cli(host: LabHost, *args: str, timeout: float = 240):
    return remotemac(
        "--home", str(host.home), "--ssh-config", str(host.ssh_config), *args, timeout=timeout
    )


def test_mac_host_remote_root_below_a_symlinked_dir_runs_and_cleanup_leaves_nothing(
    mac_host: LabHost, tmp_path: Path
):
    """Simulation: ``~/tmp`` is a symlink to ``~/private/tmp`` as ``/tmp`` is on a Mac. A
    remote_root below it is resolved once on the host and used by its real path: the run
    ends as a clean run does, its ledger shows the RAM disk made with hdiutil and
    diskutil, the record shows both forms and which dead-man guard held (launchd, user/), and cleanup leaves nothing in the target."""
    server = mac_host.sshd
    data = tmp_path / "slice"
    files = make_slice(data, ODD_NAMES, small=5)
    given = str(server.symlinked_dir / "rr")  # type: ignore[attr-defined]
    pb = playbook(mac_host, tmp_path / "pb.yaml", data, root=given)
    out = tmp_path / "out"
    proc = _cli(mac_host, "run", str(pb), "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # incomplete: no torch observed
    assert json.loads((out / "acceptance.json").read_text())["verdict"] == "incomplete"
    lines = local_lines(out, "cpu")
    assert any(line.startswith(f"data: {files - 1} files,") for line in lines), lines
    commands = [e["command"] for e in ledger(out) if e.get("via") == "agent"]
    assert any(c.startswith("hdiutil attach -nobrowse -nomount ram://") for c in commands)
    assert any(c.startswith("diskutil erasevolume HFS+ ") for c in commands), commands
    real = str(server.home / "private" / "tmp" / "rr")  # type: ignore[attr-defined]
    assert real in (out / "acceptance.json").read_text() or real in proc.stdout + proc.stderr
    # the record says which dead-man guard held: gui/ refused over SSH, launchd's user/
    guard = json.loads((out / "acceptance.json").read_text())["deadman"]
    assert guard["method"] == "launchd" and guard["domain"].startswith("user/"), guard
    assert guard["verified"] == f"launchctl print {guard['domain']}/{guard['label']}", guard
    md = (out / "acceptance.md").read_text()
    assert "## Dead-man" in md and guard["domain"] in md, md
    clean = _cli(mac_host, "cleanup", mac_host.alias, "--remote-root", given, "--yes")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    left = server.run_as_user(["ls", "-A", str(server.home / "private" / "tmp")])  # type: ignore[attr-defined]
    assert left.stdout.split() == [], left.stdout


def test_mac_host_symlinked_remote_root_is_refused_with_exit_2_and_nothing_written(
    mac_host: LabHost, tmp_path: Path
):
    """Simulation: a remote_root that is itself a symlink (``~/tmp``) would be provisioned
    through the link (marker and agent/ in its target) and then refused: it is refused
    first, exit 2, and its target stays empty."""
    server = mac_host.sshd
    data = tmp_path / "slice"
    make_slice(data, (), small=2)
    pb = playbook(mac_host, tmp_path / "pb.yaml", data, root=str(server.symlinked_dir))  # type: ignore[attr-defined]
    proc = _cli(mac_host, "run", str(pb), "--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is a symlink" in proc.stderr, proc.stderr
    left = server.run_as_user(["ls", "-A", str(server.home / "private" / "tmp")])  # type: ignore[attr-defined]
    assert left.stdout.split() == [], left.stdout


def test_doctor_on_the_mac_host_says_launchd_guards_in_user_domain_gui_refused(
    mac_host: LabHost,
):
    """Simulation: doctor names the dead-man guard a run on the Mac-shaped host gets: the
    SSH-only login has no gui/ domain (refused), launchd holds jobs in user/UID, checked
    with ``launchctl print`` (legacy ``load``'s exit 0 is not taken for it)."""
    proc = _cli(mac_host, "doctor", mac_host.alias, "--json")
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    row = checks["dead-man"]
    uid = json.loads(proc.stdout)["facts"]["deadman"]["domain"].split("/")[1]
    assert row["value"] == f"launchd, domain user/{uid}", row
    assert f"checked with launchctl print user/{uid}" in row["why"], row
    assert f"gui/{uid} refused" in row["why"], row
    table = _cli(mac_host, "doctor", mac_host.alias)
    assert "dead-man" in table.stdout and f"user/{uid}" in table.stdout, table.stdout


def test_mac_host_memory_counts_a_double_forked_child_re_parented_away_from_the_job(
    mac_host: LabHost, tmp_path: Path
):
    """Simulation: on the Mac-shaped host (no /proc: the runner reads the BSD ``ps``
    stand-in) the job double-forks a child that holds 160 MiB after its parent exited
    (re-parented, out of the job's parent-pid tree, still in its process group). The
    record's memory peak counts the child: it exceeds the job alone (its own peak RSS,
    which the job reports) by the child's 160 MiB."""
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "hold.py").write_text(REPARENTING_JOB)
    pb = playbook(mac_host, tmp_path / "pb.yaml", tmp_path)
    doc = yaml.safe_load(pb.read_text())
    doc["project"] = {"path": str(project)}
    doc.pop("data")
    doc["workload"]["command"] = f"cd src && python3 hold.py {{output_dir}} {CHILD_MIB}"
    pb.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "out"
    proc = _cli(mac_host, "run", str(pb), "--out", str(out))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # incomplete: no torch
    target = out / "results" / "cpu-target"
    job = json.loads((target / "metrics.json").read_text())
    child = json.loads((target / "child.json").read_text())
    # re-parented: its parent is neither the middle process nor the job; the job's group
    assert child["ppid"] not in (job["middle"], job["pid"]), (child, job)
    assert (child["pgid"], child["sid"]) == (job["pgid"], job["sid"]), (child, job)
    memory = json.loads((out / "acceptance.json").read_text())["observations"]["memory"]
    assert memory["source"] == "process-tree-rss", memory
    assert memory["peak_bytes"] >= job["job_alone_rss_bytes"] + CHILD_MIB * MiB, (memory, job)
    ps_calls = [json.loads(x)["argv"] for x in mac_host.sshd.mac.read_state("ps.log").splitlines()]  # type: ignore[attr-defined]
    assert ["-A", "-o", "pid=,ppid=,pgid=,rss="] in ps_calls, ps_calls[:5]
