"""The sync receiver's byte plumbing: sinks that hash, the answer lines, safe file opens.

Why its own module: every step of the receiver (whole files, cut transfers, split
pieces, the final check) writes through these, and each open here refuses to follow a
link planted under a name someone on the host can guess. Python 3.9, stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import stat
import threading
from typing import BinaryIO, Callable, Iterator, List, Optional, Tuple

from .datarecords import NOFOLLOW, DataError, open_packs_dir, pack_path
from .protocol import JsonObject
from .writebehind import WriteBehind

# ------------------------------------------------------------------ streams


class Tee:
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


class HashSink:
    """Writes plaintext to ``dst`` and hashes it on the way; with ``behind``, both happen
    on the write-behind thread (the caller reads ``digest`` only after it drained).

    ``hashing=False``: writes only (``digest`` stays the hash of nothing). For an
    encrypted file received whole in one stream, whose authenticated decryption is its
    check (see Receiver.receive and docs/contract.md)."""

    def __init__(
        self, dst: Optional[BinaryIO], behind: Optional[WriteBehind] = None, hashing: bool = True
    ) -> None:
        self._dst = dst
        self._behind = behind
        self.digest = hashlib.sha256()
        self.hashing = hashing
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self._behind is not None:
            self._behind.submit(functools.partial(self._write, data), len(data))
        else:
            self._write(data)
        return len(data)

    def _write(self, data: bytes) -> None:
        if self.hashing:
            self.digest.update(data)
        if self._dst is not None:
            self._dst.write(data)

    def hexdigest(self) -> str:
        if not self.hashing:  # (the hash of nothing must never be recorded or compared)
            raise RuntimeError("this sink does not hash")
        if self._behind is not None:
            self._behind.drain()
        return self.digest.hexdigest()


class Pieces:
    """A sink that keeps what is written (one small file's plaintext, in memory)."""

    def __init__(self, pieces: List[bytes]) -> None:
        self.pieces = pieces

    def write(self, data: bytes) -> int:
        self.pieces.append(data)
        return len(data)


class Pack:
    """One group of small files' ciphertext, appended to one file at rest (see
    datarecords.PACKS): each file is sealed on its own, the record names its span.

    Why: a file on the host's disk for each small file cost more CPU than the rest of
    storing it (shape A, 1,916 files over loopback, rounds 2-3: the host's CPU 1.90-2.09 s
    a file each, 1.10-1.29 s packed per group). Made on the first append, O_EXCL and
    never through a link; its name (pid, a random token, a count) is never reused."""

    def __init__(self, src: str, name: str) -> None:
        self.src = src
        self.name = name
        self._fd = -1
        self._size = 0

    def append(self, data: bytes) -> Tuple[str, int]:
        """Write ``data`` at the pack's end: (the pack's name, where it starts)."""
        if self._fd < 0:
            self._fd = _create_pack(self.src, self.name)
        off = self._size
        write_all(self._fd, [data])
        self._size += len(data)
        return self.name, off

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _create_pack(src: str, name: str) -> int:
    """A new pack's fd, in ``<src>/.remotemac-packs/`` (made 0700, refused if it is a
    link or a file), created through the folder's own fd: a link swapped in for the
    folder after it was checked cannot move the pack elsewhere."""
    pack_path(src, name)  # (refuses a name that is not a pack's)
    folder = open_packs_dir(src, create=True)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW
        return os.open(name, flags, 0o600, dir_fd=folder)
    finally:
        os.close(folder)


class Lines:
    """stdout of the session: JSON lines from the reader and the write-behind thread.

    Acknowledgements are gathered and sent as one ``{"acks": [...]}`` line by
    :meth:`flush_acks` (the write-behind thread's idle step), not one line per file.
    """

    def __init__(self, out: BinaryIO, before_acks: Callable[[], None] = lambda: None) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._acks: List[int] = []
        #: writes the record lines of the files about to be acknowledged (see
        #: datarecords.Recorder): an ack never reaches the laptop before its record
        self.before_acks = before_acks

    def say(self, obj: JsonObject) -> None:
        with self._lock:
            say(self._out, obj)

    def ack(self, index: int) -> None:
        with self._lock:
            self._acks.append(index)

    def flush_acks(self) -> None:
        """Send the gathered acks once their record lines are written; when they could
        not be (``before_acks`` raised), the acks are dropped, never sent: the laptop sends
        those files again and the next session stores them anew."""
        with self._lock:
            try:
                self.before_acks()
            except BaseException:
                self._acks = []
                raise
            if self._acks:
                acks, self._acks = self._acks, []
                say(self._out, {"acks": acks})


def read_exact(src: BinaryIO, size: int) -> bytes:
    data = src.read(size)
    if len(data) != size:
        raise EOFError("stream ended inside a frame")
    return data


def create_new(path: str) -> int:
    """An fd of a new file of this session's (a part, a temp name), O_EXCL: whatever
    has the name goes first, so a hard link or symlink planted at a name one can guess
    (the pid) is never written through into a file outside remote_root.

    O_EXCL is tried first and the name unlinked only when taken: the unlink of a name
    that is not there was a syscall per part file (two per small file) for nothing.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:
        unlink_quietly(path)
        return os.open(path, flags, 0o600)


def open_new(path: str) -> BinaryIO:
    """:func:`create_new` as a buffered file."""
    return os.fdopen(create_new(path), "wb")


def write_all(fd: int, pieces: List[bytes]) -> int:
    """Write ``pieces`` to ``fd`` with as few syscalls as the OS allows (one writev for
    a small file's pieces, where a buffered file made a write per piece); the bytes."""
    total = sum(len(p) for p in pieces)
    left = total
    views = [memoryview(p) for p in pieces if p]
    while views:
        done = os.writev(fd, views[:_IOV_MAX])
        left -= done
        while views and done >= len(views[0]):
            done -= len(views.pop(0))
        if done:
            views[0] = views[0][done:]
    if left:
        raise OSError("short write")
    return total


_IOV_MAX = 512


def unlink_quietly(*paths: str) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


def say(out: BinaryIO, obj: JsonObject) -> None:
    out.write((json.dumps(obj) + "\n").encode("utf-8"))
    out.flush()


@contextlib.contextmanager
def flocked(path: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (made if missing): the streams' receivers
    are separate processes that note pieces of one split."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_note(path: str) -> bytes:
    """The bytes of a kept transfer's ``.json`` note, a regular file only.

    Why: ``open()`` of a FIFO planted under that name would wait forever for a writer
    and hang the receiver (and the sync with it); a symlink would read another file
    (OSError ELOOP). A FIFO or device is not remotemac's note: DataError unsafe-path,
    and it is left where it is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DataError("%s is not a file of remotemac's: left alone" % path, "unsafe-path")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    finally:
        os.close(fd)


def own_file(path: str, flags: int) -> int:
    """An fd of ``path`` (a split's ciphertext or RAM part), never through a link.

    Why: those names outlive a session and the start answer gives their sid away, so
    someone on the host can put a symlink or a hard link to another file there; the
    receivers of several streams open them in turn (no O_EXCL), so the file must be a
    regular one with no other name, or ciphertext, or plaintext on a disk, would land
    in a file outside remote_root."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | NOFOLLOW, 0o600)  # a FIFO: no wait
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


def write_meta(base: str, meta: JsonObject) -> None:
    """``base.json`` written whole (temp name, then rename): readers never see half."""
    tmp = "%s.tmp-%d" % (base, os.getpid())
    with open_new(tmp) as fh:
        fh.write(json.dumps(meta).encode("utf-8"))
    os.replace(tmp, base + ".json")


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done
