"""Resident memory of a whole job: the sum of RSS over its process tree.

A job starts as ``/bin/sh -c 'mkdir -p … && cd src && python train.py'`` (or through
``bash run.sh``, ``torchrun``): the shell the runner started holds a megabyte or two
while the Python processes below it hold the model. So the runner samples every
process of the job — the descendants of the shell by parent pid and every process
still in the job's session (Linux) or process group (macOS: ``ps`` gives no session
id), so a grandchild whose parent exited, re-parented to init or launchd, still counts:
the runner makes the job a session leader, so both ids are its pid.

Linux reads ``/proc/<pid>/stat`` (ppid, session and RSS in one read per process);
macOS (and any BSD) runs ``ps -A -o pid=,ppid=,pgid=,rss=`` once per sample (RSS in KiB).
Standard library only, Python 3.9.
"""

from __future__ import annotations

import os
import subprocess
from typing import Dict, List, NamedTuple, Optional, Tuple

PS = "/bin/ps"

#: pid -> (ppid, session (Linux) or process group (ps) or None, rss bytes)
Table = Dict[int, Tuple[int, Optional[int], int]]


class TreeSample(NamedTuple):
    rss_bytes: int
    pids: List[int]


def linux_table(proc: str = "/proc") -> Table:
    """Every process's (ppid, session, RSS) from ``/proc/<pid>/stat``."""
    page = os.sysconf("SC_PAGE_SIZE")
    table: Table = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "stat"), "rb") as f:
                raw = f.read()
        except OSError:  # exited between listdir and open
            continue
        # comm (field 2) may hold spaces and parentheses: split after the last ')'
        fields = raw[raw.rfind(b")") + 2 :].split()
        try:  # field N of proc(5) is fields[N - 3]
            table[int(name)] = (int(fields[1]), int(fields[3]), int(fields[21]) * page)
        except (IndexError, ValueError):
            continue
    return table


def parse_ps(text: str) -> Table:
    """``ps -A -o pid=,ppid=,pgid=,rss=`` output (RSS in KiB) as a table; odd lines
    skipped. The process group takes the session's place (see the module docstring)."""
    table: Table = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue
        try:
            table[int(parts[0])] = (int(parts[1]), int(parts[2]), int(parts[3]) * 1024)
        except ValueError:
            continue
    return table


def ps_table(ps: str = PS) -> Table:
    """The process table from ``ps``; empty when ps cannot run."""
    try:
        # close_fds=False lets CPython posix_spawn on macOS instead of forking the runner
        proc = subprocess.run(
            [ps, "-A", "-o", "pid=,ppid=,pgid=,rss="],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=False,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_ps(proc.stdout.decode("ascii", "replace"))


def process_table() -> Table:
    if os.path.isdir("/proc/self"):
        return linux_table()
    return ps_table()


def tree(table: Table, root: int, session_leader: bool = False) -> List[int]:
    """``root`` and its descendants; with ``session_leader`` (the runner started ``root``
    in a new session) also every process still in that session (or, from ``ps``, its
    process group), orphans included."""
    children: Dict[int, List[int]] = {}
    for pid, (ppid, _sid, _rss) in table.items():
        children.setdefault(ppid, []).append(pid)
    found = {root} if root in table else set()
    if session_leader:
        found |= {pid for pid, (_p, sid, _r) in table.items() if sid == root}
    todo = list(found) or [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found)


def tree_rss(root: int, table: Optional[Table] = None, session_leader: bool = False) -> TreeSample:
    """Sum of RSS over ``root``'s tree; ``TreeSample(0, [])`` once everything exited."""
    table = process_table() if table is None else table
    pids = tree(table, root, session_leader)
    return TreeSample(sum(table[p][2] for p in pids if p in table), pids)
