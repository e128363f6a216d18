"""Shared set-up for the fleet, matrix and dual-track tests (and scripts/bench_fleet.py).

A "host" here is a real OpenSSH sshd on loopback, logged in as the fresh-host lab's
user (tests/harness/lab.py), with its own remote_root under its session HOME and its
own tmux server (``sshd.tmux_dir``), so killing one host's tmux server loses that
host's jobs only, as a reboot of one rented Mac would.

Records are "accepted" only when the harness saw where tensors live, which needs
torch on the host: a rental has none, so tests that want accepted records pass
``python=host_torch_python`` (and say ``host_torch`` in their names).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
LINES_PROJECT = REPO / "tests" / "fixtures" / "projects" / "lines"


@dataclass
class FakeMac:
    alias: str
    sshd: object  # tests.harness.sshd.SSHD
    root: Path
    tmux_dir: Path

    def kill_tmux(self) -> None:
        """The host's tmux server dies with every job in it (what a reboot does)."""
        self.sshd.tmux("kill-server")  # type: ignore[attr-defined]


def start_macs(count: int, base: Path, start_sshd) -> tuple[list[FakeMac], Path]:
    """``count`` sshds (``start_sshd(**kw)`` → SSHD) and one ssh_config naming them h00…"""
    macs = []
    config = base / "ssh_config"
    empty = base / "user_known_hosts"
    empty.touch()
    for i in range(count):
        server = start_sshd()
        alias = f"h{i:02d}"
        server.write_ssh_config(config, alias, known_hosts=empty)
        macs.append(FakeMac(alias, server, server.home / "root", server.tmux_dir))
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


def write_playbook(
    path: Path, *, lines: int = 6, seconds: float = 0.3, python: str | None = None, **overrides
) -> Path:
    """The ``lines`` workload; with ``python`` (a host interpreter with torch) it puts a
    tensor on the device, without it the default environment runs it torch-free."""
    data = {
        "name": path.stem,
        "remote_root": "~/remotemac-default",  # each host's own HOME
        "project": {"path": str(LINES_PROJECT), "exclude": ["data/"]},
        **({"environment": {"python": python, "venv": False}} if python else {}),
        "workload": {
            "command": f"python3 emit.py --device {{device}} --out {{output_dir}} "
            f"--lines {lines} --seconds {seconds}" + (" --torch" if python else ""),
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
    return subprocess.run(
        [sys.executable, "-m", "remotemac", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
