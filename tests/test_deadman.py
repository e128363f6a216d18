"""The dead-man wipe fires on the host at its deadline, with the laptop gone."""

from __future__ import annotations

import json
import os
import plistlib
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.hostlayout import make_run
from tests.test_cleanup_sshd import deadman_pids, make_target, write_playbook

FIXTURES = Path(__file__).parent / "fixtures" / "macos"


def _wait(predicate, timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@pytest.mark.timeout(240)
def test_sleeper_fires_after_the_laptop_is_gone(tmp_path: Path, sshd_factory, ssh_env):
    """Linux path for real: sshd host, orchestrator SIGKILLed and sshd stopped."""
    t = make_target(tmp_path, sshd_factory, ssh_env)
    book = write_playbook(
        tmp_path,
        t.alias,
        t.root,
        "doomed",
        lines=200,
        seconds=90,
        wipe="manual",
        # launch comes ~2.5 s after the dead-man is scheduled (before the sync) on an idle
        # machine; at load 8 it came past 12 s and the sleeper wiped the run before its
        # launch ("the run never reached launch"): 30 s leaves the laptop time to go first
        # (asserted below)
        wipe_deadline="30s",
    )
    orchestrator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "remotemac",
            "--ssh-config",
            str(t.ssh_config),
            "run",
            str(book),
            "--out",
            str(tmp_path / "out"),
            "--json",
        ],
        env=dict(os.environ, **t.env()),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    runs = t.root / "runs"

    def launched() -> bool:
        ids = [p.name for p in runs.iterdir()] if runs.is_dir() else []
        return (
            bool(ids) and (Path("/dev/shm") / f"remotemac-{ids[0]}").is_dir() and bool(t.sessions())
        )

    try:
        assert _wait(launched, 60), "the run never reached launch"
    finally:
        orchestrator.send_signal(signal.SIGKILL)
        orchestrator.wait()
    t.sshd.stop(kill_sessions=True)  # the laptop and its connection are gone
    [run_id] = [p.name for p in runs.iterdir()]
    run_dir = runs / run_id
    shm = Path("/dev/shm") / f"remotemac-{run_id}"
    assert (run_dir / "data").exists() and shm.exists(), "fired before the laptop left"
    result = t.root / "deadman" / f"{run_id}.result.json"
    assert _wait(result.exists, 90), "the dead-man wipe did not fire"
    report = json.loads(result.read_text())
    assert report["fired_at"] >= report["deadline"]
    for sub in ("data", "tmp", "cache", "out"):
        assert not (run_dir / sub).exists(), sub
    assert not shm.exists()
    assert t.sessions() == []
    assert _wait(lambda: deadman_pids(str(t.root)) == [], 10), "the sleeper should exit"
    assert report["verified"] is True
    inventory = json.loads((t.root / "inventory.json").read_text())
    [item] = [i for i in inventory["items"] if i["kind"] == "deadman"]
    assert item["method"] == "sleeper" and item["pid"] > 1


SHIM = textwrap.dedent('''\
    #!{python}
    """launchctl shim: logs its argv, keeps "loaded" labels in a state file, runs a
    RunAtLoad job detached like launchd would, and prints `launchctl list` as the
    recorded El Capitan sample plus the labels it loaded."""
    import json, os, plistlib, subprocess, sys
    state = os.environ["SHIM_STATE"]
    loaded = json.load(open(state)) if os.path.exists(state) else {{}}
    with open(os.environ["SHIM_LOG"], "a") as fh:
        fh.write(" ".join(sys.argv[1:]) + "\\n")
    cmd = sys.argv[1]
    if cmd == "bootstrap":
        if sys.argv[2].startswith("gui/") and os.environ.get("SHIM_NO_GUI"):
            sys.stderr.write("Bootstrap failed: 125: Domain does not support specified action\\n")
            sys.exit(125)
        if sys.argv[2].startswith("user/") and os.environ.get("SHIM_NO_USER"):
            sys.stderr.write("Bootstrap failed: 5: Input/output error\\n")
            sys.exit(5)
        with open(sys.argv[3], "rb") as fh:
            job = plistlib.load(fh)
        loaded[job["Label"]] = sys.argv[2]
        if job.get("RunAtLoad"):
            subprocess.Popen(job["ProgramArguments"], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    elif cmd in ("load", "unload"):  # legacy: prints a failure, exits 0 (macos-facts)
        sys.stderr.write("%s: Load failed: 5: Input/output error\\n" % sys.argv[-1])
    elif cmd == "print":
        domain, _, label = sys.argv[2].rpartition("/")
        if loaded.get(label) != domain:
            sys.exit(113)
        sys.stdout.write("%s = {{\\n}}\\n" % sys.argv[2])
    elif cmd == "bootout":
        label = sys.argv[2].split("/", 2)[-1]
        if loaded.pop(label, None) is None:
            sys.exit(3)
    elif cmd == "list":
        sys.stdout.write(open(os.environ["SHIM_SAMPLE"]).read())
        for label in loaded:
            sys.stdout.write("-\\t0\\t%s\\n" % label)
    json.dump(loaded, open(state, "w"))
''')


@pytest.fixture
def launchd_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Simulation: a shim ``launchctl`` on PATH and a private HOME."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "launchctl"
    shim.write_text(SHIM.format(python=sys.executable))
    shim.chmod(0o755)
    home = tmp_path / "machome"
    home.mkdir()
    log = tmp_path / "launchctl.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SHIM_LOG", str(log))
    monkeypatch.setenv("SHIM_STATE", str(tmp_path / "launchd-state.json"))
    monkeypatch.setenv("SHIM_SAMPLE", str(FIXTURES / "launchctl_list__excerpt_intel_elcapitan.txt"))
    from remotemac.agent import cleanupops, deadman

    return {"home": home, "log": log, "deadman": deadman, "cleanupops": cleanupops}


def _fake_run(root: Path, run_id: str) -> Path:
    run_dir = make_run(root, run_id, ("data", "tmp", "cache", "out", "logs", "status", "project"))
    (run_dir / "data" / "a.csv.rmenc").write_bytes(b"ciphertext")
    (run_dir / "tmp" / "plain.csv").write_bytes(b"plaintext")
    (run_dir / "out" / "result.json").write_text("{}")
    (run_dir / "logs" / "cpu.log").write_text("line\n")
    return run_dir


@pytest.mark.e2e
def test_launchd_job_fires_and_unloads_itself(tmp_path: Path, launchd_shim):
    """Simulation: the launchd path with a shim launchctl that runs RunAtLoad jobs."""
    deadman = launchd_shim["deadman"]
    root = tmp_path / "machome" / "remotemac"
    run_id = "mac-20260101-000000-abcd"
    run_dir = _fake_run(root, run_id)
    job = deadman.schedule(
        {"root": str(root), "run_id": run_id, "deadline": time.time() + 3}, platform="darwin"
    )
    assert job["method"] == "launchd" and job["domain"] == f"gui/{os.getuid()}"
    plist = Path(job["plist"])
    assert plist.parent == launchd_shim["home"] / "Library" / "LaunchAgents"
    assert plist.name == f"com.remotemac.deadman.{run_id}.plist"
    content = plistlib.loads(plist.read_bytes())
    args = content["ProgramArguments"]  # python -S -c BOOT <agent dir>/deadman.py fire …
    assert content["RunAtLoad"] is True and args[args.index(deadman.__file__) + 1] == "fire"
    result = root / "deadman" / f"{run_id}.result.json"
    assert _wait(result.exists, 30), "the launchd job did not fire"
    report = json.loads(result.read_text())
    assert report["fired_at"] >= report["deadline"]
    for sub in ("data", "tmp", "cache", "out"):
        assert not (run_dir / sub).exists(), sub
    assert (run_dir / "logs" / "cpu.log").exists()
    assert _wait(lambda: not plist.exists(), 10)
    log = launchd_shim["log"].read_text().splitlines()
    assert f"bootstrap gui/{os.getuid()} {plist}" in log
    assert _wait(
        lambda: f"bootout gui/{os.getuid()}/{content['Label']}" in launchd_shim["log"].read_text(),
        10,
    )


@pytest.mark.e2e
def test_launchd_far_deadline_then_cleanup_removes_it(
    tmp_path: Path, launchd_shim, monkeypatch: pytest.MonkeyPatch
):
    """Simulation: calendar slot, gui domain refused → user domain, cleanup boots it out."""
    deadman, cleanupops = launchd_shim["deadman"], launchd_shim["cleanupops"]
    monkeypatch.setenv("SHIM_NO_GUI", "1")
    root = tmp_path / "machome" / "remotemac"
    run_id = "mac-20260101-000000-beef"
    run_dir = _fake_run(root, run_id)
    deadline = time.time() + 2 * 86400 + 17
    job = deadman.schedule(
        {"root": str(root), "run_id": run_id, "deadline": deadline}, platform="darwin"
    )
    assert job["domain"] == f"user/{os.getuid()}"
    content = plistlib.loads(Path(job["plist"]).read_bytes())
    assert content["RunAtLoad"] is False
    slot = content["StartCalendarInterval"]
    fires = time.mktime(
        (
            time.localtime(deadline).tm_year,
            slot["Month"],
            slot["Day"],
            slot["Hour"],
            slot["Minute"],
            0,
            0,
            0,
            -1,
        )
    )
    assert deadline <= fires < deadline + 60
    # launchd waking it early (a calendar slot in another year) must not wipe
    assert deadman.fire(job["spec"]) is None
    assert (run_dir / "data" / "a.csv.rmenc").exists()
    labels = deadman.parse_launchctl_list(
        subprocess.run(["launchctl", "list"], capture_output=True, text=True).stdout
    )
    assert content["Label"] in labels and "com.apple.Finder" in labels
    answer = cleanupops.op_cleanup_host({"roots": [str(root)], "run_ids": [run_id]})
    [done] = answer["roots"]
    fates = {(i["kind"], i["path"]): i["fate"] for i in done["items"]}
    assert fates[("deadman", "launchd:" + content["Label"])] == "removed"
    assert fates[("run", str(run_dir))] == "removed"
    assert done["verified"] is True and not root.exists()
    assert not Path(job["plist"]).exists()
    assert f"bootout gui/{os.getuid()}/{content['Label']}" in launchd_shim["log"].read_text()
    labels = deadman.parse_launchctl_list(
        subprocess.run(["launchctl", "list"], capture_output=True, text=True).stdout
    )
    assert content["Label"] not in labels


def test_parse_launchctl_list_recorded_sample():
    """Simulation: `launchctl list` as a real Mac printed it (recorded sample)."""
    from remotemac.agent import deadman

    text = (FIXTURES / "launchctl_list__excerpt_intel_elcapitan.txt").read_text()
    labels = deadman.parse_launchctl_list(text)
    assert labels[0] == "com.apple.CoreAuthentication.daemon"
    assert "com.apple.Finder" in labels and "PID" not in labels and "Label" not in labels
    assert len(labels) == len(text.strip().splitlines()) - 1
    assert not [x for x in labels if x.startswith(deadman.LABEL_PREFIX)]


@pytest.mark.e2e
def test_launchd_that_exits_0_without_the_label_falls_back_to_the_sleeper(
    tmp_path: Path, launchd_shim, monkeypatch: pytest.MonkeyPatch
):
    """Simulation: over SSH gui/ is refused, user/ fails, and legacy ``load`` prints a
    failure and exits 0: ``launchctl print`` finds no label, so the sleeper guards the
    run and the job says so."""
    deadman = launchd_shim["deadman"]
    monkeypatch.setenv("SHIM_NO_GUI", "1")
    monkeypatch.setenv("SHIM_NO_USER", "1")
    root = tmp_path / "rr"
    _fake_run(root, "r1")
    job = deadman.schedule(
        {"root": str(root), "run_id": "r1", "deadline": time.time() + 3600}, platform="darwin"
    )
    try:
        assert job["method"] == "sleeper", job
        log = launchd_shim["log"].read_text()
        assert "load -w" in log and "print gui/" in log and "print user/" in log, log
    finally:
        deadman.cancel(str(root), "r1", steps=[], roots=[str(root)])


@pytest.mark.e2e
def test_launchd_armed_in_the_user_domain_is_checked_with_print(
    tmp_path: Path, launchd_shim, monkeypatch: pytest.MonkeyPatch
):
    """Simulation: gui/ refused over SSH, user/ loads: the job names the domain launchd
    holds it in, as ``launchctl print`` confirmed."""
    deadman = launchd_shim["deadman"]
    monkeypatch.setenv("SHIM_NO_GUI", "1")
    root = tmp_path / "rr"
    _fake_run(root, "r2")
    job = deadman.schedule(
        {"root": str(root), "run_id": "r2", "deadline": time.time() + 3600}, platform="darwin"
    )
    try:
        assert job["method"] == "launchd" and job["domain"] == f"user/{os.getuid()}", job
        assert job["verified"].startswith(f"launchctl print user/{os.getuid()}/"), job
    finally:
        deadman.cancel(str(root), "r2", steps=[], roots=[str(root)])
