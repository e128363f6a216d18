"""The host's record of a synced slice: which files it holds verified, and where.

Why its own module: the sync receiver, its cut-transfer and split-file steps and the
full check (``op_prepare_data``) all read and write ``<src>/.verified.jsonl`` and
check manifest paths the same way; keeping that in one place keeps the rules (a path
is never absolute, never has ``..``, names compare in the host's form) one set.
Standard library only, Python 3.9.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import re
import stat
import sys
import threading
import time
import unicodedata
from typing import Any, Dict, List, Optional, Tuple

RECORD = ".verified.jsonl"
#: cut transfers kept for resuming: ``<sha256(path)[:32]>-<pid>.rmenc`` + ``.json``, and
#: split files (see Receiver.receive_piece): ``<sha256(path)[:32]>-s<sid>`` + ``.rmenc``,
#: ``.json``, ``.lock``, their plaintext ``.<name>.split-<sid>`` beside the file in RAM
PARTIAL = ".remotemac-partial"
SPLIT_PART = re.compile(r"\..+\.split-[0-9a-f]{16}\Z")
#: small files' ciphertext at rest, each file sealed on its own and written packed per
#: group (see Receiver.hand_over): ``<src>/.remotemac-packs/<pid>-<token>-<n>``; a
#: record with ``pack`` names its pack, ``off`` and ``enc_size`` its span there
PACKS = ".remotemac-packs"
#: a pack's own name: the writer's pid, a 12-hex token, a count (nothing else in the
#: packs folder is one of remotemac's: left where it is, never deleted)
PACK_NAME = re.compile(r"([1-9][0-9]{0,9})-[0-9a-f]{12}-[0-9]{1,10}\Z")
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


# ------------------------------------------------------------------ (size, mtime)

#: how much older than the moment it was recorded (``recorded_ns``) a file's mtime
#: must be for (size, mtime) to vouch for its bytes. Why: HFS+ (the RAM disk) keeps
#: whole-second times, so a same-size rewrite within the second a copy was recorded
#: in leaves its (size, mtime) as recorded (git's "racily clean" entry). 2 s covers a
#: 1 s granularity (HFS+; FAT's is 2 s) and a file clock that lags ``time.time_ns``
#: by a tick (Linux stamps files from a coarse clock).
SETTLE_NS = 2 * 10**9


def settled(rec: Dict[str, Any], key: str) -> bool:
    """Whether ``rec[key]`` (the copy's mtime) is SETTLE_NS older than the record:
    then any later write gives the copy another mtime. A record of an agent before
    ``recorded_ns`` is not settled (its copy is hashed once, then it is)."""
    mtime, recorded = rec.get(key), rec.get("recorded_ns")
    return type(mtime) is int and type(recorded) is int and mtime + SETTLE_NS <= recorded


def backdate(path: str) -> Optional[int]:
    """Set the mtime of a file this process just wrote (not yet hashed, or not yet
    in place) to a whole second SETTLE_NS before now; the time before that, for the
    record's ``recorded_ns`` (None if the file system refused: the record is then
    not settled, and its copy hashed again when next checked).

    Why backdate rather than wait: every copy is recorded in the second it was
    written, so without it every record of a fresh sync would be racy, and the
    next re-sync would hash the whole slice again.
    """
    now = time.time_ns()
    old = now // 10**9 * 10**9 - SETTLE_NS
    try:
        os.utime(path, ns=(old, old))
    except OSError:
        return None
    return now


def backdate_fd(fd: int) -> Tuple[Optional[int], int]:
    """:func:`backdate` of a file this process holds open for writing: (the time
    before, or None if refused; its mtime now). Through the fd (futimens, fstat): two
    syscalls and no path lookups, where backdate and a later lstat were two lookups."""
    now = time.time_ns()
    old = now // 10**9 * 10**9 - SETTLE_NS
    recorded: Optional[int] = now
    try:
        os.utime(fd, ns=(old, old))
    except (OSError, NotImplementedError):  # (no futimens: the record is not settled)
        recorded = None
    return recorded, os.fstat(fd).st_mtime_ns


def stamp(rec: Dict[str, Any], key: str, path: str, recorded: Optional[int]) -> None:
    """``rec[key]`` = the mtime of ``path`` now, and its ``recorded_ns`` (see backdate)."""
    rec[key] = os.lstat(path).st_mtime_ns
    if recorded is not None:
        rec["recorded_ns"] = recorded
    else:
        rec.pop("recorded_ns", None)


def same_as(st: Optional[os.stat_result], rec: Dict[str, Any], key: str) -> bool:
    """(size, mtime) of ``st`` are the record's (whether or not that vouches for it)."""
    return (
        st is not None
        and stat.S_ISREG(st.st_mode)
        and st.st_size == rec.get("size")
        and st.st_mtime_ns == rec.get(key)
    )


def rehash_ok(path: str, rec: Dict[str, Any], key: str) -> bool:
    """A copy whose record is not settled: whether its bytes still hash as recorded.

    When they do and its mtime is SETTLE_NS old, the record becomes settled
    (``recorded_ns`` = the time before hashing: a write after that changes its mtime).
    The caller keeps ``rec`` (it was changed in place).
    """
    before = time.time_ns()
    st = regular_lstat(path)
    if not same_as(st, rec, key):
        return False
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(READ), b""):
                digest.update(block)
    except OSError:
        return False
    if digest.hexdigest() != rec.get("sha256"):
        return False
    if not same_as(regular_lstat(path), rec, key):
        return False  # written while it was hashed
    if rec[key] + SETTLE_NS <= before:
        rec["recorded_ns"] = before
    return True


def pack_path(src: str, name: Any) -> str:
    """The pack a record names, below ``<src>/.remotemac-packs/`` (a pack's name only)."""
    if not isinstance(name, str) or not PACK_NAME.match(name):
        raise DataError("a record names a pack that is not one of remotemac's: %r" % (name,))
    return os.path.join(src, PACKS, name)


def pack_writer(name: str) -> Optional[int]:
    """The pid in a pack's name, or None when ``name`` is not a pack's (see PACK_NAME)."""
    match = PACK_NAME.match(name)
    if match is None:
        return None
    pid = int(match.group(1))
    return pid if pid < 2**31 else None


def open_packs_dir(src: str, create: bool) -> int:
    """An fd of ``<src>/.remotemac-packs`` (made 0700 when ``create``), opened without
    following a link: creating, listing and removing packs go through it, so a link
    put in its place (by the job, which runs as the same user) leads nowhere.
    OSError when it is absent; DataError unsafe-path when something else is there."""
    folder = os.path.join(src, PACKS)
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
    try:
        return os.open(folder, os.O_RDONLY | NOFOLLOW | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise DataError("%s is in the way (not a directory)" % folder, "unsafe-path") from None
        raise


def stored_span(src: str, rec: Dict[str, Any], encrypted: bool) -> Tuple[str, int, Optional[int]]:
    """Where a record's stored copy is: (file, offset, length; None: the whole file)."""
    if rec.get("pack"):
        return pack_path(src, rec["pack"]), int(rec["off"]), int(rec["enc_size"])
    return inside(src, rec["path"]) + (".rmenc" if encrypted else ""), 0, None


def packed_as(st: Optional[os.stat_result], rec: Dict[str, Any]) -> bool:
    """The pack ``st`` still holds the record's whole span (packs are only appended to)."""
    off, size = rec.get("off"), rec.get("enc_size")
    if st is None or not stat.S_ISREG(st.st_mode) or not isinstance(off, int):
        return False
    return isinstance(size, int) and off >= 0 and size > 0 and st.st_size >= off + size


def stored_ok(src: str, rec: Dict[str, Any], encrypted: bool) -> bool:
    """Quick check (like rsync's): the stored copy still has the size it was verified
    with (public data: and the mtime, if the record is settled, else its hash); a
    packed one, that its pack still holds its span."""
    if rec.get("pack"):
        try:
            return packed_as(regular_lstat(pack_path(src, rec["pack"])), rec)
        except DataError:
            return False
    path = inside(src, rec["path"]) + (".rmenc" if encrypted else "")
    st = regular_lstat(path)
    if stored_as(st, rec, encrypted):
        return True
    return not encrypted and same_as(st, rec, "mtime_ns") and rehash_ok(path, rec, "mtime_ns")


def stored_as(st: Optional[os.stat_result], rec: Dict[str, Any], encrypted: bool) -> bool:
    if st is None or not stat.S_ISREG(st.st_mode):
        return False
    if encrypted:
        return st.st_size == rec.get("enc_size")
    return (
        st.st_size == rec.get("size")
        and st.st_mtime_ns == rec.get("mtime_ns")
        and settled(rec, "mtime_ns")
    )


def plain_ok(dest: str, rec: Dict[str, Any]) -> bool:
    """The RAM copy is as verified: (size, mtime) when the record is settled, else
    its hash (see :data:`SETTLE_NS`)."""
    path = inside(dest, rec["path"])
    st = regular_lstat(path)
    if not same_as(st, rec, "plain_mtime_ns"):
        return False
    return settled(rec, "plain_mtime_ns") or rehash_ok(path, rec, "plain_mtime_ns")


class Recorder:
    """Appends one line per verified file, in blocks: :meth:`add` keeps the line and
    :meth:`flush` writes every kept line in one locked write: once a group of small
    files is stored (receiver.Receiver.hand_over), at once for a large one, and in any
    case before the files' acknowledgement goes to the laptop (datafiles.Lines calls
    it) and when the session ends. Why blocks: a locked write per file was three
    syscalls per file, each a handoff of the GIL between the reading and the
    write-behind thread.

    A cut (even SIGKILL) can lose only lines not yet written, whose files were
    therefore never acknowledged: the laptop sends them again, and the next session
    replaces the copies it finds unrecorded. Each block is one write, so a cut leaves
    at most a torn last line, which :func:`load_records` skips.
    """

    def __init__(self, src: str) -> None:
        fd = os.open(
            os.path.join(src, RECORD), os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o600
        )
        self._fd = fd
        self._lines: List[bytes] = []
        self._lock = threading.Lock()
        #: the write that failed (a full disk, EIO): every later flush raises it again, so
        #: no ack goes out after a record line was lost (datafiles.Lines.flush_acks)
        self.broken: Optional[BaseException] = None

    def add(self, rec: Dict[str, Any]) -> None:
        line = (json.dumps(rec, sort_keys=True) + "\n").encode("utf-8")
        with self._lock:
            self._lines.append(line)

    def flush(self) -> None:
        """Write the kept lines (several receivers, one per stream, append to the same
        record: one locked write)."""
        with self._lock:
            if self.broken is not None:
                raise self.broken
            if not self._lines:
                return
            block, self._lines = b"".join(self._lines), []
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            start: Optional[int] = None
            try:
                start = os.lseek(self._fd, 0, os.SEEK_END)
                view = memoryview(block)
                while view:
                    view = view[os.write(self._fd, view) :]
            except BaseException as exc:
                self.broken = exc
                # a short write must not leave a torn line for another stream's block
                # to run into (load_records would drop the merged, acknowledged line)
                if start is not None:
                    with contextlib.suppress(OSError):
                        os.ftruncate(self._fd, start)
                raise
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            os.close(self._fd)


def other_alive(pid: Any, wait: float = 0.0) -> bool:
    """Whether process ``pid`` (another receiver on this host) still runs; waits up to
    ``wait`` seconds for it to end (a session cut by the link exits at its next read)."""
    import time

    # (here, not at the top: agentutil brings procid, subprocess, shutil and signal, 5-6 ms
    # of every receiver's start on the lab's python3.9, six at once in a far push; this
    # runs only where another session left a marker, a kept transfer or a file in
    # flight: after a cut)
    from .agentutil import pid_alive

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
