"""Host side of wiping a run and of end-of-rental cleanup.

Why one module: the engine's ``wipe``, the dead-man wipe that fires on the host
when the laptop never came back, and ``cleanup`` must remove things the same way,
with the same safety rules:

- nothing outside the real path of ``root`` is ever touched; ``root`` itself is
  refused when it is empty, ``/``, the home directory, an ancestor of it, or a
  system directory (the same rule as the playbook's ``check_remote_root``, written
  again here with the standard library because this file runs on the host);
- ownership before destruction: a directory is removed only when it carries
  remotemac's marker (``.remotemac-owned``, see safefs.py) naming its kind, run and
  root; a root without a marker is left alone, with what was found in it; a root
  is removed only when nothing but remotemac's own entries is left in it;
- every file operation goes through safefs.py: relative to opened directories,
  ``O_NOFOLLOW``, FIFOs and devices never opened, hard-linked files never zeroed;
- everything outside ``root`` that remotemac makes (a tmux session, a /dev/shm
  dir, a RAM disk, a dead-man job) is only touched when it can be attributed to a
  run of this ``root``: its name carries a known run id or it names ``root`` on a
  path-component boundary; a process is signalled only when its command line and
  its start time are the ones recorded when remotemac started it (procid.py).

Python 3.9, standard library only. Imports its siblings by plain name: they sit
next to it in the agent directory, or are preloaded by the in-memory bootstrap
``cleanup`` uses so that nothing is written to the host (see engine/cleanup.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

_HERE = os.path.dirname(os.path.abspath(globals().get("__file__") or "."))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import deadman  # noqa: E402
import procid  # noqa: E402
import ramstore  # noqa: E402
import safefs  # noqa: E402
import specscrub  # noqa: E402
from hostagent import pid_alive, tmux_path  # noqa: E402

SYSTEM_DIRS = frozenset(
    [
        "/",
        "/bin",
        "/sbin",
        "/usr",
        "/usr/bin",
        "/usr/sbin",
        "/usr/lib",
        "/usr/local",
        "/usr/local/bin",
        "/usr/share",
        "/etc",
        "/var",
        "/var/tmp",
        "/tmp",
        "/private",
        "/private/tmp",
        "/private/var",
        "/private/etc",
        "/System",
        "/Library",
        "/Applications",
        "/Users",
        "/Users/Shared",
        "/home",
        "/opt",
        "/opt/homebrew",
        "/dev",
        "/dev/shm",
        "/proc",
        "/sys",
        "/root",
        "/Volumes",
        "/cores",
        "/boot",
        "/lib",
        "/lib64",
        "/lib32",
        "/srv",
        "/mnt",
        "/media",
        "/run",
        "/snap",
        "/nix",
        "/Network",
    ]
)
WIPED_SUBDIRS = ("data", "tmp", "cache", "out")
KEPT_SUBDIRS = ("project", "logs", "status")
FINAL_STATES = ("finished", "failed", "timeout", "stopped", "storage-limit")
SESSION_PREFIX = "remotemac-"
SHM_ROOT = "/dev/shm"
VOLUMES = "/Volumes"
KILL_GRACE_S = 3.0


class UnsafeRoot(Exception):
    """The root is not a place remotemac may delete in."""


# ------------------------------------------------------------------ safety


def check_root(root: str) -> Tuple[str, str]:
    """``(lexical, real)`` absolute forms of ``root``, or raise :class:`UnsafeRoot`."""
    text = (root or "").strip()
    if not text:
        raise UnsafeRoot("remote_root is empty")
    expanded = os.path.expanduser(text) if text.startswith("~") else text
    if not os.path.isabs(expanded):
        raise UnsafeRoot("remote_root %r is not absolute" % root)
    if ".." in expanded.split("/"):
        raise UnsafeRoot("remote_root %r contains '..'" % root)
    norm = os.path.normpath(expanded)
    real = os.path.realpath(norm)
    home = os.path.normpath(os.path.expanduser("~"))
    homes = {home, os.path.realpath(home)}
    for candidate in (norm, real):
        if candidate in SYSTEM_DIRS or len(candidate.strip("/").split("/")) < 2:
            raise UnsafeRoot("remote_root %r is a system dir" % root)
        for h in homes:
            if candidate == h or h.startswith(candidate.rstrip("/") + "/"):
                raise UnsafeRoot("remote_root %r is the home dir or holds it" % root)
    return norm, real


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


def remove_item(
    real_root: str, path: str, dry_run: bool, overwrite: bool = False
) -> Dict[str, Any]:
    """Remove one path below the root; the answer says its fate, size and why."""
    try:
        fd, name = open_parent(real_root, path)
    except (safefs.NotOurs, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            return {"fate": "not found", "bytes": 0}
        return {
            "fate": "failed",
            "why": str(exc)
            if isinstance(exc, safefs.NotOurs)
            else "%s: %s" % (type(exc).__name__, exc.strerror or exc),
            "bytes": 0,
        }
    try:
        if safefs.lstat_at(fd, name) is None:
            return {"fate": "not found", "bytes": 0}
        size, _count = safefs.tree_size_at(fd, name)
        if dry_run:
            return {"fate": "would remove", "bytes": size}
        done = safefs.remove_at(fd, name, overwrite=overwrite)
    finally:
        os.close(fd)
    answer: Dict[str, Any] = {"fate": "removed", "bytes": size}
    if done["notes"]:
        answer["notes"] = done["notes"][:20]
    if done["failed"]:
        answer.update(
            fate="failed",
            bytes=done["bytes"],
            why="; ".join(done["failed"][:5])
            + (" (and %d more)" % (len(done["failed"]) - 5) if len(done["failed"]) > 5 else ""),
        )
    return answer


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


def run_cmd(
    argv: List[str], steps: Optional[List[Dict[str, Any]]] = None, timeout: float = 60
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


def kill_session(name: str, steps: List[Dict[str, Any]]) -> bool:
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
    steps: List[Dict[str, Any]],
    group: bool = True,
    start: Optional[Dict[str, Any]] = None,
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


def _still(pid: int, start: Optional[Dict[str, Any]]) -> bool:
    if not pid_alive(pid):
        return False
    _reap(pid)
    if not pid_alive(pid):
        return False
    return start is None or procid.same_start(pid, start)


def _reap(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.waitpid(pid, os.WNOHANG)


def runner_is_ours(pid: Any, status: Dict[str, Any], run_dirs: List[str]) -> Optional[str]:
    """None when ``pid`` is the runner of one of ``run_dirs``; else why it is left alone."""
    line = cmdline(pid)
    if "runner.py" not in line or not any(procid.names_path(line, d) for d in run_dirs):
        return "its command line is not this run's runner"
    if status.get("runner_start") is not None and not procid.same_start(
        pid, status["runner_start"]
    ):
        return "started at another time than the runner remotemac recorded"
    return None


def child_is_ours(pid: Any, status: Dict[str, Any]) -> Optional[str]:
    """None when ``pid`` is the workload the runner started (same start time, and a
    command line the runner recorded); else why it is left alone."""
    if status.get("child_start") is None:
        return "no start time recorded for it"
    if not procid.same_start(pid, status["child_start"]):
        return "started at another time than the workload remotemac started (pid reused)"
    line = cmdline(pid)
    known = [" ".join(status.get("child_argv") or []), status.get("child_cmdline") or ""]
    if not line or line not in [k for k in known if k]:
        return "its command line is not the one remotemac recorded"
    return None


def stop_run_processes(
    run_dir: str,
    steps: List[Dict[str, Any]],
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
                statuses.append(status)
    finally:
        os.close(fd)
    dirs = run_dirs or [run_dir]
    for status in statuses:
        runner, child = status.get("runner_pid"), status.get("child_pid")
        if pid_alive(runner):
            why = runner_is_ours(runner, status, dirs)
            if why is None:
                terminate(runner, steps, start=status.get("runner_start"))
                stopped.append("process:%s" % runner)
            else:
                left.append("process:%s (left alone: %s)" % (runner, why))
        if pid_alive(child) and status.get("state") not in FINAL_STATES:
            why = child_is_ours(child, status)
            if why is None:
                try:
                    leader = os.getpgid(child) == child
                except OSError:
                    leader = False
                if leader:
                    terminate(child, steps, start=status.get("child_start"))
                    stopped.append("process:%s" % child)
            else:
                left.append("process:%s (left alone: %s)" % (child, why))
    return stopped


# ------------------------------------------------------------------ RAM store


def find_ram_store(
    run_id: str, platform: Optional[str] = None, shm_root: str = SHM_ROOT, volumes: str = VOLUMES
) -> Optional[Dict[str, Any]]:
    """The RAM store ramstore.py would have made for ``run_id``, if it is there."""
    platform = platform or sys.platform
    name = "remotemac-%s" % run_id
    if platform == "darwin":
        mount = os.path.join(volumes, name)
        if os.path.ismount(mount) or os.path.isdir(mount):
            return {"path": mount, "kind": "ramdisk", "device": None}
        return None
    path = os.path.join(shm_root, name)
    if os.path.isdir(path) and not os.path.islink(path):
        return {"path": path, "kind": "shm", "device": None}
    return None


def ram_refusal(
    info: Dict[str, Any], shm_root: str = SHM_ROOT, volumes: str = VOLUMES
) -> Optional[str]:
    """Why a RAM store may not be destroyed (None: it is remotemac's by name and owner)."""
    path = str(info.get("path") or "")
    base = os.path.basename(path.rstrip("/"))
    kind = info.get("kind")
    allowed = {"shm": shm_root, "ramdisk": volumes}.get(str(kind))
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
    info: Dict[str, Any],
    steps: List[Dict[str, Any]],
    shm_root: str = SHM_ROOT,
    volumes: str = VOLUMES,
) -> Dict[str, Any]:
    """Destroy a RAM store, refusing anything that is not remotemac's by name and owner."""
    path = str(info.get("path") or "")
    if info.get("kind") == "tmp":
        return {"fate": "removed with the run dir", "bytes": 0}
    refused = ram_refusal(info, shm_root, volumes)
    if refused:
        return {"fate": "failed", "why": refused, "bytes": 0}
    if not os.path.lexists(path) and info.get("kind") == "shm":
        return {"fate": "not found", "bytes": 0}
    size, _ = tree_size(path)
    result = ramstore.destroy_ram_store(dict(info))
    for step in result.get("steps", []):
        steps.append({"argv": step.get("argv"), "code": step.get("code"), "time": time.time()})
    if result.get("removed"):
        return {"fate": "removed", "bytes": size}
    if result.get("error"):
        return {"fate": "failed", "why": result["error"], "bytes": 0}
    return {"fate": "not found", "bytes": 0, "why": result.get("why")}


# ------------------------------------------------------------------ one run's wipe


def wipe_run_data(req: Dict[str, Any]) -> Dict[str, Any]:
    """Stop a run, destroy its RAM store, delete its data, tmp, cache (and outputs).

    ``wipe_outputs`` false keeps ``out`` (not pulled yet). The project, logs and
    status stay (small, and ``status``/``logs`` still answer) until ``cleanup``.
    Used by the ``wipe_run_data`` op and by the dead-man wipe on the host. The run
    dir's contents are deleted only when it carries remotemac's marker for this run.
    """
    lexical, real_root = check_root(req["root"])
    run_id = req["run_id"]
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$", run_id):
        raise UnsafeRoot("run id %r is not valid" % run_id)
    run_dir = os.path.join(real_root, "runs", run_id)
    steps: List[Dict[str, Any]] = []
    removed: List[str] = []
    remaining: List[str] = []
    failed: List[str] = []
    notes: List[str] = []
    prefix = session_name(run_id)
    live = [s["name"] for s in tmux_sessions()]
    sessions = set(n for n in req.get("sessions") or [] if n in live)
    sessions.update(n for n in live if n.startswith(prefix))
    for name in sorted(sessions):
        if kill_session(name, steps):
            removed.append("tmux:" + name)
        else:
            remaining.append("tmux:%s (still running)" % name)
    not_ours = ownership(run_dir, "run", safefs.marker_of(real_root), run_id)
    scrubbed: List[str] = []
    if not_ours is None:
        removed += stop_run_processes(
            run_dir, steps, remaining, [run_dir, os.path.join(lexical, "runs", run_id)]
        )
        # the launch specs stay with status/ until cleanup: their env values and command go now
        scrubbed = specscrub.scrub_specs(run_dir)
    ram = req.get("ram") or find_ram_store(run_id)
    if ram and ram.get("path"):
        fate = destroy_ram(ram, steps)
        if fate["fate"] == "removed":
            removed.append("ram:%s" % ram["path"])
        elif fate["fate"] == "failed":
            remaining.append("ram:%s (%s)" % (ram["path"], fate.get("why")))
            failed.append(ram["path"])
        elif fate.get("why"):
            notes.append("ram:%s: %s" % (ram["path"], fate["why"]))
    wipe_outputs = bool(req.get("wipe_outputs", True))
    keep = set(req.get("keep") or KEPT_SUBDIRS)
    if not_ours is not None:
        remaining.append("%s (%s)" % (run_dir, not_ours))
        failed.append(run_dir)
    elif os.path.isdir(run_dir):
        for sub in _listdir(run_dir):
            path = os.path.join(run_dir, sub)
            if sub in keep or sub == safefs.MARKER or (sub == "out" and not wipe_outputs):
                continue
            fate = remove_item(real_root, path, False, overwrite=(sub == "tmp"))
            notes += fate.get("notes") or []
            if fate["fate"] == "removed":
                removed.append(path)
            elif fate["fate"] == "failed":
                failed.append(path)
                remaining.append("%s (%s)" % (path, fate.get("why")))
    if req.get("cancel_deadman"):
        for job in deadman.cancel(real_root, run_id, steps=steps, roots=[lexical, real_root]):
            if job.get("fate") == "removed":
                removed.append("deadman:%s" % job.get("what"))
    if not_ours is None:
        remaining += [
            r
            for r in run_remaining(run_dir, keep, wipe_outputs)
            if r.split(" (", 1)[0] not in failed
        ]
    ram_left = find_ram_store(run_id)
    if ram_left:
        remaining.append("ram:%s" % ram_left["path"])
    verified = (
        not failed
        and not ram_left
        and not any(r.startswith("tmux:") for r in remaining)
        and not any(
            os.path.lexists(os.path.join(run_dir, s))
            for s in WIPED_SUBDIRS
            if s != "out" or wipe_outputs
        )
    )
    return {
        "removed": removed,
        "remaining": remaining,
        "steps": steps,
        "verified": verified,
        "failed": failed,
        "run_dir": run_dir,
        "time": time.time(),
        "notes": notes,
        "scrubbed": scrubbed,
    }


def _listdir(path: str) -> List[str]:
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
    for sub in _listdir(run_dir):
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


def op_wipe_run_data(req: Dict[str, Any]) -> Dict[str, Any]:
    try:
        return wipe_run_data(req)
    except UnsafeRoot as exc:
        raise _agent_error(str(exc)) from None


def _agent_error(message: str) -> Exception:
    try:
        import hostagent

        return hostagent.AgentError(message, "unsafe-path")
    except ImportError:  # pragma: no cover - hostagent always ships alongside
        return RuntimeError(message)


# ------------------------------------------------------------------ cleanup


def read_inventory(real_root: str) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """Items of ``inventory.json`` and a note when it is missing or damaged (a FIFO or
    a link there is never opened)."""
    path = os.path.join(real_root, "inventory.json")
    if os.path.islink(path):
        return [], "inventory.json is a symlink: ignored"
    if not os.path.lexists(path):
        return [], "inventory.json missing"
    data = safefs.read_json_file(path)
    if not isinstance(data, dict):
        return [], "inventory.json unreadable (not a regular JSON file)"
    items = [i for i in data.get("items", []) if isinstance(i, dict) and i.get("path")]
    return items, None


def _add(
    items: Dict[Tuple[str, str], Dict[str, Any]],
    kind: str,
    path: str,
    source: str,
    run_id: Optional[str] = None,
    **extra: Any,
) -> None:
    key = (kind, path)
    item = items.get(key)
    if item is None:
        item = {"kind": kind, "path": path, "run_id": run_id, "sources": []}
        items[key] = item
    if source not in item["sources"]:
        item["sources"].append(source)
    if run_id and not item.get("run_id"):
        item["run_id"] = run_id
    for k, v in extra.items():
        item.setdefault(k, v)


def collect(root: str, known: List[Dict[str, Any]], run_ids: List[str]) -> Dict[str, Any]:
    """Everything remotemac made for ``root``: from inventory, journal and a scan."""
    lexical, real_root = check_root(root)
    items: Dict[Tuple[str, str], Dict[str, Any]] = {}
    notes: List[str] = []
    ids = set(r for r in run_ids if r)
    root_exists = os.path.isdir(real_root)
    if os.path.islink(lexical):
        notes.append("remote_root %s is a symlink to %s" % (lexical, real_root))
    inventory, note = read_inventory(real_root) if root_exists else ([], None)
    if note:
        notes.append(note)
    deadmen: Dict[str, Dict[str, Any]] = {}
    listed = [(i, "inventory") for i in inventory] + [(i, "journal") for i in known]
    for item, source in listed:
        ids.add(item.get("run_id") or "")
        kind = str(item.get("kind"))
        path = _relocate(str(item["path"]), lexical, real_root)
        if kind == "deadman":  # matched to the live job below, by run id or pid
            entry = deadmen.setdefault(item.get("run_id") or path, {"spec": path, "sources": []})
            entry["sources"].append(source)
            entry.update(
                {k: item[k] for k in ("pid", "label", "plist", "method", "start") if k in item}
            )
            continue
        _add(
            items,
            kind,
            path,
            source,
            item.get("run_id"),
            **{k: v for k, v in item.items() if k not in ("kind", "path", "run_id", "root")},
        )
    if root_exists:
        for sub, kind in CONTAINERS.items():
            base = os.path.join(real_root, sub)
            for name in _listdir(base):
                if kind == "run":
                    ids.add(name)
                _add(
                    items, kind, os.path.join(base, name), "found", name if kind == "run" else None
                )
        if os.path.lexists(os.path.join(real_root, "deadman")):
            _add(items, "deadman-dir", os.path.join(real_root, "deadman"), "found")
    ids.discard("")
    for run_id in sorted(ids):
        ram = find_ram_store(run_id)
        if ram:
            _add(items, "ramstore", ram["path"], "found", run_id, ram_kind=ram["kind"])
    for session in tmux_sessions():
        name = session["name"]
        mine = any(name.startswith(session_name(r)) for r in ids) or (
            procid.names_path(session["command"], real_root)
            or procid.names_path(session["command"], lexical)
        )
        if mine:
            _add(items, "tmux", name, "found")
    jobs = deadman.find_jobs([lexical, real_root], sorted(ids))
    for key, entry in deadmen.items():
        pid = entry.get("pid")
        if (
            entry.get("method") == "sleeper"
            and isinstance(pid, int)
            and not any(j.get("pid") == pid for j in jobs)
            and "deadman.py" in cmdline(pid)
            and procid.same_start(pid, entry.get("start"))
        ):
            jobs.append(
                {
                    "method": "sleeper",
                    "what": "sleeper:%d" % pid,
                    "pid": pid,
                    "run_id": key,
                    "start": entry.get("start"),
                }
            )
    for job in jobs:
        _add(items, "deadman", job["what"], "found", job.get("run_id"), job=job)
        entry = deadmen.pop(job.get("run_id") or "", None)
        if entry:
            items[("deadman", job["what"])]["sources"] += entry["sources"]
    for key, entry in deadmen.items():  # known but no longer scheduled: fired or cancelled
        for source in entry["sources"]:
            _add(items, "deadman", "spec:" + entry["spec"], source, key)
    for item in list(items.values()):
        if item["kind"] == "ramstore" and "ram_kind" not in item:
            item["ram_kind"] = "ramdisk" if item["path"].startswith(VOLUMES + "/") else "shm"
    return {
        "root": lexical,
        "real_root": real_root,
        "items": items,
        "notes": notes,
        "run_ids": sorted(ids),
        "exists": root_exists,
        "marker": safefs.marker_of(real_root) if root_exists else None,
    }


def _relocate(path: str, lexical: str, real_root: str) -> str:
    """Inventory paths may use the lexical root; compare everything on the real one."""
    if path == lexical or path.startswith(lexical.rstrip("/") + "/"):
        return real_root + path[len(lexical) :]
    return path


_ORDER = {
    "deadman": 0,
    "tmux": 1,
    "ramstore": 2,
    "run": 3,
    "venv": 4,
    "agent": 5,
    "runtime": 6,
    "deadman-dir": 7,
}
#: directories of a root that hold one owned directory per run / venv / agent version
CONTAINERS = {"runs": "run", "envs": "venv", "agent": "agent", "runtime": "runtime"}
#: marker kind of each item kind that is a directory below the root
DIR_KINDS = {
    "run": "run",
    "venv": "venv",
    "agent": "agent",
    "runtime": "runtime",
    "deadman-dir": "deadman",
}
#: files remotemac keeps at the top of a root (removed last, with the root)
BOOKKEEPING = ("inventory.json", safefs.MARKER)


def op_cleanup_host(req: Dict[str, Any]) -> Dict[str, Any]:
    """Remove (or with ``dry_run`` only list) everything remotemac made for each root.

    Request: ``roots`` (list), ``known`` (items the laptop's journal knows:
    kind/path/run_id), ``run_ids``, ``dry_run``. Answer per root: every item with
    its fate, bytes, and what remains afterwards.
    """
    dry_run = bool(req.get("dry_run"))
    answers = []
    steps: List[Dict[str, Any]] = []
    for root in req.get("roots") or []:
        try:
            answers.append(_cleanup_root(root, req, dry_run, steps))
        except UnsafeRoot as exc:
            answers.append(
                {
                    "root": root,
                    "refused": str(exc),
                    "items": [],
                    "remaining": [],
                    "bytes_freed": 0,
                    "verified": False,
                }
            )
    return {"roots": answers, "steps": steps, "host": _host_facts(), "dry_run": dry_run}


def _cleanup_root(
    root: str, req: Dict[str, Any], dry_run: bool, steps: List[Dict[str, Any]]
) -> Dict[str, Any]:
    """One root: the same decisions for the dry run and the real one (only the last
    step, doing it, differs), so the dry run lists exactly what would go."""
    known = [k for k in req.get("known") or [] if k.get("root") in (None, root)]
    found = collect(root, known, list(req.get("run_ids") or []))
    real_root, lexical = found["real_root"], found["root"]
    if found["exists"] and found["marker"] is None:
        _size, count = tree_size(real_root)
        raise UnsafeRoot(
            "%s: not made by remotemac (no marker; %d entries) - left alone"
            % (lexical, max(0, count - 1))
        )
    if found["exists"] and found["marker"].get("kind") != "root":
        raise UnsafeRoot(
            "%s: marked as remotemac's %s, not a remote_root - left alone"
            % (lexical, found["marker"].get("kind"))
        )
    items = sorted(found["items"].values(), key=lambda i: (_ORDER.get(i["kind"], 9), i["path"]))
    for item in items:
        item.update(_dispose(item, real_root, lexical, found["marker"], dry_run, steps))
    gone = set(i["path"] for i in items if i.get("fate") in ("removed", "would remove"))
    items.append(_finish_root(lexical, real_root, gone, dry_run))
    remaining = [] if dry_run else verify(lexical, real_root, found["run_ids"])
    freed = sum(int(i.get("bytes") or 0) for i in items if i.get("fate") == "removed")
    would = sum(int(i.get("bytes") or 0) for i in items if i.get("fate") == "would remove")
    for item in items:
        item.pop("job", None)
    return {
        "root": lexical,
        "real_root": real_root,
        "items": items,
        "notes": found["notes"],
        "remaining": remaining,
        "bytes_freed": freed,
        "bytes_to_free": would,
        "verified": not dry_run and not remaining,
        "run_ids": found["run_ids"],
    }


def _finish_root(lexical: str, real_root: str, gone: Any, dry_run: bool) -> Dict[str, Any]:
    """Remove the root when nothing but remotemac's own entries is left in it.

    ``gone``: paths removed (or, in a dry run, that would be). Empty containers
    (runs/, envs/, agent/) and the bookkeeping files go with the root; anything
    else keeps the root, and its marker and inventory, for a later cleanup.
    """
    item: Dict[str, Any] = {"kind": "root", "path": lexical, "sources": ["playbook"], "bytes": 0}
    if os.path.islink(lexical):
        return dict(
            item, fate="failed", why="remote_root is a symlink: not followed, remove it by hand"
        )
    if not os.path.lexists(real_root):
        return dict(item, fate="not found")
    foreign: List[str] = []
    for name in _listdir(real_root):
        path = os.path.join(real_root, name)
        if (
            path in gone
            or name in BOOKKEEPING
            or name.startswith(("inventory.json.tmp-", safefs.MARKER + ".tmp-"))
        ):
            continue
        if name in CONTAINERS and os.path.isdir(path) and not os.path.islink(path):
            foreign += [
                os.path.join(path, n) for n in _listdir(path) if os.path.join(path, n) not in gone
            ]
            continue
        foreign.append(path)
    if foreign:
        shown = ", ".join(os.path.relpath(p, real_root) for p in foreign[:5])
        more = " and %d more" % (len(foreign) - 5) if len(foreign) > 5 else ""
        return dict(
            item,
            fate="left alone",
            foreign=foreign[:50],
            why="kept: it holds %d entr%s remotemac did not make (%s%s); remove them "
            "by hand, then run cleanup again"
            % (len(foreign), "y" if len(foreign) == 1 else "ies", shown, more),
        )
    size, _count = tree_size(real_root)
    if dry_run:
        return dict(item, fate="would remove", bytes=size)
    try:
        fd = safefs.open_path(real_root)
    except (safefs.NotOurs, OSError) as exc:
        return dict(item, fate="failed", why=str(exc))
    try:
        # the marker goes last: a root that cannot be finished stays recognisable
        for name in sorted(safefs.names_at(fd), key=lambda n: (n == safefs.MARKER, n)):
            try:
                if name in CONTAINERS:  # empty by now: rmdir fails on anything new in it
                    os.rmdir(name, dir_fd=fd)
                elif name in BOOKKEEPING or name.startswith(
                    ("inventory.json.tmp-", safefs.MARKER + ".tmp-")
                ):
                    os.unlink(name, dir_fd=fd)
                else:
                    return dict(item, fate="failed", why="%s appeared meanwhile" % name)
            except OSError as exc:
                return dict(item, fate="failed", why="%s: %s" % (name, exc.strerror or exc))
    finally:
        os.close(fd)
    try:
        os.rmdir(real_root)
    except OSError as exc:
        return dict(item, fate="failed", why="%s: %s" % (real_root, exc.strerror or exc))
    return dict(item, fate="removed", bytes=size)


def _dispose(
    item: Dict[str, Any],
    real_root: str,
    lexical: str,
    root_marker: Optional[Dict[str, Any]],
    dry_run: bool,
    steps: List[Dict[str, Any]],
) -> Dict[str, Any]:
    kind, path = item["kind"], item["path"]
    if kind == "deadman":
        job = item.get("job")
        if job is None:
            jobs = [j for j in deadman.find_jobs([lexical, real_root]) if j["what"] == path]
            job = jobs[0] if jobs else None
        if job is None:
            return {
                "fate": "not found",
                "bytes": 0,
                "why": "no longer scheduled (fired or cancelled by a wipe)",
            }
        if dry_run:
            return {"fate": "would remove", "bytes": 0}
        return deadman.remove_job(job, steps)
    if kind == "tmux":
        alive = any(s["name"] == path for s in tmux_sessions())
        if not alive:
            return {"fate": "not found", "bytes": 0}
        if dry_run:
            return {"fate": "would remove", "bytes": 0}
        return {"fate": "removed" if kill_session(path, steps) else "failed", "bytes": 0}
    if kind == "ramstore":
        info = {"path": path, "kind": item.get("ram_kind") or "shm", "device": None}
        if not os.path.lexists(path):
            return {"fate": "not found", "bytes": 0}
        if dry_run:
            refused = ram_refusal(info)
            return (
                {"fate": "failed", "why": refused, "bytes": 0}
                if refused
                else {"fate": "would remove", "bytes": tree_size(path)[0]}
            )
        return destroy_ram(info, steps)
    if below(real_root, path) is None:
        return {"fate": "failed", "why": "outside remote_root: refused", "bytes": 0}
    if not os.path.lexists(path):
        return {"fate": "not found", "bytes": 0}
    not_ours = ownership(
        path, DIR_KINDS.get(kind, kind), root_marker, item.get("run_id") if kind == "run" else None
    )
    if not_ours is not None:
        return {"fate": "left alone", "why": not_ours, "bytes": 0}
    if kind == "run" and not dry_run:
        stop_run_processes(path, steps, None, [path, _relocate_back(path, lexical, real_root)])
    return (
        remove_item(real_root, path, dry_run, overwrite=False)
        if kind != "run"
        else _remove_run(real_root, path, dry_run)
    )


def _relocate_back(path: str, lexical: str, real_root: str) -> str:
    return lexical + path[len(real_root) :] if procid.is_below(path, real_root) else path


def _remove_run(real_root: str, path: str, dry_run: bool) -> Dict[str, Any]:
    """A run dir; its tmp (the on-disk plaintext store) is zeroed first."""
    if not dry_run:
        tmp = remove_item(real_root, os.path.join(path, "tmp"), False, overwrite=True)
        if tmp["fate"] == "failed":
            return tmp
    return remove_item(real_root, path, dry_run)


def verify(lexical: str, real_root: str, run_ids: List[str]) -> List[Dict[str, str]]:
    """What is still there after cleanup, each with why it matters."""
    left: List[Dict[str, str]] = []
    if os.path.lexists(real_root):
        size, count = tree_size(real_root)
        left.append(
            {
                "kind": "root",
                "path": real_root,
                "why": "still exists (%d entries, %d bytes)" % (count, size),
            }
        )
    for run_id in run_ids:
        ram = find_ram_store(run_id)
        if ram:
            left.append({"kind": "ramstore", "path": ram["path"], "why": "still exists"})
    for session in tmux_sessions():
        if (
            any(session["name"].startswith(session_name(r)) for r in run_ids)
            or procid.names_path(session["command"], real_root)
            or procid.names_path(session["command"], lexical)
        ):
            left.append({"kind": "tmux", "path": session["name"], "why": "still running"})
    for job in deadman.find_jobs([lexical, real_root]):
        left.append({"kind": "deadman", "path": job["what"], "why": "still scheduled"})
    return left


def op_claim_root(req: Dict[str, Any]) -> Dict[str, Any]:
    """Before provision writes anything: make remote_root, or adopt it, and mark it.

    Refused (``{"refused": why}``, nothing written): a root that is, holds or sits
    above the home or a system dir, or an existing directory holding entries
    remotemac did not write (a later cleanup would delete them). Run in memory
    (engine/cleanup.py), because the agent is installed below the root.
    """
    import secrets

    try:
        lexical, real_root = check_root(req["root"])
    except UnsafeRoot as exc:
        return {"refused": str(exc)}
    parent = os.path.dirname(real_root)
    try:
        if not os.path.isdir(parent):
            os.makedirs(parent, 0o700)
        marker, created = safefs.ensure_owned_dir(
            real_root,
            {"kind": "root", "root_id": secrets.token_hex(8), "run_id": req.get("run_id")},
        )
    except safefs.NotOurs as exc:
        return {"refused": "%s; choose a new or empty directory for remote_root" % exc}
    except OSError as exc:
        return {"refused": "cannot create %s: %s" % (lexical, exc.strerror or exc)}
    return {
        "root": lexical,
        "real_root": real_root,
        "root_id": marker.get("root_id"),
        "created": created,
    }


def _host_facts() -> Dict[str, Any]:
    import platform

    return {
        "platform": sys.platform,
        "machine": platform.machine(),
        "user": os.environ.get("USER") or str(os.getuid()),
        "home": os.path.expanduser("~"),
        "time": time.time(),
    }
