"""Host side of wiping a run and of end-of-rental cleanup.

Why one module: the engine's ``wipe``, the dead-man wipe that fires on the host
when the laptop never came back, and ``cleanup`` must remove things the same way,
with the same safety rules:

- nothing outside the real path of ``root`` is ever touched; ``root`` itself is
  refused when it is empty, ``/``, the home directory, an ancestor of it, or a
  system directory (the same rule as the playbook's ``check_remote_root``, written
  again here with the standard library because this file runs on the host);
- symlinks are removed, never followed (a link inside ``root`` that points at the
  user's files only loses the link);
- everything outside ``root`` that remotemac makes (a tmux session, a /dev/shm
  dir, a RAM disk, a dead-man job) is only touched when it can be attributed to a
  run of this ``root``: its name carries a known run id or it names ``root``.

Python 3.9, standard library only. Imports its siblings by plain name: they sit
next to it in the agent directory, or are preloaded by the in-memory bootstrap
``cleanup`` uses so that nothing is written to the host (see engine/cleanup.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
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
import ramstore  # noqa: E402
import specscrub  # noqa: E402
from hostagent import pid_alive, tmux_path  # noqa: E402

SYSTEM_DIRS = frozenset([
    "/", "/bin", "/sbin", "/usr", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/local",
    "/usr/local/bin", "/usr/share", "/etc", "/var", "/var/tmp", "/tmp", "/private",
    "/private/tmp", "/private/var", "/private/etc", "/System", "/Library", "/Applications",
    "/Users", "/Users/Shared", "/home", "/opt", "/opt/homebrew", "/dev", "/dev/shm", "/proc",
    "/sys", "/root", "/Volumes", "/cores", "/boot", "/lib", "/lib64", "/lib32", "/srv", "/mnt",
    "/media", "/run", "/snap", "/nix", "/Network",
])
WIPED_SUBDIRS = ("data", "tmp", "cache", "out")
KEPT_SUBDIRS = ("project", "logs", "status")
FINAL_STATES = ("finished", "failed", "timeout", "stopped")
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
    """``path`` with its parent resolved, if strictly below ``real_root``; the last
    component is not resolved, so a symlink there is handled as the link itself."""
    norm = os.path.normpath(path)
    parent = os.path.realpath(os.path.dirname(norm))
    target = os.path.join(parent, os.path.basename(norm))
    if parent == real_root or parent.startswith(real_root.rstrip("/") + "/"):
        return target
    return None


def tree_size(path: str) -> Tuple[int, int]:
    """(bytes, entries) below ``path``, links counted as themselves, never followed."""
    total = count = 0
    try:
        info = os.lstat(path)
    except OSError:
        return 0, 0
    if not stat.S_ISDIR(info.st_mode):
        return info.st_size, 1
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in dirnames + filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
                count += 1
            except OSError:
                continue
    return total, count + 1


def remove_path(target: str, overwrite: bool = False) -> None:
    """Unlink a file or link; remove a directory tree without following links."""
    if os.path.islink(target) or not os.path.isdir(target):
        os.unlink(target)
        return
    if overwrite:
        ramstore._overwrite_tree(target)
    shutil.rmtree(target)


def remove_item(real_root: str, path: str, dry_run: bool,
                overwrite: bool = False) -> Dict[str, Any]:
    """Remove one path below the root; the answer says its fate, size and why."""
    target = below(real_root, path)
    if target is None:
        return {"fate": "failed", "why": "outside remote_root: refused", "bytes": 0}
    if not os.path.lexists(target):
        return {"fate": "not found", "bytes": 0}
    size, _count = tree_size(target)
    if dry_run:
        return {"fate": "would remove", "bytes": size}
    try:
        remove_path(target, overwrite=overwrite)
    except OSError as exc:
        return {"fate": "failed", "why": "%s: %s" % (type(exc).__name__, exc.strerror or exc),
                "bytes": 0}
    return {"fate": "removed", "bytes": size}


# ------------------------------------------------------------------ processes


def session_name(run_id: str, label: str = "") -> str:
    """The tmux session name of engine/context.Side.session (prefix when no label)."""
    tail = "%s-%s" % (run_id, label) if label else run_id + "-"
    return SESSION_PREFIX + re.sub(r"[^A-Za-z0-9_-]", "_", tail)


def run_cmd(argv: List[str], steps: Optional[List[Dict[str, Any]]] = None,
            timeout: float = 60) -> Tuple[int, str, str]:
    """Run a command without a shell; record it in ``steps`` for the ledger."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout)
        code, out, err = (proc.returncode, proc.stdout.decode("utf-8", "replace"),
                          proc.stderr.decode("utf-8", "replace"))
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
    code, out, _ = run_cmd([tmux, "list-panes", "-a", "-F",
                            "#{session_name}\t#{pane_start_command}"])
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
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        if os.path.isdir("/proc/self"):
            return ""
    code, out, _ = run_cmd(["ps", "-o", "command=", "-p", str(pid)])
    return out.strip() if code == 0 else ""


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


def terminate(pid: int, steps: List[Dict[str, Any]], group: bool = True) -> bool:
    """SIGTERM (the group when ``pid`` leads one), then SIGKILL after a grace."""
    def send(sig: int) -> None:
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
    while time.time() < deadline and pid_alive(pid):
        _reap(pid)
        time.sleep(0.05)
    if pid_alive(pid):
        steps.append({"argv": ["kill", "-KILL", str(pid)], "code": 0, "time": time.time()})
        send(signal.SIGKILL)
        time.sleep(0.1)
        _reap(pid)
    return not pid_alive(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.waitpid(pid, os.WNOHANG)


def stop_run_processes(run_dir: str, steps: List[Dict[str, Any]]) -> List[str]:
    """Stop the runners (and their workloads) a run's status files name."""
    stopped = []
    status_dir = os.path.join(run_dir, "status")
    try:
        names = sorted(os.listdir(status_dir))
    except OSError:
        return stopped
    for name in names:
        if not name.endswith(".json") or name.endswith(".spec.json"):
            continue
        try:
            with open(os.path.join(status_dir, name)) as fh:
                status = json.load(fh)
        except (OSError, ValueError):
            continue
        runner, child = status.get("runner_pid"), status.get("child_pid")
        if pid_alive(runner) and run_dir in cmdline(runner):
            terminate(runner, steps)
            stopped.append("process:%s" % runner)
        if pid_alive(child) and status.get("state") not in FINAL_STATES:
            try:
                leader = os.getpgid(child) == child
            except OSError:
                leader = False
            if leader:
                terminate(child, steps)
                stopped.append("process:%s" % child)
    return stopped


# ------------------------------------------------------------------ RAM store


def find_ram_store(run_id: str, platform: Optional[str] = None,
                   shm_root: str = SHM_ROOT, volumes: str = VOLUMES) -> Optional[Dict[str, Any]]:
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


def destroy_ram(info: Dict[str, Any], steps: List[Dict[str, Any]],
                shm_root: str = SHM_ROOT, volumes: str = VOLUMES) -> Dict[str, Any]:
    """Destroy a RAM store, refusing anything that is not remotemac's by name and owner."""
    path = str(info.get("path") or "")
    base = os.path.basename(path.rstrip("/"))
    kind = info.get("kind")
    allowed = {"shm": shm_root, "ramdisk": volumes}.get(str(kind))
    if kind == "tmp":
        return {"fate": "removed with the run dir", "bytes": 0}
    if allowed is None or os.path.dirname(path.rstrip("/")) != allowed \
            or not base.startswith("remotemac-"):
        return {"fate": "failed", "why": "not a remotemac RAM store: refused", "bytes": 0}
    if not os.path.lexists(path) and kind == "shm":
        return {"fate": "not found", "bytes": 0}
    if kind == "shm":
        info_st = os.lstat(path)
        if not stat.S_ISDIR(info_st.st_mode) or info_st.st_uid != os.geteuid():
            return {"fate": "failed", "why": "not our own directory: refused", "bytes": 0}
    size, _ = tree_size(path)
    result = ramstore.destroy_ram_store(dict(info))
    for step in result.get("steps", []):
        steps.append({"argv": step.get("argv"), "code": step.get("code"), "time": time.time()})
    if result.get("removed"):
        return {"fate": "removed", "bytes": size}
    if result.get("error"):
        return {"fate": "failed", "why": result["error"], "bytes": 0}
    return {"fate": "not found", "bytes": 0}


# ------------------------------------------------------------------ one run's wipe


def wipe_run_data(req: Dict[str, Any]) -> Dict[str, Any]:
    """Stop a run, destroy its RAM store, delete its data, tmp, cache (and outputs).

    ``wipe_outputs`` false keeps ``out`` (not pulled yet). The project, logs and
    status stay (small, and ``status``/``logs`` still answer) until ``cleanup``.
    Used by the ``wipe_run_data`` op and by the dead-man wipe on the host.
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
    prefix = session_name(run_id)
    live = [s["name"] for s in tmux_sessions()]
    sessions = set(n for n in req.get("sessions") or [] if n in live)
    sessions.update(n for n in live if n.startswith(prefix))
    for name in sorted(sessions):
        if kill_session(name, steps):
            removed.append("tmux:" + name)
        else:
            remaining.append("tmux:%s (still running)" % name)
    removed += stop_run_processes(run_dir, steps)
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
    wipe_outputs = bool(req.get("wipe_outputs", True))
    keep = set(req.get("keep") or KEPT_SUBDIRS)
    if os.path.isdir(run_dir) and not os.path.islink(run_dir):
        for sub in sorted(os.listdir(run_dir)):
            path = os.path.join(run_dir, sub)
            if sub in keep or (sub == "out" and not wipe_outputs):
                continue
            fate = remove_item(real_root, path, False, overwrite=(sub == "tmp"))
            if fate["fate"] == "removed":
                removed.append(path)
            elif fate["fate"] == "failed":
                failed.append(path)
    if req.get("cancel_deadman"):
        for job in deadman.cancel(real_root, run_id, steps=steps, roots=[lexical, real_root]):
            if job.get("fate") == "removed":
                removed.append("deadman:%s" % job.get("what"))
    listing = run_remaining(run_dir, keep, wipe_outputs)
    remaining += listing
    ram_left = find_ram_store(run_id)
    if ram_left:
        remaining.append("ram:%s" % ram_left["path"])
    verified = not failed and not ram_left and not any(
        r.startswith("tmux:") for r in remaining) and not any(
        os.path.lexists(os.path.join(run_dir, s)) for s in WIPED_SUBDIRS
        if s != "out" or wipe_outputs)
    return {"removed": removed, "remaining": remaining, "steps": steps, "verified": verified,
            "failed": failed, "run_dir": run_dir, "time": time.time(), "scrubbed": scrubbed}


def run_remaining(run_dir: str, keep: Any, wipe_outputs: bool) -> List[str]:
    """What is left of a run dir, one line per top-level entry, with why it stays."""
    out: List[str] = []
    if not os.path.lexists(run_dir):
        return out
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return ["%s (unreadable)" % run_dir]
    for sub in names:
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
    """Items of ``inventory.json`` and a note when it is missing or damaged."""
    path = os.path.join(real_root, "inventory.json")
    if os.path.islink(path):
        return [], "inventory.json is a symlink: ignored"
    try:
        with open(path) as fh:
            data = json.load(fh)
        items = [i for i in data.get("items", []) if isinstance(i, dict) and i.get("path")]
        return items, None
    except FileNotFoundError:
        return [], "inventory.json missing"
    except (OSError, ValueError, AttributeError) as exc:
        return [], "inventory.json unreadable (%s)" % type(exc).__name__


def _add(items: Dict[Tuple[str, str], Dict[str, Any]], kind: str, path: str, source: str,
         run_id: Optional[str] = None, **extra: Any) -> None:
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
            entry.update({k: item[k] for k in ("pid", "label", "plist", "method") if k in item})
            continue
        _add(items, kind, path, source, item.get("run_id"),
             **{k: v for k, v in item.items() if k not in ("kind", "path", "run_id", "root")})
    if root_exists:
        for sub, kind in (("runs", "run"), ("envs", "venv"), ("agent", "agent")):
            base = os.path.join(real_root, sub)
            if os.path.isdir(base) and not os.path.islink(base):
                for name in sorted(os.listdir(base)):
                    if kind == "run":
                        ids.add(name)
                    _add(items, kind, os.path.join(base, name), "found",
                         name if kind == "run" else None)
    ids.discard("")
    for run_id in sorted(ids):
        ram = find_ram_store(run_id)
        if ram:
            _add(items, "ramstore", ram["path"], "found", run_id, ram_kind=ram["kind"])
    for session in tmux_sessions():
        name = session["name"]
        mine = any(name.startswith(session_name(r)) for r in ids) or (
            real_root in session["command"] or lexical in session["command"])
        if mine:
            _add(items, "tmux", name, "found")
    jobs = deadman.find_jobs([lexical, real_root], sorted(ids))
    for key, entry in deadmen.items():
        pid = entry.get("pid")
        if entry.get("method") == "sleeper" and isinstance(pid, int) and \
                not any(j.get("pid") == pid for j in jobs) and "deadman.py" in cmdline(pid):
            jobs.append({"method": "sleeper", "what": "sleeper:%d" % pid, "pid": pid,
                         "run_id": key})
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
    return {"root": lexical, "real_root": real_root, "items": items, "notes": notes,
            "run_ids": sorted(ids), "exists": root_exists}


def _relocate(path: str, lexical: str, real_root: str) -> str:
    """Inventory paths may use the lexical root; compare everything on the real one."""
    if path == lexical or path.startswith(lexical.rstrip("/") + "/"):
        return real_root + path[len(lexical):]
    return path


_ORDER = {"deadman": 0, "tmux": 1, "ramstore": 2, "run": 3, "venv": 4, "agent": 5}


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
            answers.append({"root": root, "refused": str(exc), "items": [], "remaining": [],
                            "bytes_freed": 0, "verified": False})
    return {"roots": answers, "steps": steps, "host": _host_facts(), "dry_run": dry_run}


def _cleanup_root(root: str, req: Dict[str, Any], dry_run: bool,
                  steps: List[Dict[str, Any]]) -> Dict[str, Any]:
    known = [k for k in req.get("known") or [] if k.get("root") in (None, root)]
    found = collect(root, known, list(req.get("run_ids") or []))
    real_root = found["real_root"]
    items = sorted(found["items"].values(), key=lambda i: (_ORDER.get(i["kind"], 9), i["path"]))
    for item in items:
        item.update(_dispose(item, real_root, found["root"], dry_run, steps))
    root_item: Dict[str, Any] = {"kind": "root", "path": found["root"], "sources": ["playbook"]}
    if os.path.islink(found["root"]):
        root_item.update({"fate": "failed", "bytes": 0,
                          "why": "remote_root is a symlink: not followed, remove it by hand"})
    elif not os.path.lexists(real_root):
        root_item.update({"fate": "not found", "bytes": 0})
    else:
        size, _ = tree_size(real_root)
        if dry_run:  # what is not already counted in the items below it
            counted = sum(int(i.get("bytes") or 0) for i in items
                          if i.get("fate") == "would remove" and below(real_root, i["path"]))
            root_item.update({"fate": "would remove", "bytes": max(0, size - counted)})
        else:
            try:
                shutil.rmtree(real_root)
                root_item.update({"fate": "removed", "bytes": size})
            except OSError as exc:
                root_item.update({"fate": "failed", "bytes": 0, "why": str(exc)})
    items.append(root_item)
    remaining = [] if dry_run else verify(found["root"], real_root, found["run_ids"])
    freed = sum(int(i.get("bytes") or 0) for i in items if i.get("fate") == "removed")
    would = sum(int(i.get("bytes") or 0) for i in items if i.get("fate") == "would remove")
    for item in items:
        item.pop("job", None)
    return {"root": found["root"], "real_root": real_root, "items": items, "notes": found["notes"],
            "remaining": remaining, "bytes_freed": freed, "bytes_to_free": would,
            "verified": not dry_run and not remaining,
            "run_ids": found["run_ids"]}


def _dispose(item: Dict[str, Any], real_root: str, lexical: str, dry_run: bool,
             steps: List[Dict[str, Any]]) -> Dict[str, Any]:
    kind, path = item["kind"], item["path"]
    if kind == "deadman":
        job = item.get("job")
        if job is None:
            jobs = [j for j in deadman.find_jobs([lexical, real_root]) if j["what"] == path]
            job = jobs[0] if jobs else None
        if job is None:
            return {"fate": "not found", "bytes": 0, "why": "no longer scheduled (fired or "
                    "cancelled by a wipe)"}
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
            return {"fate": "would remove", "bytes": tree_size(path)[0]}
        return destroy_ram(info, steps)
    if kind == "run" and not dry_run:
        target = below(real_root, path)
        if target and os.path.isdir(target) and not os.path.islink(target):
            stop_run_processes(target, steps)
    return remove_item(real_root, path, dry_run, overwrite=False) if kind != "run" else \
        _remove_run(real_root, path, dry_run)


def _remove_run(real_root: str, path: str, dry_run: bool) -> Dict[str, Any]:
    target = below(real_root, path)
    if target and not dry_run and os.path.isdir(os.path.join(target, "tmp")) \
            and not os.path.islink(os.path.join(target, "tmp")):
        ramstore._overwrite_tree(os.path.join(target, "tmp"))
    return remove_item(real_root, path, dry_run)


def verify(lexical: str, real_root: str, run_ids: List[str]) -> List[Dict[str, str]]:
    """What is still there after cleanup, each with why it matters."""
    left: List[Dict[str, str]] = []
    if os.path.lexists(real_root):
        size, count = tree_size(real_root)
        left.append({"kind": "root", "path": real_root,
                     "why": "still exists (%d entries, %d bytes)" % (count, size)})
    for run_id in run_ids:
        ram = find_ram_store(run_id)
        if ram:
            left.append({"kind": "ramstore", "path": ram["path"], "why": "still exists"})
    for session in tmux_sessions():
        if any(session["name"].startswith(session_name(r)) for r in run_ids) or \
                real_root in session["command"] or lexical in session["command"]:
            left.append({"kind": "tmux", "path": session["name"], "why": "still running"})
    for job in deadman.find_jobs([lexical, real_root]):
        left.append({"kind": "deadman", "path": job["what"], "why": "still scheduled"})
    return left


def _host_facts() -> Dict[str, Any]:
    import platform

    return {"platform": sys.platform, "machine": platform.machine(),
            "user": os.environ.get("USER") or str(os.getuid()),
            "home": os.path.expanduser("~"), "time": time.time()}
