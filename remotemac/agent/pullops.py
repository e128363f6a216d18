"""Host side of a pull: stream result files to the laptop over one exec channel.

Why a stream and not SFTP: OpenSSH's sftp-server answers reads of at most 256 KiB,
each a request and a response, and the laptop had to hash every file a second time
through the agent's listing. Here one process reads each file once, hashes it as it
goes and writes it down the channel; many files follow each other with no round
trip between them, and a file cut part-way is asked for again from an offset.

``python3 -S pullops.py send`` speaks this protocol on stdin/stdout:

0. laptop → ``{"ping": true}`` lines (optional, any number), each answered by a
   ``b"P" 0 0`` frame (the laptop sends none now: it reads the round trip from the
   channel's opening and writes its request at once, issue 36);
1. laptop → one JSON line ``{"dir": output dir, "files": [[index, name_hex, offset,
   limit], ...]}``: ``name_hex`` is the file's path below ``dir`` as bytes (the name
   the listing gave), ``offset`` what the laptop already holds of it, ``limit`` the
   size it was listed with (never more is read);
2. host → for each file, in the order asked, frames ``kind:c index:u32 length:u64``
   (``protocol.FRAME``; the kinds are named in ``protocol.PullFrame``):
   ``b"D"`` + ``length`` bytes of the file, continuing from ``offset`` (chunks of at
   most CHUNK); then ``b"H"`` + the 32-byte SHA-256 of the file's bytes from 0 to
   where the data ended; or instead ``b"X"`` + a JSON ``{"why"}``: the file is not
   sent (a link, FIFO or device, gone, or a parent that is not a directory). When
   ``offset`` is not 0 the data is preceded by ``b"V"`` + the SHA-256 of the file's
   first ``offset`` bytes (read and hashed here, not sent), and the laptop answers
   one line: ``go`` (its prefix is the same: continue from ``offset``) or
   ``restart`` (send the file from 0);
3. ``b"Z" 0 0`` once every file was sent; any failure is ``b"E" 0 length`` + JSON
   ``{"error", "code"}`` and the end of the stream.

Nothing below ``dir`` is followed: each directory on the way is opened with
``O_NOFOLLOW | O_DIRECTORY`` relative to its parent, and a file is opened only when
its ``lstat`` says it is regular (a FIFO is never opened, so it cannot hang here),
then checked again with ``fstat``. The laptop validates every name before asking
and never trusts what this side says beyond the bytes it asked for.

Standard library only, Python 3.9.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import stat
import sys
from typing import Any, BinaryIO, List, Optional, Tuple

if __package__:  # imported as remotemac.agent.pullops (the laptop, tests)
    from .protocol import FRAME, PullFrame
else:  # ``python3 -S pullops.py send`` in the agent dir on the host
    from protocol import FRAME, PullFrame

#: bytes per data frame: big enough that framing costs nothing, small enough that the
#: laptop's buffers stay small
CHUNK = 1 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
#: Linux only: a bigger pipe to sshd means fewer wake-ups of both processes
_F_SETPIPE_SZ = 1031


class Skip(Exception):
    """This file is not sent; the message says why (it goes to the laptop as ``X``)."""


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISFIFO(mode):
        return "fifo"
    return "regular file" if stat.S_ISREG(mode) else "special file"


def _lstat_at(name: bytes, dir_fd: int) -> Optional[os.stat_result]:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_below(base_fd: int, name: bytes) -> int:
    """An fd of the regular file ``name`` below ``base_fd``, no link followed; or Skip."""
    parts = name.split(b"/")
    if not name or name.startswith(b"/") or any(p in (b"", b".", b"..") for p in parts):
        raise Skip("not a plain relative name")
    fd = base_fd
    try:
        for i, part in enumerate(parts):
            where = b"/".join(parts[: i + 1]).decode("utf-8", "replace")
            st = _lstat_at(part, fd)
            last = i == len(parts) - 1
            if st is None:
                raise Skip("gone from the host" if last else "its parent %s is missing" % where)
            if not last:
                if not stat.S_ISDIR(st.st_mode):
                    raise Skip("its parent %s is a %s on the host" % (where, _kind(st.st_mode)))
                flags = os.O_RDONLY | _DIRECTORY | _NOFOLLOW
            elif not stat.S_ISREG(st.st_mode):
                raise Skip("it is a %s on the host, not a regular file" % _kind(st.st_mode))
            else:
                flags = os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK
            try:
                nfd = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                raise Skip("gone from the host") from None
            except OSError as exc:  # swapped for a link or a file since the lstat
                raise Skip("changed while it was opened: %s" % exc.strerror) from None
            if fd != base_fd:
                os.close(fd)
            fd = nfd
            st2 = os.fstat(fd)
            if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
                raise Skip("changed while it was opened")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        if fd != base_fd:
            os.close(fd)
        raise


class Sender:
    """Writes frames to the laptop; the hash of each block runs on a helper thread
    while the next block is read and written (hashlib lets go of the GIL)."""

    def __init__(self, out: int, stdin: BinaryIO) -> None:
        self.out, self.stdin = out, stdin
        self.pool = concurrent.futures.ThreadPoolExecutor(1)
        if sys.platform.startswith("linux"):
            # a pipe of the default size only costs more wake-ups
            with contextlib.suppress(OSError):
                fcntl.fcntl(out, _F_SETPIPE_SZ, 1 << 20)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.out, view) :]

    def frame(self, kind: bytes, index: int, payload: bytes = b"") -> None:
        self._write(FRAME.pack(kind, index, len(payload)) + payload)

    def send_file(self, base_fd: int, index: int, name: bytes, offset: int, limit: int) -> None:
        """One file: its data from ``offset`` up to ``limit``, then its SHA-256 (or X)."""
        try:
            fd = open_below(base_fd, name)
        except Skip as exc:
            self.frame(PullFrame.SKIP, index, json.dumps({"why": str(exc)}).encode("utf-8"))
            return
        digest = hashlib.sha256()
        try:
            offset = max(0, min(offset, limit))
            done = 0
            while done < offset:  # the prefix the laptop holds: hashed, not sent
                block = os.read(fd, min(CHUNK, offset - done))
                if not block:
                    break
                digest.update(block)
                done += len(block)
            if offset:
                self.frame(PullFrame.VERIFY, index, digest.copy().digest())
                answer = self.stdin.readline()
                if answer == b"restart\n":
                    digest, done = hashlib.sha256(), 0
                    os.lseek(fd, 0, os.SEEK_SET)
                elif answer != b"go\n":
                    raise BrokenPipeError("no answer to the prefix check")
            pending = None
            while done < limit:
                block = os.read(fd, min(CHUNK, limit - done))
                if not block:
                    break  # shorter than listed: the laptop sees the size differ
                done += len(block)
                if done >= limit and pending is None:
                    # a file of one block (most results): hashed here, no thread hand-off
                    digest.update(block)
                    self._write(FRAME.pack(PullFrame.DATA, index, len(block)) + block)
                    break
                self._write(FRAME.pack(PullFrame.DATA, index, len(block)))
                if pending is not None:
                    pending.result()
                pending = self.pool.submit(digest.update, block)
                self._write(block)
            if pending is not None:
                pending.result()
        finally:
            os.close(fd)
        self.frame(PullFrame.HASH, index, digest.digest())


def _files(req: Any) -> List[Tuple[int, bytes, int, int]]:
    files = req.get("files") if isinstance(req, dict) else None
    if not isinstance(files, list):
        raise ValueError("no file list")
    out = []
    for item in files:
        index, name_hex, offset, limit = item
        out.append((int(index), bytes.fromhex(name_hex), int(offset), int(limit)))
    return out


def serve(stdin: BinaryIO, out: int) -> int:
    """Run one pull stream (see the module doc); returns the process exit code."""
    sender = Sender(out, stdin)
    try:
        while True:
            line = stdin.readline()
            if not line:
                return 3
            req = json.loads(line.decode("utf-8"))
            if not (isinstance(req, dict) and req.get("ping")):
                break
            sender.frame(PullFrame.PING, 0)
        files = _files(req)
        base_fd = os.open(req["dir"], os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
        try:
            for index, name, offset, limit in files:
                sender.send_file(base_fd, index, name, offset, limit)
        finally:
            os.close(base_fd)
        sender.frame(PullFrame.END, 0)
        return 0
    except BrokenPipeError:
        return 3  # the laptop went away; it asks again from what it holds
    except Exception as exc:  # one frame back to the laptop, never a traceback
        message = {"error": "%s: %s" % (type(exc).__name__, exc), "code": "internal"}
        with contextlib.suppress(OSError):
            sender.frame(PullFrame.ERROR, 0, json.dumps(message).encode("utf-8"))
        return 1


if __name__ == "__main__":
    if sys.argv[1:] != ["send"]:
        sys.stderr.write("usage: pullops.py send\n")
        sys.exit(2)
    sys.exit(serve(sys.stdin.buffer, sys.stdout.fileno()))
