"""Host side of the dataset: receive the streamed slice, verify it, decrypt it into RAM.

Why a stream and not file copies: the laptop hashes, encrypts and sends while this
process, on the other end of an SSH channel (one of several on a far link or for many
small files), stores the ciphertext (the slice rests encrypted in ``<run>/data``),
decrypts it into RAM-backed storage and checks each file's SHA-256, so every stage
overlaps and nothing is read twice. Within this process the reading thread reads and
decrypts, and a second one (writebehind.py) creates and writes the files, hashes the
plaintext, checks it and acknowledges it.

``python3 dataops.py sync [--runtime DIR]`` (see :func:`main`) speaks this protocol on
stdin/stdout (the runtime named in argv, the same as the hello's, is imported while
the hello is on its way):

1. laptop → one JSON line: ``{"run_dir", "run_id", "src", "encrypted", "key_hex"
   (only when encrypted; the key never touches disk, argv or the environment),
   "runtime_dir" (only when encrypted: the agent runtime to decrypt with),
   "ram_bytes", "columns": {"path": [...], "size": [...], "sha256": [... or null],
   "mtime_ns": [...]} (or "entries": [{"path", "size", "sha256", "mtime_ns"}]),
   "worker" (true on the extra channels of a multi-stream sync)}``;
2. host → one JSON line: ``{"ok": true, "todo": [[index, sha256 or null], ...],
   "partial": [[index, {...}], ...]}`` (a worker answers ``{"ok": true, "ram"}``):
   ``todo`` are the entries it does not hold complete and verified with the hello's
   size and SHA-256, each with the hash of the verified copy of that path it holds
   (same size), if any; every other entry it holds (the record
   ``<src>/.verified.jsonl`` is keyed by relative path and plaintext SHA-256,
   because every encryption uses a fresh salt and so gives different ciphertext);
   ``partial`` the cut transfers it kept (``.remotemac-partial/``, ciphertext only,
   files of RESUMABLE bytes or more): ``{"partial", "chunks", "offset",
   "prefix_sha256", "header", "size", "mtime_ns"}``, ``chunks`` being the whole
   chunks that authenticate and ``offset`` their plaintext length;
3. laptop → ``b"P" 0 0`` (optional, any number): the host answers ``{"ok": true,
   "pong": true}`` (the laptop sizes its streams by this round trip);
4. laptop → frames ``b"F" index:u32 length:u64`` + ``length`` bytes (ciphertext,
   or plaintext for public data) + the 32-byte SHA-256 of the plaintext, or
   ``b"R" index:u32 length:u64`` + ``meta_len:u32`` + ``{"partial", "chunks",
   "prefix_sha256"}`` + the ciphertext from chunk ``chunks`` on + the SHA-256 (the
   host decrypts the kept prefix again, checks its hash, continues after it); the
   host answers ``{"acks": [index, ...]}`` once files are stored, decrypted and
   verified (one line for all that were verified within ~20 ms, see writebehind.py).
   The laptop may send F frames of files it knows changed right after the hello,
   before the start answer (engine/sync.py ``_Session._ahead``): they wait in the
   pipe and are read once the answer is out, like any other;
   A file too large for one channel's window comes as pieces over several streams
   (see ``S``/``J`` below and :meth:`Receiver.receive_piece`);
5. a worker gets ``b"D" 0 0`` and answers ``{"ok": true, "result": {"received"}}``;
   the first channel, once every worker is done, ``b"E" 0:u32 length:u64`` + the
   final manifest as JSON (``{"changed": [[index, size, sha256], ...]}``, the entries
   whose size or hash differ from the hello's, or a whole list): the host checks every
   entry against its record
   (re-decrypting from the stored ciphertext what is missing from RAM, e.g. after a
   reboot), removes files that left the slice (those its record lists; after a cut
   session, any file the manifest does not list) and kept cut transfers, and answers
   ``{"ok": true, "result": {...}}``.

Split push (one large file over several channels, each stream's receiver its own
process): ``b"S" index length`` + ``meta_len:u32`` + ``{"header", "first", "count"}``
+ the sealed chunks ``first`` .. ``first + count - 1`` (the bytes the whole stream
would hold there): the host writes them into one ciphertext under
``.remotemac-partial/<sha256(path)[:32]>-s<sid>.rmenc`` (``sid`` from the header) and
their plaintext into ``.<name>.split-<sid>`` beside the file in RAM, notes the piece
in ``…-s<sid>.json`` and answers ``{"piece": [index, first]}`` at once; then
``b"J" index length`` + ``{"sha256", "header"}`` once every piece is in: the pieces
must tile the file, the plaintext must hash as said, and the file is renamed into
place, recorded and acknowledged like any other. A start answer lists kept splits as
``[index, {"split": true, "header", "pieces": [[first, count, plain_sha256], ...],
"size", "mtime_ns"}]``.

Any failure is one line ``{"ok": false, "error", "code"}`` (code ``integrity``
for checksum or decryption failures, ``ram`` when no RAM store could be made).
A cut link leaves ``.part-<pid>`` files (removed on the way out, or by the next
finish once that process is gone) and, for large files, the kept ciphertext; a
re-run skips every file already acknowledged and resumes the kept ones.

``op_prepare_data`` (through hostagent.py) is the full check: it decrypts every
file from its stored ciphertext again and compares it to the manifest.

Standard library only; where the slice is encrypted, streamcrypt's ``cryptography``
comes from the agent runtime named in the first line (``runtime_dir``, see
agentruntime.py) and from nowhere else. Python 3.9.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import io
import json
import os
import re
import select
import stat
import struct
import sys
import threading
import unicodedata
from typing import Any, BinaryIO, Dict, Iterator, List, Optional, Tuple

try:  # a sibling on the host (or preloaded by the in-memory bootstrap)
    from agentutil import pid_alive
except ImportError:  # imported as remotemac.agent.dataops (the laptop, tests)
    from remotemac.agent.agentutil import pid_alive

try:  # a sibling on the host
    from writebehind import WriteBehind
except ImportError:  # imported as remotemac.agent.dataops (the laptop, tests)
    from remotemac.agent.writebehind import WriteBehind

RECORD = ".verified.jsonl"
#: cut transfers kept for resuming: ``<sha256(path)[:32]>-<pid>.rmenc`` + ``.json``, and
#: split files (see Receiver.receive_piece): ``<sha256(path)[:32]>-s<sid>`` + ``.rmenc``,
#: ``.json``, ``.lock``, their plaintext ``.<name>.split-<sid>`` beside the file in RAM
PARTIAL = ".remotemac-partial"
_SPLIT_PART = re.compile(r"\..+\.split-[0-9a-f]{16}\Z")
#: ``<src>/.remotemac-writing-<pid>``: made before a session's first write into the
#: data dirs, removed when it ends cleanly. One left by another process means that
#: session was cut (or still runs) and may have left debris: finish then walks both
#: trees; otherwise it prunes by the record alone (see :meth:`Receiver.finish`)
WRITING = ".remotemac-writing-"
#: only files this big are kept for resuming when cut (below, resending is cheap)
RESUMABLE = 8 << 20
FRAME = struct.Struct(">cIQ")
META_LEN = struct.Struct(">I")
READ = 1 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: bytes queued for the write-behind thread at most (received, not yet stored)
BEHIND_BYTES = 32 << 20


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


def _check_rel(rel: str) -> str:
    """A manifest path as given, or DataError: no absolute path, '..', '.', control chars.

    Cached: a re-sync checks every path of the slice several times (records, manifest,
    prune), and a slice has thousands of them.
    """
    if _UNSAFE.search(rel):
        raise DataError("unsafe dataset path %r" % rel, "unsafe-path")
    return rel


def _inside(base: str, rel: str) -> str:
    # POSIX hosts only: a checked relative path joins as it is (a re-sync calls this
    # for every file of the slice, so plain concatenation rather than os.path.join)
    return (base if base.endswith("/") else base + "/") + _check_rel(rel)


def _make_parents(base: str, rel: str) -> None:
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


def _lstat(path: str) -> Optional[os.stat_result]:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def load_records(src: str) -> Dict[str, Dict[str, Any]]:
    """The last record line for each path (a torn last line is ignored)."""
    records: Dict[str, Dict[str, Any]] = {}
    _read_records(src, 0, records)
    return records


def _read_records(src: str, offset: int, records: Dict[str, Dict[str, Any]]) -> Tuple[int, int]:
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


def _stored(src: str, rec: Dict[str, Any], encrypted: bool) -> bool:
    """Quick check (like rsync's): the stored copy still has the size it was verified with."""
    path = _inside(src, rec["path"]) + (".rmenc" if encrypted else "")
    return _stored_as(_lstat(path), rec, encrypted)


def _stored_as(st: Optional[os.stat_result], rec: Dict[str, Any], encrypted: bool) -> bool:
    if st is None or not stat.S_ISREG(st.st_mode):
        return False
    if encrypted:
        return st.st_size == rec.get("enc_size")
    return st.st_size == rec.get("size") and st.st_mtime_ns == rec.get("mtime_ns")


def _plain_ok(dest: str, rec: Dict[str, Any]) -> bool:
    st = _lstat(_inside(dest, rec["path"]))
    return (
        st is not None
        and st.st_size == rec.get("size")
        and (st.st_mtime_ns == rec.get("plain_mtime_ns"))
    )


class _Recorder:
    """Appends one line per verified file; each line is written whole, so a cut leaves
    at most a torn last line, which :func:`load_records` skips."""

    def __init__(self, src: str) -> None:
        fd = os.open(
            os.path.join(src, RECORD), os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW, 0o600
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


def _alive(pid: Any, wait: float = 0.0) -> bool:
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


def _compact(src: str, records: Dict[str, Dict[str, Any]]) -> None:
    tmp = os.path.join(src, RECORD + ".tmp-%d" % os.getpid())
    with open(tmp, "w") as fh:
        for path in sorted(records):
            fh.write(json.dumps(records[path], sort_keys=True) + "\n")
    os.replace(tmp, os.path.join(src, RECORD))


# ------------------------------------------------------------------ streams


class _Tee:
    """Reads ``stdin``, copying every byte read into ``copy`` (the stored ciphertext)."""

    def __init__(self, src: BinaryIO, copy: BinaryIO) -> None:
        self._src = src
        self._copy = copy
        self.count = 0
        self.eof = False

    def read(self, size: int) -> bytes:
        data = self._src.read(size)
        if len(data) < size:
            self.eof = True  # a buffered pipe read is short only at end of input
        if data:
            self._copy.write(data)
            self.count += len(data)
        return data


class _HashSink:
    """Writes plaintext to ``dst`` and hashes it on the way; with ``behind``, both happen
    on the write-behind thread (the caller reads ``digest`` only after it drained)."""

    def __init__(self, dst: Optional[BinaryIO], behind: Optional[WriteBehind] = None) -> None:
        self._dst = dst
        self._behind = behind
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self._behind is not None:
            self._behind.submit(functools.partial(self._write, data), len(data))
        else:
            self._write(data)
        return len(data)

    def _write(self, data: bytes) -> None:
        self.digest.update(data)
        if self._dst is not None:
            self._dst.write(data)

    def hexdigest(self) -> str:
        if self._behind is not None:
            self._behind.drain()
        return self.digest.hexdigest()


class _Pieces:
    """A sink that keeps what is written (one small file's plaintext, in memory)."""

    def __init__(self, pieces: List[bytes]) -> None:
        self.pieces = pieces

    def write(self, data: bytes) -> int:
        self.pieces.append(data)
        return len(data)


class _Lines:
    """stdout of the session: JSON lines from the reader and the write-behind thread.

    Acknowledgements are gathered and sent as one ``{"acks": [...]}`` line by
    :meth:`flush_acks` (the write-behind thread's idle step), not one line per file.
    """

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._acks: List[int] = []

    def say(self, obj: Dict[str, Any]) -> None:
        with self._lock:
            _say(self._out, obj)

    def ack(self, index: int) -> None:
        with self._lock:
            self._acks.append(index)

    def flush_acks(self) -> None:
        with self._lock:
            if self._acks:
                acks, self._acks = self._acks, []
                _say(self._out, {"acks": acks})


def _read_exact(src: BinaryIO, size: int) -> bytes:
    data = src.read(size)
    if len(data) != size:
        raise EOFError("stream ended inside a frame")
    return data


def _open_new(path: str) -> BinaryIO:
    """A new file of this session's (a part, a temp name): whatever has the name goes
    first, and O_EXCL, so a hard link or symlink planted at a name one can guess (the
    pid) is never written through into a file outside remote_root."""
    _unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    return os.fdopen(fd, "wb")


def _unlink(*paths: str) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


class _Split:
    """One split file as a frame names it (see :meth:`Receiver._split`)."""

    def __init__(self, **fields: Any) -> None:
        self.index: int = fields["index"]
        self.rel: str = fields["rel"]
        self.size: int = fields["size"]
        self.mtime_ns: Any = fields["mtime_ns"]
        self.header: bytes = fields["header"]
        self.opener: Any = fields["opener"]
        self.chunk_size: int = fields["chunk_size"]
        self.total: int = fields["total"]
        #: ``.remotemac-partial/<sha256(path)[:32]>-s<sid>`` (+ .rmenc, .json, .lock)
        self.base: str = fields["base"]
        self.sid: str = fields["sid"]
        #: the plaintext part in RAM (see Receiver._split_part)
        self.part: str = fields["part"]


def _split_sid(base: str) -> str:
    """The sid of a split's base path ("" for a single stream's cut transfer)."""
    name = os.path.basename(base)
    return name.rpartition("-s")[2] if "-s" in name else ""


@contextlib.contextmanager
def _flocked(path: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (made if missing): the streams' receivers
    are separate processes that note pieces of one split."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_note(path: str) -> bytes:
    """The bytes of a kept transfer's ``.json`` note, a regular file only.

    Why: ``open()`` of a FIFO planted under that name would wait forever for a writer
    and hang the receiver (and the sync with it); a symlink would read another file
    (OSError ELOOP). A FIFO or device is not remotemac's note: DataError unsafe-path,
    and it is left where it is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DataError("%s is not a file of remotemac's: left alone" % path, "unsafe-path")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    finally:
        os.close(fd)


def _own_file(path: str, flags: int) -> int:
    """An fd of ``path`` (a split's ciphertext or RAM part), never through a link.

    Why: those names outlive a session and the start answer gives their sid away, so
    someone on the host can put a symlink or a hard link to another file there; the
    receivers of several streams open them in turn (no O_EXCL), so the file must be a
    regular one with no other name, or ciphertext, or plaintext on a disk, would land
    in a file outside remote_root."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | _NOFOLLOW, 0o600)  # a FIFO: no wait
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        fd = -1
    if fd >= 0:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return fd
        os.close(fd)
    raise DataError("%s is a link, not a file of this split's: refused" % path, "unsafe-path")


def _write_meta(base: str, meta: Dict[str, Any]) -> None:
    """``base.json`` written whole (temp name, then rename): readers never see half."""
    tmp = "%s.tmp-%d" % (base, os.getpid())
    with _open_new(tmp) as fh:
        fh.write(json.dumps(meta).encode("utf-8"))
    os.replace(tmp, base + ".json")


def _pwrite(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _use_runtime(path: Optional[str]) -> None:
    """Decrypt with the agent runtime's cryptography only (see agentruntime.py)."""
    import agentruntime

    if not path:
        raise DataError("no agent runtime was named for decryption", "host-env")
    try:
        agentruntime.activate(path)
    except agentruntime.RuntimeInstallError as exc:
        raise DataError(str(exc), "host-env") from None


def _entries(req: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The hello's entries: ``columns`` (one list per field, as the laptop sends them:
    much cheaper to encode and parse) or ``entries`` (a list of dicts)."""
    cols = req.get("columns")
    if not cols:
        return list(req.get("entries") or [])
    fields = ("path", "size", "sha256", "mtime_ns")
    lists = [cols[k] for k in fields]
    if len({len(x) for x in lists}) != 1:
        raise DataError("the hello's columns differ in length")
    return [dict(zip(fields, row)) for row in zip(*lists)]


class Receiver:
    """One sync session on the host: holds the key in memory only."""

    def __init__(self, req: Dict[str, Any]) -> None:
        self.src = req["src"]
        self.encrypted = bool(req.get("encrypted"))
        self.key = bytes.fromhex(req["key_hex"]) if self.encrypted else b""
        #: where the job reads the slice: the RAM store, made on first use (see dest)
        self._dest: Optional[str] = None if self.encrypted else self.src
        self._req = req
        self.ram: Optional[Dict[str, Any]] = None
        #: the runtime to decrypt with: activated (tens of ms of imports) when the first
        #: byte needs decrypting, or while nothing else waits (see serve)
        self.runtime_dir = req.get("runtime_dir")
        if self.encrypted and not self.runtime_dir:
            raise DataError("no agent runtime was named for decryption", "host-env")
        os.makedirs(self.src, mode=0o700, exist_ok=True)
        self.records: Dict[str, Dict[str, Any]] = {}
        self._record_end, self._record_lines = _read_records(self.src, 0, self.records)
        #: paths whose stored copy this session saw (known) or wrote: finish trusts it
        self._stored_seen: set = set()
        #: path -> the RAM copy's mtime this session saw matching its record (see check_ram)
        self._ram_seen: Dict[str, int] = {}
        self._ram_check: Optional[threading.Thread] = None
        self._cipher_ready = False  # the runtime was activated (see cipher)
        self._writing_mark = ""  # this session's WRITING marker, once it writes
        self.entries: List[Dict[str, Any]] = _entries(req)
        for entry in self.entries:
            _check_rel(entry["path"])
        self.received = 0
        self.recorder: Optional[_Recorder] = None
        self.lines: Optional[_Lines] = None
        self._made: set = set()
        #: sids of the splits this process wrote pieces of and has not assembled or
        #: dropped: their files are in flight (finish and its prune leave them)
        self._splits_open: set = set()

    def writing(self) -> None:
        """Mark the data dirs as being written by this process (before its first write)."""
        if not self._writing_mark:
            path = os.path.join(self.src, WRITING + str(os.getpid()))
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | _NOFOLLOW, 0o600))
            self._writing_mark = path

    def done_writing(self) -> None:
        """This session ended cleanly: whatever it wrote is in place and recorded."""
        if self._writing_mark:
            _unlink(self._writing_mark)
            self._writing_mark = ""

    def _other_writers(self) -> List[Tuple[str, int]]:
        """(marker, pid) of every other session that wrote here and did not end cleanly."""
        out = []
        with contextlib.suppress(OSError):
            for name in os.listdir(self.src):
                pid = name[len(WRITING) :]
                if name.startswith(WRITING) and pid.isdigit() and int(pid) != os.getpid():
                    out.append((os.path.join(self.src, name), int(pid)))
        return out

    def todo(self, known: List[Tuple[int, str]]) -> List[Tuple[int, Optional[str]]]:
        """The entries the host does not hold as the hello describes them: [index, the
        SHA-256 of the verified copy of that path it holds (same size), or None].

        The start answer carries only these (a re-sync of thousands of unchanged files
        answers a few lines, not one per file); every other entry is held, verified,
        with the hello's size and hash.
        """
        have = dict(known)
        out = []
        for index, entry in enumerate(self.entries):
            sha = have.get(index)
            if sha is None or sha != entry.get("sha256"):
                out.append((index, sha))
        return out

    def known(self) -> List[Tuple[int, str]]:
        """Entries stored complete and verified (whether or not still in RAM)."""
        out = []
        records, seen, encrypted = self.records, self._stored_seen, self.encrypted
        base = self.src if self.src.endswith("/") else self.src + "/"
        suffix = ".rmenc" if encrypted else ""
        for index, entry in enumerate(self.entries):
            path = entry["path"]  # checked when the hello was read
            rec = records.get(path)
            if rec is None or (entry.get("size") is not None and rec.get("size") != entry["size"]):
                continue
            # _stored, inlined: this loop runs for every file of the slice
            try:
                st = os.lstat(base + path + suffix)
            except OSError:
                continue
            if _stored_as(st, rec, encrypted):
                out.append((index, str(rec["sha256"])))
                seen.add(path)
        return out

    @property
    def dest(self) -> str:
        """The RAM store of an encrypted slice (made here on first use, so the start
        answer does not wait for it), or the data dir itself for public data."""
        if self._dest is None:
            import ramstore

            req = self._req
            try:
                self.ram = ramstore.create_ram_store(
                    req["run_dir"], int(req.get("ram_bytes") or (64 << 20)), req["run_id"]
                )
            except ramstore.RamStoreError as exc:
                raise DataError(
                    "no RAM-backed storage for the decrypted slice: %s" % exc, "ram"
                ) from None
            except OSError as exc:
                raise DataError("cannot make the RAM store: %s" % exc, "ram") from None
            self._dest = str(self.ram["path"])
        return self._dest

    def cipher(self) -> None:
        """Make the runtime's cryptography importable (once; DataError host-env if not).

        Called before every file is decrypted: activating the runtime resolves its
        path and reads its marker, ~0.2 ms that 76 changed files paid one after
        another on the reading thread; once it has worked, it holds for the session.
        """
        if self.encrypted and not self._cipher_ready:
            _use_runtime(self.runtime_dir)
            self._cipher_ready = True

    def check_ram(self) -> None:
        """Look at the RAM copy of every file held (size and mtime as recorded).

        Run once the start answer is out, on its own thread (:meth:`start_check_ram`)
        while this one reads the laptop's first files, rather than in :meth:`finish`,
        which then trusts these sightings (and its own writes) as it trusts
        :meth:`known`'s of the stored copies. A sighting is the mtime seen, and
        :meth:`finish` compares it with the record it holds then: a file this session
        rewrites meanwhile (its record changes) is looked at again there.
        """
        if not self.encrypted:
            return
        dest = self.dest
        base = dest if dest.endswith("/") else dest + "/"
        records, sightings = self.records, self._ram_seen
        for rel in list(self._stored_seen):  # (the write-behind thread adds to it)
            rec = records[rel]
            # _plain_ok, inlined: this loop runs for every file of the slice
            try:
                st = os.lstat(base + rel)  # checked when the hello was read
            except OSError:
                continue
            mtime = rec.get("plain_mtime_ns")
            if stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns) == (
                rec.get("size"),
                mtime,
            ):
                sightings.setdefault(rel, mtime)

    def start_check_ram(self) -> None:
        """:meth:`check_ram` on a thread (os.lstat lets the GIL go): with 7,681 files
        it took 60 ms, which the first file's frame used to wait for; :meth:`finish`
        waits for it. A failure there only costs :meth:`finish` its own looks."""
        if not self.encrypted:
            return
        self.dest  # noqa: B018 (the RAM store is made here, on this thread, once)

        def run() -> None:
            with contextlib.suppress(Exception):
                self.check_ram()

        self._ram_check = threading.Thread(target=run, name="check-ram", daemon=True)
        self._ram_check.start()

    # -------------------------------------------------------------- cut transfers

    def _partial_dir(self) -> str:
        path = os.path.join(self.src, PARTIAL)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise DataError("%s is in the way (not a directory)" % path, "unsafe-path")
        return path

    def _partial_metas(self) -> List[Tuple[str, Dict[str, Any]]]:
        """(base path without extension, meta) of every kept cut transfer.

        Metas are written whole (temp name, then rename), so one that does not parse
        is damage, not another stream's file being written: it goes.
        """
        out = []
        directory = os.path.join(self.src, PARTIAL)
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(directory)):
                if not name.endswith(".json"):
                    continue
                base = os.path.join(directory, name[: -len(".json")])
                try:
                    raw = _read_note(base + ".json")
                except DataError:  # not a note of ours (a FIFO, a device): left alone
                    continue
                except OSError:
                    raw = b""
                try:
                    meta = json.loads(raw.decode("utf-8"))
                    _check_rel(meta["path"])
                    if meta.get("split") and not (
                        isinstance(meta.get("header"), str) and isinstance(meta["pieces"], list)
                    ):
                        raise ValueError("not a split's meta")
                except (OSError, ValueError, KeyError, TypeError, AttributeError, DataError):
                    _unlink(base + ".json", base + ".rmenc", base + ".lock")
                    continue
                out.append((base, meta))
        return out

    def partials(self, known: List[Tuple[int, str]]) -> List[Tuple[int, Dict[str, Any]]]:
        """Cut transfers worth resuming: [index, {partial, chunks, offset, prefix_sha256,
        header, size, mtime_ns}], the verified prefix being whole chunks that authenticate,
        or for a split file [index, {split, header, pieces, size, mtime_ns}] (the pieces
        whose ciphertext and plaintext are in; its plaintext part must still be in RAM).

        Stale ones (the entry left the slice, is already verified, or its size or the
        laptop's mtime changed) are deleted; so is all but the longest per file. The
        laptop resumes only when its own prefix (or each piece) hashes the same.
        """
        if not self.encrypted:
            return []
        metas = self._partial_metas()
        if not metas:  # the usual case: no cut transfer, nothing to import or index
            return []
        import streamcrypt

        index_of = {e["path"]: i for i, e in enumerate(self.entries)}
        done = {i for i, _ in known}
        #: index -> (base, meta, chunks kept, what the start answer says)
        best: Dict[int, Tuple[str, Dict[str, Any], int, Dict[str, Any]]] = {}
        for base, meta in metas:
            if _alive(meta.get("pid"), wait=3.0):
                continue  # an earlier session still writes it (it dies of the cut soon)
            index = index_of.get(meta["path"])
            entry = self.entries[index] if index is not None else None
            if (
                entry is None
                or index in done
                or (entry.get("size"), entry.get("mtime_ns"))
                != (meta.get("size"), meta.get("mtime_ns"))
            ):
                self._drop_meta(base, meta)
                continue
            assert index is not None
            if meta.get("split"):
                chunks, info = self._split_kept(base, meta)
            else:
                sink = _HashSink(None)
                self.cipher()
                try:
                    with os.fdopen(_own_file(base + ".rmenc", os.O_RDONLY), "rb") as fh:
                        header, chunks = streamcrypt.verified_prefix(
                            self.key, meta["path"], fh, sink
                        )
                except (OSError, DataError):
                    header, chunks = b"", 0
                info = {
                    "partial": os.path.basename(base),
                    "chunks": chunks,
                    "offset": sink.size,
                    "prefix_sha256": sink.digest.hexdigest(),
                    "header": header.hex(),
                }
            old = best.get(index)
            if not chunks or (old is not None and old[2] >= chunks):
                self._drop_meta(base, meta)
                continue
            if old is not None:
                self._drop_meta(old[0], old[1])
            info.update(size=meta["size"], mtime_ns=meta["mtime_ns"])
            best[index] = (base, meta, chunks, info)
        return [(i, kept[3]) for i, kept in best.items()]

    def _split_kept(self, base: str, meta: Dict[str, Any]) -> Tuple[int, Dict[str, Any]]:
        """(chunks held, start answer entry) of a kept split; 0 chunks when its
        ciphertext or its plaintext part is gone (a reboot empties RAM)."""
        pieces = meta["pieces"]
        try:
            chunks = sum(int(p[1]) for p in pieces)
        except (ValueError, TypeError, IndexError):
            chunks = 0
        part = self._split_part(meta["path"], _split_sid(base))
        if _lstat(base + ".rmenc") is None or _lstat(part) is None:
            chunks = 0
        return chunks, {"split": True, "header": meta["header"], "pieces": pieces}

    def _drop_meta(self, base: str, meta: Dict[str, Any]) -> None:
        """Delete a kept cut transfer (a split's: its ciphertext, lock and RAM part too)."""
        if not meta.get("split"):
            _unlink(base + ".json", base + ".rmenc")
            return
        sid = _split_sid(base)
        _unlink(base + ".json", base + ".rmenc", base + ".lock")
        _unlink(self._split_part(meta["path"], sid))
        self._splits_open.discard(sid)

    def _drop_partials(self, rel: str) -> None:
        """Forget every cut transfer of ``rel`` no live session is writing."""
        for base, meta in self._partial_metas():
            if meta["path"] == rel and not _alive(meta.get("pid")):
                self._drop_meta(base, meta)

    def _claim_partial(self, rel: str, entry: Dict[str, Any], resume: Optional[Dict[str, Any]]):
        """The path this session stores ``rel``'s ciphertext under while it arrives.

        ``resume`` names a cut transfer to continue: it is renamed to this session's
        name first (so two sessions never write one file); otherwise older ones go.
        """
        directory = self._partial_dir()
        base = os.path.join(
            directory, "%s-%d" % (hashlib.sha256(rel.encode("utf-8")).hexdigest()[:32], os.getpid())
        )
        if resume is None:
            self._drop_partials(rel)
        else:
            old = os.path.join(directory, os.path.basename(str(resume["partial"])))
            try:
                os.replace(old + ".rmenc", base + ".rmenc")
            except OSError:
                raise DataError("the cut transfer of %s to resume is gone" % rel) from None
            _unlink(old + ".json")
        meta = {
            "path": rel,
            "size": entry.get("size"),
            "mtime_ns": entry.get("mtime_ns"),
            "pid": os.getpid(),
        }
        tmp = "%s.tmp-%d" % (base, os.getpid())
        with _open_new(tmp) as fh:
            fh.write(json.dumps(meta).encode("utf-8"))
        os.replace(tmp, base + ".json")
        return base

    # -------------------------------------------------------------- split files

    def _split_part(self, rel: str, sid: str) -> str:
        """The plaintext part of ``rel``'s split ``sid``: hidden, beside the file in RAM."""
        plain = _inside(self.dest, rel)
        return os.path.join(os.path.dirname(plain), ".%s.split-%s" % (os.path.basename(plain), sid))

    def _split(self, index: int, header_hex: Any) -> "_Split":
        """The split of entry ``index`` under a header that authenticates under the key
        and the entry's path (DataError integrity otherwise)."""
        if not self.encrypted:
            raise DataError("a split frame in a session that is not encrypted", "integrity")
        if not 0 <= index < len(self.entries):
            raise DataError("split frame for unknown entry %d" % index, "integrity")
        rel = self.entries[index]["path"]
        size = self.entries[index].get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise DataError("split of %s: the hello gave it no size" % rel, "integrity")
        self.cipher()
        import streamcrypt

        try:
            header = bytes.fromhex(header_hex)
        except (TypeError, ValueError):
            header = b""
        if len(header) != streamcrypt.HEADER_LEN:
            raise DataError("split of %s: not a remotemac-enc/v1 header" % rel, "integrity")
        try:
            opener, chunk_size = streamcrypt.chunk_opener(self.key, rel, header)
        except streamcrypt.DecryptError as exc:
            raise DataError("split of %s refused: %s" % (rel, exc), "integrity") from None
        sid = hashlib.sha256(header).hexdigest()[:16]
        name = "%s-s%s" % (hashlib.sha256(rel.encode("utf-8")).hexdigest()[:32], sid)
        return _Split(
            index=index,
            rel=rel,
            size=size,
            mtime_ns=self.entries[index].get("mtime_ns"),
            header=header,
            opener=opener,
            chunk_size=chunk_size,
            total=streamcrypt.chunk_count(size, chunk_size),
            base=os.path.join(self._partial_dir(), name),
            sid=sid,
            part=self._split_part(rel, sid),
        )

    def _split_meta(self, sp: "_Split") -> Dict[str, Any]:
        """The split's meta as written (under its lock), or a new one with no piece;
        DataError integrity when it names another file or another version of it."""
        try:
            meta = json.loads(_read_note(sp.base + ".json").decode("utf-8"))
        except FileNotFoundError:
            return {
                "path": sp.rel,
                "size": sp.size,
                "mtime_ns": sp.mtime_ns,
                "split": True,
                "header": sp.header.hex(),
                "pieces": [],
            }
        except (OSError, ValueError) as exc:
            raise DataError(
                "split of %s: its notes are damaged (%s)" % (sp.rel, exc), "integrity"
            ) from None
        if not isinstance(meta, dict) or (
            meta.get("path"),
            meta.get("header"),
            meta.get("size"),
            meta.get("mtime_ns"),
        ) != (sp.rel, sp.header.hex(), sp.size, sp.mtime_ns):
            raise DataError(
                "split of %s: begun for another version of the file" % sp.rel, "integrity"
            )
        return meta

    def receive_piece(self, stdin: BinaryIO, index: int, length: int, desc: Dict[str, Any]) -> None:
        """One piece of a split file (an ``S`` frame): chunks ``first`` .. ``first +
        count - 1``, written where the whole stream would hold them.

        Why here, on the reading thread: a file is split only on a far link, where
        this process waits on the network, not on its CPU. Each chunk is stored, opened
        (authenticated) and its plaintext written at its place in the RAM part; the
        piece is noted in the split's meta (under its lock: the other streams'
        processes note theirs) only once it is all in, so a cut inside it notes
        nothing, and the laptop hears of it at once (``{"piece": [index, first]}``).
        """
        sp = self._split(index, desc.get("header"))
        import streamcrypt

        first, count = desc.get("first"), desc.get("count")
        if not (
            type(first) is int
            and type(count) is int
            and first >= 0
            and count >= 1
            and first + count <= sp.total
        ):
            raise DataError(
                "split of %s: piece %r+%r is not within its %d chunks"
                % (sp.rel, first, count, sp.total),
                "integrity",
            )
        span = streamcrypt.sealed_span(sp.size, sp.chunk_size, first, count)
        if length != span:
            raise DataError(
                "split of %s: piece %d+%d of %d bytes, not %d"
                % (sp.rel, first, count, length, span),
                "integrity",
            )
        self.writing()
        self._make_parents(self.src, sp.rel)
        self._make_parents(self.dest, sp.rel)
        with _flocked(sp.base + ".lock"):
            meta = self._split_meta(sp)
            if not os.path.exists(sp.base + ".json"):  # found by partials/finish if cut
                _write_meta(sp.base, meta)
        self._splits_open.add(sp.sid)
        digest = hashlib.sha256()
        cs, tag = sp.chunk_size, streamcrypt.TAG_LEN
        done = 0  # whole chunks of this piece stored and opened
        try:
            cipher_fd = _own_file(sp.base + ".rmenc", os.O_RDWR | os.O_CREAT)
            try:
                plain_fd = _own_file(sp.part, os.O_RDWR | os.O_CREAT)
            except BaseException:
                os.close(cipher_fd)
                raise
        except DataError:  # a link in the way: the split starts afresh next time
            self._drop_meta(sp.base, {"path": sp.rel, "split": True})
            raise
        try:
            try:
                _pwrite(cipher_fd, sp.header, 0)
                for counter in range(first, first + count):
                    sealed = _read_exact(stdin, min(cs, sp.size - counter * cs) + tag)
                    _pwrite(cipher_fd, sealed, streamcrypt.HEADER_LEN + counter * (cs + tag))
                    try:
                        plain = sp.opener(counter, counter == sp.total - 1, sealed)
                    except streamcrypt.DecryptError as exc:
                        raise DataError(
                            "dataset file %s failed decryption on the host: %s" % (sp.rel, exc),
                            "integrity",
                        ) from None
                    _pwrite(plain_fd, plain, counter * cs)
                    digest.update(plain)
                    done += 1
            finally:
                os.close(plain_fd)
        except EOFError:
            # a cut inside the piece: its chunks that came whole are noted as a shorter
            # piece, so the next attempt sends only the rest of it
            if done:
                self._note_piece(sp, first, done, digest.hexdigest())
            raise
        finally:
            os.close(cipher_fd)
        self._note_piece(sp, first, count, digest.hexdigest())
        assert self.lines is not None
        self.lines.say({"piece": [index, first]})

    def _note_piece(self, sp: "_Split", first: int, count: int, sha: str) -> None:
        """Add a piece whose chunks are all stored and opened to the split's meta.

        The receiver of a cut session may note the piece it was inside only once sshd
        gives up on its link, after the next session stored that piece whole or even
        assembled the split: a shorter note never replaces a longer one, and a split
        whose notes are gone (assembled, dropped) gets none back."""
        if not os.path.exists(sp.base + ".json"):
            return
        with _flocked(sp.base + ".lock"):
            if not os.path.exists(sp.base + ".json"):
                return
            meta = self._split_meta(sp)
            if any(p[0] == first and p[1] >= count for p in meta["pieces"]):
                return
            pieces = [p for p in meta["pieces"] if p[0] != first]
            meta["pieces"] = sorted(pieces + [[first, count, sha]])
            _write_meta(sp.base, meta)

    def assemble(self, index: int, req: Dict[str, Any]) -> None:
        """A ``J`` frame, on the write-behind thread after the files before it: the
        split's pieces must tile the file and its plaintext hash as the laptop says;
        then both parts go into place and the file is recorded and acknowledged like
        a whole one. Any failure removes the split (DataError integrity)."""
        sp = self._split(index, req.get("header"))
        if not os.path.exists(sp.base + ".json"):
            raise DataError(
                "split of %s: no piece of it under this header was received" % sp.rel,
                "integrity",
            )
        try:
            rec = self._assemble(sp, str(req.get("sha256")))
        except OSError as exc:
            self._drop_meta(sp.base, {"path": sp.rel, "split": True})
            raise DataError(
                "split of %s: cannot assemble it: %s" % (sp.rel, exc), "integrity"
            ) from None
        except BaseException:
            self._drop_meta(sp.base, {"path": sp.rel, "split": True})
            raise
        self._splits_open.discard(sp.sid)
        self._verified(index, rec)

    def _assemble(self, sp: "_Split", claimed: str) -> Dict[str, Any]:
        """:meth:`assemble`'s checks and renames, under the split's lock; the record."""
        import streamcrypt

        with _flocked(sp.base + ".lock"):
            meta = self._split_meta(sp)
            at = 0  # the end of the pieces so far that tile from chunk 0
            try:
                for first, count, _ in sorted(meta["pieces"]):
                    if first != at or count < 1:
                        at = -1
                        break
                    at += count
            except (TypeError, ValueError):
                at = -1
            if at != sp.total:
                raise DataError(
                    "split of %s: its pieces do not cover its %d chunks exactly once"
                    % (sp.rel, sp.total),
                    "integrity",
                )
            st = _lstat(sp.part)
            if st is None or st.st_size != sp.size:
                raise DataError(
                    "split of %s: its plaintext in RAM is not %d bytes" % (sp.rel, sp.size),
                    "integrity",
                )
            sink = _HashSink(None)
            with os.fdopen(_own_file(sp.part, os.O_RDONLY), "rb") as fh:
                for block in iter(lambda: fh.read(READ), b""):
                    sink.write(block)
            self._check_digest(sp.rel, sink.digest.hexdigest(), claimed)
            enc_size = streamcrypt.ciphertext_size(sp.size, sp.chunk_size)
            with os.fdopen(_own_file(sp.base + ".rmenc", os.O_RDWR), "r+b") as fh:
                if os.fstat(fh.fileno()).st_size > enc_size:
                    fh.truncate(enc_size)
                if os.fstat(fh.fileno()).st_size != enc_size:
                    raise DataError(
                        "split of %s: its ciphertext is not %d bytes" % (sp.rel, enc_size),
                        "integrity",
                    )
            stored, plain = _inside(self.src, sp.rel) + ".rmenc", _inside(self.dest, sp.rel)
            _make_parents(self.src, sp.rel)
            _make_parents(self.dest, sp.rel)
            os.replace(sp.base + ".rmenc", stored)
            os.replace(sp.part, plain)
            _unlink(sp.base + ".json", sp.base + ".lock")
        return {
            "path": sp.rel,
            "sha256": claimed,
            "size": sp.size,
            "enc_size": os.lstat(stored).st_size,
            "plain_mtime_ns": os.lstat(plain).st_mtime_ns,
        }

    # -------------------------------------------------------------- receiving

    def receive(
        self,
        stdin: BinaryIO,
        index: int,
        length: int,
        behind: WriteBehind,
        resume: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Read one framed file; store, decrypt and verify it (partly on ``behind``).

        The job never sees a partial file. An encrypted file below RESUMABLE bytes is
        read and decrypted in memory here, then stored, hashed, checked and renamed
        into place on the write-behind thread while the next one is read. A larger one
        streams (its plaintext written and hashed on that thread) and arrives under
        ``.remotemac-partial/``, where it stays when the link is cut (see
        :meth:`partials`); ``resume`` continues such a one (the frame carries chunks
        ``resume["chunks"]`` on). Plaintext only ever goes to a hidden part file in
        RAM, renamed into place once verified.
        """
        if not 0 <= index < len(self.entries):
            raise DataError("frame for unknown entry %d" % index)
        self.writing()
        entry = self.entries[index]
        rel = entry["path"]
        stored = _inside(self.src, rel) + (".rmenc" if self.encrypted else "")
        self._make_parents(self.src, rel)
        plain = _inside(self.dest, rel) if self.encrypted else None
        plain_part = None
        meta = None
        if plain is not None:
            self._make_parents(self.dest, rel)
            plain_part = os.path.join(
                os.path.dirname(plain), ".%s.part-%d" % (os.path.basename(plain), os.getpid())
            )
            if resume is None and length < RESUMABLE:
                self._receive_small(stdin, index, rel, length, stored, plain, plain_part, behind)
                return
        if plain is not None and (resume is not None or length >= RESUMABLE):
            base = self._claim_partial(rel, entry, resume)
            part, meta = base + ".rmenc", base + ".json"
        else:  # public: a cut resends it whole
            part = "%s.part-%d" % (stored, os.getpid())
        keep_partial = False
        out = _open_new(plain_part if plain_part is not None else part)
        sink = _HashSink(out, behind)
        try:
            if self.encrypted:
                self._receive_sealed(stdin, rel, length, part, sink, resume)
            else:
                left = length
                while left:
                    block = stdin.read(min(READ, left))
                    if not block:
                        raise EOFError("stream ended inside a frame")
                    sink.write(block)
                    left -= len(block)
            keep_partial = True  # the ciphertext is whole; a cut from here resumes at its end
            claimed = _read_exact(stdin, 32).hex()
            keep_partial = False
        except (EOFError, OSError) as exc:
            # a cut link: the stored ciphertext stays for the next session to resume
            behind.wait_idle()  # it may still be writing the plaintext
            out.close()
            keep_partial = bool(meta) and (keep_partial or isinstance(exc, EOFError))
            _unlink(plain_part or "", *(() if keep_partial else (part, meta or "")))
            raise
        except BaseException:
            behind.wait_idle()
            out.close()
            _unlink(part, plain_part or "", meta or "")
            raise

        def finish() -> None:
            try:
                out.close()
                digest = sink.digest.hexdigest()
                self._check_digest(rel, digest, claimed)
                os.replace(part, stored)
                rec: Dict[str, Any] = {"path": rel, "sha256": digest, "size": sink.size}
                st = os.lstat(stored)
                if plain is not None and plain_part is not None:
                    os.replace(plain_part, plain)
                    rec["enc_size"] = st.st_size
                    rec["plain_mtime_ns"] = os.lstat(plain).st_mtime_ns
                else:
                    rec["mtime_ns"] = st.st_mtime_ns
            except BaseException:
                _unlink(part, plain_part or "", meta or "")
                raise
            if meta:
                _unlink(meta)
            self._verified(index, rec)

        behind.submit(finish)

    def _receive_small(
        self,
        stdin: BinaryIO,
        index: int,
        rel: str,
        length: int,
        stored: str,
        plain: str,
        plain_part: str,
        behind: WriteBehind,
    ) -> None:
        """An encrypted file below RESUMABLE bytes: read and decrypt it here (in memory),
        and leave storing, hashing, checking and renaming to the write-behind thread.

        A cut link leaves nothing of it (it is resent whole)."""
        self.cipher()
        import streamcrypt

        sealed = _read_exact(stdin, length)
        claimed = _read_exact(stdin, 32).hex()
        pieces: List[bytes] = []
        try:
            streamcrypt.decrypt_stream(self.key, rel, io.BytesIO(sealed), _Pieces(pieces))
        except streamcrypt.DecryptError as exc:
            raise DataError(
                "dataset file %s failed decryption on the host: %s" % (rel, exc), "integrity"
            ) from None

        def store() -> None:
            part = "%s.part-%d" % (stored, os.getpid())
            try:
                with _open_new(part) as fh:
                    fh.write(sealed)
                digest = hashlib.sha256()
                size = 0
                with _open_new(plain_part) as fh:
                    for piece in pieces:
                        digest.update(piece)
                        fh.write(piece)
                        size += len(piece)
                self._check_digest(rel, digest.hexdigest(), claimed)
                os.replace(part, stored)
                os.replace(plain_part, plain)
                rec = {
                    "path": rel,
                    "sha256": claimed,
                    "size": size,
                    "enc_size": os.lstat(stored).st_size,
                    "plain_mtime_ns": os.lstat(plain).st_mtime_ns,
                }
            except BaseException:
                _unlink(part, plain_part)
                raise
            self._verified(index, rec)

        behind.submit(store, 2 * length)

    @staticmethod
    def _check_digest(rel: str, digest: str, claimed: str) -> None:
        if digest != claimed:
            raise DataError(
                "dataset file %s: sha256 on the host %s… differs from the "
                "laptop's %s…" % (rel, digest[:12], claimed[:12]),
                "integrity",
            )

    def _verified(self, index: int, rec: Dict[str, Any]) -> None:
        """On the write-behind thread: record a verified file and acknowledge it."""
        assert self.recorder is not None and self.lines is not None
        self.recorder.add(rec)
        self.records[rec["path"]] = rec
        self._stored_seen.add(rec["path"])
        if self.encrypted:
            self._ram_seen[rec["path"]] = rec["plain_mtime_ns"]
        self.received += 1
        self.lines.ack(index)

    def _make_parents(self, base: str, rel: str) -> None:
        """:func:`_make_parents`, once per directory per session (thousands of files
        share a few directories)."""
        parent = rel.rpartition("/")[0]
        if (base, parent) not in self._made:
            _make_parents(base, rel)
            self._made.add((base, parent))

    def _receive_sealed(
        self,
        stdin: BinaryIO,
        rel: str,
        length: int,
        part: str,
        sink: _HashSink,
        resume: Optional[Dict[str, Any]],
    ) -> None:
        """Tee the ciphertext into ``part`` while decrypting it into ``sink``.

        Resuming, the kept prefix is authenticated and decrypted into ``sink`` again
        first (it must hash as it did when reported), then cut to exactly the chunks
        the laptop continues after.
        """
        self.cipher()
        import streamcrypt

        mode = "r+b" if resume is not None else "wb"
        fd = os.open(
            part, os.O_RDWR | os.O_CREAT | _NOFOLLOW | (0 if resume else os.O_TRUNC), 0o600
        )
        with os.fdopen(fd, mode) as copy:
            where = None
            if resume is not None:
                chunks = int(resume["chunks"])
                header, got = streamcrypt.verified_prefix(self.key, rel, copy, sink, chunks)
                if got != chunks or sink.hexdigest() != resume["prefix_sha256"]:
                    raise DataError(
                        "the kept part of %s changed on the host since it was reported" % rel,
                        "integrity",
                    )
                cs = streamcrypt.header_chunk_size(header)
                copy.truncate(streamcrypt.HEADER_LEN + chunks * (cs + streamcrypt.TAG_LEN))
                copy.seek(0, os.SEEK_END)
                where = (header, chunks)
            tee = _Tee(stdin, copy)
            try:
                streamcrypt.decrypt_stream(self.key, rel, tee, sink, limit=length, resume=where)
            except streamcrypt.DecryptError as exc:
                if tee.eof:
                    raise EOFError("stream ended inside a frame") from None
                raise DataError(
                    "dataset file %s failed decryption on the host: %s" % (rel, exc),
                    "integrity",
                ) from None
            if tee.count != length:
                raise EOFError("stream ended inside a frame")

    def final_manifest(self, final: Any) -> List[Dict[str, Any]]:
        """The manifest the E frame describes: the hello's entries with ``changed``
        ([index, size, sha256] the laptop learnt while sending) applied; a list is a
        whole manifest."""
        if isinstance(final, list):
            return final
        changed = {int(i): (size, sha) for i, size, sha in final.get("changed") or []}
        out = []
        for index, entry in enumerate(self.entries):
            size, sha = changed.get(index, (entry["size"], entry["sha256"]))
            out.append({"path": entry["path"], "size": size, "sha256": sha})
        return out

    def finish(self, manifest: List[Dict[str, Any]]) -> Dict[str, Any]:
        """Check every manifest entry before launch; prune what left the slice.

        Per unchanged file this costs no syscall: its plaintext (the job reads it: it
        must have the size and mtime it had when it was verified) was seen by
        :meth:`check_ram` and its stored ciphertext by :meth:`known` moments ago, at the
        start of this session, or this session wrote them; the record is read once per session
        (plus what the other streams appended) and rewritten only when it shrinks or
        has grown to twice its live lines. Both trees are walked for debris only when
        another session's WRITING marker says it did not end cleanly (a clean session
        leaves nothing its record does not list).
        """
        if self._ram_check is not None:
            self._ram_check.join()
        mismatches: List[Dict[str, str]] = []
        redecrypted = 0
        wanted = {}
        # with what the other streams verified
        self._record_end, lines = _read_records(self.src, self._record_end, self.records)
        self._record_lines += lines
        for entry in manifest:
            rel = _check_rel(entry["path"])
            wanted[rel] = entry
            rec = self.records.get(rel)
            if rec is None or (
                rel not in self._stored_seen and not _stored(self.src, rec, self.encrypted)
            ):
                mismatches.append({"path": rel, "why": "missing on the host"})
                continue
            if rec["sha256"] != entry["sha256"] or rec["size"] != entry["size"]:
                mismatches.append({"path": rel, "why": "the host holds another version"})
                continue
            if (
                self.encrypted
                and self._ram_seen.get(rel, -1) != rec.get("plain_mtime_ns")
                and not _plain_ok(self.dest, rec)
            ):
                why = self._redecrypt(rec)
                if why:
                    mismatches.append({"path": rel, "why": why})
                    continue
                redecrypted += 1
        others = self._other_writers()
        if others:  # a cut session may have left debris: walk both trees
            ended = [mark for mark, pid in others if not _alive(pid)]
            pruned = self._prune(set(wanted))
            _unlink(*ended)
        else:  # every session ended cleanly: only recorded files can be left over
            pruned = self._prune_recorded(wanted)
        for base, meta in self._partial_metas():  # every wanted file is whole: none resumes
            if not _alive(meta.get("pid")) and _split_sid(base) not in self._splits_open:
                self._drop_meta(base, meta)
        live = {p: r for p, r in self.records.items() if p in wanted}
        if redecrypted or len(live) < len(self.records) or self._record_lines > 2 * len(live) + 64:
            _compact(self.src, live)
        self.records = live
        self.done_writing()
        return {
            "data_dir": self.dest,
            "mismatches": mismatches,
            "ram": self.ram,
            "received": self.received,
            "redecrypted": redecrypted,
            "pruned": pruned,
        }

    def _redecrypt(self, rec: Dict[str, Any]) -> Optional[str]:
        """RAM lost the plaintext (reboot, workload edit): decrypt the stored copy again."""
        self.cipher()
        import streamcrypt

        rel = rec["path"]
        plain = _inside(self.dest, rel)
        self.writing()
        _make_parents(self.dest, rel)
        try:
            streamcrypt.decrypt_file(self.key, rel, _inside(self.src, rel) + ".rmenc", plain)
        except streamcrypt.DecryptError as exc:
            return "stored ciphertext failed authentication (tampered or damaged): %s" % exc
        except OSError as exc:
            return "cannot decrypt the stored ciphertext: %s" % exc
        sink = _HashSink(None)
        with open(plain, "rb") as fh:
            for block in iter(lambda: fh.read(READ), b""):
                sink.write(block)
        if sink.digest.hexdigest() != rec["sha256"]:
            _unlink(plain)
            return "sha256 differs after decrypting the stored ciphertext"
        rec["plain_mtime_ns"] = os.lstat(plain).st_mtime_ns
        return None

    def _prune_recorded(self, wanted: Dict[str, Any]) -> int:
        """Remove the stored and decrypted copies of recorded files that left the slice.

        Enough when no session was cut since the last walk: a clean session leaves
        nothing in the data dirs that its record does not list.
        """
        pruned = 0
        keys = {name_key(rel) for rel in wanted}
        for rel in self.records:
            if rel in wanted or name_key(rel) in keys:
                continue
            paths = [_inside(self.src, rel) + (".rmenc" if self.encrypted else "")]
            if self.encrypted:
                paths.append(_inside(self.dest, rel))
            for path in paths:
                if _lstat(path) is not None:
                    _unlink(path)
                    pruned += 1
        return pruned

    def _prune(self, wanted: set) -> int:
        """Remove stored and decrypted files that are no longer in the slice (names
        compared by :func:`name_key`: a Mac lists what it stores in its own form)."""
        pruned = 0
        wanted = {name_key(rel) for rel in wanted}
        roots = [(self.src, ".rmenc" if self.encrypted else "")]
        if self.encrypted:
            roots.append((self.dest, ""))
        for base, ext in roots:
            prefix_len = len(base.rstrip(os.sep)) + 1
            for dirpath, dirs, files in os.walk(base):
                below = dirpath[prefix_len:]  # os.walk joins below base with "/"
                prefix = below + "/" if below else ""
                top_of_src = not prefix and base == self.src
                if top_of_src:
                    dirs[:] = [d for d in dirs if not d.startswith(PARTIAL)]
                for name in files:
                    if ".part-" in name:
                        pid = name.rsplit(".part-", 1)[1]
                        if pid.isdigit() and not _alive(int(pid)):
                            _unlink(dirpath + "/" + name)  # debris of a session killed mid-file
                        continue  # else a live session's file in flight
                    if _SPLIT_PART.match(name) and name_key(prefix + name) not in wanted:
                        # a split file's plaintext part (see receive_piece): debris of a
                        # cut split, unless this session is writing it
                        if name.rpartition(".split-")[2] not in self._splits_open:
                            _unlink(dirpath + "/" + name)
                        continue
                    if top_of_src and name.startswith((RECORD, PARTIAL, WRITING)):
                        continue
                    rel = prefix + name
                    if ext:  # a stored copy is "<path>.rmenc"; anything else there goes
                        rel = rel[: -len(ext)] if rel.endswith(ext) else ""
                    if name_key(rel) not in wanted:
                        _unlink(dirpath + "/" + name)
                        pruned += 1
        return pruned


# ------------------------------------------------------------------ entry points


def _say(out: BinaryIO, obj: Dict[str, Any]) -> None:
    out.write((json.dumps(obj) + "\n").encode("utf-8"))
    out.flush()


#: Linux's F_SETPIPE_SZ (fcntl names it from Python 3.10 on), and the size asked for
_F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20


def _widen_pipe(stdin: BinaryIO) -> None:
    """Linux: grow the stdin pipe from sshd to 1 MiB (the unprivileged maximum).

    With the default 64 KiB, every 64 KiB of the stream costs a round of wake-ups
    between sshd and this process; on a busy host (or the loopback bench, where
    both ends share the cores) 10 MB took 60-170 ms through it, ~20 ms through
    1 MiB. macOS has no such call (its pipes size themselves); a refusal (the
    user's pipe quota) just keeps the default.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        fd = stdin.fileno()
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)


def _waiting(stdin: BinaryIO) -> bool:
    """Whether input is already there to read (False when that cannot be told)."""
    try:
        return bool(select.select([stdin.fileno()], [], [], 0)[0])
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


def _preload(runtime_dir: Optional[str]) -> None:
    """Import the cipher from the runtime named in argv while nothing else waits.

    The laptop stats its slice before it sends the hello: when the hello is not
    there yet, this import (tens of ms) costs no time; when it is, the import
    waits until the start answer is out (the laptop then plans and reads its first
    files). A runtime that fails here fails again, with its message, when a byte
    needs decrypting (:meth:`Receiver.cipher`).
    """
    if not runtime_dir:
        return
    with contextlib.suppress(Exception):
        _use_runtime(runtime_dir)
        import streamcrypt

        streamcrypt._aead(bytes(32))


def serve(stdin: BinaryIO, stdout: BinaryIO, runtime_dir: Optional[str] = None) -> int:
    """Run one sync session (see the module doc); returns the process exit code."""
    lines = _Lines(stdout)
    try:
        _widen_pipe(stdin)
        if not _waiting(stdin):
            _preload(runtime_dir)
        line = stdin.readline()
        if not line:
            return 3
        req = json.loads(line.decode("utf-8"))
        receiver = Receiver(req)
        if req.get("worker"):
            lines.say({"ok": True, "ram": receiver.dest and receiver.ram})
            receiver.cipher()
        else:
            known = receiver.known()
            partial = receiver.partials(known)
            todo = receiver.todo(known)
            lines.say({"ok": True, "todo": todo, "partial": partial})
            # while the laptop plans and reads its first files: the RAM store, a look
            # at the RAM copies, the cipher
            receiver.start_check_ram()
            receiver.cipher()
        receiver.recorder, receiver.lines = _Recorder(receiver.src), lines
        behind = WriteBehind(BEHIND_BYTES, idle=lines.flush_acks)
        try:
            return _frames(stdin, receiver, behind, lines)
        finally:
            behind.close()  # what was read whole is still stored, verified and recorded
            lines.flush_acks()
            receiver.recorder.close()
    except DataError as exc:
        _answer_error(lines, str(exc), exc.code)
        return 1
    except (EOFError, BrokenPipeError):
        return 3  # the laptop went away; what was acknowledged is recorded
    except Exception as exc:  # one line back to the laptop, never a traceback
        _answer_error(
            lines,
            "%s: %s" % (type(exc).__name__, exc),
            "host-env" if isinstance(exc, ImportError) else "internal",
        )
        return 1


def _frames(stdin: BinaryIO, receiver: Receiver, behind: WriteBehind, lines: _Lines) -> int:
    """Read frames until the session ends (the D or E frame); the exit code."""
    while True:
        kind, index, length = FRAME.unpack(_read_exact(stdin, FRAME.size))
        if kind == b"F":
            receiver.receive(stdin, index, length, behind)
        elif kind == b"R":
            (size,) = META_LEN.unpack(_read_exact(stdin, META_LEN.size))
            resume = json.loads(_read_exact(stdin, size).decode("utf-8"))
            receiver.receive(stdin, index, length, behind, resume)
        elif kind == b"S":  # one piece of a split file, written here (see receive_piece)
            if behind.error is not None:  # a file before it failed: that ends the session
                raise behind.error
            (size,) = META_LEN.unpack(_read_exact(stdin, META_LEN.size))
            receiver.receive_piece(stdin, index, length, _small_json(stdin, size))
        elif kind == b"J":  # after the files before it: records and acks stay in order
            req = _small_json(stdin, length)
            behind.submit(functools.partial(receiver.assemble, index, req))
        elif kind == b"P":
            lines.say({"ok": True, "pong": True})
        elif kind == b"D":  # one of several streams is done: the first one finishes
            behind.drain()
            receiver.done_writing()
            lines.say({"ok": True, "result": {"received": receiver.received}})
            return 0
        elif kind == b"E":
            final = json.loads(_read_exact(stdin, length).decode("utf-8"))
            behind.drain()
            manifest = receiver.final_manifest(final)
            lines.say({"ok": True, "result": receiver.finish(manifest)})
            return 0
        else:
            raise DataError("unknown frame %r" % kind)


#: a split frame's JSON is a header and a few numbers: anything longer is not ours
SPLIT_JSON_MAX = 1 << 16


def _small_json(stdin: BinaryIO, size: int) -> Dict[str, Any]:
    """A split frame's JSON object (DataError integrity when it is not one)."""
    if size > SPLIT_JSON_MAX:
        raise DataError("a split frame's description of %d bytes" % size, "integrity")
    try:
        obj = json.loads(_read_exact(stdin, size).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        obj = None
    if not isinstance(obj, dict):
        raise DataError("a split frame's description is not a JSON object", "integrity")
    return obj


def _answer_error(lines: _Lines, message: str, code: str) -> None:
    with contextlib.suppress(OSError):
        lines.flush_acks()
        lines.say({"ok": False, "error": message, "code": code})


def op_prepare_data(req: Dict[str, Any]) -> Dict[str, Any]:
    """Full check: decrypt (or hash) every manifest entry from what is stored on the host.

    Slower than the sync session's quick check, and independent of its record: a
    ciphertext edited on the host since it was received is caught here.
    """
    try:
        receiver = Receiver(dict(req, entries=[]))
        receiver.cipher()
        receiver.dest  # noqa: B018 (makes the RAM store: its errors answer here)
    except DataError as exc:
        return {
            "data_dir": None,
            "mismatches": [],
            "ram": None,
            "error": {"message": str(exc), "code": exc.code},
        }
    mismatches: List[Dict[str, str]] = []
    for entry in req["manifest"]:
        rel = _check_rel(entry["path"])
        rec = {"path": rel, "sha256": entry["sha256"], "size": entry["size"]}
        if receiver.encrypted:
            why = receiver._redecrypt(rec)
        else:
            why = _hash_check(_inside(receiver.src, rel), entry["sha256"])
        if why:
            mismatches.append({"path": rel, "why": why})
        elif receiver.encrypted:
            old = receiver.records.get(rel)
            if old is not None and old.get("sha256") == rec["sha256"]:
                old["plain_mtime_ns"] = rec["plain_mtime_ns"]
    if receiver.encrypted and receiver.records:
        _compact(receiver.src, receiver.records)
    receiver.done_writing()
    return {"data_dir": receiver.dest, "mismatches": mismatches, "ram": receiver.ram}


def _hash_check(path: str, expected: str) -> Optional[str]:
    if _lstat(path) is None:
        return "missing"
    sink = _HashSink(None)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(READ), b""):
            sink.write(block)
    return None if sink.digest.hexdigest() == expected else "sha256 differs"


def main(args: List[str]) -> None:
    """``dataops.py sync [--runtime DIR]``: one session on stdin/stdout, then exit.

    The laptop runs it as ``python -S -c BOOT <agent dir>/dataops.py sync …`` (see
    engine/sync.py ``_receiver_argv``): imported, this module loads from its cached
    bytecode, where run as a script it was compiled on every start (7 ms of the
    18 ms this file's start cost on top of the interpreter's, before the host
    could read the hello).
    """
    if args[:1] != ["sync"] or args[1:] not in ([], ["--runtime", args[-1]]):
        sys.stdout.write(
            json.dumps(
                {"ok": False, "error": "usage: dataops.py sync [--runtime DIR]", "code": "usage"}
            )
            + "\n"
        )
        sys.exit(2)
    code = serve(sys.stdin.buffer, sys.stdout.buffer, args[2] if len(args) == 3 else None)
    # every answer is flushed and every record line written (os.write): skip the
    # interpreter's teardown of the session's thousands of dicts, which the laptop waits for
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(sys.argv[1:])
