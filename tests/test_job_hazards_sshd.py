"""What befalls a job on a real host, through the real CLI over sshd with real tmux:
unseeded noise (reproduce), a full disk, a killed tmux server (relaunch), a changed torch
(drift).

Every test runs the real ``remotemac`` CLI against a test sshd on 127.0.0.1; the host
is the fresh-host lab (tests/harness/lab.py: a bare python3, the playbook's default
``environment``) with its own tmux socket dir per sshd, so ``tmux kill-server`` only
kills the test's own server. The workloads are in tests/fixtures/projects/stress/
(standard library, a few seconds each).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from remotemac.acceptance.record import validate_record
from tests.conftest import REPO, remotemac
from tests.harness.maclab import root_argv

pytestmark = pytest.mark.timeout(150)

PROJECT = REPO / "tests" / "fixtures" / "projects" / "stress"
MARKER = "=== remotemac: relaunched after the job was lost"


class Host:
    """A test sshd as a remotemac host, with its own tmux server."""

    def __init__(self, tmp_path: Path, sshd_factory, ssh_env, env: dict[str, str]) -> None:
        extra = ["SetEnv " + " ".join(f"{k}={v}" for k, v in env.items())] if env else []
        self.sshd = sshd_factory(extra_config=extra)
        self.home, self.cfg, self.alias = ssh_env(
            self.sshd,
            extra={"ServerAliveInterval": "1", "ServerAliveCountMax": "3", "ConnectTimeout": "5"},
        )
        self.tmp = tmp_path

    def argv(self, *args: str) -> list[str]:
        return ["--home", str(self.home), "--ssh-config", str(self.cfg), *args]

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return remotemac(*self.argv(*args), timeout=timeout)

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "remotemac", *self.argv(*args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def tmux(self, *args: str) -> subprocess.CompletedProcess:
        return self.sshd.tmux(*args)

    def root(self, name: str) -> Path:
        """A remote_root the host's user can write (under its session HOME)."""
        return self.sshd.home / name

    def playbook(self, name: str, root: Path, command: str, **extra) -> Path:
        data = {
            "name": name,
            "host": self.alias,
            "remote_root": str(root),
            "project": {"path": str(PROJECT)},
            "workload": {
                "command": command,
                "reference": None,
                "target": {"device": "cpu"},
                "timeout": "5m",
            },
            "outputs": {
                "path": ".",
                "compare": [{"file": "result.json", "rtol": 1e-6, "atol": 1e-9}],
            },
            "stop_when": {"memory_growth": False},
            "wipe": "manual",
        }
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def close(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def host_factory(tmp_path: Path, sshd_factory, ssh_env):
    made: list[Host] = []

    def make(**env: str) -> Host:
        host = Host(tmp_path, sshd_factory, ssh_env, env)
        made.append(host)
        return host

    yield make
    for host in made:
        host.close()


def record_of(out: Path) -> dict:
    record = json.loads((out / "acceptance.json").read_text())
    assert validate_record(record) == []
    return record


def row(record: dict, word: str) -> dict:
    return next(r for r in record["process_behaviour"] if word in r["question"])


def newest_run(home: Path) -> str:
    import sqlite3

    db = sqlite3.connect(home / "journal.sqlite3")
    try:
        return db.execute("select run_id from runs order by created_at desc limit 1").fetchone()[0]
    finally:
        db.close()


# ---------------------------------------------------------------------- reproduce


def test_reproduce_catches_unseeded_noise_and_passes_a_deterministic_target(
    host_factory, tmp_path: Path
):
    """reproduce: the target twice in fresh processes; noise → not-reproducible, else ok."""
    host = host_factory()
    # ``exec``: the stdlib workload never imports torch (the observer stays inert: faster)
    command = "exec python3 noise.py --device {device} --out {output_dir} --mode %s"
    ref = {"workload": {"reference": {"device": "cpu"}}}
    noisy = host.playbook("noisy", host.root("root-n"), command % "noisy", reproduce=True, **ref)
    steady = host.playbook("steady", host.root("root-d"), command % "deterministic", **ref)

    done = host.cli("run", str(noisy), "--out", str(tmp_path / "out-n"))
    assert done.returncode == 1, done.stderr
    record = record_of(tmp_path / "out-n")
    again = record["observations"]["reproducibility"]
    assert again["reproduces"] is False and again["first"] == "cpu-target"
    assert again["second"] == "cpu-target-reproduce"
    assert [f["path"] for f in again["files"]] == ["result.json"]
    codes = [c["code"] for c in record["stopping_conditions"]]
    assert "not-reproducible" in codes
    answer = row(record, "reproduce")
    assert answer["outcome"] == "problem" and "does not reproduce" in answer["result"]
    # two distinct processes wrote two distinct outputs, each pulled and verified
    first = json.loads((tmp_path / "out-n/results/cpu-target/result.json").read_text())
    second = json.loads((tmp_path / "out-n/results/cpu-target-reproduce/result.json").read_text())
    assert first != second
    assert "Process behaviour" in (tmp_path / "out-n" / "acceptance.md").read_text()

    done = host.cli("run", str(steady), "--out", str(tmp_path / "out-d"), "--reproduce")
    record = record_of(tmp_path / "out-d")
    assert done.returncode in (0, 1), done.stderr  # no torch: tensors not observed
    assert not any(c["code"] == "not-reproducible" for c in record["stopping_conditions"])
    assert record["observations"]["reproducibility"]["reproduces"] is True
    assert record["observations"]["results"]["within_tolerance"] is True  # CPU vs target
    answer = row(record, "reproduce")
    assert answer["outcome"] == "ok" and answer["result"].startswith("reproduces: 1 of 1")
    assert record["reproduce"].endswith("--reproduce")
    assert {c["env"] for c in record["caches"]} >= {
        "TORCH_HOME",
        "HF_HOME",
        "PIP_CACHE_DIR",
        "XDG_CACHE_HOME",
    }
    assert all(c["writable"] is True for c in record["caches"])


# ---------------------------------------------------------------------- full disk


@pytest.fixture
def small_volume(sshd_factory):
    """``small_volume(host)``: a 64 MiB tmpfs the host's user owns, beside its home
    (mounted as root, or through ``sudo -n`` as a normal user: maclab.root_argv; the
    test says so when it cannot). Unmounted before the host's dirs are removed."""
    mounted: list[Path] = []

    def mount(host: Host) -> Path:
        vol = host.sshd.host_dir("vol")
        uid, gid = vol.stat().st_uid, vol.stat().st_gid
        res = subprocess.run(
            root_argv(
                ["mount", "-t", "tmpfs", "-o", f"size=64m,uid={uid},gid={gid},mode=0700"]
                + ["tmpfs", str(vol)]
            ),
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            pytest.fail(
                f"cannot mount a 64 MiB tmpfs here ({res.stderr.strip()}); "
                "the storage-limit stop is still covered by test_job_guards.py"
            )
        mounted.append(vol)
        return vol

    yield mount
    for vol in mounted:
        subprocess.run(root_argv(["umount", "-l", str(vol)]), capture_output=True)


def test_full_disk_stops_with_storage_limit_and_keeps_the_run(
    host_factory, small_volume, tmp_path: Path
):
    """remote_root on a 64 MiB tmpfs; a workload that writes until full is stopped in time."""
    host = host_factory()
    vol = small_volume(host)
    root = vol / "root"
    # first, provision refuses a run whose margin cannot fit at all: one line, nothing sent
    greedy = host.playbook(
        "greedy",
        root,
        "exec python3 fill.py --out {output_dir}",
        stop_when={"min_free_disk": "100MiB"},
    )
    refused = host.cli("run", str(greedy), "--out", str(tmp_path / "out-g"))
    assert refused.returncode == 6, refused.stderr  # host environment (issue 31 item 9)
    lines = [ln for ln in refused.stderr.splitlines() if "not enough disk" in ln]
    assert len(lines) == 1 and "min_free_disk 100.0 MiB" in lines[0], refused.stderr
    assert "remote_root" in lines[0]

    pb = host.playbook(
        "fill",
        root,
        "exec python3 fill.py --out {output_dir} --sleep 0.1",
        stop_when={"min_free_disk": "16MiB"},
    )
    out = tmp_path / "out"
    done = host.cli("run", str(pb), "--out", str(out), "--json", timeout=140)
    assert done.returncode == 1, done.stderr
    run_id = newest_run(host.home)
    status = json.loads((root / "runs" / run_id / "status" / "cpu.json").read_text())
    assert status["state"] == "storage-limit" and "min_free_disk 16.0 MiB" in status["reason"]
    disk = status["disk"]["root"]
    assert disk["total"] == 64 << 20
    # stopped before the volume was full: never below 8 MiB free, and the job did write
    assert disk["min_free_seen"] > 8 << 20, disk
    free_now = shutil.disk_usage(vol).free
    assert free_now > 8 << 20
    log = (out / "logs" / "cpu.log").read_text().splitlines()
    written = [ln for ln in log if ln.startswith("fill: ") and ln.endswith("MiB written")]
    assert len(written) >= 20, log[-5:]
    assert any(ln.startswith("remotemac: only") and "stopping the workload" in ln for ln in log)
    assert "fill: SIGTERM" in log[-1] and not any("No space" in ln for ln in log)
    # logs, status and record intact: the local log is the host's log, byte for byte
    assert (out / "logs" / "cpu.log").read_bytes() == (
        root / "runs" / run_id / "logs" / "cpu.log"
    ).read_bytes()
    record = record_of(out)
    cond = [c for c in record["stopping_conditions"] if c["code"] == "storage-limit"]
    assert cond and "before the volume was full" in cond[0]["detail"]
    assert not any(c["code"] == "workload-failed" for c in record["stopping_conditions"])
    answer = row(record, "disk")
    assert answer["outcome"] == "problem" and "storage-limit" in answer["result"]
    events = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert any(e["event"] == "warning" and e.get("code") == "low-disk" for e in events)
    assert (out / "results" / "cpu" / "filler.bin").stat().st_size >= 20 << 20


# ---------------------------------------------------------------------- lost job


def test_killed_tmux_server_relaunches_through_resume_command(host_factory, tmp_path: Path):
    """on_lost: relaunch; kill the test's tmux server mid-job → resumed, finished, one marker."""
    host = host_factory(REMOTEMAC_HEARTBEAT_STALE_S="3")
    pb = host.playbook(
        "resume",
        host.root("root"),
        "exec python3 steps.py --out {output_dir} --steps 60 --sleep 0.1",
        on_lost="relaunch",
        workload={
            "resume_command": "exec python3 steps.py --out {output_dir} --steps 60 "
            "--sleep 0.02 --resume"
        },
    )
    out = tmp_path / "out"
    proc = host.popen("run", str(pb), "--out", str(out), "--json")
    log = out / "logs" / "cpu.log"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().count("step ") >= 10:
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    assert host.tmux("kill-server").returncode == 0
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode in (0, 1), stderr  # not 4: the job was not given up
    text = log.read_text()
    assert text.count(MARKER) == 1, text
    marker_line = next(ln for ln in text.splitlines() if ln.startswith(MARKER))
    assert "tmux session was killed" in marker_line
    after = text.split(MARKER, 1)[1]
    assert "steps: resuming from step " in after and "steps: done, total 1830" in after
    result = json.loads((out / "results" / "cpu" / "result.json").read_text())
    assert result == {"steps": 60, "total": 1830}  # sum(1..60): no step lost or repeated
    record = record_of(out)
    assert not any(
        c["code"] in ("job-lost", "workload-failed") for c in record["stopping_conditions"]
    )
    answer = row(record, "lost")
    assert answer["outcome"] == "ok" and "relaunched" in answer["result"]
    assert "resume_command" in answer["how_tested"] and MARKER in answer["evidence"]
    events = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    assert sum(1 for e in events if e.get("code") == "relaunched") == 1
    run_id = newest_run(host.home)
    status = json.loads((host.root("root") / "runs" / run_id / "status" / "cpu.json").read_text())
    assert status["state"] == "finished" and status["relaunched"]["previous"]["hangup"]


# ---------------------------------------------------------------------- drift


def test_torch_changed_between_launch_and_attach_is_environment_drift(host_factory, tmp_path: Path):
    """Simulation of a package update: a newer torch (and another package) appear in the venv
    (the default one, from the host's bare python3) between `run --detach` and `attach`:
    torch → environment-drift, the other → a warning."""
    host = host_factory()
    root = host.root("root")
    pb = host.playbook(
        "drift", root, "exec python3 steps.py --out {output_dir} --steps 20 --sleep 0.1"
    )
    out = tmp_path / "out"
    launched = host.cli("run", str(pb), "--out", str(out), "--detach")
    assert launched.returncode == 0, launched.stderr
    run_id = newest_run(host.home)
    site = next((root / "envs").glob("*/lib/python*/site-packages"))
    fake = site / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "2.14.0"\n')
    for name, version in (("torch", "2.14.0"), ("fakepkg", "1.0")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    done = host.cli("attach", run_id, "--json")
    assert done.returncode == 1, done.stderr
    record = record_of(out)
    drift = [c for c in record["stopping_conditions"] if c["code"] == "environment-drift"]
    assert drift and "re-attach" in drift[0]["detail"] and "2.14.0" in drift[0]["detail"]
    warnings = record["environment"]["drift"]["warnings"]
    pkg = next(w for w in warnings if w["key"] == "lock_hash")
    assert {p["name"] for p in pkg["packages"]} == {"torch", "fakepkg"}
    assert record["environment"]["drift"]["checks"][0]["when"] == "re-attach"
    answer = row(record, "drift")
    assert answer["outcome"] == "problem" and "torch changed" in answer["result"]
    events = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert any(e.get("code") == "environment-drift" for e in events)
    assert (out / "env" / "drift.jsonl").exists()
