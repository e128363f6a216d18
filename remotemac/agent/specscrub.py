"""Scrub a run's launch specs on the host: workload.env values and the command go.

And wherever else the host wrote them: the runner's ``status/<device>.json`` (it
names the command) and the resident agent's answer records in ``agent/calls/``
(an answer may quote a status or a spec). Those are rewritten with each secret
(the command, its ``NAME=value`` values, every env value) replaced by the marker.

Standard library only, Python 3.9+. ``status/<device>.spec.json`` is what the
runner reads to start the job: it holds the workload command and its environment,
where users put API tokens. The runner needs it while the job may still start or
be relaunched; after the wipe nothing does, yet the status dir stays until
``cleanup``. So the wipe (and the dead-man wipe, which runs the same code)
rewrites every spec with each env value and the command replaced by a marker.

Files are opened without following links, non-blocking (a FIFO planted there is
never waited on) and only when they are regular files with one link (a hard link
to a file elsewhere is never rewritten).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from typing import Any, List, Set

from .protocol import JsonObject

SCRUBBED = "<scrubbed at wipe>"
MAX_SPEC_BYTES = 16 * 1024 * 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _scrub(spec: Any) -> Any:
    """The spec with env values and commands replaced, ``next`` and ``relaunch`` too."""
    if not isinstance(spec, dict):
        return spec
    out = dict(spec)
    if isinstance(out.get("env"), dict):
        out["env"] = {k: SCRUBBED for k in out["env"]}
    for key in ("command", "resume_command"):
        if isinstance(out.get(key), str):
            out[key] = SCRUBBED
    for key in ("next", "relaunch"):
        if isinstance(out.get(key), dict):
            out[key] = _scrub(out[key])
    return out


def _read_regular(path: str) -> bytes:
    """A regular, singly linked file's bytes; ValueError for anything else."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > MAX_SPEC_BYTES:
            raise ValueError("not a plain spec file")
        chunks = []
        while True:
            block = os.read(fd, 1 << 20)
            if not block:
                break
            chunks.append(block)
        return b"".join(chunks)
    finally:
        os.close(fd)


def scrub_specs(run_dir: str) -> List[str]:
    """Rewrite every ``status/*.spec.json`` of ``run_dir``; the paths scrubbed."""
    status_dir = os.path.join(run_dir, "status")
    try:
        if not stat.S_ISDIR(os.lstat(status_dir).st_mode):
            return []
        names = sorted(os.listdir(status_dir))
    except OSError:
        return []
    done: List[str] = []
    for name in names:
        if not name.endswith(".spec.json"):
            continue
        path = os.path.join(status_dir, name)
        try:
            spec = json.loads(_read_regular(path).decode("utf-8"))
        except (OSError, ValueError):
            continue
        clean: JsonObject = _scrub(spec)
        tmp = "%s.scrub-%d" % (path, os.getpid())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump(clean, fh)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            continue
        done.append(path)
    return done


#: an assignment in a command line (``API_KEY=… python3 x.py``): its value is a secret
_ASSIGNMENT = re.compile(r"(?:^|\s)[A-Za-z_][A-Za-z0-9_]*=(\'[^\']*\'|\"[^\"]*\"|\S+)")
#: shorter values are not looked for (a ``1`` would match everywhere)
MIN_SECRET = 4


def _secrets_of(spec: Any, found: Set[str]) -> None:
    """The command, its assignments' values and env values of a spec (and of ``next``)."""
    if not isinstance(spec, dict):
        return
    for value in (spec.get("env") or {}).values() if isinstance(spec.get("env"), dict) else ():
        if isinstance(value, str) and len(value) >= MIN_SECRET:
            found.add(value)
    for key in ("command", "resume_command"):
        command = spec.get(key)
        if isinstance(command, str) and command != SCRUBBED and len(command) >= MIN_SECRET:
            found.add(command)
            for value in _ASSIGNMENT.findall(command):
                value = value.strip("'\"")
                if len(value) >= MIN_SECRET:
                    found.add(value)
    for key in ("next", "relaunch"):
        _secrets_of(spec.get(key), found)


def run_secrets(run_dir: str) -> List[str]:
    """Every secret the run's launch specs hold (read before they are scrubbed)."""
    found: Set[str] = set()
    for path in _files(os.path.join(run_dir, "status"), ".spec.json"):
        try:
            _secrets_of(json.loads(_read_regular(path).decode("utf-8")), found)
        except (OSError, ValueError):
            continue
    return sorted(found, key=len, reverse=True)  # the longest first: a command holds a value


def _files(directory: str, suffix: str) -> List[str]:
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return []
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names if n.endswith(suffix)]


def scrub_records(secrets: List[str], directories: List[str]) -> List[str]:
    """Rewrite every ``*.json`` of ``directories`` that holds one of ``secrets`` (as
    JSON text), each replaced by the marker; the paths rewritten. Specs are left to
    :func:`scrub_specs`."""
    if not secrets:
        return []
    needles = [json.dumps(s)[1:-1] for s in secrets]
    marker = json.dumps(SCRUBBED)[1:-1]
    done: List[str] = []
    for directory in directories:
        for path in _files(directory, ".json"):
            if path.endswith(".spec.json"):
                continue
            try:
                text = _read_regular(path).decode("utf-8")
            except (OSError, ValueError):
                continue
            clean = text
            for needle in needles:
                clean = clean.replace(needle, marker)
            if clean != text and _rewrite(path, clean):
                done.append(path)
    return done


def _rewrite(path: str, text: str) -> bool:
    tmp = "%s.scrub-%d" % (path, os.getpid())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True
