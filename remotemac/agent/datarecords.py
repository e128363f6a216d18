"""The host's record of a synced slice: which files it holds verified, and where.

Why its own module: the sync receiver, its cut-transfer and split-file steps and the
full check (``op_prepare_data``) all read and write ``<src>/.verified.jsonl`` and
check manifest paths the same way; keeping that in one place keeps the rules (a path
is never absolute, never has ``..``, names compare in the host's form) one set.
Standard library only, Python 3.9.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import stat
import sys
import unicodedata
from typing import Any, Dict, Optional, Tuple

from .agentutil import pid_alive

RECORD = ".verified.jsonl"
#: cut transfers kept for resuming: ``<sha256(path)[:32]>-<pid>.rmenc`` + ``.json``, and
#: split files (see Receiver.receive_piece): ``<sha256(path)[:32]>-s<sid>`` + ``.rmenc``,
#: ``.json``, ``.lock``, their plaintext ``.<name>.split-<sid>`` beside the file in RAM
PARTIAL = ".remotemac-partial"
SPLIT_PART = re.compile(r"\..+\.split-[0-9a-f]{16}\Z")
#: ``<src>/.remotemac-writing-<pid>``: made before a session's first write into the
#: data dirs, removed when it ends cleanly. One left by another process means that
#: session was cut (or still runs) and may have left debris: finish then walks both
#: trees; otherwise it prunes by the record alone (see :meth:`Receiver.finish`)
WRITING = ".remotemac-writing-"
#: only files this big are kept for resuming when cut (below, resending is cheap)
RESUMABLE = 8 << 20
READ = 1 << 20
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class DataError(Exception):
    """One line for the laptop; ``code`` tells integrity failures from the rest."""

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------ paths and records


#: an empty, "." or ".." part (so also a leading "/"), a control character or a
#: backslash: one search per path (a re-sync checks thousands)
_UNSAFE = re.compile(r"(?:^|/)\.{0,2}(?:/|$)|[\x00-\x1f\\]")


@functools.lru_cache(maxsize=65536)
def name_key(rel: str) -> str:
    """The form two names are compared in on this host: NFC, and case-folded on macOS.

    Why: a Mac volume matches names case- and normalization-insensitively, and HFS+
    (the RAM disk) lists them in NFD while the manifest holds the laptop's form (NFC on
    Linux): compared as given, a walk found ``café.csv`` "not wanted" and unlinked the
    file the job needed. The laptop refuses a slice whose names collide in this form.
    """
    key = unicodedata.normalize("NFC", rel)
    return key.casefold() if sys.platform == "darwin" else key


def check_rel(rel: str) -> str:
    """A manifest path as given, or DataError: no absolute path, '..', '.', control chars.

    Cached: a re-sync checks every path of the slice several times (records, manifest,
    prune), and a slice has thousands of them.
    """
    if _UNSAFE.search(rel):
        raise DataError("unsafe dataset path %r" % rel, "unsafe-path")
    return rel


def inside(base: str, rel: str) -> str:
    # POSIX hosts only: a checked relative path joins as it is (a re-sync calls this
    # for every file of the slice, so plain concatenation rather than os.path.join)
    return (base if base.endswith("/") else base + "/") + check_rel(rel)


def make_parents(base: str, rel: str) -> None:
    """Create the directories of ``rel`` below ``base``, refusing links on the way."""
    current = base
    for part in rel.split("/")[:-1]:
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                raise DataError(
                    "%s is in the way (not a directory)" % current, "unsafe-path"
                ) from None


def regular_lstat(path: str) -> Optional[os.stat_result]:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def load_records(src: str) -> Dict[str, Dict[str, Any]]:
    """The last record line for each path (a torn last line is ignored)."""
    records: Dict[str, Dict[str, Any]] = {}
    read_records(src, 0, records)
    return records


def read_records(src: str, offset: int, records: Dict[str, Dict[str, Any]]) -> Tuple[int, int]:
    """Add the record lines from byte ``offset`` on to ``records``: (end offset, lines).

    The end offset lets a later call read only what was appended since (the other
    streams' files), so a re-sync of a large unchanged slice parses the record once.
    All lines are parsed in one ``json.loads`` (per-line calls cost more than the
    parsing); a torn or foreign line sends it line by line.
    """
    try:
        with open(os.path.join(src, RECORD), "rb") as fh:
            fh.seek(offset)
            raw = fh.read()
    except OSError:
        return offset, 0
    whole = raw[: raw.rfind(b"\n") + 1]  # a torn last line (no newline yet) waits
    lines = whole.splitlines()
    try:
        parsed = json.loads(b"[" + b",".join(lines) + b"]")
        for rec in parsed:
            records[str(rec["path"])] = rec
    except (ValueError, KeyError, TypeError):
        for line in lines:
            try:
                rec = json.loads(line.decode("utf-8"))
                records[str(rec["path"])] = rec
            except (ValueError, KeyError, TypeError):
                continue
    return offset + len(whole), len(lines)


def stored_ok(src: str, rec: Dict[str, Any], encrypted: bool) -> bool:
    """Quick check (like rsync's): the stored copy still has the size it was verified with."""
    path = inside(src, rec["path"]) + (".rmenc" if encrypted else "")
    return stored_as(regular_lstat(path), rec, encrypted)


def stored_as(st: Optional[os.stat_result], rec: Dict[str, Any], encrypted: bool) -> bool:
    if st is None or not stat.S_ISREG(st.st_mode):
        return False
    if encrypted:
        return st.st_size == rec.get("enc_size")
    return st.st_size == rec.get("size") and st.st_mtime_ns == rec.get("mtime_ns")


def plain_ok(dest: str, rec: Dict[str, Any]) -> bool:
    st = regular_lstat(inside(dest, rec["path"]))
    return (
        st is not None
        and st.st_size == rec.get("size")
        and (st.st_mtime_ns == rec.get("plain_mtime_ns"))
    )


class Recorder:
    """Appends one line per verified file; each line is written whole, so a cut leaves
    at most a torn last line, which :func:`load_records` skips."""

    def __init__(self, src: str) -> None:
        fd = os.open(
            os.path.join(src, RECORD), os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o600
        )
        self._fd = fd

    def add(self, rec: Dict[str, Any]) -> None:
        # several receivers (one per stream) append to the same record: one locked write
        line = (json.dumps(rec, sort_keys=True) + "\n").encode("utf-8")
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            os.write(self._fd, line)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


def other_alive(pid: Any, wait: float = 0.0) -> bool:
    """Whether process ``pid`` (another receiver on this host) still runs; waits up to
    ``wait`` seconds for it to end (a session cut by the link exits at its next read)."""
    import time

    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    deadline = time.monotonic() + wait
    while True:
        if not pid_alive(pid):  # gone, or a zombie: its part files are debris
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)


def compact_records(src: str, records: Dict[str, Dict[str, Any]]) -> None:
    tmp = os.path.join(src, RECORD + ".tmp-%d" % os.getpid())
    with open(tmp, "w") as fh:
        for path in sorted(records):
            fh.write(json.dumps(records[path], sort_keys=True) + "\n")
    os.replace(tmp, os.path.join(src, RECORD))
