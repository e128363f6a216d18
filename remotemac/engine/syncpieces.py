"""Sync's pieces: read each file once, hash and seal it, and frame it for the channel.

Small files' batches are made on the event loop, a large file's in a worker thread
(``Lane``); engine/synctalk.py writes the batches. See engine/sync.py for the stream
as a whole.
"""

from __future__ import annotations

import collections
import enum
import hashlib
import io
import json
import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from remotemac.agent.protocol import FRAME as FRAME_HEADER
from remotemac.engine import syncsplit
from remotemac.engine.syncplan import BATCH_BYTES, FRAME, Job, LocalFile
from remotemac.errors import IntegrityError

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
#: a file up to one chunk of the stream cipher (streamcrypt.DEFAULT_CHUNK) goes as one piece
SMALL_BYTES = 256 << 10


def pack_frame(kind: str, index: int, length: int) -> bytes:
    """A sync frame header (``protocol.FRAME``; the kinds are ``protocol.SyncFrame``)."""
    return FRAME_HEADER.pack(kind.encode(), index, length)


class Lane(enum.Enum):
    """Where the next batches are best made: ``read_pieces(lanes=True)`` yields one
    before and after each large file or split piece.

    A small file is read, hashed and sealed in tens of microseconds, and each of those
    calls drops the GIL: made in a worker thread, every file cost a few hand-offs of
    the GIL to the event loop and back (0.33-0.43 s of the laptop's CPU per GiB of
    7,681 files, ~14 us each, with 20-27 thousand context switches), more than the
    thread won. A large file's 1 MiB reads, hashes and seals release the GIL long
    enough for the overlap with the loop's SSH work to pay, and a resumed one hashes
    its whole kept prefix first: those stay in the thread, off the loop."""

    LOOP = "loop"
    THREAD = "thread"


@dataclass
class FileDone:
    index: int
    local: LocalFile
    sent: bool
    resumed: int = 0  # plaintext bytes the host already held (a resumed cut transfer)


class HashingReader:
    """Reads exactly ``size`` bytes of a file while hashing them (one read, two uses)."""

    def __init__(self, fh: BinaryIO, size: int, path: str) -> None:
        self.fh, self.left, self.path, self.size = fh, size, path, size
        self.digest = hashlib.sha256()

    def rewind(self) -> None:
        self.fh.seek(0)
        self.left, self.digest = self.size, hashlib.sha256()

    def read(self, n: int) -> bytes:
        if not self.left:  # (the sealer asks once more after a small file's one chunk)
            return b""
        data = self.fh.read(min(n, self.left))
        self.left -= len(data)
        self.digest.update(data)
        if not data and self.left:
            raise IntegrityError(
                f"data file {self.path} shrank while it was sent",
                hint="stop whatever writes to the dataset and sync again",
            )
        return data


def read_pieces(
    root: Path,
    files: list[LocalFile],
    work: collections.deque,
    key: bytes | None,
    halted: Callable[[], bool] = lambda: False,
    splits: dict[int, syncsplit.Split] | None = None,
    log: syncsplit.SealLog | None = None,
    hints: collections.deque[bytes] | None = None,
    lanes: bool = False,
) -> Iterator[Any]:
    """Yield (bytes, plaintext bytes covered) to send, and a FileDone after each file
    (a small file's bytes come as one list: its frame, header, sealed chunk and hash).

    Takes the next file from ``work`` (shared by every stream) only when ready for it.
    A piece of a split file (``splits``) yields no FileDone: the assemble frame ends it.
    ``log`` (the session's) refuses a chunk sealed again with other bytes. ``hints``:
    frames another task queues for this stream, sent between two files' frames.
    ``lanes``: a ``Lane.THREAD`` before a large file or a piece and a ``Lane.LOOP``
    after it, before any of its work is done (``next_batch`` stops there on the loop).
    """
    top = os.fspath(root)  # (a pathlib join costs ~10 us a small file)
    while not halted():
        while hints:
            try:  # (the loop's teardown may clear the queue under a thread)
                hint = hints.popleft()
            except IndexError:
                break
            yield hint, 0
        try:
            job = work.popleft()
        except IndexError:
            return
        large = lanes and (
            job.piece is not None or bool(job.partial) or files[job.index].size > SMALL_BYTES
        )
        if large:
            yield Lane.THREAD
        if job.piece is not None:
            assert key is not None and splits is not None
            yield from syncsplit.sealed_piece(
                root, splits[job.index], job.piece, key, pack_frame, log
            )
        else:  # (a file grown past SMALL_BYTES since the scan turns to the thread itself)
            large |= yield from _file_pieces(
                top, files[job.index], job, key, log, lanes and not large
            )
        if large:
            yield Lane.LOOP


def _file_pieces(
    top: str,
    f: LocalFile,
    job: Job,
    key: bytes | None,
    log: syncsplit.SealLog | None,
    on_loop: bool = False,
) -> Generator[Any, None, bool]:
    """One whole file's pieces and its FileDone (read_pieces). ``on_loop``: the file
    was small when scanned; if it is large now, yield ``Lane.THREAD`` before reading
    it and return True (the caller turns back to the loop after it)."""
    full = os.path.join(top, f.path)
    fd = os.open(full, _OPEN_FLAGS)
    with io.FileIO(fd, "rb") as fh:
        before = os.fstat(fh.fileno())
        size = before.st_size
        grown = on_loop and size > SMALL_BYTES
        if grown:
            yield Lane.THREAD
        if job.host_sha is not None and f.sha256 is None:
            # the host holds a verified copy of this path: hash first, maybe skip sending
            sha = _hash_all(fh, size, f.path)
            local = LocalFile(
                f.path, size, before.st_mtime_ns, before.st_ino, sha, before.st_ctime_ns
            )
            if sha == job.host_sha and _unchanged(fh, before):
                yield FileDone(job.index, local, sent=False)
                return grown
            fh.seek(0)
        reader = HashingReader(fh, size, f.path)
        resumed = 0
        small: list[bytes] | None = None
        if key is not None and not job.partial and size <= SMALL_BYTES:
            small = _sealed_small(job.index, f.path, reader, before, key)
        elif key is not None:
            resumed = yield from _sealed_file(job, f.path, reader, before, key, log)
        else:
            yield pack_frame(FRAME, job.index, size), 0
            while block := reader.read(BATCH_BYTES):
                yield block, len(block)
        if reader.left or not _unchanged(fh, before):
            raise IntegrityError(
                f"data file {full} changed while it was sent",
                hint="stop whatever writes to the dataset and sync again",
            )
        raw = reader.digest.digest()
        sha = raw.hex()
        if small is None:
            yield raw, 0
        else:  # (one piece for the whole file, once it is known unchanged)
            small.append(raw)
            yield small, size
        yield FileDone(
            job.index,
            LocalFile(f.path, size, before.st_mtime_ns, before.st_ino, sha, before.st_ctime_ns),
            sent=True,
            resumed=resumed,
        )
    return grown


def _sealed_small(
    index: int,
    path: str,
    reader: HashingReader,
    before: os.stat_result,
    key: bytes,
) -> list[bytes]:
    """A file of one chunk at most, sent whole: its frame, header and sealed chunk as
    one piece (a small file's five pieces through three generators, each a turn of
    next_batch, had cost more than sealing it: ~10 us a file).

    Not noted in the SealLog: a small file is never continued (a cut resends it whole
    under a fresh header and salt), so no chunk of it is ever sealed twice under one
    nonce, and its entry (the header kept as its key, the tag, the slot: ~240 bytes a
    file) would only grow the laptop's memory with the file count (a slice of a
    million small files: ~240 MB, past the 200 MiB the laptop keeps to)."""
    from remotemac.agent.streamcrypt import DEFAULT_CHUNK, ciphertext_size, iter_encrypt

    version = syncsplit.file_version(before)
    header, *chunks = iter_encrypt(key, path, reader, DEFAULT_CHUNK, version=version)  # type: ignore[arg-type]
    return [
        pack_frame(FRAME, index, ciphertext_size(before.st_size, DEFAULT_CHUNK)),
        header,
        *chunks,
    ]


def _sealed_file(
    job: Job,
    path: str,
    reader: HashingReader,
    before: os.stat_result,
    key: bytes,
    log: syncsplit.SealLog | None,
) -> Generator[tuple[bytes, int], None, int]:
    """Yield one file's frame and sealed chunks (a cut transfer continued where the host
    holds it); return the plaintext bytes the host already held."""
    from remotemac.agent.streamcrypt import DEFAULT_CHUNK, ciphertext_size, iter_encrypt

    size = before.st_size
    resume = resume_point(job, reader, before, key, path)
    if resume is None:
        yield pack_frame(FRAME, job.index, ciphertext_size(size, DEFAULT_CHUNK)), 0
        chunk, where, resumed = DEFAULT_CHUNK, None, 0
    else:
        frame, chunk, where, resumed = resume
        yield frame, resumed
    covered = resumed
    version = syncsplit.file_version(before)
    header, counter = where if where is not None else (b"", 0)
    for sealed in iter_encrypt(
        key,
        path,
        reader,  # type: ignore[arg-type]
        chunk,
        resume=where,
        version=version,
    ):
        if not header:
            header = sealed  # (a fresh stream's first item)
        elif log is not None:
            log.check(header, counter, sealed, path)
            counter += 1
        read = size - reader.left
        yield sealed, read - covered
        covered = read
    return resumed


def resume_point(
    job: Job, reader: HashingReader, before: os.stat_result, key: bytes, path: str
) -> tuple[bytes, int, tuple[bytes, int], int] | None:
    """(R frame, chunk size, (header, first chunk), plaintext offset) to continue the
    host's cut transfer of this file, or None to send it whole.

    Resumes only when the file has the size and mtime it had when that transfer
    began, the header is ours (its MAC verifies under this key for this path) and was
    made for this version of the file (the host, not trusted, could hand back an older
    version's header with a prefix it knows did not change), and
    the first ``offset`` bytes hash as the host's verified prefix does: the tail is
    then sealed again under the same key and nonces with the same plaintext (a
    changed file would reuse GCM nonces with other plaintext, so it starts afresh).
    The prefix is read from disk to hash it, never sent.
    """
    from remotemac.agent.streamcrypt import (
        HEADER_LEN,
        TAG_LEN,
        DecryptError,
        ciphertext_size,
        header_chunk_size,
        header_fits,
        open_header,
    )

    partial, size = job.partial, before.st_size
    if not partial or (size, before.st_mtime_ns) != (partial.size, partial.mtime_ns):
        return None
    header = bytes.fromhex(str(partial.header))
    chunk = header_chunk_size(header)
    chunks = int(partial.chunks)
    offset = chunks * chunk
    if not chunk or not 0 < offset < size or offset != partial.offset:
        return None
    try:
        open_header(key, path, header)
    except DecryptError:
        return None
    if not header_fits(key, path, header, syncsplit.file_version(before)):
        return None
    while reader.left > size - offset:
        reader.read(min(BATCH_BYTES, reader.left - (size - offset)))
    if reader.digest.hexdigest() != partial.prefix_sha256:
        reader.rewind()
        return None
    meta = json.dumps(
        {"partial": partial.partial, "chunks": chunks, "prefix_sha256": partial.prefix_sha256}
    ).encode()
    tail = ciphertext_size(size, chunk) - HEADER_LEN - chunks * (chunk + TAG_LEN)
    frame = pack_frame("R", job.index, tail) + len(meta).to_bytes(4, "big") + meta
    return frame, chunk, (header, chunks), offset


def _hash_all(fh: BinaryIO, size: int, path: str) -> str:
    reader = HashingReader(fh, size, path)
    while reader.read(BATCH_BYTES):
        pass
    return reader.digest.hexdigest()


def _unchanged(fh: BinaryIO, before: os.stat_result) -> bool:
    after = os.fstat(fh.fileno())
    return (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@dataclass
class Batch:
    """Up to ~BATCH_BYTES of the stream, joined: one channel write (a write per piece,
    thousands for small files, cost the event loop more than the bytes did)."""

    data: bytes
    plain: int  # plaintext bytes it covers (progress)
    done: list[FileDone]  # files whose last byte is in this batch or an earlier one
    lane: Lane = Lane.THREAD  # where the next batch is best made
    ended: bool = False  # the pieces ran out: no batch follows


#: files in one batch at most: a batch made on the loop holds the loop for as long as
#: it takes, and ~7,000 empty files fit in 1 MiB (~0.1 s warm, seconds from a cold disk)
BATCH_FILES = 256


def next_batch(pieces: Iterator[Any], limit: int = BATCH_BYTES, lane: Lane | None = None) -> Batch:
    """The next batch of pieces, about ``limit`` bytes read, sent or not, or
    BATCH_FILES files (files the host already holds are read and hashed, and send
    nothing: on the loop, a run of them must not make one endless batch).

    ``lane``: where this batch is being made, for pieces that carry ``Lane`` marks: it
    stops at a mark for the other lane, before a large file's first read on the loop
    and before the next small file in the thread (the batch may then be empty, and is
    not ``ended``). Without marks, an empty batch is the end."""
    parts: list[bytes] = []
    done: list[FileDone] = []
    size = plain = 0
    for item in pieces:
        if type(item) is Lane:
            if lane is not None and item is not lane:
                return Batch(b"".join(parts), plain, done, item)
            continue
        if isinstance(item, FileDone):
            done.append(item)
            if not item.sent:
                size += item.local.size  # (read and hashed, not sent)
            if size >= limit or len(done) >= BATCH_FILES:
                return Batch(b"".join(parts), plain, done, lane or Lane.THREAD)
            continue
        data, covered = item
        if type(data) is list:  # a small file whole (read_pieces)
            parts += data
            size += sum(map(len, data))
        else:
            parts.append(data)
            size += len(data)
        plain += covered
        if size >= limit:
            return Batch(b"".join(parts), plain, done, lane or Lane.THREAD)
    return Batch(b"".join(parts), plain, done, lane or Lane.THREAD, ended=True)
