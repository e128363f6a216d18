"""The dead-man wipe: the host wipes a run's data at a deadline on its own.

Why: a rental ends whether or not the laptop comes back. With ``wipe_deadline``
in the playbook the agent schedules, on the host itself, the same wipe the
engine runs (wipeops.wipe_run_data: processes stopped, RAM store destroyed,
data/tmp/cache/out deleted), so the data does not outlive the rental.

How:
- macOS: a launchd LaunchAgent ``~/Library/LaunchAgents/com.remotemac.deadman.<run>.plist``
  with ``StartCalendarInterval`` (launchd also runs a missed slot after the Mac
  wakes), loaded with ``launchctl bootstrap gui/<uid>``, else ``user/<uid>``, else
  ``launchctl load -w``; when all fail, the sleeper below. A deadline less than
  two minutes away uses ``RunAtLoad`` and the job waits for the exact second.
- elsewhere: a detached sleeper (double fork + setsid, stdio on /dev/null) whose
  pid is recorded in the inventory. ``at`` is not used: it is often missing or
  disabled, and its queue cannot be attributed to a remote_root afterwards.

The job's spec lives in ``<root>/deadman/<run>.json``; what the wipe did is
written next to it (``<run>.result.json``). ``cleanup`` finds jobs by their
plist or command line naming the root, and removes them (bootout + delete plist,
or kill the sleeper). Python 3.9, standard library only.
"""

from __future__ import annotations

import contextlib
import os
import plistlib
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from . import agentutil, procid, safefs
from .protocol import JsonObject
from .shared import agent_argv

_HERE = os.path.dirname(os.path.abspath(globals().get("__file__") or "."))

#: the commands a wipe or cleanup ran, as its answer's ``steps`` lists them: built by
#: agentutil.run_cmd and friends, never read back (a JSON array under construction)
Steps = List[JsonObject]


@dataclass
class Fate:
    """What became of one thing a wipe or a cleanup meant to remove: ``fate`` (removed,
    would remove, not found, left alone, failed …), its ``bytes`` and ``why``.

    Here, not in wipeops: the destroyers share it (a dead-man job's removal is one), and
    this module loads first (wipeops and cleanupops import it)."""

    fate: str
    bytes: int = 0
    why: Optional[str] = None
    #: what the removal noted on the way (a hard-linked file not zeroed …)
    notes: List[str] = field(default_factory=list)
    #: the entries that kept a root (cleanup's root entry only)
    foreign: Optional[List[str]] = None

    @property
    def failed(self) -> bool:
        return self.fate == "failed"

    def to_json(self) -> JsonObject:
        out: JsonObject = {"fate": self.fate, "bytes": self.bytes}
        if self.why is not None:
            out["why"] = self.why
        if self.notes:
            out["notes"] = self.notes
        if self.foreign is not None:
            out["foreign"] = self.foreign
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> Fate:
        return cls(
            fate=str(data["fate"]),
            bytes=int(data.get("bytes") or 0),
            why=data.get("why"),
            notes=list(data.get("notes") or []),
            foreign=data.get("foreign"),
        )


LABEL_PREFIX = "com.remotemac.deadman."
RUN_AT_LOAD_WITHIN_S = 120.0
SLEEP_STEP_S = 30.0


def label_for(run_id: str) -> str:
    return LABEL_PREFIX + re.sub(r"[^A-Za-z0-9.-]", "-", run_id)


def launch_agents_dir() -> str:
    return os.path.join(os.path.expanduser("~"), "Library", "LaunchAgents")


def launchctl() -> str:
    return shutil.which("launchctl") or "/bin/launchctl"


def spec_path(real_root: str, run_id: str) -> str:
    return os.path.join(real_root, "deadman", run_id + ".json")


#: the keys a scheduled job writes, by method (each always, null included)
_JOB_KEYS = {
    "launchd": ("method", "label", "plist", "domain", "verified", "created_dir"),
    "sleeper": ("method", "pid", "start"),
}


@dataclass
class DeadmanJob:
    """One dead-man job: as scheduled (the arming record's ``job``, the schedule answer,
    its inventory item) or as found on the host (:func:`find_jobs`: ``what`` names it).

    ``launchd``: a LaunchAgent ``label`` (its ``plist``; ``domain`` where launchd holds
    it); ``sleeper``: a detached process ``pid`` with its start identity ``start``."""

    method: str
    what: str = ""
    run_id: Optional[str] = None
    label: Optional[str] = None
    plist: Optional[str] = None
    domain: Optional[str] = None
    verified: Optional[str] = None
    created_dir: Optional[str] = None
    pid: Optional[int] = None
    start: Optional[JsonObject] = None  # procid.identity: written as recorded
    deadline: Optional[float] = None
    spec: Optional[str] = None

    def to_json(self) -> JsonObject:
        """The scheduled job as the arming record, the answer and the inventory hold it."""
        out: JsonObject = {k: getattr(self, k) for k in _JOB_KEYS.get(self.method, ("method",))}
        out.update(deadline=self.deadline, spec=self.spec, run_id=self.run_id)
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> DeadmanJob:
        known = ("method", "run_id", "label", "plist", "domain", "verified", "created_dir")
        job = cls(**{k: data.get(k) for k in known})
        job.method = str(job.method or "")
        job.pid = data["pid"] if isinstance(data.get("pid"), int) else None
        job.start, job.deadline, job.spec = (
            data.get("start"),
            data.get("deadline"),
            data.get("spec"),
        )
        return job


@dataclass
class ArmingRecord:
    """``<root>/deadman/<run>.json``: what the dead-man wipes, when, and the job that
    will do it (``job``, once scheduled). The sleeper polls it; cancelling deletes it."""

    root: str
    run_id: str
    deadline: float
    sessions: List[str] = field(default_factory=list)
    created_at: float = 0.0
    platform: str = ""
    job: Optional[DeadmanJob] = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "root": self.root,
            "run_id": self.run_id,
            "deadline": self.deadline,
            "sessions": self.sessions,
            "created_at": self.created_at,
            "platform": self.platform,
        }
        if self.job is not None:
            out["job"] = self.job.to_json()
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> ArmingRecord:
        job = data.get("job")
        return cls(
            root=data["root"],
            run_id=data["run_id"],
            deadline=float(data["deadline"]),
            sessions=list(data.get("sessions") or []),
            created_at=data.get("created_at") or 0.0,
            platform=data.get("platform") or "",
            job=DeadmanJob.from_json(job) if isinstance(job, dict) else None,
        )


def read_record(spec_file: str) -> Optional[ArmingRecord]:
    """The arming record, or None when it is gone (cancelled) or not a regular file."""
    data = safefs.read_json_file(spec_file)
    if not isinstance(data, dict):
        return None
    return ArmingRecord.from_json(data)


# ------------------------------------------------------------------ scheduling


def op_deadman_schedule(req: JsonObject) -> JsonObject:
    return schedule(req)


def schedule(req: JsonObject, platform: Optional[str] = None) -> JsonObject:
    """Schedule the wipe of ``run_id`` at ``deadline`` (Unix time); idempotent. The
    request ``{root, run_id, deadline, sessions}``; the answer the job and its steps."""
    from . import wipeops

    lexical, real_root = wipeops.check_root(req["root"])
    run_id = req["run_id"]
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$", run_id):
        raise wipeops.UnsafeRoot("run id %r is not valid" % run_id)
    deadline = float(req["deadline"])
    platform = platform or sys.platform
    steps: Steps = []
    cancel(real_root, run_id, steps=steps, roots=[lexical, real_root], keep_spec=True)
    spec_file = spec_path(real_root, run_id)
    spec_dir = os.path.dirname(spec_file)
    if not os.path.isdir(spec_dir):
        os.mkdir(spec_dir, 0o700)
        safefs.mark_dir(
            spec_dir,
            {"kind": "deadman", "root_id": (safefs.marker_of(real_root) or {}).get("root_id")},
        )
    record = ArmingRecord(
        root=real_root,
        run_id=run_id,
        deadline=deadline,
        sessions=list(req.get("sessions") or []),
        created_at=time.time(),
        platform=platform,
    )
    _write_json(spec_file, record.to_json())
    job: Optional[DeadmanJob] = None
    if platform == "darwin":
        job = _schedule_launchd(record, spec_file, steps)
    if job is None:
        job = _schedule_sleeper(spec_file, steps)
    job.deadline, job.spec, job.run_id = deadline, spec_file, run_id
    record.job = job
    _write_json(spec_file, record.to_json())
    _inventory_set(real_root, dict(job.to_json(), kind="deadman", path=spec_file))
    return dict(job.to_json(), steps=steps)


def _schedule_launchd(record: ArmingRecord, spec_file: str, steps: Steps) -> Optional[DeadmanJob]:
    label = label_for(record.run_id)
    agents = launch_agents_dir()
    created_dir = not os.path.isdir(agents)
    os.makedirs(agents, mode=0o755, exist_ok=True)
    plist = os.path.join(agents, label + ".plist")
    deadline = record.deadline
    content: JsonObject = {  # the plist, as plistlib writes it
        "Label": label,
        "ProgramArguments": agent_argv(sys.executable, _HERE, "deadman", "fire", spec_file),
        "StandardOutPath": spec_file[:-5] + ".log",
        "StandardErrorPath": spec_file[:-5] + ".log",
        "ProcessType": "Background",
    }
    if deadline - time.time() < RUN_AT_LOAD_WITHIN_S:
        content["RunAtLoad"] = True
    else:
        content["RunAtLoad"] = False
        content["StartCalendarInterval"] = calendar_slot(deadline)
    with open(plist + ".tmp", "wb") as fh:
        plistlib.dump(content, fh)
    os.replace(plist + ".tmp", plist)
    uid = os.getuid()
    for argv, domain in (
        ([launchctl(), "bootstrap", "gui/%d" % uid, plist], "gui/%d" % uid),
        ([launchctl(), "bootstrap", "user/%d" % uid, plist], "user/%d" % uid),
        ([launchctl(), "load", "-w", plist], "load"),
    ):
        code, _out, _err = agentutil.run_cmd(argv, steps)
        if code != 0:
            continue
        held = _held_by(label, domain, uid, steps)
        if held:
            return DeadmanJob(
                "launchd",
                label=label,
                plist=plist,
                domain=held,
                verified="launchctl print %s/%s" % (held, label),
                created_dir=agents if created_dir else None,
            )
        if domain == "load":  # legacy load said 0 and loaded nothing: undo what it may hold
            agentutil.run_cmd([launchctl(), "unload", plist], steps)
    os.unlink(plist)
    if created_dir:
        with contextlib.suppress(OSError):
            os.rmdir(agents)
    return None


def _held_by(label: str, domain: str, uid: int, steps: Steps) -> Optional[str]:
    """The domain where launchd really holds ``label`` after a load said 0, or None.

    Why: legacy ``launchctl load`` prints a failure and still exits 0 on some releases
    (and an SSH-only login has no GUI domain): only ``launchctl print`` tells.
    """
    domains = ["gui/%d" % uid, "user/%d" % uid] if domain == "load" else [domain]
    for where in domains:
        code, _out, _err = agentutil.run_cmd(
            [launchctl(), "print", "%s/%s" % (where, label)], steps
        )
        if code == 0:
            return where
    return None


def calendar_slot(deadline: float) -> Dict[str, int]:
    """launchd StartCalendarInterval for the first local minute at or after ``deadline``."""
    minute = int(-(-deadline // 60) * 60)
    t = time.localtime(minute)
    return {"Month": t.tm_mon, "Day": t.tm_mday, "Hour": t.tm_hour, "Minute": t.tm_min}


def _schedule_sleeper(spec_file: str, steps: Steps) -> DeadmanJob:
    argv = agent_argv(sys.executable, _HERE, "deadman", "sleep", spec_file)
    pid = spawn_detached(argv)
    steps.append({"argv": argv, "code": 0, "time": time.time(), "detached_pid": pid})
    return DeadmanJob("sleeper", pid=pid, start=procid.identity(pid))


def spawn_detached(argv: List[str]) -> int:
    """Double fork + setsid; returns the pid of the process that runs ``argv``.

    The grandchild is in its own session with stdio on /dev/null, so it outlives
    the agent call, the SSH session (no SIGHUP) and does not hold the channel open.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read_end)
            os.setsid()
            grandchild = os.fork()
            if grandchild:
                os.write(write_end, str(grandchild).encode())
                os._exit(0)
            os.close(write_end)
            os.chdir("/")
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    os.close(write_end)
    os.waitpid(pid, 0)
    data = b""
    while True:
        chunk = os.read(read_end, 64)
        if not chunk:
            break
        data += chunk
    os.close(read_end)
    return int(data or b"0")


# ------------------------------------------------------------------ finding, removing


def find_jobs(roots: List[str], run_ids: Optional[List[str]] = None) -> List[DeadmanJob]:
    """Dead-man jobs that belong to one of ``roots``: plists and sleeper processes."""

    marks = [r for r in roots if r]
    jobs: List[DeadmanJob] = []
    agents = launch_agents_dir()
    seen_labels = set()
    if os.path.isdir(agents):
        for name in sorted(os.listdir(agents)):
            if not (name.startswith(LABEL_PREFIX) and name.endswith(".plist")):
                continue
            path = os.path.join(agents, name)
            try:
                content = plistlib.loads(safefs.read_regular_at(None, path) or b"")
                args = " ".join(str(a) for a in content.get("ProgramArguments", []))
            except Exception:  # a damaged plist of ours is still ours by name
                content, args = {}, ""
            if args and not any(procid.names_path(args, m + "/deadman") for m in marks):
                continue
            label = str(content.get("Label") or name[: -len(".plist")])
            seen_labels.add(label)
            jobs.append(
                DeadmanJob("launchd", "launchd:" + label, _run_of(args), label=label, plist=path)
            )
    if run_ids and sys.platform == "darwin":
        for label in loaded_labels():
            if label in seen_labels:
                continue
            for run_id in run_ids:
                if label == label_for(run_id):
                    jobs.append(DeadmanJob("launchd", "launchd:" + label, run_id, label=label))
    me = os.getpid()
    for pid, line in agentutil.all_processes():
        if pid == me or "deadman.py" not in line or " sleep " not in line + " ":
            continue
        if any(procid.names_path(line, m + "/deadman") for m in marks):
            jobs.append(sleeper_job(pid, _run_of(line), procid.identity(pid)))
    return jobs


def sleeper_job(pid: int, run_id: Optional[str], start: Optional[JsonObject]) -> DeadmanJob:
    """A live sleeper process, found on the host."""
    return DeadmanJob("sleeper", "sleeper:%d" % pid, run_id, pid=pid, start=start)


def _run_of(text: str) -> Optional[str]:
    match = re.search(r"/deadman/([A-Za-z0-9][A-Za-z0-9._-]*)\.json", text)
    return match.group(1) if match else None


def parse_launchctl_list(text: str) -> List[str]:
    """Labels from ``launchctl list`` (TAB-separated PID, Status, Label; header first)."""
    labels = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] != "PID":
            labels.append(fields[-1])
    return labels


def loaded_labels() -> List[str]:

    code, out, _ = agentutil.run_cmd([launchctl(), "list"])
    return parse_launchctl_list(out) if code == 0 else []


def remove_job(job: DeadmanJob, steps: Steps) -> Fate:
    """Unload + delete a LaunchAgent, or stop a sleeper; the fate for the record."""
    if job.method == "sleeper":
        pid = int(job.pid or 0)
        line = agentutil.cmdline(pid)
        if not line or "deadman.py" not in line:
            return Fate("not found")
        if not procid.same_start(pid, job.start):
            return Fate(
                "left alone",
                why="pid %d is not the sleeper remotemac started (start time differs)" % pid,
            )
        ok = agentutil.terminate(pid, steps, group=False, start=job.start)
        return Fate(
            "removed" if ok else "failed", why=None if ok else "sleeper %d would not stop" % pid
        )
    label, plist = str(job.label), job.plist
    uid = os.getuid()
    unloaded = False
    for argv in (
        [launchctl(), "bootout", "gui/%d/%s" % (uid, label)],
        [launchctl(), "bootout", "user/%d/%s" % (uid, label)],
    ):
        code, _o, _e = agentutil.run_cmd(argv, steps)
        if code == 0:
            unloaded = True
            break
    if not unloaded and plist:
        code, _o, _e = agentutil.run_cmd([launchctl(), "unload", plist], steps)
        unloaded = code == 0
    size = 0
    if plist and os.path.lexists(plist):
        size = os.lstat(plist).st_size
        try:
            os.unlink(plist)
        except OSError as exc:
            return Fate("failed", why="cannot delete %s: %s" % (plist, exc))
    still = sys.platform == "darwin" and label in loaded_labels()
    if still:
        return Fate("failed", size, why="launchd still lists %s" % label)
    return Fate("removed", size)


@dataclass
class Cancelled:
    """One dead-man job a cancel removed (or tried to): which, and its fate."""

    what: str
    fate: Fate

    def to_json(self) -> JsonObject:
        return dict(self.fate.to_json(), what=self.what)


def cancel(
    real_root: str,
    run_id: str,
    steps: Steps,
    roots: List[str],
    keep_spec: bool = False,
) -> List[Cancelled]:
    """Remove this run's dead-man jobs (after a verified wipe, or to reschedule)."""
    done = []
    for job in find_jobs(roots, [run_id]):
        if job.run_id != run_id:
            continue
        done.append(Cancelled(job.what, remove_job(job, steps)))
    if not keep_spec:
        spec_file = spec_path(real_root, run_id)
        if os.path.isfile(spec_file) and not os.path.islink(spec_file):
            os.unlink(spec_file)
    return done


def op_deadman_cancel(req: JsonObject) -> JsonObject:
    from . import wipeops

    lexical, real_root = wipeops.check_root(req["root"])
    steps: Steps = []
    jobs = cancel(real_root, req["run_id"], steps=steps, roots=[lexical, real_root])
    return {"jobs": [j.to_json() for j in jobs], "steps": steps}


# ------------------------------------------------------------------ running on the host


def fire(spec_file: str, now: Optional[float] = None) -> Optional[JsonObject]:
    """Run the wipe when the deadline has come; None if the spec is gone or it is early.
    The wipe's report (also written to ``<run>.result.json``) otherwise."""
    from . import wipeops

    record = read_record(spec_file)
    if record is None:
        return None
    deadline = record.deadline
    now = time.time() if now is None else now
    if deadline - now > RUN_AT_LOAD_WITHIN_S:
        return None  # launchd fired early (a calendar slot of another year): not yet
    if deadline > now:
        time.sleep(deadline - now)
        # the job (plist, domain) is written once launchd is seen to hold it: after the
        # start of a RunAtLoad job, so read the spec again now
        record = read_record(spec_file)
        if record is None:
            return None  # cancelled while we waited
    report = wipeops.wipe_run(
        wipeops.WipeRequest(record.root, record.run_id, sessions=record.sessions)
    )
    report.fired_at = time.time()
    report.deadline = deadline
    _write_json(spec_file[:-5] + ".result.json", report.to_json())
    job = record.job
    with contextlib.suppress(OSError):
        os.unlink(spec_file)
    if job is not None and job.method == "launchd":
        plist = job.plist
        if plist and os.path.lexists(plist):
            os.unlink(plist)
        domain = job.domain or "gui/%d" % os.getuid()
        argv = (
            [launchctl(), "remove", str(job.label)]
            if domain == "load"
            else [launchctl(), "bootout", "%s/%s" % (domain, job.label)]
        )
        agentutil.run_cmd(argv)  # last: launchd may stop this very process
    return report.to_json()


def sleep_then_fire(spec_file: str) -> int:
    """The sleeper: wake at the deadline (wall clock, so laptop-style sleep is fine)."""
    while True:
        try:
            record = read_record(spec_file)
        except (TypeError, ValueError, KeyError):
            record = None
        if record is None:
            return 0  # cancelled: the spec is gone (or is not a regular file)
        left = record.deadline - time.time()
        if left <= 0:
            break
        time.sleep(max(0.05, min(SLEEP_STEP_S, left)))
    fire(spec_file)
    return 0


def _write_json(path: str, data: Any) -> None:
    safefs.write_json_atomic(path, data)


def _inventory_set(real_root: str, item: JsonObject) -> None:
    """Add or replace one inventory item, keeping hostagent's file format."""
    path = os.path.join(real_root, "inventory.json")
    inv = safefs.read_json_file(path)
    if not isinstance(inv, dict) or not isinstance(inv.get("items"), list):
        inv = {"version": 1, "items": []}
    items = [
        i
        for i in inv.get("items", [])
        if not (i.get("kind") == item["kind"] and i.get("path") == item["path"])
    ]
    item = {k: v for k, v in item.items() if k != "steps"}
    item.setdefault("created_at", time.time())
    items.append(item)
    inv["items"] = items
    _write_json(path, inv)


def main(args: List[str]) -> int:
    """``deadman sleep|fire SPEC`` (see shared.py)."""
    if len(args) == 2 and args[0] == "sleep":
        return sleep_then_fire(args[1])
    if len(args) == 2 and args[0] == "fire":
        fire(args[1])
        return 0
    sys.stderr.write("usage: deadman.py sleep|fire SPEC\n")
    return 2
