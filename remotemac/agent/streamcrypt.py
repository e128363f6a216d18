"""Streaming authenticated encryption of dataset files (remotemac-enc/v1).

Why: the slice travels to and rests on someone else's Mac, so every file is
encrypted locally and decrypted only into RAM-backed storage on the host. A file
can be gigabytes, so it is processed in fixed-size chunks with flat memory, and
every chunk is authenticated before any of its plaintext is released.

The format follows age's STREAM construction (https://age-encryption.org/v1,
"Payload"; Hoang, Reyhanitabar, Rogaway and Vizar 2015):

    header  = MAGIC (16 bytes, b"remotemac-enc/v1")
              || chunk_size (4 bytes, big-endian, 64 KiB .. 1 MiB)
              || salt (32 bytes, fresh for every encryption: random, or 16 random
                       + 16 binding the laptop's file version, see new_header)
              || header_mac (32 bytes, HMAC-SHA256(mac_key, the 52 bytes before))
    body    = chunk_0 || chunk_1 || ... || chunk_n
    chunk_i = AES-256-GCM(payload_key, nonce_i, plaintext_i)   (plaintext + 16-byte tag)
    nonce_i = i as 11-byte big-endian counter || 0x01 if i is the last chunk else 0x00

    payload_key || mac_key = HKDF-SHA256(ikm=data_key, salt=salt,
                                         info=b"remotemac file v1\\x00" + relpath (UTF-8),
                                         length=64)

Every chunk but the last holds exactly ``chunk_size`` plaintext bytes; the last
holds 1..chunk_size bytes, or 0 only when the whole file is empty (an empty file
is one empty final chunk). So:

* truncation at a chunk boundary fails: the new last chunk was sealed with flag 0;
* truncation mid-chunk, bit flips and chunk edits fail the GCM tag;
* reordering fails: the counter is part of the nonce;
* a chunk or a whole file swapped in from another file fails: the other file has
  another salt and/or path, hence another key;
* a renamed file fails: the path is bound into the key (and the header MAC);
* any header edit (magic, chunk size, salt, MAC) fails the header MAC check, which
  also tells a wrong key or path apart from a damaged body before any output.

What it does not detect on its own: an older ciphertext of the same path under the
same run key (a rollback) decrypts fine; the agent's SHA-256 check against the
manifest catches that.

Why AES-256-GCM rather than age's ChaCha20-Poly1305: both ends have AES instructions
(Apple Silicon always; x86 laptops since 2010), where OpenSSL's GCM measured about
1.6-2x faster than ChaCha20-Poly1305 (see the numbers below); the one GCM hazard, a
repeated nonce under one key, cannot happen because every file gets a fresh key from a
random 256-bit salt and the nonce is a counter. Each chunk is far below GCM's 64 GiB
per-message limit.

Why 256 KiB chunks by default: throughput is flat from 64 KiB to 1 MiB (the Python
overhead per chunk is a few microseconds), with 256 KiB best or tied in every run, and
it keeps memory at a few hundred KiB per file in flight. Measured on a 2-core Xeon
(``python -m remotemac.agent.streamcrypt --bench``, best of 3, 256 MiB in memory;
the ChaCha20 column is the same loop with the cipher swapped), MB/s encrypt / decrypt:

    chunk      ChaCha20-Poly1305   AES-256-GCM
    64 KiB     1760 / 2168         3018 / 4580
    256 KiB    1982 / 2397         3231 / 4564
    1 MiB      1850 / 2292         2960 / 3814

Runs on the host under Python 3.9 with the standard library; ``cryptography`` is
imported lazily because only this module needs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

MAGIC = b"remotemac-enc/v1"
SALT_LEN = 32
MAC_LEN = 32
TAG_LEN = 16
HEADER_LEN = len(MAGIC) + 4 + SALT_LEN + MAC_LEN  # 84
MIN_CHUNK = 64 * 1024
MAX_CHUNK = 1024 * 1024
DEFAULT_CHUNK = 256 * 1024
KEY_LEN = 32
_INFO_PREFIX = b"remotemac file v1\x00"
_MAX_COUNTER = 1 << 88
#: salt bytes that bind a header to a file version (see new_header); the rest is random
_BIND_LEN = 16


class DecryptError(Exception):
    """The ciphertext is damaged, truncated, forged, or meant for another key or path.

    The message is one line; the sync layer maps it to exit code 5 (integrity).
    """


def ciphertext_size(plain_size: int, chunk_size: int = DEFAULT_CHUNK) -> int:
    """Exact encrypted size of a ``plain_size``-byte file, for framing and progress."""
    _check_chunk_size(chunk_size)
    if plain_size < 0:
        raise ValueError("plain_size must be >= 0")
    chunks = max(1, -(-plain_size // chunk_size))
    return HEADER_LEN + plain_size + chunks * TAG_LEN


def iter_encrypt(
    data_key: bytes,
    relpath: str,
    src: BinaryIO,
    chunk_size: int = DEFAULT_CHUNK,
    *,
    resume: tuple[bytes, int] | None = None,
    version: bytes | None = None,
) -> Iterator[bytes]:
    """Yield the header, then each sealed chunk of ``src``, for a pipelined sender.

    Reads one chunk ahead so the last chunk can be flagged; memory is two chunks.
    ``resume=(header, first_chunk)`` continues a cut stream instead: same salt (taken
    from ``header``, whose MAC must verify under ``data_key``), counter from
    ``first_chunk``, no header yielded, ``src`` positioned at ``first_chunk *
    chunk_size``. The caller must make sure the plaintext from there on is the same
    as when that stream was first sealed (same key and nonces: a different plaintext
    would reuse a GCM nonce); the sync checks the file's size, mtime and prefix hash,
    and that the header was made for this ``version`` of the file (see new_header).
    """
    if resume is None:
        # the keys derived for the header seal the chunks too (opening the header just
        # made would derive them again: 4 of a small file's 10 HMACs, ~20 us per file)
        header, payload_key = _fresh_header(data_key, relpath, chunk_size, version)
        yield header
        counter = 0
    else:
        payload_key, chunk_size = open_header(data_key, relpath, resume[0])
        counter = resume[1]
    aead = new_aead(payload_key)
    current = _read_exact(src, chunk_size)
    while True:
        following = _read_exact(src, chunk_size) if len(current) == chunk_size else b""
        last = not following
        yield aead.encrypt(_nonce(counter, last), current, None)
        if last:
            return
        counter += 1
        current = following


def new_header(
    data_key: bytes, relpath: str, chunk_size: int = DEFAULT_CHUNK, version: bytes | None = None
) -> bytes:
    """A fresh header (new random salt) for a file sealed in pieces (see seal_chunks).

    ``version`` (the laptop's file size, mtime, inode and ctime, say) is bound into the salt:
    its first half random, its second a MAC of that half, the path and ``version``
    under a key derived from ``data_key``. Why: a cut transfer is continued under the
    header the host hands back, and the host is not trusted; it can hand back the
    header of an earlier version of the path (every stored ``.rmenc`` starts with one,
    and it authenticates). Only :func:`header_fits` tells the laptop the header was
    made for the file as it is now, so the same nonces never seal other plaintext.
    """
    return _fresh_header(data_key, relpath, chunk_size, version)[0]


def _fresh_header(
    data_key: bytes, relpath: str, chunk_size: int, version: bytes | None
) -> tuple[bytes, bytes]:
    """(:func:`new_header`'s header, the payload key it opens to)."""
    _check_chunk_size(chunk_size)
    if version is None:
        salt = os.urandom(SALT_LEN)
    else:
        salt = _bound_salt(data_key, relpath, version, os.urandom(SALT_LEN - _BIND_LEN))
    payload_key, mac_key = _derive(data_key, salt, relpath)
    prefix = MAGIC + chunk_size.to_bytes(4, "big") + salt
    return prefix + hmac.new(mac_key, prefix, hashlib.sha256).digest(), payload_key


def header_fits(data_key: bytes, relpath: str, header: bytes, version: bytes) -> bool:
    """Whether ``header`` was made by :func:`new_header` for this ``version`` of the file
    (under this key and path); a header made without one never fits."""
    if len(header) < HEADER_LEN:
        return False
    salt = header[len(MAGIC) + 4 : len(MAGIC) + 4 + SALT_LEN]
    want = _bound_salt(data_key, relpath, version, salt[: SALT_LEN - _BIND_LEN])
    return hmac.compare_digest(want, salt)


def _bound_salt(data_key: bytes, relpath: str, version: bytes, random_half: bytes) -> bytes:
    bind_key = hmac.new(data_key, b"remotemac header version v1", hashlib.sha256).digest()
    what = random_half + relpath.encode("utf-8") + b"\x00" + version
    return random_half + hmac.new(bind_key, what, hashlib.sha256).digest()[:_BIND_LEN]


def chunk_count(plain_size: int, chunk_size: int) -> int:
    """Chunks of a ``plain_size``-byte file (an empty file is one empty final chunk)."""
    return max(1, -(-plain_size // chunk_size))


def sealed_span(plain_size: int, chunk_size: int, first: int, count: int) -> int:
    """Ciphertext bytes of chunks ``first`` .. ``first + count - 1`` of such a file."""
    total = chunk_count(plain_size, chunk_size)
    if first < 0 or count < 1 or first + count > total:
        raise ValueError("chunks %d+%d are not within the file's %d" % (first, count, total))
    end = min(plain_size, (first + count) * chunk_size)
    return end - first * chunk_size + count * TAG_LEN


def seal_chunks(
    data_key: bytes,
    relpath: str,
    header: bytes,
    src: BinaryIO,
    plain_size: int,
    first: int,
    count: int,
) -> Iterator[bytes]:
    """Seal chunks ``first`` .. ``first + count - 1`` of a ``plain_size``-byte file.

    Why: one large file is sent as pieces over several channels (a far link gives each
    channel one window per round trip); each piece is the same bytes the whole stream
    would hold there, so the host stores one ciphertext in the usual format. ``src``
    is positioned at ``first * chunk_size``. The caller makes sure every piece of one
    header seals the same plaintext (see iter_encrypt's ``resume``).
    """
    payload_key, chunk_size = open_header(data_key, relpath, header)
    total = chunk_count(plain_size, chunk_size)
    sealed_span(plain_size, chunk_size, first, count)  # range check
    aead = new_aead(payload_key)
    for counter in range(first, first + count):
        want = min(chunk_size, plain_size - counter * chunk_size)
        plain = _read_exact(src, want)
        if len(plain) != want:
            raise ValueError("%s: shorter than its %d bytes" % (relpath, plain_size))
        yield aead.encrypt(_nonce(counter, counter == total - 1), plain, None)


def chunk_opener(data_key: bytes, relpath: str, header: bytes) -> tuple[Callable[..., bytes], int]:
    """(open(counter, last, sealed) -> plaintext, chunk size) for a header that
    authenticates: the host opens a piece's chunks one by one (see seal_chunks)."""
    payload_key, chunk_size = open_header(data_key, relpath, header)
    aead = new_aead(payload_key)

    def open_one(counter: int, last: bool, sealed: bytes) -> bytes:
        return _open_chunk(aead, counter, last, sealed, relpath)

    return open_one, chunk_size


def header_chunk_size(header: bytes) -> int:
    """The chunk size a (not yet authenticated) header names; 0 when it is too short."""
    if len(header) < HEADER_LEN:
        return 0
    return int.from_bytes(header[len(MAGIC) : len(MAGIC) + 4], "big")


def verified_prefix(
    data_key: bytes, relpath: str, src: BinaryIO, dst: BinaryIO, max_chunks: int | None = None
) -> tuple[bytes, int]:
    """(header, n) for a cut ciphertext: its first ``n`` whole non-final chunks authenticate.

    Their plaintext is written to ``dst``. Why: a cut transfer resumes after the last
    chunk that verified (each chunk is sealed on its own, its counter in the nonce);
    a torn or damaged chunk and everything after it is sent again. ``(b"", 0)`` when
    the header itself is missing or not ours. A final chunk (flag 1) never counts, so
    at least one chunk is always left to send.
    """
    header = _read_exact(src, HEADER_LEN)
    if len(header) < HEADER_LEN:
        return b"", 0
    try:
        payload_key, chunk_size = open_header(data_key, relpath, header)
    except DecryptError:
        return b"", 0
    aead = new_aead(payload_key)
    counter = 0
    while max_chunks is None or counter < max_chunks:
        sealed = _read_exact(src, chunk_size + TAG_LEN)
        if len(sealed) < chunk_size + TAG_LEN:
            break
        try:
            plain = _open_chunk(aead, counter, False, sealed, relpath)
        except DecryptError:
            break
        dst.write(plain)
        counter += 1
    return header, counter


def encrypt_stream(
    data_key: bytes,
    relpath: str,
    src: BinaryIO,
    dst: BinaryIO,
    chunk_size: int = DEFAULT_CHUNK,
) -> int:
    """Encrypt ``src`` into ``dst``; return the number of ciphertext bytes written."""
    written = 0
    for piece in iter_encrypt(data_key, relpath, src, chunk_size):
        dst.write(piece)
        written += len(piece)
    return written


def decrypt_stream(
    data_key: bytes,
    relpath: str,
    src: BinaryIO,
    dst: BinaryIO,
    limit: int | None = None,
    *,
    resume: tuple[bytes, int] | None = None,
) -> int:
    """Decrypt ``src`` into ``dst``; return the number of plaintext bytes written.

    Only authenticated chunks are written, but when a later chunk fails the
    verified prefix is already in ``dst``: use :func:`decrypt_file` for
    all-or-nothing output. ``limit`` reads exactly that many ciphertext bytes
    (one file framed inside a longer stream); otherwise ``src`` is read to EOF.
    ``resume=(header, first_chunk)``: ``src`` holds only the chunks from
    ``first_chunk`` on (the tail of a cut stream, see :func:`iter_encrypt`).
    """
    reader = _Limited(src, limit) if limit is not None else src
    if resume is None:
        header = _read_exact(reader, HEADER_LEN)
        if len(header) < HEADER_LEN:
            raise DecryptError(f"{relpath}: truncated header ({len(header)} of {HEADER_LEN} bytes)")
        counter = 0
    else:
        header, counter = resume
    payload_key, chunk_size = open_header(data_key, relpath, header)
    aead = new_aead(payload_key)
    sealed_size = chunk_size + TAG_LEN
    written = 0
    current = _read_exact(reader, sealed_size)
    if not current:
        raise DecryptError(f"{relpath}: truncated: no chunk after the header")
    while True:
        following = _read_exact(reader, sealed_size) if len(current) == sealed_size else b""
        last = not following
        plain = _open_chunk(aead, counter, last, current, relpath)
        if last and not plain and counter > 0:
            raise DecryptError(f"{relpath}: empty final chunk after chunk {counter - 1}")
        dst.write(plain)
        written += len(plain)
        if last:
            if limit is not None and reader.remaining:  # type: ignore[union-attr]
                raise DecryptError(f"{relpath}: ciphertext shorter than its frame")
            return written
        counter += 1
        current = following


def decrypt_file(
    data_key: bytes,
    relpath: str,
    src_path: str,
    dst_path: str,
    offset: int = 0,
    length: int | None = None,
) -> int:
    """Decrypt to ``dst_path`` all-or-nothing; return the plaintext size.

    Plaintext goes to a 0600 temp file in the destination directory and is
    renamed into place only after the last chunk verified, so a failure never
    leaves a half-decrypted file that a workload could read. ``offset`` and
    ``length``: the file's ciphertext is that span of ``src_path`` (a pack of small
    files, see agent/datarecords.py PACKS), not all of it.
    """
    fd = os.open(src_path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as src:
        if offset:
            src.seek(offset)

        def fill(dst: BinaryIO) -> int:
            return decrypt_stream(data_key, relpath, src, dst, limit=length)

        return _atomic_write(dst_path, fill)


def _atomic_write(dst_path: str, fill: Callable[[BinaryIO], int]) -> int:
    directory = os.path.dirname(os.path.abspath(dst_path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".remotemac-part-")
    try:
        with os.fdopen(fd, "wb") as dst:
            size = fill(dst)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, dst_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return size


def _check_chunk_size(chunk_size: int) -> None:
    if not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
        raise ValueError(f"chunk_size must be within {MIN_CHUNK}..{MAX_CHUNK}, got {chunk_size}")


def _derive(data_key: bytes, salt: bytes, relpath: str) -> tuple[bytes, bytes]:
    """HKDF-SHA256 (RFC 5869) in the standard library: two 32-byte keys."""
    if len(data_key) != KEY_LEN:
        raise ValueError(f"data key must be {KEY_LEN} bytes, got {len(data_key)}")
    info = _INFO_PREFIX + relpath.encode("utf-8")
    prk = hmac.new(salt, data_key, hashlib.sha256).digest()
    okm = b""
    block = b""
    for i in (1, 2):
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        okm += block
    return okm[:KEY_LEN], okm[KEY_LEN:]


def open_header(data_key: bytes, relpath: str, header: bytes) -> tuple[bytes, int]:
    """(payload key, chunk size) of a header that authenticates under this key and path."""
    if header[: len(MAGIC)] != MAGIC:
        raise DecryptError(f"{relpath}: not a remotemac-enc/v1 file (bad magic)")
    body_end = HEADER_LEN - MAC_LEN
    salt = header[len(MAGIC) + 4 : body_end]
    payload_key, mac_key = _derive(data_key, salt, relpath)
    expected = hmac.new(mac_key, header[:body_end], hashlib.sha256).digest()
    if not hmac.compare_digest(expected, header[body_end:]):
        raise DecryptError(
            f"{relpath}: header authentication failed (wrong key, renamed file or edited header)"
        )
    chunk_size = int.from_bytes(header[len(MAGIC) : len(MAGIC) + 4], "big")
    if not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
        raise DecryptError(f"{relpath}: chunk size {chunk_size} out of range")
    return payload_key, chunk_size


def _open_chunk(aead: Any, counter: int, last: bool, sealed: bytes, relpath: str) -> bytes:
    from cryptography.exceptions import InvalidTag  # agent-imports: lazy (agent runtime)

    try:
        return aead.decrypt(_nonce(counter, last), sealed, None)
    except InvalidTag:
        where = "final chunk" if last else "chunk"
        raise DecryptError(
            f"{relpath}: {where} {counter} failed authentication "
            "(truncated, reordered, swapped or corrupted)"
        ) from None


def _nonce(counter: int, last: bool) -> bytes:
    if counter >= _MAX_COUNTER:
        raise DecryptError("chunk counter overflow")
    return counter.to_bytes(11, "big") + (b"\x01" if last else b"\x00")


def new_aead(key: bytes) -> Any:
    """AES-256-GCM under ``key``; the first call imports the agent runtime's cipher
    (the sync receiver makes one while it waits for the hello, see dataops._preload)."""
    from cryptography.hazmat.primitives.ciphers.aead import (  # agent-imports: lazy
        AESGCM,
    )

    return AESGCM(key)


def _read_exact(src: Any, size: int) -> bytes:
    """Read ``size`` bytes unless EOF comes first (pipes and sockets return short reads)."""
    data = src.read(size)
    if data is None:
        data = b""
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = src.read(size - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


class _Limited:
    """A reader that stops after ``limit`` bytes of the underlying stream."""

    def __init__(self, src: BinaryIO, limit: int) -> None:
        self._src = src
        self.remaining = limit

    def read(self, size: int) -> bytes:
        if self.remaining <= 0:
            return b""
        data = self._src.read(min(size, self.remaining))
        self.remaining -= len(data)
        return data


def bench(total_mib: int = 256, chunk_size: int = DEFAULT_CHUNK, repeats: int = 3) -> dict:
    """Best-of-``repeats`` in-memory throughput in MB/s, so the numbers above can be rerun."""
    import io
    import time

    key = os.urandom(KEY_LEN)
    data = os.urandom(total_mib << 20)
    best = {"encrypt_mb_s": 0.0, "decrypt_mb_s": 0.0}
    for _ in range(repeats):
        start = time.perf_counter()
        sealed = list(iter_encrypt(key, "bench", io.BytesIO(data), chunk_size))
        best["encrypt_mb_s"] = max(best["encrypt_mb_s"], len(data) / (time.perf_counter() - start))
        src = io.BytesIO(b"".join(sealed))
        start = time.perf_counter()
        decrypt_stream(key, "bench", src, _Sink())
        best["decrypt_mb_s"] = max(best["decrypt_mb_s"], len(data) / (time.perf_counter() - start))
    return {k: round(v / 1e6) for k, v in best.items()}


class _Sink:
    def write(self, data: bytes) -> int:
        return len(data)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--bench"]:
        for size in (MIN_CHUNK, DEFAULT_CHUNK, MAX_CHUNK):
            print(f"chunk {size >> 10:5d} KiB", bench(chunk_size=size))
