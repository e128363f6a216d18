"""remotemac's agent on the host: its operations (``OPS``), each JSON in, JSON out.

The resident agent (resident.py) serves them; ``hostagent OP`` (:func:`main`, started
by shared.py's boot) runs one of them alone, with the request on stdin.

Standard library only, Python 3.9+. Every operation takes one JSON object on
stdin and prints one JSON object on stdout: ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": "...", "code": "..."}``. Secrets (the data key) only
ever arrive inside that stdin document, never in argv or the environment.

Everything it creates lives under the ``root`` it is given, and is listed in
``<root>/inventory.json`` so that ``remotemac cleanup`` can remove it later even
if the laptop's journal is gone.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import importlib
import io
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, List, Optional

from . import protocol, safefs
from .agentutil import cpu_seconds, find_tool, pid_alive, tmux_path
from .protocol import JsonObject
from .shared import agent_argv

Op = protocol.Op

AGENT_DIR = os.path.dirname(os.path.abspath(__file__))
HEARTBEAT_STALE_S = 15.0
#: knobs read from the agent's environment (tests, or a host where tmux misbehaves)
ENV_STALE_S = protocol.ENV_HEARTBEAT_STALE_S
ENV_NO_TMUX = protocol.ENV_NO_TMUX
FINAL_STATES = protocol.FINAL_STATES


class AgentError(Exception):
    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------ the job's files


@dataclasses.dataclass
class JobSpec(protocol.LaunchRequest):
    """``status/<device>.spec.json``: the launch request as the runner reads it, with
    where its status and log go (:func:`op_launch` writes it, runner.py reads it).

    ``use_tmux`` false runs the job daemonised; ``caffeinate`` false lets a Mac sleep;
    ``skip_access_check`` skips guards.check_access (a relaunch). Read back with
    ``from_json``, a spec writes the keys it was read with (``extra`` the others)."""

    status_path: str = ""
    log_path: str = ""
    use_tmux: Any = True
    caffeinate: Any = True
    skip_access_check: Any = False


@dataclasses.dataclass
class JobStatusFile(protocol.Message):
    """``status/<device>.json``: the job as its runner keeps it, written last at its end
    (``state`` one of protocol.JobState; :func:`op_launch` writes the first,
    ``starting``). Read with ``from_json``, a file writes back exactly its own keys
    (older files' too); a field left None is not written."""

    state: Optional[str] = None
    device: Optional[str] = None
    created_at: Optional[float] = None
    runner_pid: Optional[int] = None
    #: procid.identity of the runner and of the workload: who may be signalled
    runner_start: Optional[JsonObject] = None
    mode: Optional[str] = None
    started_at: Optional[float] = None
    heartbeat_at: Optional[float] = None
    command: Optional[str] = None
    session: Optional[str] = None
    #: the spec's ``relaunch`` (``{reason, marker, previous}``) when this is a relaunch
    relaunched: Any = None
    caffeinate: Optional[List[str]] = None
    child_pid: Optional[int] = None
    child_start: Optional[JsonObject] = None
    child_argv: Optional[List[str]] = None
    child_cmdline: Optional[str] = None
    #: runner.DiskWatch.report(): free space of each watched volume
    disk: Optional[JsonObject] = None
    disk_warning: Optional[str] = None
    disk_full: Optional[str] = None
    peak_rss_bytes: Optional[int] = None
    processes: Optional[int] = None
    #: ckptconvert.py's answer, when the job's checkpoints were converted
    converted: Optional[JsonObject] = None
    exit_code: Optional[int] = None
    ended_at: Optional[float] = None
    reason: Optional[str] = None
    hangup_at: Optional[float] = None
    hangup: Optional[str] = None

    @property
    def final(self) -> bool:
        return protocol.is_final(self.state)

    @property
    def beat(self) -> float:
        """When the runner last said it was alive (0: never)."""
        return float(self.heartbeat_at or self.created_at or 0)


def read_status(path: str) -> Optional[JobStatusFile]:
    """A job's status file, or None when there is none (a FIFO or a link is never opened)."""
    data = _read_json(path)
    return None if data is None else JobStatusFile.from_json(data)


# ------------------------------------------------------------------ helpers


def _safe_under(root: str, path: str) -> str:
    """Resolve ``path`` and refuse anything that is not strictly below ``root``."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real == real_root or not real.startswith(real_root + os.sep):
        raise AgentError("refusing %s: not below %s" % (path, root), "unsafe-path")
    return real


def _atomic_write_json(path: str, data: Any) -> None:
    safefs.write_json_atomic(path, data)


def _read_json(path: str, default: Any = None) -> Any:
    """A JSON file, or ``default``; a FIFO or a link there is never opened."""
    data = safefs.read_json_file(path)
    return default if data is None else data


def inventory_add(root: str, kind: str, path: str, run_id: str | None = None) -> None:
    """Record something remotemac created; idempotent."""
    inv_path = os.path.join(root, "inventory.json")
    inv = _read_json(inv_path, {"version": 1, "items": []})
    if not isinstance(inv, dict) or not isinstance(inv.get("items"), list):
        inv = {"version": 1, "items": []}
    for item in inv["items"]:
        if item["kind"] == kind and item["path"] == path:
            return
    inv["items"].append({"kind": kind, "path": path, "run_id": run_id, "created_at": time.time()})
    _atomic_write_json(inv_path, inv)


def stale_after_s(stale_s: Any = None) -> float:
    """Seconds without a heartbeat before a job may be called lost (request, env, default)."""
    for value in (stale_s, os.environ.get(ENV_STALE_S)):
        try:
            if value is not None and float(value) > 0:
                return float(value)
        except ValueError:
            pass
    return HEARTBEAT_STALE_S


def tmux_wanted(use_tmux: Any = True) -> bool:
    return bool(use_tmux) and os.environ.get(ENV_NO_TMUX, "") in ("", "0")


def tmux_install_hint(platform: str, brew: str | None) -> str | None:
    """What to tell the user when tmux is missing: an offer, never an install."""
    if platform == "darwin" and brew:
        return (
            "tmux is not installed on the host; install it with `brew install tmux`"
            " (Homebrew: %s)" % brew
        )
    return None


def brew_path() -> str | None:
    return find_tool("brew")


def tmux_alive(session: str) -> bool | None:
    tmux = tmux_path()
    if not tmux:
        return None
    res = subprocess.run(
        [tmux, "has-session", "-t", "=" + session],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return res.returncode == 0


def sha256_file(path: str, size: int | None = None) -> str:
    """SHA-256 of the file, or of its first ``size`` bytes (what a listing promised:
    a file still growing hashes as it was when its size was taken)."""
    digest = hashlib.sha256()
    left = size
    with open(path, "rb") as fh:
        while left is None or left > 0:
            block = fh.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            digest.update(block)
            if left is not None:
                left -= len(block)
    return digest.hexdigest()


# ------------------------------------------------------------------ operations


def op_ping(req: JsonObject) -> JsonObject:
    import platform

    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": sys.platform,
        "machine": platform.machine(),
        "time": time.time(),
        "tmux": tmux_path(),
        "agent_dir": AGENT_DIR,
        "protocol": protocol.PROTOCOL_VERSION,
    }


def root_marker(root: str) -> dict[str, Any]:
    """The root's ownership marker; the root is claimed first when it has none
    (cleanupops.op_claim_root refuses a root holding files remotemac did not write)."""
    marker = safefs.marker_of(root)
    if marker is not None and marker.get("kind") == "root":
        return marker
    from . import cleanupops

    claimed = cleanupops.op_claim_root({"root": root})
    if "refused" in claimed:
        raise AgentError("remote_root %s: %s" % (root, claimed["refused"]), "not-ours")
    return safefs.marker_of(root) or {}


def owned_dir(path: str, info: JsonObject) -> str:
    """Create (or find again) a directory remotemac owns, with its marker (``info``:
    the marker file's body, safefs writes it)."""
    try:
        safefs.ensure_owned_dir(path, info)
    except safefs.NotOurs as exc:
        raise AgentError(str(exc), "not-ours") from None
    return path


def op_prepare_run(req: JsonObject) -> JsonObject:
    root, run_id = req["root"], req["run_id"]
    marker = root_marker(root)
    runs = os.path.join(root, "runs")
    os.makedirs(runs, mode=0o700, exist_ok=True)
    run_dir = os.path.join(runs, run_id)
    _safe_under(root, runs + "/x")
    owned_dir(run_dir, {"kind": "run", "run_id": run_id, "root_id": marker.get("root_id")})
    paths = {}
    for sub in ("project", "data", "out", "logs", "status", "tmp", "cache"):
        path = os.path.join(run_dir, sub)
        os.makedirs(path, mode=0o700, exist_ok=True)
        paths[sub] = path
    _safe_under(root, run_dir)
    inventory_add(root, "run", run_dir, run_id)
    agent = safefs.marker_of(AGENT_DIR)
    if agent is not None and agent.get("kind") == "agent":  # this very agent, below root
        inventory_add(root, "agent", AGENT_DIR)
    extracted = None
    project = req.get("project")
    if isinstance(project, dict) and project.get("data_b64"):
        # a small project comes with the request: no extract call (a round trip) after it
        extracted = op_extract_project({"dest": paths["project"], "data_b64": project["data_b64"]})
    answer = protocol.PrepareRunAnswer(run_dir=run_dir, paths=paths, extracted=extracted)
    return answer.to_json()


def op_launch(req: JsonObject) -> JsonObject:
    """Start the runner for one device, in tmux when present, else daemonised.

    One launch of a device at a time (a flock beside its status): the host starts the
    next device itself when a job ends (runner.py ``_launch_next``) and a laptop that
    re-attaches at that moment launches it too. Unlocked, both found no live job and
    both started one: the second's ``tmux kill-session`` killed the first after a few
    lines (its log then held those lines and the whole log again), or its
    ``new-session`` failed "duplicate session". Locked, the second waits until the
    first's runner has said it runs, and answers ``already_running``."""
    spec = JobSpec.from_json(req)
    lock = os.open(  # in the run's status dir, made with the run (prepare_run)
        os.path.join(spec.run_dir, "status", spec.device + ".launch.lock"),
        os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK,
        0o600,
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _launch_locked(spec, req)
    finally:
        os.close(lock)


def _launch_locked(spec: JobSpec, req: JsonObject) -> JsonObject:
    """Launch under the device's lock; ``spec`` is the request read, the spec once its
    paths are set (``req``: the request as it came, for guards.check_access)."""
    run_dir, device, session = spec.run_dir, spec.device, spec.session
    status_path = os.path.join(run_dir, "status", device + ".json")
    fingerprint_path = os.path.join(run_dir, "status", device + ".fingerprint.json")
    existing = read_status(status_path)
    found = None
    if (
        existing
        and existing.state in protocol.LIVE_STATES
        and (tmux_alive(session) or pid_alive(existing.runner_pid))
    ):
        found = {"already_running": True, "session": session, "mode": existing.mode}
    # ``relaunch: true`` starts a finished job again; ``relaunch: {reason, marker}`` (after
    # a lost job) never does: a job that did reach its end was not lost after all
    lost_relaunch = isinstance(spec.relaunch, dict)
    if found is None and existing and existing.final and (lost_relaunch or not spec.relaunch):
        found = {"already_done": True, "session": session, "status": existing.to_json()}
    if found is not None:
        if spec.fingerprint:  # taken by the launch that started the job (the host's next)
            found["fingerprint"] = _read_json(fingerprint_path)
        return found
    from . import guards

    fingerprinting = None
    if spec.fingerprint:  # before the runner starts: the job's own changes come after it
        fingerprinting = guards.start_env_fingerprint({"python": spec.fingerprint})
    access = None
    try:
        if not spec.skip_access_check:
            access = guards.check_access(req)  # (while the fingerprint's probe runs)
    except BaseException:
        if fingerprinting is not None:  # reap the probe; the access check's error is the answer
            with contextlib.suppress(Exception):
                fingerprinting()
        raise
    fingerprint = fingerprinting() if fingerprinting is not None else None
    if fingerprint is not None:
        _atomic_write_json(fingerprint_path, fingerprint)
    spec_path = os.path.join(run_dir, "status", device + ".spec.json")
    tmux = tmux_path() if tmux_wanted(spec.use_tmux) else None
    if lost_relaunch:
        spec.relaunch = dict(spec.relaunch, previous=existing.to_json() if existing else None)
    spec.status_path = status_path
    spec.log_path = os.path.join(run_dir, "logs", device + ".log")
    spec.mode = "tmux" if tmux else "daemon"
    if "metrics_path" not in req:
        spec.metrics_path = os.path.join(run_dir, "logs", device + ".rss.jsonl")
    if spec.next:  # the next launch request, as the runner hands it to op_launch
        wanted = JobSpec.from_json(spec.next).use_tmux
        spec.next = dict(spec.next, use_tmux=bool(tmux) and wanted)
    _atomic_write_json(spec_path, spec.to_json())
    starting = JobStatusFile(
        state=protocol.JobState.STARTING, device=device, created_at=time.time()
    )
    _atomic_write_json(status_path, starting.to_json())
    argv = agent_argv(sys.executable, AGENT_DIR, "runner", spec_path, site=True)
    mode = _start_runner(argv, tmux, session)
    deadline = time.time() + 10
    while time.time() < deadline:
        status = read_status(status_path)
        if status is None or status.state != protocol.JobState.STARTING:
            break
        # the launch's answer waits for this: every 10 ms (a small file read), not 50
        time.sleep(0.01)
    status = read_status(status_path)
    answer = {
        "session": session,
        "mode": mode,
        "status": status.to_json() if status else {},
        "access": access,
    }
    if fingerprint is not None:
        answer["fingerprint"] = fingerprint
    if not tmux and not tmux_path():
        answer["tmux_hint"] = tmux_install_hint(sys.platform, brew_path())
    return answer


def _start_runner(argv: list[str], tmux: str | None, session: str) -> str:
    """Start the job's runner: in a new tmux session (one of that name goes first), or
    detached in its own session (double fork + setsid) when there is no tmux; the mode."""
    if tmux:
        subprocess.run(
            [tmux, "kill-session", "-t", "=" + session],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        res = subprocess.run(
            [
                tmux,
                "new-session",
                "-d",
                "-s",
                session,
                "-x",
                "200",
                "-y",
                "50",
                " ".join(shlex.quote(a) for a in argv),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        if res.returncode != 0:
            raise AgentError("tmux new-session failed: %s" % res.stdout.decode().strip(), "launch")
        return "tmux"
    else:
        from .deadman import spawn_detached  # double fork + setsid, shared with the dead-man

        spawn_detached(argv)
        return "daemon"


def op_extract_project(req: JsonObject) -> JsonObject:
    """Unpack the uploaded project tar into ``dest``, refusing unsafe members."""
    import tarfile

    dest, archive = req["dest"], req.get("archive")
    real_dest = os.path.realpath(dest)
    count = 0
    # a small project comes inside the request (``data_b64``), a larger one as a file
    source = (
        {"fileobj": io.BytesIO(base64.b64decode(req["data_b64"]))}
        if req.get("data_b64")
        else {"name": archive}
    )
    with tarfile.open(mode="r", **source) as tar:
        members = tar.getmembers()
        for member in members:
            name = member.name
            target = os.path.realpath(os.path.join(real_dest, name))
            if (
                os.path.isabs(name)
                or ".." in name.split("/")
                or not member.isreg()
                and not member.isdir()
                or not target.startswith(real_dest + os.sep)
            ):
                raise AgentError("unsafe member in project archive: %r" % name, "unsafe-path")
        for member in members:
            tar.extract(member, real_dest, set_attrs=False)
            count += member.isreg()
    if archive and not req.get("data_b64"):
        os.unlink(archive)
    return {"files": count}


@dataclasses.dataclass
class StatusQuery(protocol.StatusRequest):
    """A ``status`` request; ``stale_s`` overrides the heartbeat's staleness (tests)."""

    stale_s: Any = None


def op_status(req: JsonObject) -> JsonObject:
    query = StatusQuery.from_json(req)
    run_dir, device = query.run_dir, query.device
    status = read_status(os.path.join(run_dir, "status", device + ".json"))
    now = time.time()
    alive = tmux_alive(query.session)
    result: JsonObject = {  # a protocol.JobStatus answer, keys as it always had them
        "status": status.to_json() if status is not None else None,
        "now": now,
        "tmux_alive": alive,
        "log_size": _size(os.path.join(run_dir, "logs", device + ".log")),
    }
    if status is None:
        result["state"] = protocol.JobState.ABSENT
        return result
    state = status.state
    runner_alive = pid_alive(status.runner_pid)
    result["runner_alive"] = runner_alive
    stale_s = stale_after_s(query.stale_s)
    stale = now - status.beat > stale_s
    result["stale_after_s"] = stale_s
    if not status.final and stale and not runner_alive and not alive:
        state = protocol.JobState.LOST
        result["lost_reason"] = status.hangup or (
            "runner gone, no heartbeat for %ds" % int(now - status.beat)
        )
    result["state"] = state
    return result


#: how often a waiting ``status`` looks at the log and the status file, and how long
#: it lingers after a change (a job that prints its last line and ends: one answer)
WAIT_TICK_S = 0.05
SETTLE_S = 0.03
MAX_WAIT_S = 10.0


def op_status_with_log(req: JsonObject) -> JsonObject:
    """``status``; with ``log_from``, the log's next bytes too, read after the status.

    ``wait_s``: answer when the log has grown past ``log_from`` or the job is over, or
    after that long (the laptop's poll, done here: an answer the moment there is news,
    instead of a sleep and a round trip). ``log_only``: the log's bytes and size alone,
    unless the job is over (then the whole status)."""
    query = StatusQuery.from_json(req)
    path = os.path.join(query.run_dir, "logs", query.device + ".log")
    status_path = os.path.join(query.run_dir, "status", query.device + ".json")
    logging = isinstance(query.log_from, int) and query.log_from >= 0
    wait = min(max(float(query.wait_s or 0), 0.0), MAX_WAIT_S) if logging else 0.0
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if _size(path) > int(query.log_from or 0) or _over(status_path):
            time.sleep(SETTLE_S)
            break
        time.sleep(WAIT_TICK_S)
    result = (
        {"log_size": _size(path)} if query.log_only and not _over(status_path) else op_status(req)
    )
    if logging:
        chunk = read_log(path, query.log_from, max(0, min(int(query.log_max), 8 << 20)))
        if chunk is not None:
            result["log_b64"] = base64.b64encode(chunk).decode("ascii")
    return result


def _over(status_path: str) -> bool:
    status = read_status(status_path)
    return status is not None and status.final


def read_log(path: str, offset: int, size: int) -> Optional[bytes]:
    """Up to ``size`` bytes of the regular file ``path`` from ``offset`` (None: no such
    file, or not a regular file: a FIFO is never waited on, a link never followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def op_stop(req: JsonObject) -> JsonObject:
    query = StatusQuery.from_json(req)
    run_dir, session = query.run_dir, query.session
    status = read_status(os.path.join(run_dir, "status", query.device + ".json"))
    status = status or JobStatusFile()
    from . import wipeops

    left = []
    for pid, child in ((status.child_pid, True), (status.runner_pid, False)):
        if pid and pid_alive(pid):
            why = (
                wipeops.child_is_ours(pid, status)
                if child
                else wipeops.runner_is_ours(pid, status, [run_dir])
            )
            if why:  # a reused pid: never signal it
                left.append("process:%s (left alone: %s)" % (pid, why))
                continue
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGTERM)
    tmux = tmux_path()
    if tmux and session:
        subprocess.run(
            [tmux, "kill-session", "-t", "=" + session],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    return {"stopped": True, "left_alone": left}


def op_list_outputs(req: JsonObject) -> JsonObject:
    """Every entry below ``dir`` with its kind, size and sha256; links never followed.

    ``name_hex`` is the entry's relative path as the file system's bytes: the
    orchestrator validates those bytes (UTF-8, length) rather than a decoded guess.
    ``hash: false`` leaves the sha256 out: the pull starts moving bytes on that quick
    listing while a second call hashes the files on the host. ``upto`` (name_hex to
    size, from the quick listing) hashes only the first that many bytes of each file
    and gives that size, so a file still growing hashes as it was first listed.
    """
    base = req["dir"]
    with_hash = req.get("hash", True) is not False
    upto = req.get("upto") if isinstance(req.get("upto"), dict) else {}
    entries = []
    if not os.path.isdir(base) or os.path.islink(base):
        return {"entries": entries}
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, base)
            raw = {"path": rel, "name_hex": os.fsencode(rel).hex()}
            try:
                st = os.lstat(full)
                if stat.S_ISLNK(st.st_mode):
                    entries.append(dict(raw, kind="link", size=0))
                elif stat.S_ISDIR(st.st_mode):
                    entries.append(dict(raw, kind="dir", size=0))
                elif stat.S_ISREG(st.st_mode):
                    size = st.st_size
                    cap = upto.get(raw["name_hex"])
                    if isinstance(cap, int) and 0 <= cap < size:
                        size = cap
                    entry = dict(raw, kind="file", size=size)
                    if with_hash:
                        entry["sha256"] = sha256_file(full, size)
                    entries.append(entry)
                else:
                    entries.append(dict(raw, kind="other", size=0))
            except OSError as exc:  # e.g. a path past PATH_MAX: listed, never pulled
                entries.append(dict(raw, kind="unreadable", size=0, error=exc.strerror))
    return {"entries": entries}


#: an op: the request as JSON just read, the result as JSON about to be sent
Handler = Callable[[JsonObject], JsonObject]
#: the handler of every op the agent serves, keyed by ``protocol.Op`` (a ``str``: the
#: wire name looks its handler up directly)
OPS: dict[str, Handler] = {
    Op.PING: op_ping,
    Op.PREPARE_RUN: op_prepare_run,
    Op.LAUNCH: op_launch,
    Op.STATUS: op_status_with_log,
    Op.STOP: op_stop,
    Op.EXTRACT_PROJECT: op_extract_project,
    Op.LIST_OUTPUTS: op_list_outputs,
}


def _lazy(module: str, name: str) -> Handler:
    def call(req: JsonObject) -> JsonObject:
        return getattr(importlib.import_module("." + module, __package__), name)(req)

    return call


#: ops served by another agent module, imported on first use (``op_<name>`` there)
LAZY_OPS: dict[str, str] = {
    Op.ENSURE_VENV: "venvops",
    Op.PREPARE_DATA: "dataops",
    Op.WIPE_RUN_DATA: "wipeops",
    Op.CLEANUP_HOST: "cleanupops",
    Op.DEADMAN_SCHEDULE: "deadman",
    Op.DEADMAN_CANCEL: "deadman",
    Op.FREEZE_ENV: "envfreeze",
    Op.CHECK_ACCESS: "guards",
    Op.CHECK_SPACE: "guards",
    Op.ENV_FINGERPRINT: "guards",
    Op.RUNTIME_STATUS: "agentruntime",
    Op.RUNTIME_ENSURE: "agentruntime",
    Op.FIND_PYTHON: "pythons",
    Op.BRING: "bring",
}
for _op, _module in LAZY_OPS.items():
    OPS[_op] = _lazy(_module, Op(_op).function)
del _op, _module


#: a full disk or quota: the host's environment (exit 6), not an agent bug
_NO_SPACE = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def error_answer(exc: BaseException) -> JsonObject:
    """One line for the laptop. An exception's own ``code`` (and pip's ``tail``) travels
    along; a missing module is the host's environment, not remotemac's bug."""
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code:
        answer = protocol.Answer(error=str(exc), code=code)
    elif isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        where = " writing %s" % exc.filename if exc.filename else ""
        answer = protocol.Answer(
            error="the host's disk is full (%s)%s: free some space on the host or "
            "choose another remote_root" % (exc.strerror or "no space left", where),
            code=protocol.ErrorCode.NO_SPACE,
        )
    else:
        answer = protocol.Answer(
            error="%s: %s" % (type(exc).__name__, exc),
            code=(
                protocol.ErrorCode.HOST_ENV
                if isinstance(exc, ImportError)
                else protocol.ErrorCode.INTERNAL
            ),
        )
    tail = getattr(exc, "tail", None)
    if tail:
        answer.tail = [str(line) for line in tail]
    return answer.to_json()


def main(args: list[str]) -> int:
    """``hostagent OP`` (see shared.py): one operation, JSON in on stdin, one line out."""
    if len(args) != 1 or args[0] not in OPS:
        sys.stdout.write(
            json.dumps(
                {"ok": False, "error": "usage: hostagent OP", "code": protocol.ErrorCode.USAGE}
            )
        )
        return 2
    try:
        raw = sys.stdin.read()
        req = json.loads(raw) if raw.strip() else {}
        result = OPS[args[0]](req)
    except Exception as exc:  # one line back to the orchestrator, never a hang
        sys.stdout.write(json.dumps(error_answer(exc)))
        return 1
    sys.stdout.write(json.dumps({"ok": True, "result": result, "cpu_s": cpu_seconds()}))
    return 0
