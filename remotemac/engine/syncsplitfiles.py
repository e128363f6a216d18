"""Sync's large files sent as pieces, one attempt's worth: which files split, their
pieces as jobs, each whole file's SHA-256 read in order, and the assemble frames.

Why apart from engine/synctalk.py: the session decides how many channels there are;
this decides what a large file becomes over them. How a file is cut into pieces and
each piece sealed is engine/syncsplit.py.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
from collections.abc import Callable
from pathlib import Path

from remotemac.engine import syncsplit
from remotemac.engine.syncpieces import FileDone, pack_frame
from remotemac.engine.syncplan import Job, LocalFile
from remotemac.transport.base import RemoteProcess

#: plaintext of a split file's pieces the host has stored since the last hint that
#: makes the laptop send another (an ``H`` frame: the host hashes what tiles so far)
HINT_BYTES = 32 << 20

_DIGESTS: list[concurrent.futures.ThreadPoolExecutor] = []


def _digest_thread() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that reads split files whole for their SHA-256, one after another.

    Why not asyncio.to_thread: its pool has cpu_count + 4 threads (6 on 2 cores), and
    each file's whole read held one for the length of the push: with three large
    files, half of six streams waited for a thread to seal their first batches
    (256 MiB at 80 ms: 5 MB sent in the streams' first 0.2 s)."""
    if not _DIGESTS:
        _DIGESTS.append(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sync-digest"))
    return _DIGESTS[0]


class SplitFiles:
    """The files one attempt sends as pieces (``splits``) and their whole-file SHA-256
    being read (``digests``); a new attempt starts with none (:meth:`drop`)."""

    def __init__(self, root: Path, key: bytes | None) -> None:
        self.root, self.key = root, key
        self.splits: dict[int, syncsplit.Split] = {}
        self.digests: dict[int, asyncio.Future[str]] = {}
        #: ``H`` frames for the first channel to send at its next frame boundary
        #: (engine/syncpieces.read_pieces); the streams' producers take them
        self.hints: collections.deque[bytes] = collections.deque()
        #: each split file's pieces not yet stored on the host (first chunk: plaintext
        #: bytes), and what was stored since its last hint
        self._waiting: dict[int, dict[int, int]] = {}
        self._unhinted: dict[int, int] = {}

    def units(self, files: list[LocalFile], rest: list[Job]) -> int:
        """Jobs ``rest`` can make: a large file may go as pieces (syncsplit.py)."""
        if self.key is None:
            return len(rest)
        return syncsplit.units([files[j.index].size if _splittable(files, j) else 0 for j in rest])

    async def split(self, files: list[LocalFile], rest: list[Job], streams: int) -> list[Job]:
        """``rest`` with each large file as pieces when there are channels to spread
        them over (or the host holds some pieces of it already)."""
        self.drop()
        out: list[Job] = []
        for job in rest:
            f = files[job.index]
            resuming = bool(job.partial and job.partial.split)
            if self.key is None or not _splittable(files, job) or (streams < 2 and not resuming):
                out.append(job)
                continue
            split, pieces = await asyncio.to_thread(
                syncsplit.plan, self.root, job.index, f.path, self.key, job.partial
            )
            self.splits[job.index] = split
            self._waiting[job.index] = {piece.first: piece.nbytes for piece in pieces}
            self._unhinted[job.index] = 0
            if f.sha256 is None or (f.size, f.mtime_ns) != (split.size, split.mtime_ns):
                # the pieces are read apart: the whole file's SHA-256 is read in order here
                self.digests[job.index] = asyncio.get_running_loop().run_in_executor(
                    _digest_thread(), syncsplit.whole_digest, self.root, split
                )
            out.extend(Job(job.index, None, None, piece) for piece in pieces)
        return out

    def drop(self) -> None:
        """An attempt's whole-file hashing that will not be used (a cut, a failure)."""
        for pending in self.digests.values():
            pending.cancel()
        self.splits, self.digests = {}, {}
        self.hints.clear()
        self._waiting, self._unhinted = {}, {}

    def all_in(self) -> bool:
        """Whether the host has stored every piece of this attempt's split files (each
        piece's line came back): the join frames may go without waiting for the
        workers' answers."""
        return not any(self._waiting.values())

    def piece_in(self, index: int, first: int) -> None:
        """The host stored and opened piece ``first`` of split file ``index`` (its
        ``{"piece"}`` line): after HINT_BYTES more of that file, or its last piece, a
        hint for the first channel, so the host hashes the file while the streams run
        and the join at the end has little left to hash (agent/datasplit.hash_ahead)."""
        waiting = self._waiting.get(index)
        split = self.splits.get(index)
        if waiting is None or split is None or first not in waiting:
            return
        self._unhinted[index] += waiting.pop(first)
        if self._unhinted[index] >= HINT_BYTES or not waiting:
            self._unhinted[index] = 0
            body = json.dumps({"header": split.header.hex()}).encode()
            self.hints.append(pack_frame("H", index, len(body)) + body)

    async def assemble(
        self, main: RemoteProcess, files: list[LocalFile], done: Callable[[FileDone], None]
    ) -> None:
        """Ask the host to put each split file together, checked against its SHA-256;
        ``done`` is told of each file once its frame is written."""
        for index, split in self.splits.items():
            pending = self.digests.get(index)
            digest = await pending if pending is not None else files[index].sha256
            assert digest is not None
            body = json.dumps({"sha256": digest, "header": split.header.hex()}).encode()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await main.write(pack_frame("J", index, len(body)) + body)
            local = LocalFile(
                split.path, split.size, split.mtime_ns, split.inode, digest, split.ctime_ns
            )
            done(FileDone(index, local, sent=True, resumed=split.kept))


def _splittable(files: list[LocalFile], job: Job) -> bool:
    # (a file the host holds a verified copy of is hashed first: it may not travel)
    return job.host_sha is None and syncsplit.splittable(files[job.index].size, job.partial)
