"""Sync's pieces: read each file once, hash and seal it, and frame it for the channel.

Runs in a worker thread (hashing and AES release the GIL); engine/synctalk.py writes
the batches it makes. See engine/sync.py for the stream as a whole.
"""

from __future__ import annotations

import collections
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
) -> Iterator[Any]:
    """Yield (bytes, plaintext bytes covered) to send, and a FileDone after each file
    (a small file's bytes come as one list: its frame, header, sealed chunk and hash).

    Takes the next file from ``work`` (shared by every stream) only when ready for it.
    A piece of a split file (``splits``) yields no FileDone: the assemble frame ends it.
    ``log`` (the session's) refuses a chunk sealed again with other bytes. ``hints``:
    frames another task queues for this stream, sent between two files' frames.
    """
    top = os.fspath(root)  # (a pathlib join costs ~10 us a small file)
    while not halted():
        while hints:
            try:  # (the loop's teardown may clear the queue under this thread)
                hint = hints.popleft()
            except IndexError:
                break
            yield hint, 0
        try:
            job = work.popleft()
        except IndexError:
            return
        if job.piece is not None:
            assert key is not None and splits is not None
            yield from syncsplit.sealed_piece(
                root, splits[job.index], job.piece, key, pack_frame, log
            )
            continue
        f = files[job.index]
        full = os.path.join(top, f.path)
        fd = os.open(full, _OPEN_FLAGS)
        with io.FileIO(fd, "rb") as fh:
            before = os.fstat(fh.fileno())
            size = before.st_size
            if job.host_sha is not None and f.sha256 is None:
                # the host holds a verified copy of this path: hash first, maybe skip sending
                sha = _hash_all(fh, size, f.path)
                local = LocalFile(
                    f.path, size, before.st_mtime_ns, before.st_ino, sha, before.st_ctime_ns
                )
                if sha == job.host_sha and _unchanged(fh, before):
                    yield FileDone(job.index, local, sent=False)
                    continue
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


def next_batch(pieces: Iterator[Any], limit: int = BATCH_BYTES) -> Batch:
    """The next batch of pieces, about ``limit`` bytes (run in a worker thread: hashing
    and AES release the GIL)."""
    parts: list[bytes] = []
    done: list[FileDone] = []
    size = plain = 0
    for item in pieces:
        if isinstance(item, FileDone):
            done.append(item)
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
            break
    return Batch(b"".join(parts), plain, done)
