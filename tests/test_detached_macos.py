"""Simulation: the macOS-only parts of detached jobs (caffeinate, the Homebrew tmux offer).

Simulation: these run on Linux with ``sys.platform`` set to ``"darwin"`` in the
agent's own process and shims on PATH standing in for ``caffeinate`` and ``brew``
(neither prints anything a test could record: caffeinate execs its command, and
only brew's presence matters).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remotemac.agent import hostagent, runner

AGENT = Path(hostagent.__file__).resolve().parent

pytestmark = pytest.mark.timeout(60)


def _shim(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _as_darwin(code: str, *, path: str, stdin: str = "") -> subprocess.CompletedProcess:
    """Run agent code in a fresh interpreter that believes it is on macOS."""
    prog = (
        f"import sys; sys.platform = 'darwin'; sys.path.insert(0, {str(AGENT.parent.parent)!r})\n"
        + code
    )
    env = dict(os.environ, PATH=path)
    env.pop("TMUX", None)
    return subprocess.run(
        [sys.executable, "-c", prog],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


CAFFEINATE = (
    "# models caffeinate(8) -w PID: holds the assertion until PID exits (macos-facts)\n"
    'printf "%s\\n" "$@" > "$CAFF_LOG"\n'
    '[ "$1" = -i ] && [ "$2" = -w ] || exit 64\n'
    'while kill -0 "$3" 2>/dev/null; do sleep 0.05; done\n'
    'echo ended >> "$CAFF_LOG"\n'
)


def _run_as_darwin(tmp_path: Path, command: str) -> tuple[dict, list[str]]:
    shims = tmp_path / "shims"
    _shim(shims, "caffeinate", CAFFEINATE)
    for sub in ("logs", "status"):
        (tmp_path / sub).mkdir(exist_ok=True)
    spec = {
        "command": command,
        "device": "mps",
        "status_path": str(tmp_path / "status" / "mps.json"),
        "log_path": str(tmp_path / "logs" / "mps.log"),
        "mode": "daemon",
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    log = tmp_path / "caffeinate.argv"
    prog = f"import os; os.environ['CAFF_LOG'] = {str(log)!r}; from remotemac.agent import runner\n"
    res = _as_darwin(
        prog + f"sys.exit(runner.run({str(spec_path)!r}))", path=f"{shims}:/usr/bin:/bin"
    )
    assert res.returncode == 0, res.stderr
    status = json.loads((tmp_path / "status" / "mps.json").read_text())
    return status, log.read_text().splitlines()


def test_caffeinate_watches_the_job_by_pid_and_its_exit_5_is_recorded_as_5(tmp_path: Path):
    """Simulation: on darwin the runner starts the job itself and ``caffeinate -i -w PID``
    beside it (the real tool forks when given a command): the job's process tree and its
    exit code 5 are its own, and caffeinate ends with the job."""
    status, caff = _run_as_darwin(tmp_path, "echo hello from the workload; exit 5")
    assert caff == ["-i", "-w", str(status["child_pid"]), "ended"], caff
    assert status["child_argv"] == ["/bin/sh", "-c", "echo hello from the workload; exit 5"]
    assert (tmp_path / "logs" / "mps.log").read_text() == "hello from the workload\n"
    assert status["state"] == "failed" and status["exit_code"] == 5


def test_a_job_killed_by_a_signal_under_caffeinate_is_recorded_as_killed(tmp_path: Path):
    """Simulation: a death by SIGKILL comes through as the signal (exit_code -9), not as
    an exit status a wrapper made up."""
    status, caff = _run_as_darwin(tmp_path, "kill -9 $$")
    assert status["state"] == "failed" and status["exit_code"] == -9, status
    assert caff[-1] == "ended", caff


def test_build_argv_only_adds_caffeinate_on_macos(tmp_path: Path, monkeypatch):
    """Simulation: `caffeinate -i -w PID` on darwin (when present), never on Linux, off by
    request; the job's own argv is the same everywhere."""
    shims = tmp_path / "shims"
    caffeinate = _shim(shims, "caffeinate", "exit 0\n")
    monkeypatch.setenv("PATH", f"{shims}:/usr/bin:/bin")
    spec = runner.JobSpec.from_json({"command": "python3 train.py"})
    assert runner.build_argv(spec, "darwin") == ["/bin/sh", "-c", "python3 train.py"]
    assert runner.caffeinate_argv(spec, 42, "darwin") == [str(caffeinate), "-i", "-w", "42"]
    assert runner.caffeinate_argv(spec, 42, "linux") is None
    off = runner.JobSpec.from_json({"command": "python3 train.py", "caffeinate": False})
    assert runner.caffeinate_argv(off, 42, "darwin") is None


def _launch_request(tmp_path: Path) -> dict:
    run_dir = tmp_path / "run"
    for sub in ("logs", "status"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    return {
        "run_dir": str(run_dir),
        "device": "cpu",
        "session": "remotemac-sim-cpu",
        "command": "echo done",
        "env": {},
        "cwd": str(tmp_path),
    }


def test_no_tmux_with_homebrew_offers_brew_install_tmux(tmp_path: Path):
    """Simulation: macOS + Homebrew + no tmux → daemon mode and the offer `brew install tmux`.

    Nothing is installed: the brew shim fails the test if it is ever run.
    """
    shims = tmp_path / "shims"
    ran = tmp_path / "brew-ran"
    _shim(shims, "brew", f"touch {ran}\nexit 1\n")
    req = _launch_request(tmp_path)
    res = _as_darwin(
        "from remotemac.agent import hostagent; sys.exit(hostagent.main(['launch']))",
        path=str(shims),
        stdin=json.dumps(req),
    )  # no tmux on PATH
    answer = json.loads(res.stdout)
    assert answer["ok"], answer
    result = answer["result"]
    assert result["mode"] == "daemon"
    assert "brew install tmux" in result["tmux_hint"] and str(shims / "brew") in result["tmux_hint"]
    assert not ran.exists(), "brew was run: remotemac must offer, never install"
    status = Path(req["run_dir"]) / "status" / "cpu.json"
    deadline = time.monotonic() + 20
    while json.loads(status.read_text()).get("state") not in ("finished", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert (Path(req["run_dir"]) / "logs" / "cpu.log").read_text() == "done\n"


def test_tmux_hint_only_on_macos_with_homebrew():
    """Simulation: no offer on Linux, none without brew, one on darwin with brew."""
    assert hostagent.tmux_install_hint("linux", "/usr/bin/brew") is None
    assert hostagent.tmux_install_hint("darwin", None) is None
    assert "brew install tmux" in hostagent.tmux_install_hint("darwin", "/opt/homebrew/bin/brew")


def test_stale_threshold_comes_from_request_env_or_default(monkeypatch):
    """The lost-job threshold is configurable (tests use seconds, not the 15 s default)."""
    monkeypatch.delenv(hostagent.ENV_STALE_S, raising=False)
    assert hostagent.stale_after_s() == hostagent.HEARTBEAT_STALE_S
    monkeypatch.setenv(hostagent.ENV_STALE_S, "3")
    assert hostagent.stale_after_s() == 3.0
    assert hostagent.stale_after_s(7) == 7.0
    monkeypatch.setenv(hostagent.ENV_STALE_S, "nonsense")
    assert hostagent.stale_after_s() == hostagent.HEARTBEAT_STALE_S
