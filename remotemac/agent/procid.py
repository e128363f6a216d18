"""Who a process is: its command line and its start time, so a kill hits only our own.

Why: a pid in a status file outlives its process. After a reboot, or just a busy
week, the same number belongs to something else (the user's editor, another
root's job); a pid alone is never enough to send a signal. The runner records the
start time of the processes it starts; wipe and cleanup signal a pid only when the
live process has that start time and a command line remotemac recorded.

Start time: Linux reads field 22 of ``/proc/<pid>/stat`` (clock ticks since boot)
together with the boot id, so the value is unique across reboots and compared
exactly. Elsewhere (macOS) ``ps -o etime= -p PID`` gives the elapsed time
(``[[dd-]hh:]mm:ss``), turned into a start time with a one-second resolution and
compared with a tolerance of ``ETIME_SLACK_S``.

Path matches use component boundaries: ``/x/rr`` names ``/x/rr/runs/a`` but never
``/x/rr2/runs/a``. Python 3.9, standard library only.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Any, List, Optional

from .protocol import JsonObject

ETIME_SLACK_S = 2.0
_ETIME = re.compile(r"^\s*(?:(?:(\d+)-)?(\d+):)?(\d+):(\d+)\s*$")
#: characters that may stand right before or after a path inside a command line
_EDGE_BEFORE = " \t\"'=:"
_EDGE_AFTER = " \t\"'/:"


def _read(path: str) -> Optional[bytes]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return None
    finally:
        os.close(fd)


def boot_id() -> str:
    raw = _read("/proc/sys/kernel/random/boot_id")
    return raw.decode("ascii", "replace").strip() if raw else ""


def parse_etime(text: str) -> Optional[int]:
    """Seconds from ``ps -o etime`` (``43:49``, ``01:02:03``, ``2-01:02:03``)."""
    match = _ETIME.match(text or "")
    if not match:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _ps(pid: int, field: str) -> str:
    try:
        proc = subprocess.run(
            ["ps", "-o", field + "=", "-p", str(pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=20,
            env=dict(os.environ, LC_ALL="C"),
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return proc.stdout.decode("utf-8", "replace").strip() if proc.returncode == 0 else ""


def is_zombie(pid: Any) -> bool:
    """``pid`` has exited and waits for its parent to reap it: no command line, no start
    time, never signalled; to wipe and cleanup it is gone, not "left alone"."""
    if not isinstance(pid, int) or pid <= 1:
        return False
    if os.path.isdir("/proc/self"):
        raw = _read("/proc/%d/stat" % pid)
        if not raw:
            return False
        fields = raw.rsplit(b")", 1)[-1].split()
        return bool(fields) and fields[0] in (b"Z", b"X")
    return _ps(pid, "stat").startswith("Z")


@dataclass(frozen=True)
class StartIdentity:
    """When a process started: ``start`` on Linux (``linux:<boot id>:<ticks>``, exact),
    ``start_s`` elsewhere (epoch seconds from ``ps`` etime, within ETIME_SLACK_S)."""

    start: Optional[str] = None
    start_s: Any = None

    def to_json(self) -> JsonObject:
        return {"start": self.start} if self.start is not None else {"start_s": self.start_s}

    @classmethod
    def from_json(cls, data: Any) -> Optional["StartIdentity"]:
        """A recorded identity (a status file's); None when it is not one."""
        if not isinstance(data, dict):
            return None
        return cls(start=data.get("start"), start_s=data.get("start_s"))


def start_identity(pid: Any) -> Optional[StartIdentity]:
    """The start identity of a live ``pid`` (None when it is gone or not a pid)."""
    if not isinstance(pid, int) or pid <= 1:
        return None
    if os.path.isdir("/proc/self"):
        raw = _read("/proc/%d/stat" % pid)
        if not raw:
            return None
        fields = raw[raw.rfind(b")") + 2 :].split()
        if len(fields) < 20:
            return None
        return StartIdentity(
            start="linux:%s:%s" % (boot_id(), fields[19].decode("ascii", "replace"))
        )
    elapsed = parse_etime(_ps(pid, "etime"))
    if elapsed is None:
        return None
    return StartIdentity(start_s=time.time() - elapsed)


def identity(pid: Any) -> Optional[JsonObject]:
    """:func:`start_identity` as a status file records it."""
    found = start_identity(pid)
    return None if found is None else found.to_json()


def same_start(pid: Any, recorded: Any) -> bool:
    """Does the live ``pid`` have the start identity recorded when remotemac started it?"""
    then = StartIdentity.from_json(recorded)
    now = start_identity(pid) if then is not None else None
    if then is None or now is None:
        return False
    if then.start is not None or now.start is not None:
        return bool(then.start) and then.start == now.start
    try:
        return abs(float(then.start_s) - float(now.start_s)) <= ETIME_SLACK_S
    except (TypeError, ValueError):
        return False


def started_since(pid: Any, recorded: Any) -> bool:
    """Did the live ``pid`` start at or after the start identity ``recorded`` (a runner's)?
    A process that names a run's directory and started after its runner is the job's
    (a daemon it left in a new session), not one that was there before."""
    now = start_identity(pid)
    then = StartIdentity.from_json(recorded)
    if now is None or then is None:
        return False
    if then.start is not None and now.start is not None:
        mine, theirs = str(then.start).split(":"), str(now.start).split(":")
        if len(mine) != 3 or len(theirs) != 3 or mine[:2] != theirs[:2]:
            return False  # another boot, another kind of host
        try:
            return int(theirs[2]) >= int(mine[2])
        except ValueError:
            return False
    try:
        return float(now.start_s) >= float(then.start_s) - ETIME_SLACK_S
    except (TypeError, ValueError):
        return False


def argv_of(pid: Any) -> List[str]:
    """The command line as a list ([] when gone): /proc on Linux, ``ps`` elsewhere
    (``ps`` loses the argument boundaries; words are split on blanks)."""
    if not isinstance(pid, int) or pid <= 1:
        return []
    if os.path.isdir("/proc/self"):
        raw = _read("/proc/%d/cmdline" % pid)
        if not raw:
            return []
        return [a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0")]
    return _ps(pid, "command").split()


def cmdline(pid: Any) -> str:
    return " ".join(argv_of(pid))


def names_path(text: str, path: str) -> bool:
    """``text`` (a command line) mentions ``path`` or something below it, on a
    component boundary: ``/x/rr`` matches ``/x/rr`` and ``/x/rr/a`` but not ``/x/rr2``."""
    path = path.rstrip("/")
    if not path or not text:
        return False
    start = 0
    while True:
        at = text.find(path, start)
        if at < 0:
            return False
        end = at + len(path)
        before_ok = at == 0 or text[at - 1] in _EDGE_BEFORE
        after_ok = end == len(text) or text[end] in _EDGE_AFTER
        if before_ok and after_ok:
            return True
        start = at + 1


def is_below(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it, by whole components."""
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root if root == "/" else root + "/")
