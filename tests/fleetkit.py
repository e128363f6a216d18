"""Shared set-up for the fleet, matrix and dual-track tests (and scripts/bench_fleet.py).

A "host" here is a real OpenSSH sshd on loopback with its own remote_root and
its own tmux server (``SetEnv TMUX_TMPDIR``), so killing one host's tmux server
loses that host's jobs only, as a reboot of one rented Mac would.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
LINES_PROJECT = REPO / "tests" / "fixtures" / "projects" / "lines"
#: the interpreter the jobs run with: this one, which has torch (the harness needs it to
#: observe where tensors live; without it every record is "incomplete")
HOST_PYTHON = sys.executable


@dataclass
class FakeMac:
    alias: str
    sshd: object  # tests.harness.sshd.SSHD
    root: Path
    tmux_dir: Path

    def kill_tmux(self) -> None:
        """The host's tmux server dies with every job in it (what a reboot does)."""
        sock = self.tmux_dir / f"tmux-{_uid()}" / "default"
        subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True,
                       check=False)


def _uid() -> int:
    import os

    return os.getuid()


def start_macs(count: int, base: Path, start_sshd) -> tuple[list[FakeMac], Path]:
    """``count`` sshds (``start_sshd(**kw)`` → SSHD) and one ssh_config naming them h00…"""
    macs = []
    config = base / "ssh_config"
    empty = base / "user_known_hosts"
    empty.touch()
    for i in range(count):
        tmux_dir = base / f"h{i:02d}" / "tmux"
        tmux_dir.mkdir(parents=True, exist_ok=True)
        server = start_sshd(extra_config=[f"SetEnv TMUX_TMPDIR={tmux_dir}"])
        alias = f"h{i:02d}"
        server.write_ssh_config(config, alias, known_hosts=empty)
        macs.append(FakeMac(alias, server, base / f"h{i:02d}" / "root", tmux_dir))
    return macs, config


def trust(home: Path, macs: list[FakeMac]) -> None:
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "known_hosts", "a") as fh:
        for mac in macs:
            fh.write(mac.sshd.known_hosts_line())


def write_inventory(path: Path, macs: list[FakeMac], rate: float = 1.5) -> Path:
    hosts = {m.alias: {"remote_root": str(m.root), "hourly_rate": rate} for m in macs}
    path.write_text(yaml.safe_dump({"macs": {"hosts": hosts}}, sort_keys=False))
    return path


def write_playbook(path: Path, *, lines: int = 6, seconds: float = 0.3, **overrides) -> Path:
    data = {
        "name": path.stem,
        "remote_root": str(path.parent / "default-root"),
        "project": {"path": str(LINES_PROJECT), "exclude": ["data/"]},
        "environment": {"python": HOST_PYTHON, "venv": False},
        "workload": {
            "command": f"python3 emit.py --device {{device}} --out {{output_dir}} "
                       f"--lines {lines} --seconds {seconds} --torch",
            "reference": {"device": "cpu"},
            "target": {"device": "cpu"},
            "timeout": "5m",
        },
        "outputs": {"path": ".", "compare": [{"file": "result.json", "rtol": 1e-6}]},
        "stop_when": {"memory_growth": False},
        "cost": {"hourly_rate": 0.0},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli(*args: str, home: Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, REMOTEMAC_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "remotemac", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
