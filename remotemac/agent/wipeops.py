"""Host side of wiping a run: stop its processes, destroy its RAM store, remove its data.

Why its own module: the engine's ``wipe`` and the dead-man wipe that fires on the
host when the laptop never came back run this very code (cleanupops.py, the
end-of-rental cleanup, builds on it). The safety rules:

- nothing outside the real path of ``root`` is ever touched; ``root`` itself is
  refused when it is empty, ``/``, the home directory, an ancestor of it, or a
  system directory (the same rule as the playbook's ``check_remote_root``, written
  again here with the standard library because this file runs on the host);
- ownership before destruction: a directory is removed only when it carries
  remotemac's marker (``.remotemac-owned``, see safefs.py) naming its kind, run and
  root;
- every file operation goes through safefs.py: relative to opened directories,
  ``O_NOFOLLOW``, FIFOs and devices never opened, hard-linked files never zeroed;
- everything outside ``root`` that remotemac makes (a tmux session, a /dev/shm
  dir, a RAM disk) is only touched when it can be attributed to a run of this
  ``root``; a process is signalled only when its command line and its start time
  are the ones recorded when remotemac started it (procid.py).

Python 3.9, standard library only. Imports its siblings by plain name: they sit
next to it in the agent directory, or are preloaded by the in-memory bootstrap
``cleanup`` uses so that nothing is written to the host (see engine/cleanup.py).
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from . import deadman, procid, proctree, protocol, ramstore, safefs, specscrub
from .agentutil import (
    SESSION_PREFIX,
    cmdline,
    kill_session,
    pid_alive,
    terminate,
    tmux_sessions,
)
from .deadman import Fate, Steps
from .hostagent import JobStatusFile
from .protocol import JsonObject
from .rootclaim import SYSTEM_DIRS, UnsafeRoot, check_root  # noqa: F401 (names callers use)

_HERE = os.path.dirname(os.path.abspath(globals().get("__file__") or "."))

WIPED_SUBDIRS = ("data", "tmp", "cache", "out")
KEPT_SUBDIRS = ("project", "logs", "status")
FINAL_STATES = protocol.FINAL_STATES
SHM_ROOT = "/dev/shm"
VOLUMES = "/Volumes"


@dataclass
class RamStore:
    """A run's RAM store as ramstore.py describes it: ``kind`` shm, ramdisk or tmp."""

    path: str
    kind: str = "shm"
    device: Optional[str] = None
    #: what else the laptop's description holds (size, mount facts): passed on as given
    extra: JsonObject = field(default_factory=dict, repr=False)

    def to_json(self) -> JsonObject:
        return dict(self.extra, path=self.path, kind=self.kind, device=self.device)

    @classmethod
    def from_json(cls, data: JsonObject) -> RamStore:
        known = ("path", "kind", "device")
        return cls(
            path=str(data.get("path") or ""),
            kind=str(data.get("kind")),
            device=data.get("device"),
            extra={k: v for k, v in data.items() if k not in known},
        )


# ------------------------------------------------------------------ safety


def below(real_root: str, path: str) -> Optional[str]:
    """``path`` normalised, if strictly below ``real_root`` (compared lexically: the
    removal itself walks the components with ``O_NOFOLLOW``, so a link on the way
    is refused there, not resolved here)."""
    norm = os.path.normpath(path)
    if ".." in norm.split("/") or not norm.startswith(real_root.rstrip("/") + "/"):
        return None
    return norm


def tree_size(path: str) -> Tuple[int, int]:
    """(bytes, entries) below ``path``, links counted as themselves, never followed."""
    parent, name = os.path.split(os.path.normpath(path))
    try:
        fd = safefs.open_path(parent)
    except (safefs.NotOurs, OSError):
        return 0, 0
    try:
        return safefs.tree_size_at(fd, name)
    finally:
        os.close(fd)


def open_parent(real_root: str, path: str) -> Tuple[int, str]:
    """An fd on the directory holding ``path`` (walked from the root, never through a
    link) and the last component; raises safefs.NotOurs when it leaves the root."""
    target = below(real_root, path)
    if target is None:
        raise safefs.NotOurs("outside remote_root: refused")
    parts = target[len(real_root.rstrip("/")) + 1 :].split("/")
    fd = safefs.open_path(real_root)
    try:
        for part in parts[:-1]:
            child = safefs.open_subdir(fd, part)
            os.close(fd)
            fd = child
    except safefs.NotOurs:
        os.close(fd)
        raise safefs.NotOurs("a link or a non-directory on the way: refused") from None
    return fd, parts[-1]


def remove_item(real_root: str, path: str, dry_run: bool, overwrite: bool = False) -> Fate:
    """Remove one path below the root; the fate says what happened, its size and why."""
    try:
        fd, name = open_parent(real_root, path)
    except (safefs.NotOurs, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            return Fate("not found")
        return Fate(
            "failed",
            why=str(exc)
            if isinstance(exc, safefs.NotOurs)
            else "%s: %s" % (type(exc).__name__, exc.strerror or exc),
        )
    try:
        if safefs.lstat_at(fd, name) is None:
            return Fate("not found")
        size, _count = safefs.tree_size_at(fd, name)
        if dry_run:
            return Fate("would remove", size)
        done = safefs.remove_at(fd, name, overwrite=overwrite)
    finally:
        os.close(fd)
    fate = Fate("removed", size, notes=list(done["notes"][:20]))
    if done["failed"]:
        fate.fate, fate.bytes = "failed", done["bytes"]
        fate.why = "; ".join(done["failed"][:5]) + (
            " (and %d more)" % (len(done["failed"]) - 5) if len(done["failed"]) > 5 else ""
        )
    return fate


def ownership(
    path: str, kind: str, root_marker: Optional[Dict[str, Any]], run_id: Optional[str] = None
) -> Optional[str]:
    """None when ``path`` is a directory remotemac made (its marker names ``kind``,
    the run and the root); else why it is not, for the record."""
    try:
        st = os.lstat(path)
    except OSError:
        return None  # gone: nothing to decide
    if stat.S_ISLNK(st.st_mode):
        return "not made by remotemac (a symlink; it and its target are left alone)"
    if not stat.S_ISDIR(st.st_mode):
        return "not made by remotemac (not a directory, no marker)"
    marker = safefs.marker_of(path)
    if marker is None:
        _size, count = tree_size(path)
        return "not made by remotemac (no marker; %d entries) - left alone" % max(0, count - 1)
    if marker.get("kind") != kind:
        return "marked as a %s, not a %s - left alone" % (marker.get("kind"), kind)
    if run_id and marker.get("run_id") not in (None, run_id):
        return "marked for run %s, not %s - left alone" % (marker.get("run_id"), run_id)
    root_id = (root_marker or {}).get("root_id")
    if root_id and marker.get("root_id") not in (None, root_id):
        return "marked for another remote_root - left alone"
    return None


# ------------------------------------------------------------------ processes


def session_name(run_id: str, label: str = "") -> str:
    """The tmux session name of engine/context.Side.session (prefix when no label)."""
    tail = "%s-%s" % (run_id, label) if label else run_id + "-"
    return SESSION_PREFIX + re.sub(r"[^A-Za-z0-9_-]", "_", tail)


def runner_is_ours(pid: Any, status: JobStatusFile, run_dirs: List[str]) -> Optional[str]:
    """None when ``pid`` is the runner of one of ``run_dirs``; else why it is left alone."""
    line = cmdline(pid)
    if "runner.py" not in line or not any(procid.names_path(line, d) for d in run_dirs):
        return "its command line is not this run's runner"
    if status.runner_start is not None and not procid.same_start(pid, status.runner_start):
        return "started at another time than the runner remotemac recorded"
    return None


def child_is_ours(pid: Any, status: JobStatusFile) -> Optional[str]:
    """None when ``pid`` is the workload the runner started (same start time, and a
    command line the runner recorded); else why it is left alone."""
    if status.child_start is None:
        return "no start time recorded for it"
    if not procid.same_start(pid, status.child_start):
        return "started at another time than the workload remotemac started (pid reused)"
    line = cmdline(pid)
    known = [" ".join(status.child_argv or []), status.child_cmdline or ""]
    if not line or line not in [k for k in known if k]:
        return "its command line is not the one remotemac recorded"
    return None


def stop_run_processes(
    run_dir: str,
    steps: Steps,
    left: Optional[List[str]] = None,
    run_dirs: Optional[List[str]] = None,
) -> List[str]:
    """Stop the runners (and their workloads) a run's status files name.

    A status file is read only when it is a regular file (a FIFO there never
    blocks); a pid is signalled only when procid says it is the very process
    remotemac started. What is left alone goes to ``left`` with the reason.
    """
    stopped: List[str] = []
    left = left if left is not None else []
    status_dir = os.path.join(run_dir, "status")
    try:
        fd = safefs.open_path(status_dir)
    except (safefs.NotOurs, OSError):
        return stopped
    try:
        names = safefs.names_at(fd)
        statuses = []
        for name in names:
            if not name.endswith(".json") or name.endswith(".spec.json"):
                continue
            raw = safefs.read_regular_at(fd, name, 1 << 20)
            try:
                status = json.loads(raw.decode("utf-8")) if raw else None
            except ValueError:
                status = None
            if isinstance(status, dict):
                statuses.append(JobStatusFile.from_json(status))
    finally:
        os.close(fd)
    dirs = run_dirs or [run_dir]
    for status in statuses:
        runner, child = status.runner_pid, status.child_pid
        # a runner that exited a moment ago may wait to be reaped: gone, not "left alone"
        if pid_alive(runner) and not procid.is_zombie(runner):
            why = runner_is_ours(runner, status, dirs)
            if why is None:
                terminate(runner, steps, start=status.runner_start)
                stopped.append("process:%s" % runner)
            else:
                left.append("process:%s (left alone: %s)" % (runner, why))
        if pid_alive(child) and not procid.is_zombie(child) and not status.final:
            why = child_is_ours(child, status)
            if why is None:
                try:
                    leader = os.getpgid(child) == child
                except OSError:
                    leader = False
                if leader:
                    terminate(child, steps, start=status.child_start)
                    stopped.append("process:%s" % child)
            else:
                left.append("process:%s (left alone: %s)" % (child, why))
    stopped += stop_strays(dirs, statuses, steps)
    return stopped


def own_lineage(table: proctree.Table) -> Set[int]:
    """This process and its ancestors (the agent, its shell, on ``local`` the laptop's
    remotemac): their command lines may name the root, they are never strays."""
    mine: Set[int] = set()
    pid = os.getpid()
    while pid > 1 and pid not in mine:
        mine.add(pid)
        pid = table.get(pid, (0, None, 0))[0]
    return mine


def strays_naming(paths: List[str], table: Optional[proctree.Table] = None) -> List[int]:
    """Live processes (not zombies, not tmux, not this agent's lineage) whose command
    line names one of ``paths``."""
    table = proctree.process_table() if table is None else table
    skip = own_lineage(table)
    found = []
    for pid in sorted(table):
        if pid in skip or pid <= 1:
            continue
        argv = procid.argv_of(pid)
        if not argv or os.path.basename(argv[0]).startswith("tmux"):
            continue  # a tmux server keeps its first client's argv: never a stray
        if is_remotemac_cli(argv):
            continue  # the user's own remotemac (host ``local``, a same-user lab): the driver
        line = " ".join(argv)
        if any(procid.names_path(line, p) for p in paths) and _same_user(pid):
            found.append(pid)
    return found


def is_remotemac_cli(argv: List[str]) -> bool:
    """``remotemac …`` or ``python -m remotemac …``: the laptop's command line, which
    names ``remote_root`` (``cleanup --remote-root``) when the laptop and the host are
    one machine and one user. It is the user's driver, never something a run left
    behind: stopping it would end the very cleanup or run that asked."""
    if os.path.basename(argv[0]) == "remotemac":
        return True
    return any(a == "-m" and b == "remotemac" for a, b in zip(argv, argv[1:]))


def _same_user(pid: int) -> bool:
    """A live process of this agent's user (only those could be the job's; another
    user's, e.g. the laptop's own remotemac on a shared machine, is not)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False  # gone, or another user's (EPERM)
    try:
        if os.stat("/proc/%d" % pid).st_uid != os.getuid():
            return False
    except OSError:
        pass  # no /proc (macOS): kill's permission check is the test
    return pid_alive(pid)


def stop_strays(dirs: List[str], statuses: List[JobStatusFile], steps: Steps) -> List[str]:
    """Stop what the job left running outside its process group: a daemon started in a
    new session (``setsid``, a double fork) whose argv names the run's ``out/`` dir.

    Only a process that started after the run's first runner (a recorded start
    identity) and names the run's own output dir is the job's; a runner is left to
    :func:`stop_run_processes` and its ownership checks.
    """
    starts = [s.runner_start for s in statuses if isinstance(s.runner_start, dict)]
    if not starts:
        return []  # no recorded start: no evidence that anything is the job's
    outs = [os.path.join(d, "out") for d in dirs]
    stopped = []
    for pid in strays_naming(outs):
        if "runner.py" in procid.cmdline(pid):
            continue
        if not any(procid.started_since(pid, start) for start in starts):
            continue  # there before the run: not the job's
        start = procid.identity(pid)
        if start is not None and terminate(pid, steps, start=start):
            stopped.append("process:%s" % pid)
    return stopped


# ------------------------------------------------------------------ RAM store


def find_ram_store(
    run_id: str, platform: Optional[str] = None, shm_root: str = SHM_ROOT, volumes: str = VOLUMES
) -> Optional[RamStore]:
    """The RAM store ramstore.py would have made for ``run_id``, if it is there."""
    platform = platform or sys.platform
    name = "remotemac-%s" % run_id
    if platform == "darwin":
        mount = os.path.join(volumes, name)
        if os.path.ismount(mount) or os.path.isdir(mount):
            return RamStore(mount, "ramdisk")
        return None
    path = os.path.join(shm_root, name)
    if os.path.isdir(path) and not os.path.islink(path):
        return RamStore(path, "shm")
    return None


def ram_refusal(info: RamStore, shm_root: str = SHM_ROOT, volumes: str = VOLUMES) -> Optional[str]:
    """Why a RAM store may not be destroyed (None: it is remotemac's by name and owner)."""
    path = info.path
    base = os.path.basename(path.rstrip("/"))
    kind = info.kind
    allowed = {"shm": shm_root, "ramdisk": volumes}.get(kind)
    if (
        allowed is None
        or os.path.dirname(path.rstrip("/")) != allowed
        or not base.startswith("remotemac-")
    ):
        return "not a remotemac RAM store: refused"
    if kind == "shm" and os.path.lexists(path):
        info_st = os.lstat(path)
        if not stat.S_ISDIR(info_st.st_mode) or info_st.st_uid != os.geteuid():
            return "not our own directory: refused"
    return None


def destroy_ram(
    info: RamStore, steps: Steps, shm_root: str = SHM_ROOT, volumes: str = VOLUMES
) -> Fate:
    """Destroy a RAM store, refusing anything that is not remotemac's by name and owner."""
    path = info.path
    if info.kind == "tmp":
        return Fate("removed with the run dir")
    refused = ram_refusal(info, shm_root, volumes)
    if refused:
        return Fate("failed", why=refused)
    if not os.path.lexists(path) and info.kind == "shm":
        return Fate("not found")
    size, _ = tree_size(path)
    # ramstore's answer {"removed", "steps", "error", "why"}: read here, where it arrives
    result: JsonObject = dict(ramstore.destroy_ram_store(info.to_json()))
    for step in result.get("steps") or []:
        steps.append({"argv": step.get("argv"), "code": step.get("code"), "time": time.time()})
    if result.get("removed"):
        return Fate("removed", size)
    if result.get("error"):
        return Fate("failed", why=str(result["error"]))
    return Fate("not found", why=result.get("why"))


# ------------------------------------------------------------------ one run's wipe


@dataclass
class _Tally:
    """What a wipe did, as its answer lists it (every step adds to these)."""

    steps: Steps = field(default_factory=list)
    removed: List[str] = field(default_factory=list)
    remaining: List[str] = field(default_factory=list)
    failed: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class WipeRequest:
    """The ``wipe_run_data`` request (the engine's wipe, the dead-man's fire).

    ``ram``: the run's RAM store as the sync made it (else the one found by name);
    ``keep``: the run dir's entries that stay until cleanup (default KEPT_SUBDIRS)."""

    root: str
    run_id: str
    sessions: List[str] = field(default_factory=list)
    ram: Optional[RamStore] = None
    wipe_outputs: bool = True
    keep: Optional[List[str]] = None
    cancel_deadman: bool = False

    @classmethod
    def from_json(cls, data: JsonObject) -> WipeRequest:
        ram = data.get("ram")
        return cls(
            root=data["root"],
            run_id=data["run_id"],
            sessions=list(data.get("sessions") or []),
            ram=RamStore.from_json(ram) if ram else None,
            wipe_outputs=bool(data.get("wipe_outputs", True)),
            keep=list(data["keep"]) if data.get("keep") else None,
            cancel_deadman=bool(data.get("cancel_deadman")),
        )

    def to_json(self) -> JsonObject:
        out: JsonObject = {"root": self.root, "run_id": self.run_id, "sessions": self.sessions}
        if self.ram is not None:
            out["ram"] = self.ram.to_json()
        out["wipe_outputs"] = self.wipe_outputs
        if self.keep is not None:
            out["keep"] = self.keep
        if self.cancel_deadman:
            out["cancel_deadman"] = True
        return out


@dataclass
class WipeReport:
    """What a wipe did: the ``wipe_run_data`` answer, and (with ``fired_at`` and
    ``deadline``) the dead-man's ``<run>.result.json``."""

    removed: List[str]
    remaining: List[str]
    steps: Steps
    verified: bool
    failed: List[str]
    run_dir: str
    time: float
    notes: List[str] = field(default_factory=list)
    scrubbed: List[str] = field(default_factory=list)
    #: the dead-man's wipe only: when it ran, and the deadline it ran for
    fired_at: Optional[float] = None
    deadline: Optional[float] = None

    _KEYS = ("removed", "remaining", "steps", "verified", "failed", "run_dir", "time")
    _LATER = ("notes", "scrubbed")

    def to_json(self) -> JsonObject:
        out: JsonObject = {k: getattr(self, k) for k in self._KEYS + self._LATER}
        for key in ("fired_at", "deadline"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> WipeReport:
        return cls(
            **{k: data[k] for k in cls._KEYS},
            **{k: list(data.get(k) or []) for k in cls._LATER},
            fired_at=data.get("fired_at"),
            deadline=data.get("deadline"),
        )


def wipe_run_data(req: JsonObject) -> JsonObject:
    """The ``wipe_run_data`` request in, its answer out (see :func:`wipe_run`)."""
    return wipe_run(WipeRequest.from_json(req)).to_json()


def wipe_run(req: WipeRequest) -> WipeReport:
    """Stop a run, destroy its RAM store, delete its data, tmp, cache (and outputs).

    ``wipe_outputs`` false keeps ``out`` (not pulled yet). The project, logs and
    status stay (small, and ``status``/``logs`` still answer) until ``cleanup``.
    Used by the ``wipe_run_data`` op and by the dead-man wipe on the host. The run
    dir's contents are deleted only when it carries remotemac's marker for this run.
    """
    lexical, real_root = check_root(req.root)
    run_id = req.run_id
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$", run_id):
        raise UnsafeRoot("run id %r is not valid" % run_id)
    run_dir = os.path.join(real_root, "runs", run_id)
    tally = _Tally()
    _kill_sessions(run_id, req.sessions, tally)
    not_ours = ownership(run_dir, "run", safefs.marker_of(real_root), run_id)
    scrubbed: List[str] = []
    if not_ours is None:
        tally.removed += stop_run_processes(
            run_dir, tally.steps, tally.remaining, [run_dir, os.path.join(lexical, "runs", run_id)]
        )
        # the launch specs stay with status/ until cleanup: their env values and command go now
        secrets = specscrub.run_secrets(run_dir)
        scrubbed = specscrub.scrub_records(
            secrets, [os.path.join(run_dir, "status"), os.path.join(real_root, "agent", "calls")]
        )
        scrubbed += specscrub.scrub_specs(run_dir)
    _destroy_run_ram(req.ram or find_ram_store(run_id), tally)
    wipe_outputs = req.wipe_outputs
    keep = set(req.keep or KEPT_SUBDIRS)
    if not_ours is not None:
        tally.remaining.append("%s (%s)" % (run_dir, not_ours))
        tally.failed.append(run_dir)
    elif os.path.isdir(run_dir):
        _remove_run_subdirs(real_root, run_dir, keep, wipe_outputs, tally)
    if req.cancel_deadman:
        for job in deadman.cancel(real_root, run_id, steps=tally.steps, roots=[lexical, real_root]):
            if job.fate == "removed":
                tally.removed.append("deadman:%s" % job.what)
    if not_ours is None:
        tally.remaining += [
            r
            for r in run_remaining(run_dir, keep, wipe_outputs)
            if r.split(" (", 1)[0] not in tally.failed
        ]
    ram_left = find_ram_store(run_id)
    if ram_left:
        tally.remaining.append("ram:%s" % ram_left.path)
    verified = (
        not tally.failed
        and not ram_left
        and not any(r.startswith("tmux:") for r in tally.remaining)
        and not any(
            os.path.lexists(os.path.join(run_dir, s))
            for s in WIPED_SUBDIRS
            if s != "out" or wipe_outputs
        )
    )
    return WipeReport(
        removed=tally.removed,
        remaining=tally.remaining,
        steps=tally.steps,
        verified=verified,
        failed=tally.failed,
        run_dir=run_dir,
        time=time.time(),
        notes=tally.notes,
        scrubbed=scrubbed,
    )


def _kill_sessions(run_id: str, named: List[str], tally: _Tally) -> None:
    """Kill the run's tmux sessions: those the request names and those of its prefix."""
    prefix = session_name(run_id)
    live = [s["name"] for s in tmux_sessions()]
    sessions = set(n for n in named if n in live)
    sessions.update(n for n in live if n.startswith(prefix))
    for name in sorted(sessions):
        if kill_session(name, tally.steps):
            tally.removed.append("tmux:" + name)
        else:
            tally.remaining.append("tmux:%s (still running)" % name)


def _destroy_run_ram(ram: Optional[RamStore], tally: _Tally) -> None:
    """Destroy the run's RAM store (its decrypted slice), if it has one."""
    if not (ram and ram.path):
        return
    fate = destroy_ram(ram, tally.steps)
    if fate.fate == "removed":
        tally.removed.append("ram:%s" % ram.path)
    elif fate.failed:
        tally.remaining.append("ram:%s (%s)" % (ram.path, fate.why))
        tally.failed.append(ram.path)
    elif fate.why:
        tally.notes.append("ram:%s: %s" % (ram.path, fate.why))


def _remove_run_subdirs(
    real_root: str, run_dir: str, keep: Set[str], wipe_outputs: bool, tally: _Tally
) -> None:
    """Delete the run dir's contents but what stays until cleanup (``keep``, the marker,
    and ``out`` when it is kept); ``tmp`` is overwritten first."""
    for sub in listdir_or_empty(run_dir):
        path = os.path.join(run_dir, sub)
        if sub in keep or sub == safefs.MARKER or (sub == "out" and not wipe_outputs):
            continue
        fate = remove_item(real_root, path, False, overwrite=(sub == "tmp"))
        tally.notes += fate.notes
        if fate.fate == "removed":
            tally.removed.append(path)
        elif fate.failed:
            tally.failed.append(path)
            tally.remaining.append("%s (%s)" % (path, fate.why))


def listdir_or_empty(path: str) -> List[str]:
    """Names in a directory opened without following a link ([] when it is not one)."""
    try:
        fd = safefs.open_path(path)
    except (safefs.NotOurs, OSError):
        return []
    try:
        return safefs.names_at(fd)
    except OSError:
        return []
    finally:
        os.close(fd)


def run_remaining(run_dir: str, keep: Any, wipe_outputs: bool) -> List[str]:
    """What is left of a run dir, one line per top-level entry, with why it stays."""
    out: List[str] = []
    if not os.path.lexists(run_dir):
        return out
    for sub in listdir_or_empty(run_dir):
        if sub == safefs.MARKER:
            continue
        path = os.path.join(run_dir, sub)
        size, count = tree_size(path)
        if sub in keep:
            why = "kept until cleanup"
        elif sub == "out" and not wipe_outputs:
            why = "kept: outputs not pulled yet"
        else:
            why = "could not be removed"
        out.append("%s (%s; %d entries, %d bytes)" % (path, why, count, size))
    return out


def op_wipe_run_data(req: JsonObject) -> JsonObject:
    try:
        return wipe_run_data(req)
    except UnsafeRoot as exc:
        raise _agent_error(str(exc)) from None


def _agent_error(message: str) -> Exception:
    from .hostagent import AgentError

    return AgentError(message, "unsafe-path")
