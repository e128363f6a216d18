"""Processes on this machine (the laptop): is the run that holds a lock still alive?

Why not the agent's ``pid_alive``: the agent is shipped to the host and imported on
the laptop only for what both sides share (the protocol, the stream crypto); the
journal asks about processes here, so it has its own, the same check.
"""

from __future__ import annotations

import os
import subprocess


def pid_alive(pid: object) -> bool:
    """Is ``pid`` a live process (never for 0, 1 or a non-integer)? A zombie (exited, not
    reaped yet) is not: ``kill(pid, 0)`` succeeds on one, so its state is read too."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[-1].split()
        except OSError:
            return False
        return bool(fields) and fields[0] in (b"Z", b"X")
    try:
        out = subprocess.run(  # stdin: never the terminal a TUI draws on
            ["ps", "-o", "stat=", "-p", str(pid)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return out.strip().startswith("Z")
