"""Helpers every agent module shares: processes, tmux, atomic JSON writes, the package probe.

Why one module: these were copied around the agent (seven atomic JSON writes, two
package probes that disagreed on which copy of a package wins), and the wipe,
cleanup and dead-man modules imported each other, and ``hostagent``, for them.
This module imports no sibling but ``procid`` and ``protocol``, so anything may import it.

Python 3.9, standard library only. Not imported by the code that runs inside the
workload's process (harness.py, optrace.py): those keep the agent directory off the
workload's ``sys.path``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from . import procid
from .protocol import JsonObject

SESSION_PREFIX = "remotemac-"
KILL_GRACE_S = 3.0
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


# ------------------------------------------------------------------ messages


def format_mib(n: float) -> str:
    """Bytes as the agent's messages write them: ``512.0 MiB``."""
    return "%.1f MiB" % (n / 1048576.0)


# ------------------------------------------------------------------ files


def write_json_atomic(
    path: str,
    data: Any,
    *,
    indent: Optional[int] = None,
    sort_keys: bool = False,
    newline: bool = False,
    fsync: bool = True,
) -> None:
    """Write JSON to ``path`` through a fresh tmp file (O_EXCL, O_NOFOLLOW) and a rename.

    A reader never sees half a file. The tmp name is guessable
    (``<path>.tmp-<pid>-<thread>``, unique per thread: the resident agent writes from
    several) and the workload can write in status/: a link planted there is
    removed, never written through.
    """
    text = json.dumps(data, indent=indent, sort_keys=sort_keys) + ("\n" if newline else "")
    tmp = "%s.tmp-%d-%d" % (path, os.getpid(), threading.get_ident())
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode())
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


# ------------------------------------------------------------------ packages

#: Python source run by the *workload's* interpreter (``python -c``): defines
#: ``installed_packages()``, {normalized name: version} of every distribution on
#: ``sys.path``. When two copies of a package are on the path the first wins, as
#: it does for ``import``: the environment record (envfreeze) and the drift check
#: (guards) must report the version the job really imports.
PACKAGES_PROBE = r"""
def installed_packages():
    from importlib import metadata
    pkgs = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name and name not in pkgs:  # the first on sys.path is the one imported
            pkgs[name] = dist.version
    return dict(sorted(pkgs.items()))
"""


# ------------------------------------------------------------------ processes and tmux


def pid_alive(pid: Any) -> bool:
    """Is ``pid`` a live process (never true for 0, 1 or a non-integer)? A zombie (exited,
    not reaped yet: a SIGKILLed session's receiver for ~2 s) is not: ``kill(pid, 0)``
    succeeds on it, so the state is read too (/proc on Linux, ``ps -o stat=`` on macOS)."""
    if not isinstance(pid, int) or pid <= 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not procid.is_zombie(pid)


def find_tool(name: str) -> Optional[str]:
    """``name`` on PATH, else in Homebrew's prefixes (an ssh login's PATH often lacks them)."""
    found = shutil.which(name)
    if found:
        return found
    for prefix in ("/opt/homebrew/bin", "/usr/local/bin"):
        candidate = os.path.join(prefix, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def tmux_path() -> Optional[str]:
    return find_tool("tmux")


def run_cmd(
    argv: List[str], steps: Optional[List[JsonObject]] = None, timeout: float = 60
) -> Tuple[int, str, str]:
    """Run a command without a shell; record it in ``steps`` for the ledger."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        code, out, err = (
            proc.returncode,
            proc.stdout.decode("utf-8", "replace"),
            proc.stderr.decode("utf-8", "replace"),
        )
    except FileNotFoundError:
        code, out, err = 127, "", "%s: command not found" % argv[0]
    except subprocess.TimeoutExpired:
        code, out, err = 124, "", "%s: timed out" % argv[0]
    if steps is not None:
        steps.append({"argv": list(argv), "code": code, "time": time.time()})
    return code, out, err


def tmux_sessions() -> List[Dict[str, str]]:
    """Every live ``remotemac-*`` session with the command its first pane started."""
    tmux = tmux_path()
    if not tmux:
        return []
    code, out, _ = run_cmd(
        [tmux, "list-panes", "-a", "-F", "#{session_name}\t#{pane_start_command}"]
    )
    if code != 0:
        return []
    seen: Dict[str, str] = {}
    for line in out.splitlines():
        name, _tab, command = line.partition("\t")
        if name.startswith(SESSION_PREFIX) and name not in seen:
            seen[name] = command
    return [{"name": n, "command": c} for n, c in sorted(seen.items())]


def kill_session(name: str, steps: List[JsonObject]) -> bool:
    tmux = tmux_path()
    if not tmux:
        return False
    run_cmd([tmux, "kill-session", "-t", "=" + name], steps)
    code, _, _ = run_cmd([tmux, "has-session", "-t", "=" + name])
    return code != 0


def cmdline(pid: int) -> str:
    """A process's command line ('' when gone): /proc on Linux, ps elsewhere."""
    return procid.cmdline(pid)


def all_processes() -> List[Tuple[int, str]]:
    """(pid, command line) of every process this user can see."""
    found: List[Tuple[int, str]] = []
    if os.path.isdir("/proc/self"):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                line = cmdline(int(entry))
                if line:
                    found.append((int(entry), line))
        return found
    code, out, _ = run_cmd(["ps", "-axo", "pid=,command="])
    for line in out.splitlines() if code == 0 else []:
        head, _sp, rest = line.strip().partition(" ")
        if head.isdigit():
            found.append((int(head), rest.strip()))
    return found


def terminate(
    pid: int,
    steps: List[JsonObject],
    group: bool = True,
    start: Optional[JsonObject] = None,
) -> bool:
    """SIGTERM (the group when ``pid`` leads one), then SIGKILL after a grace.

    With ``start`` (procid.identity recorded earlier) no signal is sent once the
    pid stopped being that process: the SIGKILL cannot hit a reused pid.
    """

    def send(sig: int) -> None:
        if start is not None and not procid.same_start(pid, start):
            return
        try:
            if group and os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except OSError:
            pass

    steps.append({"argv": ["kill", "-TERM", str(pid)], "code": 0, "time": time.time()})
    send(signal.SIGTERM)
    deadline = time.time() + KILL_GRACE_S
    while time.time() < deadline and _still(pid, start):
        _reap(pid)
        time.sleep(0.05)
    if _still(pid, start):
        steps.append({"argv": ["kill", "-KILL", str(pid)], "code": 0, "time": time.time()})
        send(signal.SIGKILL)
        time.sleep(0.1)
        _reap(pid)
    return not _still(pid, start)


def _still(pid: int, start: Optional[JsonObject]) -> bool:
    if not pid_alive(pid):
        return False
    _reap(pid)
    if not pid_alive(pid):
        return False
    return start is None or procid.same_start(pid, start)


def _reap(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.waitpid(pid, os.WNOHANG)


def cpu_seconds() -> float:
    """This process's CPU and its waited-for children's (the run's host-side CPU figure)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime, 4)
