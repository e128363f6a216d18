"""Split push: one large file sent as pieces over several channels at once.

Why: sshd gives each session channel a 2 MiB window, so one channel carries about
25 MB/s at an 80 ms round trip. The sync already spreads files over channels, but a
dataset that is one large file (``train.bin``) went over one of them: 23 MB/s on a
100 MB/s link. Such a file is sealed as it always is (one header, 256 KiB chunks,
remotemac-enc/v1) but its chunks go as pieces (chunk ranges) on every channel; each
host receiver writes its range into one ciphertext file and one plaintext file in RAM,
and an assemble frame makes the host hash the whole plaintext, check it against this
side's SHA-256 and put both in place (agent/dataops.py, frames ``S`` and ``J``).

A cut costs only the pieces that were not whole: the host lists the ones it holds, and
they are kept when this file still has the size and mtime it had and each kept piece's
plaintext hashes the same here (the rest is then sealed again under the same header: the
same plaintext under the same nonces, as a single-stream resume does). Otherwise the
file starts over under a new header.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remotemac.agent.streamcrypt import (
    DEFAULT_CHUNK,
    TAG_LEN,
    DecryptError,
    chunk_count,
    header_chunk_size,
    header_fits,
    new_header,
    open_header,
    seal_chunks,
    sealed_span,
)
from remotemac.errors import IntegrityError

if TYPE_CHECKING:  # (syncplan imports this module: the type only)
    from remotemac.engine.syncplan import PartialTransfer

#: a file is split only from this size (smaller ones fill a channel's window anyway
#: among the others)
SPLIT_MIN_BYTES = 32 << 20
#: plaintext per piece. Small enough that a cut loses little: the channels each have
#: a piece in flight, and only whole pieces are kept (1 GiB over 5 channels cut half-way
#: sends ~52 % again); large enough that a piece's frame, lock and line on the host
#: cost nothing next to its bytes
PIECE_BYTES = 8 << 20
#: what the laptop reads at a time while hashing a file or a kept piece
READ_BYTES = 1 << 20


@dataclass(frozen=True)
class Piece:
    """Chunks ``first`` .. ``first + count - 1`` of a file sealed under ``header``."""

    header: bytes
    first: int
    count: int

    @property
    def nbytes(self) -> int:
        """Plaintext bytes it holds (at most: the file's last chunk may be short)."""
        return self.count * header_chunk_size(self.header)


@dataclass
class Split:
    """A file going as pieces: the stat it was planned with, what the host kept."""

    index: int
    path: str
    header: bytes
    size: int
    mtime_ns: int
    inode: int
    kept: int = 0  # plaintext bytes of pieces the host already held
    #: the file_version its header is bound to: a piece is sealed only while it holds
    version: bytes = b""
    ctime_ns: int = 0


class SealLog:
    """The GCM tag of each chunk one sync sealed, by header and counter.

    Why: a continued transfer (pieces of a split, the tail of a file sent whole) seals
    again, under the same nonces, chunks an earlier attempt may have sent: those in
    flight when it was cut. The file must hold the same bytes there. Its stat says so
    only at the moments it is taken, and a writer at work on the file changes bytes
    between two reads. Under one key and nonce the same plaintext gives the same tag
    and another plaintext (all but surely) another: a chunk whose tag differs from the
    one sealed before is never sent. 16 bytes per 256 KiB chunk; the streams' producers
    share it (on the loop and in threads)."""

    def __init__(self) -> None:
        self._tags: dict[bytes, bytearray] = {}
        self._lock = threading.Lock()

    def check(self, header: bytes, counter: int, sealed: bytes, path: str) -> None:
        """Note ``sealed`` (chunk ``counter`` under ``header``), or raise IntegrityError
        when that chunk was sealed before with other bytes."""
        tag, at = sealed[-TAG_LEN:], counter * TAG_LEN
        with self._lock:
            tags = self._tags.setdefault(header, bytearray())
            if len(tags) < at + TAG_LEN:
                tags.extend(bytes(at + TAG_LEN - len(tags)))
            old = bytes(tags[at : at + TAG_LEN])
            if old == bytes(TAG_LEN):
                tags[at : at + TAG_LEN] = tag
                return
        if old != tag:
            raise IntegrityError(
                f"data file {path} changed while it was sent",
                hint="stop whatever writes to the dataset and sync again",
            )


def file_version(st: os.stat_result) -> bytes:
    """What a header is bound to (streamcrypt.new_header): the file as this side sees
    it. A host can hand back any header it saw for the path; only one made for this
    size, mtime, inode and ctime is continued. The ctime because the mtime can be put
    back after an edit (``cp -p``, ``rsync -t``) and the chunks that went before a cut
    are not all among the pieces the host kept; nothing sets a ctime back."""
    return b"%d:%d:%d:%d" % (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def splittable(size: int, partial: PartialTransfer | None) -> bool:
    """A file worth splitting: large, and not the cut single-stream transfer of one
    (that one resumes as it was sent)."""
    return size >= SPLIT_MIN_BYTES and (partial is None or bool(partial.split))


def units(sizes: list[int]) -> int:
    """How many jobs these files can make, pieces counted (what bounds the streams)."""
    return sum(max(1, size // PIECE_BYTES) if size >= SPLIT_MIN_BYTES else 1 for size in sizes)


def missing(total: int, kept: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The chunk ranges ``(first, end)`` of ``total`` not in ``kept`` ``(first, count)``."""
    out, at = [], 0
    for first, count in sorted(kept):
        if first > at:
            out.append((at, first))
        at = max(at, first + count)
    if at < total:
        out.append((at, total))
    return out


def cut(ranges: list[tuple[int, int]], per_piece: int, header: bytes) -> list[Piece]:
    """``ranges`` as pieces of at most ``per_piece`` chunks."""
    return [
        Piece(header, first, min(per_piece, end - first))
        for start, end in ranges
        for first in range(start, end, per_piece)
    ]


def plan(
    root: Path,
    index: int,
    path: str,
    key: bytes,
    partial: PartialTransfer | None,
    per_piece_bytes: int = PIECE_BYTES,
) -> tuple[Split, list[Piece]]:
    """The pieces still to send of one file (runs on a thread: it may read kept pieces).

    A split the host holds part of (``partial``, from its start answer) is continued
    when :func:`kept_pieces` accepts it; otherwise a new header starts it afresh."""
    st = os.stat(root / path)
    split = Split(index, path, b"", st.st_size, st.st_mtime_ns, st.st_ino)
    split.version, split.ctime_ns = file_version(st), st.st_ctime_ns
    kept = kept_pieces(root / path, split, key, partial, split.version) if partial else None
    if kept is None:
        split.header = new_header(key, path, DEFAULT_CHUNK, split.version)
        kept = []
    chunk = header_chunk_size(split.header)
    total = chunk_count(split.size, chunk)
    split.kept = sum(min(split.size, (f + n) * chunk) - f * chunk for f, n in kept)
    per_piece = max(1, -(-per_piece_bytes // chunk))
    return split, cut(missing(total, kept), per_piece, split.header)


def kept_pieces(
    full: Path, split: Split, key: bytes, partial: PartialTransfer, version: bytes
) -> list[tuple[int, int]] | None:
    """The host's pieces of this file that this side can continue, or None.

    Only when the file has the size and mtime the host's copy began with, the header is
    ours for this path and was made for this ``version`` of the file (the host's word
    on size and mtime is not enough: it can hand back an older version's header), and
    every kept piece's plaintext hashes here as it did there: the missing chunks are
    then sealed under the same nonces with the same plaintext."""
    if not partial.split or (split.size, split.mtime_ns) != (partial.size, partial.mtime_ns):
        return None
    try:
        header = bytes.fromhex(str(partial.header))
        open_header(key, split.path, header)
    except (ValueError, DecryptError):
        return None
    if not header_fits(key, split.path, header, version):
        return None
    chunk = header_chunk_size(header)
    total = chunk_count(split.size, chunk)
    kept: list[tuple[int, int]] = []
    listed = partial.pieces
    if not isinstance(listed, list):
        return None
    with _open(full) as fh:
        for item in listed:
            try:  # (the host's word: anything but [first, count, sha256] starts afresh)
                first, count, sha = int(item[0]), int(item[1]), str(item[2])
            except (TypeError, ValueError, IndexError, KeyError):
                return None
            if first < 0 or count < 1 or first + count > total:
                return None
            fh.seek(first * chunk)
            left = min(split.size, (first + count) * chunk) - first * chunk
            digest = hashlib.sha256()
            while left:
                block = fh.read(min(READ_BYTES, left))
                if not block:
                    return None
                digest.update(block)
                left -= len(block)
            if digest.hexdigest() != sha:
                return None
            kept.append((first, count))
    split.header = header
    return kept


def sealed_piece(
    root: Path, split: Split, piece: Piece, key: bytes, frame: Any, log: SealLog | None = None
) -> Iterator[tuple[bytes, int]]:
    """The ``S`` frame of one piece, then its sealed chunks, as (bytes, plaintext
    bytes covered). Refuses a file that changed since the split was planned, and
    (``log``) a chunk this sync sealed before with other bytes."""
    chunk = header_chunk_size(piece.header)
    span = sealed_span(split.size, chunk, piece.first, piece.count)
    meta = json.dumps(
        {"header": piece.header.hex(), "first": piece.first, "count": piece.count}
    ).encode()
    with _open(root / split.path) as fh:
        _same(fh, split)
        fh.seek(piece.first * chunk)
        yield frame("S", split.index, span) + len(meta).to_bytes(4, "big") + meta, 0
        sealing = seal_chunks(
            key, split.path, piece.header, fh, split.size, piece.first, piece.count
        )
        for counter, sealed in enumerate(sealing, piece.first):
            if log is not None:
                log.check(piece.header, counter, sealed, split.path)
            yield sealed, len(sealed) - TAG_LEN
        _same(fh, split)


def whole_digest(root: Path, split: Split) -> str:
    """The file's SHA-256 in order (pieces are read apart; the manifest needs the whole)."""
    digest = hashlib.sha256()
    with _open(root / split.path) as fh:
        _same(fh, split)
        while block := fh.read(READ_BYTES):
            digest.update(block)
        _same(fh, split)
    return digest.hexdigest()


def _open(path: Path) -> Any:
    """The data file, never through a link (as the whole-file sender opens it)."""
    return os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)), "rb", buffering=0)


def _same(fh: Any, split: Split) -> None:
    """The file is still the version the header is bound to (its ctime too: an edit
    with the mtime put back would otherwise be sealed under nonces a cut attempt may
    have used for the old bytes)."""
    st = os.fstat(fh.fileno())
    if (st.st_size, st.st_mtime_ns) != (split.size, split.mtime_ns) or (
        split.version and file_version(st) != split.version
    ):
        raise IntegrityError(
            f"data file {split.path} changed while it was sent",
            hint="stop whatever writes to the dataset and sync again",
        )
