"""Scrub a run's launch specs on the host: workload.env values and the command go.

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
import stat
from typing import Any, Dict, List

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
        clean: Dict[str, Any] = _scrub(spec)
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
