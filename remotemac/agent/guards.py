"""Checks before a job starts: can the workload reach its dirs, and does the run fit the disk.

Runs on the host (Python 3.9, standard library). Why before launch: a workload
that finds out after an hour that it cannot write its cache or its outputs has
wasted the hour; so has one that fills the volume with the slice and the venv
before the first step. Both checks answer in one line that says what to do.

The access check runs in a child process with exactly the environment the runner
gives the workload (the agent's own environment plus the job's ``env``), as the
same user, so it sees what the workload will see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from .agentutil import format_mib
from .protocol import CACHE_VARS, ENV_DATA, ENV_OUTPUT, JsonObject, LaunchRequest
from .shared import agent_argv

# CACHE_VARS: the caches remotemac points inside the run dir (engine/jobs.py sets them)
#: the data check opens at most this many files (a dataset may have millions)
READ_SAMPLE = 3


def _agent_error(message: str, code: str) -> Exception:
    """hostagent's AgentError (its code reaches the engine)."""
    from .hostagent import AgentError

    return AgentError(message, code)


# ------------------------------------------------------------------ access


@dataclass(frozen=True)
class AccessPlan:
    """What the access probe checks: ``[what, path]`` pairs to read and to write (it
    travels to the probe's process as JSON on stdin)."""

    read: List[List[str]] = field(default_factory=list)
    write: List[List[str]] = field(default_factory=list)

    def to_json(self) -> JsonObject:
        return {"read": self.read, "write": self.write}

    @classmethod
    def from_json(cls, data: JsonObject) -> "AccessPlan":
        return cls(read=data.get("read", []), write=data.get("write", []))


@dataclass(frozen=True)
class AccessCheck:
    """One probed dir: ``entries`` it lists (read) or the ``error`` that refused it."""

    what: str
    path: str
    mode: str
    ok: bool = True
    entries: Optional[int] = None
    error: Optional[str] = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"what": self.what, "path": self.path, "mode": self.mode, "ok": self.ok}
        if self.entries is not None:
            out["entries"] = self.entries
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> "AccessCheck":
        return cls(
            what=data["what"],
            path=data["path"],
            mode=data["mode"],
            ok=data["ok"],
            entries=data.get("entries"),
            error=data.get("error"),
        )


def plan_access(env: Dict[str, str]) -> AccessPlan:
    """What to check for a job's ``env``: [what, path] pairs to read and to write."""
    read, write = [], []
    if env.get(ENV_DATA):
        read.append(["data dir", env[ENV_DATA]])
    if env.get(ENV_OUTPUT):
        write.append(["output dir", env[ENV_OUTPUT]])
    for var in CACHE_VARS:
        if env.get(var):
            write.append(["cache " + var, env[var]])
    return AccessPlan(read, write)


def _probe(plan: AccessPlan) -> List[AccessCheck]:
    """In the workload's environment: read the data dir, create and write every other dir."""
    results = []
    for what, path in plan.read:
        try:
            names = sorted(os.listdir(path))
            opened = 0
            for dirpath, _dirs, files in os.walk(path):
                for name in sorted(files):
                    if opened >= READ_SAMPLE:
                        break
                    with open(os.path.join(dirpath, name), "rb") as fh:
                        fh.read(1)
                    opened += 1
                if opened >= READ_SAMPLE:
                    break
            results.append(AccessCheck(what, path, "read", entries=len(names)))
        except OSError as exc:
            results.append(AccessCheck(what, path, "read", False, error=exc.strerror or str(exc)))
    for what, path in plan.write:
        entry = AccessCheck(what, path, "write")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".remotemac-access-", dir=path)
            try:
                os.write(fd, b"ok")
            finally:
                os.close(fd)
                os.unlink(tmp)
        except OSError as exc:
            entry = AccessCheck(what, path, "write", False, error=exc.strerror or str(exc))
        results.append(entry)
    return results


def check_access(req: JsonObject) -> JsonObject:
    """Run the probe as the workload would run; raise with one line on the first problem.
    ``req``: the launch request (its ``env`` and ``cwd``); the answer ``{"checked"}``
    goes into the launch answer as it is."""
    launch = LaunchRequest.from_json(req)
    job_env = launch.env or {}
    plan = plan_access(job_env)
    if not plan.read and not plan.write:
        return {"checked": []}
    env = dict(os.environ)
    env.update(job_env)
    cwd = launch.cwd if launch.cwd and os.path.isdir(launch.cwd) else None
    res = subprocess.run(
        agent_argv(
            sys.executable,
            os.path.dirname(os.path.abspath(__file__)),
            "guards",
            "access",
            site=True,
        ),
        input=json.dumps(plan.to_json()).encode(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        timeout=120,
    )
    try:
        checked = [
            AccessCheck.from_json(e) for e in json.loads(res.stdout.decode("utf-8", "replace"))
        ]
    except ValueError:
        tail = res.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        raise _agent_error("the access check did not run: %s" % " ".join(tail), "access") from None
    for entry in checked:
        if not entry.ok:
            if "No space left" in str(entry.error) or "quota" in str(entry.error):
                raise _agent_error(
                    "the host's disk is full: the workload cannot write to its %s %s (%s); "
                    "free space there or choose another remote_root"
                    % (entry.what, entry.path, entry.error),
                    "disk-full",
                )
            verb = "read" if entry.mode == "read" else "write to"
            raise _agent_error(
                "the workload cannot %s its %s %s (%s); fix its permissions or choose another "
                "remote_root" % (verb, entry.what, entry.path, entry.error),
                "access",
            )
    return {"checked": [entry.to_json() for entry in checked]}


def op_check_access(req: JsonObject) -> JsonObject:
    return check_access(req)


# ------------------------------------------------------------------ space


def tree_bytes(path: str) -> int:
    """Bytes allocated below ``path`` (links not followed), like ``du``."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += getattr(st, "st_blocks", 0) * 512 or st.st_size
    return total


def op_check_space(req: JsonObject) -> JsonObject:
    """Refuse a run whose slice, venv and expected outputs do not fit on remote_root's volume.

    ``items`` are bytes still to be written (slice, outputs …); the venv is already
    installed when this runs (its size is shown, and already taken from the free
    space); ``min_free`` is what the job must leave free (stop_when.min_free_disk).
    """
    path = req["path"]
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    items = dict((k, int(v)) for k, v in (req.get("items") or {}).items())
    min_free = int(req.get("min_free") or 0)
    venv = (
        tree_bytes(req["venv_dir"])
        if req.get("venv_dir") and os.path.isdir(req["venv_dir"])
        else None
    )
    need = sum(items.values()) + min_free
    if free < need:
        parts = ["%s %s" % (k, format_mib(v)) for k, v in sorted(items.items())]
        parts.append("min_free_disk %s" % format_mib(min_free))
        venv_note = "; the venv, %s, is already installed" % format_mib(venv) if venv else ""
        raise _agent_error(
            "not enough disk for this run on %s: it needs %s free (%s%s) but %s is free; free "
            "some space, lower stop_when.min_free_disk or choose another remote_root"
            % (path, format_mib(need), " + ".join(parts), venv_note, format_mib(free)),
            "no-space",
        )
    return {
        "path": path,
        "free": free,
        "total": st.f_blocks * st.f_frsize,
        "need": need,
        "items": items,
        "venv": venv,
        "min_free": min_free,
        "fits": True,
    }


# ------------------------------------------------------------------ drift


def _fingerprint_source() -> str:
    """The probe run by the workload's interpreter: agentutil's package probe, the
    same one envfreeze runs, so both name the copy of a package that is imported
    (agentutil's source, run by the workload's interpreter)."""
    from .agentutil import PACKAGES_PROBE

    return PACKAGES_PROBE + _FINGERPRINT


_FINGERPRINT = r"""
import hashlib, json, sys
d = {"python": sys.version.split()[0], "executable": sys.executable}
pkgs = {}
try:
    pkgs = installed_packages()
except Exception as exc:
    d["packages_error"] = str(exc)
d["packages"] = dict(sorted(pkgs.items()))
d["lock_hash"] = hashlib.sha256("".join(
    "%s==%s\n" % kv for kv in sorted(pkgs.items())).encode()).hexdigest()
d["torch"] = pkgs.get("torch")
try:
    import importlib.util
    spec = importlib.util.find_spec("torch")
    d["torch_origin"] = spec.origin if spec else None
except Exception:
    d["torch_origin"] = None
print(json.dumps(d))
"""


def op_env_fingerprint(req: JsonObject) -> JsonObject:
    """Python, OS version, the venv's package set (and its hash) and torch, without
    importing torch: cheap enough to take at launch, at every re-attach and before
    the target run, to see whether the environment drifted in between."""
    return start_env_fingerprint(req)()


def start_env_fingerprint(req: JsonObject) -> Callable[[], JsonObject]:
    """Start op_env_fingerprint's probe; the function returned waits for it and answers.

    Why two halves: a launch takes the fingerprint before its runner starts, and its
    access check is another Python start of the workload's interpreter: the two
    probes run at once, not one after the other (issue 36)."""
    python = req["python"]
    try:
        proc = subprocess.Popen(
            [python, "-c", _fingerprint_source()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        failed = {"error": "the workload interpreter %s does not start: %s" % (python, exc)}
        return lambda: failed

    def finish() -> JsonObject:
        from . import envfreeze

        try:
            out, err = proc.communicate(timeout=120)
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
        if proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:]
            return {
                "error": "the workload interpreter %s does not start: %s" % (python, " ".join(tail))
            }
        found = json.loads(out.decode().strip().splitlines()[-1])
        host = envfreeze.host_facts()
        found["os"] = host.os
        found["os_version"] = host.os_version
        return found

    return finish


def main(args: List[str]) -> int:
    """``guards access < plan.json`` (see shared.py): the access probe alone."""
    if args != ["access"]:
        sys.stderr.write("usage: guards access < plan.json\n")
        return 2
    checked = _probe(AccessPlan.from_json(json.loads(sys.stdin.read())))
    sys.stdout.write(json.dumps([entry.to_json() for entry in checked]))
    return 0
