"""A local file that SHA-256-hashes what is written to it, on one hashing thread.

Why its own module: the SFTP pull (engine/pull.py) and the streamed pull
(engine/pullstream.py) both write results through it, so every byte is hashed as
it lands and no file is ever read a second time.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
from typing import Any, BinaryIO

#: one thread hashes for every pull of the process, in the order blocks were written,
#: and another writes them to disk (hashlib and file writes let go of the GIL, so the
#: event loop keeps decrypting meanwhile: a 1 MiB write into a fresh file took the
#: loop 1-8 ms); blocks waiting for them are bounded per file by HASH_BACKLOG
_THREADS: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
HASH_BACKLOG = 32


def pull_thread(name: str) -> concurrent.futures.ThreadPoolExecutor:
    """The pull's one thread called ``name`` (``pull-write`` or ``pull-sha256``)."""
    if name not in _THREADS:
        _THREADS[name] = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
    return _THREADS[name]


class HashingSink:
    """A local file that SHA-256-hashes what is written to it, in order.

    Why: the transport writes a clean prefix (in order, and after a reconnect it
    seeks back to where the prefix ends), so the digest of the whole file is ready
    when the last byte lands; the file is never read a second time. A seek to any
    other offset re-hashes the prefix up to there from the file. The hashing and the
    writing run on the pull's two threads, off the event loop.
    """

    def __init__(self, fh: BinaryIO, prefix: int = 0) -> None:
        self.fh = fh
        self._hash = hashlib.sha256()
        self._backlog: collections.deque[concurrent.futures.Future[Any]] = collections.deque()
        self.pos = 0
        self._rehash(prefix)

    def _drain(self) -> None:
        while self._backlog:
            self._backlog.popleft().result()

    def _rehash(self, upto: int) -> None:
        self._drain()
        self._hash, self.pos = hashlib.sha256(), 0
        self.fh.seek(0)
        while self.pos < upto:
            block = self.fh.read(min(1 << 20, upto - self.pos))
            if not block:
                break
            self._hash.update(block)
            self.pos += len(block)

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence != 0:
            raise ValueError("HashingSink seeks from the start only")
        if offset != self.pos:
            self._rehash(offset)
        return self.fh.seek(offset)

    def truncate(self, size: int | None = None) -> int:
        if size is not None and size != self.pos:
            raise ValueError("HashingSink truncates at the hashed prefix only")
        return self.fh.truncate(self.pos)

    def write(self, data: bytes) -> int:
        while len(self._backlog) >= HASH_BACKLOG:
            self._backlog.popleft().result()  # the hashing thread is behind: wait for it
        self._backlog.append(pull_thread("pull-write").submit(self.fh.write, data))
        self._backlog.append(pull_thread("pull-sha256").submit(self._hash.update, data))
        self.pos += len(data)
        return len(data)

    def prefix_hexdigest(self) -> str:
        """The digest of what was written so far (the file goes on being hashed)."""
        self._drain()
        return self._hash.copy().hexdigest()

    def hexdigest(self) -> str:
        self._drain()
        self.fh.flush()
        return self._hash.hexdigest()
