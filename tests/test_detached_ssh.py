"""Detached jobs over the real sshd with real tmux: Ctrl-C, SIGKILL + attach, lost, daemon, drill.

Every test runs the real ``remotemac`` CLI in a subprocess against a test sshd on
127.0.0.1; the "host" is the fresh-host lab (tests/harness/lab.py: its own user with a
bare python3, the playbook's default ``environment``), with its own tmux socket dir
per sshd (``sshd.tmux_dir``) so that ``tmux kill-server`` only ever kills the test's
own server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import LINES_PROJECT, as_in_a_terminal, remotemac

pytestmark = pytest.mark.timeout(120)


def expected_lines(lines: int, device: str = "cpu") -> list[str]:
    """What ``emit.py --lines N`` (without --torch) prints, stdout and stderr interleaved."""
    out = [f"device={device} data_files=2"]
    for i in range(1, lines + 1):
        out.append(f"line {i:06d} of {lines}")
        if i % 7 == 0:
            out.append(f"stderr line {i:06d}")
    return out


@dataclass
class SSHHost:
    """A test sshd as a remotemac host: CLI flags, remote root and its tmux socket dir."""

    home: Path
    ssh_config: Path
    alias: str
    root: Path
    tmux_dir: str
    sshd: object
    proxy: object = None

    def cli(self, *args: str, **kw: object) -> subprocess.CompletedProcess:
        return remotemac(
            "--home", str(self.home), "--ssh-config", str(self.ssh_config), *args, **kw
        )  # type: ignore[arg-type]

    def popen(self, *args: str) -> subprocess.Popen:
        argv = [
            sys.executable,
            "-m",
            "remotemac",
            "--home",
            str(self.home),
            "--ssh-config",
            str(self.ssh_config),
            *args,
        ]
        return subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=as_in_a_terminal,
        )

    def tmux(self, *args: str) -> subprocess.CompletedProcess:
        """tmux on the host's own server, as the host's user."""
        return self.sshd.tmux(*args)  # type: ignore[attr-defined]

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def status(self, run_id: str, label: str = "cpu") -> dict:
        path = self.run_dir(run_id) / "status" / f"{label}.json"
        return json.loads(path.read_text()) if path.exists() else {}


def make_host(
    tmp_path: Path,
    sshd_factory: Callable,
    ssh_env: Callable,
    *,
    proxy_factory: Callable | None = None,
    env: dict[str, str] | None = None,
) -> tuple[SSHHost, object]:
    """An sshd (optionally behind a fault proxy) whose sessions see ``env``."""
    extra = ["SetEnv " + " ".join(f"{k}={v}" for k, v in env.items())] if env else []
    server = sshd_factory(extra_config=extra)
    proxy = proxy_factory(server) if proxy_factory else None
    home, cfg, alias = ssh_env(
        server,
        proxy,
        extra={"ServerAliveInterval": "1", "ServerAliveCountMax": "3", "ConnectTimeout": "5"},
    )
    root = server.home / "host-root"
    return SSHHost(home, cfg, alias, root, str(server.tmux_dir), server, proxy), proxy


def cleanup_host(host: SSHHost) -> None:
    host.tmux("kill-server")


def write_playbook(
    host: SSHHost,
    path: Path,
    *,
    lines: int,
    seconds: float,
    encrypt: bool = True,
    exit_code: int = 0,
) -> Path:
    """A target-only playbook for ``emit.py`` on the test host."""
    data = {
        "name": "detached",
        "host": host.alias,
        "remote_root": str(host.root),
        "project": {"path": str(LINES_PROJECT), "exclude": ["data/"]},
        "data": {
            "path": str(LINES_PROJECT / "data"),
            "classification": "public",
            "encrypt": encrypt,
        },
        "workload": {
            "command": f"python3 emit.py --device {{device}} --data {{data_dir}} "
            f"--out {{output_dir}} --lines {lines} --seconds {seconds} "
            f"--exit {exit_code}",
            "reference": None,
            "target": {"device": "cpu"},
            "timeout": "10m",
        },
        "outputs": {"path": "."},
        "stop_when": {"memory_growth": False},
        "wipe": "manual",
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_id_of(out: Path) -> str:
    """The run id, from the journal-independent place the CLI prints it: the ledger dir."""
    return out.name


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_lines(proc: subprocess.Popen, out: Path, count: int, timeout: float = 90) -> None:
    """Until the running CLI has followed ``count`` lines (fails early if it exited)."""

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"remotemac exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            )
        return len(local_lines(out)) >= count

    wait_for(ready, timeout, f"{count} followed lines")


def local_lines(out: Path, label: str = "cpu") -> list[str]:
    path = out / "logs" / f"{label}.log"
    return path.read_text().splitlines() if path.exists() else []


def first_run_id(home: Path) -> str:
    """The newest run in the journal (the CLI under test created it)."""
    import sqlite3

    db = sqlite3.connect(home / "journal.sqlite3")
    try:
        row = db.execute("select run_id from runs order by created_at desc limit 1").fetchone()
    finally:
        db.close()
    assert row, "no run in the journal"
    return row[0]


def pids_alive(*pids: int | None) -> bool:
    for pid in pids:
        if not pid:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
    return True


@pytest.fixture
def host_factory(tmp_path: Path, sshd_factory, ssh_env, fault_proxy) -> Iterator[Callable]:
    made: list[SSHHost] = []

    def make(*, proxy: bool = False, env: dict[str, str] | None = None) -> SSHHost:
        host, _ = make_host(
            tmp_path, sshd_factory, ssh_env, proxy_factory=fault_proxy if proxy else None, env=env
        )
        made.append(host)
        return host

    yield make
    for host in made:
        cleanup_host(host)


# ---------------------------------------------------------------------- tests


def test_ctrl_c_leaves_the_job_running_and_says_how_to_attach(host_factory, tmp_path: Path):
    """SIGINT in `run`: exit 130, `remotemac attach <id>` printed, the job keeps running."""
    host = host_factory()
    pb = write_playbook(host, tmp_path / "pb.yaml", lines=300, seconds=8)
    out = tmp_path / "out"
    proc = host.popen("run", str(pb), "--out", str(out))
    wait_lines(proc, out, 20)
    run_id = first_run_id(host.home)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert f"remotemac attach {run_id}" in stderr
    status = host.status(run_id)
    assert status["state"] == "running" and status["mode"] == "tmux"
    assert pids_alive(status["runner_pid"], status["child_pid"])
    assert host.tmux("has-session", "-t", f"=remotemac-{run_id}-cpu").returncode == 0
    # and attach finishes the run with every line exactly once
    done = host.cli("attach", run_id, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    assert local_lines(out) == expected_lines(300)
    assert host.status(run_id)["state"] == "finished"


def test_sigkill_of_run_then_attach_completes_the_log(host_factory, tmp_path: Path):
    """SIGKILL of the local `remotemac run` mid-follow, then `attach`: each line exactly once."""
    host = host_factory()
    pb = write_playbook(host, tmp_path / "pb.yaml", lines=400, seconds=8, exit_code=3)
    out = tmp_path / "out"
    proc = host.popen("run", str(pb), "--out", str(out))
    wait_lines(proc, out, 50)
    proc.kill()
    proc.wait(timeout=10)
    run_id = first_run_id(host.home)
    before = len(local_lines(out))
    time.sleep(1.0)  # the host keeps writing while nobody follows
    assert host.status(run_id)["state"] == "running"
    done = host.cli("attach", run_id, "--json", timeout=120)
    events = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert local_lines(out) == expected_lines(400), "lost or repeated lines after SIGKILL"
    assert before < len(expected_lines(400))
    # the job's own exit code is reported (the workload exits 3: a failed job)
    follow = [e for e in events if e["event"] == "phase_finished" and e["phase"] == "follow:target"]
    assert follow and "exit 3" in follow[-1]["detail"], events
    record = json.loads((out / "acceptance.json").read_text())
    assert any(
        c["code"] == "workload-failed" and "exit 3" in c["detail"]
        for c in record["stopping_conditions"]
    )


def test_killed_tmux_server_is_a_lost_job_exit_4(host_factory, tmp_path: Path):
    """`tmux kill-server` on the host mid-job: status `lost`, exit 4, `job-lost` in the record."""
    host = host_factory(env={"REMOTEMAC_HEARTBEAT_STALE_S": "3"})
    pb = write_playbook(host, tmp_path / "pb.yaml", lines=2000, seconds=60)
    out = tmp_path / "out"
    proc = host.popen("run", str(pb), "--out", str(out), "--json")
    wait_lines(proc, out, 10)
    run_id = first_run_id(host.home)
    status = host.status(run_id)
    assert host.tmux("kill-server").returncode == 0
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 4, stderr
    assert "lost" in stderr + stdout
    assert not pids_alive(status["runner_pid"]) and not pids_alive(status["child_pid"])
    record = json.loads((out / "acceptance.json").read_text())
    lost = [c for c in record["stopping_conditions"] if c["code"] == "job-lost"]
    assert lost and "tmux session was killed" in lost[0]["detail"]
    assert record["verdict"] != "accepted"


def test_without_tmux_the_daemonised_runner_survives_ssh_going_away(host_factory, tmp_path: Path):
    """No tmux (REMOTEMAC_NO_TMUX=1): double fork + setsid; sshd and all its sessions die."""
    host = host_factory(env={"REMOTEMAC_NO_TMUX": "1"})
    pb = write_playbook(host, tmp_path / "pb.yaml", lines=200, seconds=6)
    out = tmp_path / "out"
    launched = host.cli("run", str(pb), "--out", str(out), "--detach", timeout=120)
    assert launched.returncode == 0, launched.stderr
    run_id = first_run_id(host.home)
    status = host.status(run_id)
    assert status["mode"] == "daemon" and status["state"] == "running"
    assert host.tmux("has-session", "-t", f"=remotemac-{run_id}-cpu").returncode != 0
    # the runner is its own session leader's child, not in any ssh session
    assert os.getsid(status["runner_pid"]) != os.getsid(host.sshd.proc.pid)  # type: ignore[attr-defined]
    host.sshd.restart(kill_sessions=True)  # type: ignore[attr-defined]
    time.sleep(0.5)
    assert pids_alive(status["runner_pid"], status["child_pid"])
    done = host.cli("attach", run_id, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    assert local_lines(out) == expected_lines(200)
    assert host.status(run_id)["state"] == "finished"


def test_no_secret_in_argv_env_or_tmux_environment(host_factory, tmp_path: Path):
    """The encrypted dataset's key never shows in `ps`, /proc/*/environ or tmux's environment."""
    host = host_factory()
    pb = write_playbook(host, tmp_path / "pb.yaml", lines=100, seconds=6, encrypt=True)
    out = tmp_path / "out"
    launched = host.cli("run", str(pb), "--out", str(out), "--detach", timeout=120)
    assert launched.returncode == 0, launched.stderr
    run_id = first_run_id(host.home)
    key_hex = (host.home / "keys" / f"{run_id}.key").read_bytes().hex()
    assert len(key_hex) == 64
    status = host.status(run_id)
    assert pids_alive(status["runner_pid"], status["child_pid"])
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    assert "runner.py" in ps and key_hex not in ps.lower()
    checked = 0
    for pid in (status["runner_pid"], status["child_pid"], *_descendants(status["child_pid"])):
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert environ and key_hex.encode() not in environ.lower()
        if pid != status["runner_pid"]:  # the workload's env: we read the right process
            assert b"REMOTEMAC_RUN_ID=" + run_id.encode() in environ
        checked += 1
    assert checked >= 2
    for args in (
        ("show-environment", "-g"),
        ("show-environment", "-t", f"=remotemac-{run_id}-cpu"),
    ):
        shown = host.tmux(*args)
        assert shown.returncode == 0 and key_hex not in shown.stdout.lower()
    # the data really is encrypted with that key on the host (the test is about that key)
    assert any((host.run_dir(run_id) / "data").rglob("*"))
    done = host.cli("attach", run_id, timeout=120)
    assert done.returncode in (0, 1), done.stderr


def _descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent:
                found.append(int(entry.name))
                frontier.append(int(entry.name))
    return found


def test_drill_disconnect_is_recorded(host_factory, tmp_path: Path):
    """`run --drill disconnect`: the link is dropped mid-target; the record says what survived."""
    host = host_factory()
    pb = write_playbook(host, tmp_path / "pb.yaml", lines=300, seconds=5)
    out = tmp_path / "out"
    done = host.cli("run", str(pb), "--out", str(out), "--drill", "disconnect", timeout=120)
    assert done.returncode in (0, 1), done.stderr
    record = json.loads((out / "acceptance.json").read_text())
    continuity = record["continuity"]
    drill = continuity["drill"]
    assert drill["kind"] == "disconnect" and drill["dropped"] is True
    assert drill["job_kept_running"] is True and drill["log_complete"] is True
    assert 0 < drill["reconnect_s"] < 10
    assert continuity["disconnects"] >= 1 and continuity["reconnects"] >= 1
    # counted once each, not once per front end listening
    assert continuity["disconnects"] == continuity["reconnects"] == 1
    assert local_lines(out) == expected_lines(300)
    assert "disconnect" in (out / "acceptance.md").read_text()
