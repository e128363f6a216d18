"""The detached runner: ``python3 runner.py SPEC.json`` (inside tmux or daemonised).

It starts the workload with stdout and stderr appended to ``logs/<device>.log``
(so a reader that remembers a byte offset never misses or repeats a line), keeps
``status/<device>.json`` current with a heartbeat, enforces the timeout, and
writes the final state and exit code last — after the log is complete — so the
orchestrator can learn the end of the job even if it was away when it happened.

Standard library only, Python 3.9+.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import memsample  # sibling file: this script runs from the agent dir

HEARTBEAT_S = 2.0
KILL_GRACE_S = 10.0


def _write_status(path: str, status: dict[str, Any]) -> None:
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w") as fh:
        json.dump(status, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def build_argv(spec: dict[str, Any]) -> list[str]:
    argv = ["/bin/sh", "-c", spec["command"]]
    if sys.platform == "darwin" and spec.get("caffeinate", True) and shutil.which("caffeinate"):
        argv = ["caffeinate", "-i"] + argv
    return argv


def run(spec_path: str) -> int:
    with open(spec_path) as fh:
        spec = json.load(fh)
    status_path, log_path = spec["status_path"], spec["log_path"]
    env = dict(os.environ)
    env.update(spec.get("env", {}))
    env["PYTHONUNBUFFERED"] = "1"
    status: dict[str, Any] = {
        "state": "running",
        "device": spec["device"],
        "runner_pid": os.getpid(),
        "mode": spec.get("mode", ""),
        "started_at": time.time(),
        "heartbeat_at": time.time(),
        "command": spec["command"],
        "session": spec.get("session"),
    }
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        child = subprocess.Popen(
            build_argv(spec),
            cwd=spec.get("cwd") or None,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
        )
    except OSError as exc:
        os.write(log_fd, ("remotemac: could not start the workload: %s\n" % exc).encode())
        os.close(log_fd)
        status.update(state="failed", exit_code=127, ended_at=time.time(), reason=str(exc))
        _write_status(status_path, status)
        return 127
    status["child_pid"] = child.pid
    _write_status(status_path, status)

    stop = threading.Event()
    stopped_by: dict[str, str] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        stopped_by["reason"] = "signal %d" % signum
        _terminate(child)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closing tmux client must not kill the job

    deadline = (
        status["started_at"] + float(spec.get("timeout") or 0) if spec.get("timeout") else None
    )
    metrics_path = spec.get("metrics_path")
    peak = 0
    while not stop.is_set():
        try:
            code = child.wait(timeout=HEARTBEAT_S)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.time()
        rss = memsample.sample_rss(child.pid)
        if rss:
            peak = max(peak, rss)
            if metrics_path:
                with open(metrics_path, "a") as fh:
                    fh.write(
                        json.dumps(
                            {
                                "t": round(now - status["started_at"], 3),
                                "rss_bytes": rss,
                                "source": "runner",
                            }
                        )
                        + "\n"
                    )
        status["heartbeat_at"] = now
        status["peak_rss_bytes"] = peak
        _write_status(status_path, status)
        if deadline and now > deadline and "reason" not in stopped_by:
            stopped_by["reason"] = "timeout"
            os.write(log_fd, b"remotemac: timeout reached, stopping the workload\n")
            _terminate(child)
    os.close(log_fd)
    reason = stopped_by.get("reason")
    if reason == "timeout":
        state = "timeout"
    elif reason:
        state = "stopped"
    else:
        state = "finished" if code == 0 else "failed"
    status.update(
        state=state,
        exit_code=code,
        ended_at=time.time(),
        heartbeat_at=time.time(),
        peak_rss_bytes=peak,
    )
    if reason:
        status["reason"] = reason
    _write_status(status_path, status)
    _launch_next(spec, state)
    return 0


def _launch_next(spec: dict[str, Any], state: str) -> None:
    """Start the next device's job on the host itself, so the chain needs no laptop."""
    nxt = spec.get("next")
    if not nxt or state == "stopped":
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hostagent

    try:
        hostagent.op_launch(nxt)
    except Exception as exc:  # the orchestrator relaunches on attach
        with open(spec["status_path"] + ".next-error", "w") as fh:
            fh.write("could not start the next job: %s\n" % exc)


def _terminate(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM the workload's process group, SIGKILL after a grace period."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except OSError:
        return

    def kill_later() -> None:
        time.sleep(KILL_GRACE_S)
        if child.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(child.pid, signal.SIGKILL)

    threading.Thread(target=kill_later, daemon=True).start()


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
