"""The laptop's side of a streamed pull: result files framed down plain exec channels.

Why: SFTP moves a file as 256 KiB requests, each answered on its own, and the host
had to hash every file a second time for the listing. Here the host's
``agent/pullops.py send`` reads each file once, hashes it while it reads, and sends
many files back to back on one channel; this side writes them to ``.<name>.rmpart``
and hashes them as they land (hashsink.py), so a result is verified the moment its
last frame arrives.

What the host may say is narrow: frames name a file only by the index the laptop
gave it, in the order the laptop asked, and no more bytes than its listed size. A
frame for another file, a byte past the listed size, an unknown frame or a bad
digest frame is an IntegrityError (exit 5): the host never chooses a local name.

A cut link costs only what was in flight: the stream is asked for again from the
byte each file holds, within the transport's reconnect deadline. For a file asked
from a non-zero offset the host first sends the SHA-256 of that prefix and this
side answers ``go`` or ``restart``: a prefix from another version of the file (a
stale ``.rmpart``, a result changed on the host) costs no byte before it is found.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import errno
import hashlib
import json
import os
import stat
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from remotemac.agent.protocol import FRAME, Message, PullFrame
from remotemac.data.manifest import sha256_file
from remotemac.engine.hashsink import HashingSink, pull_thread
from remotemac.errors import HostError, IntegrityError, TransientHostError
from remotemac.transport.base import RemoteProcess, Transport

PART = ".rmpart"
#: the longest file name ext4 and APFS take, in bytes
NAME_MAX = 255


def part_path(dest: Path) -> Path:
    """Where ``dest`` lands until it is verified: ``.<name>.rmpart`` beside it.

    A name of 248-255 bytes is legal but its ``.rmpart`` would not be (8 bytes more:
    ENAMETOOLONG aborted the whole pull), so a long name's part file is named by a
    digest of the name instead: as stable, so an interrupted pull still continues it.
    """
    name = dest.name
    if len(os.fsencode(name)) + len(PART) + 1 <= NAME_MAX:
        return dest.parent / f".{name}{PART}"
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:32]
    return dest.parent / f".long-{digest}{PART}"


#: the largest data frame accepted (the host sends 1 MiB): bounds what one frame holds
MAX_CHUNK = 8 << 20
#: a stream's blocks waiting for the writing and hashing threads (two futures each):
#: with the channel window, what a stream holds in memory
STREAM_BACKLOG = 16
#: the largest skip or error message accepted from the host
MAX_NOTE = 64 << 10
#: the laptop's receive window per channel: one channel carries this much per round
#: trip. OpenSSH's 2 MiB caps a channel at 25 MB/s over 80 ms, so a far host gets a
#: window sized by the measured round trip for TARGET_RATE (at most MAX_WINDOW); a
#: near one keeps the small window, because a big one costs the host's sshd CPU
#: (it then holds megabytes of its buffer, measured 0.2 vs 0.35-0.9 s per 256 MiB)
BASE_WINDOW = 2 << 20
MAX_WINDOW = 32 << 20
#: twice a 100 MB/s link: the fault proxy's 80 ms, 100 MB/s link gave 58 MB/s with
#: 12 MiB windows and 68 MB/s with 25 MiB on one file (its queue adds to the round trip)
TARGET_RATE = 200e6
#: channels a pull's files are split over (each file whole on one, hashed in order as
#: it lands). One: a stream has no round trip between files, its window is sized for
#: the link, and on loopback both ends share the same cores (1 and 2 streams gave
#: 1.8-4.6 s each for 1,000 files of 512 MiB on the shared 2-core machine: no
#: difference to see through its noise, and one stream holds less memory)
STREAMS = 1
#: a second stream only pays for this much data (it costs a python start on the host)
MIN_STREAM_BYTES = 64 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: local errors that mean "this name cannot live here", not "the pull is broken"
LOCAL_REFUSALS = {
    errno.ENAMETOOLONG,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.ELOOP,
    errno.EEXIST,
    errno.EINVAL,
    errno.EILSEQ,
}


class ProgressSink(Protocol):
    def add(self, count: int) -> None: ...

    def skip(self, count: int) -> None: ...

    def unskip(self, count: int) -> None: ...


@dataclass(eq=False)
class StreamFile:
    """One validated result to fetch, and (once done) its SHA-256 or why it was not."""

    index: int
    name: bytes  # the host's bytes for its path below the output dir
    remote: str  # for messages
    dest: Path
    size: int
    key: str = ""  # files with one key land on one local file: they share a stream
    offset: int = 0  # what the host is asked to send from (bytes held here)
    whole: bool = False  # ``dest`` already holds ``size`` bytes: only its digest is asked
    reused: int = 0  # the prefix counted as already here (``offset`` when planned)
    sha256: str = ""
    why: str | None = None
    _fh: BinaryIO | None = None
    _sink: HashingSink | None = None
    _landing: _Landing | None = None
    _discard: bool = False

    @property
    def part(self) -> Path:
        return part_path(self.dest)

    @property
    def held(self) -> int:
        """Bytes of this file in its ``.rmpart`` so far (its prefix and what landed)."""
        if self._landing is not None:
            return self._landing.pos
        return self._sink.pos if self._sink is not None else self.offset

    def plan(self, progress: ProgressSink, first: bool) -> None:
        """Where to ask from: a complete ``dest`` is only checked, a ``.rmpart`` continued.

        ``first``: no earlier file of this pull lands on the same local file."""
        self.offset, self.whole, self.reused = 0, False, 0
        if not first:
            return
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(self.dest)
            if stat.S_ISREG(st.st_mode) and st.st_size == self.size > 0:
                self.offset, self.whole = self.size, True
                return
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(self.part)
            if stat.S_ISREG(st.st_mode) and st.st_size <= self.size:
                self.offset = self.reused = st.st_size
                progress.skip(self.offset)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        if self._landing is not None:
            self._landing.abandon()
        self._fh, self._sink, self._landing = None, None, None

    def drop_part(self) -> None:
        self.close()
        self.part.unlink(missing_ok=True)


Backlog = collections.deque[concurrent.futures.Future[Any]]


class _Landing:
    """A file fetched from its start, opened, written, hashed and renamed into place on
    the pull's threads, so the event loop never waits for a file to end.

    Why: with 1,000 small files the loop spent 0.5 s in ``open`` and 0.7 s waiting for
    each file's last block to be hashed before it read the next frame. A file that
    comes as one block (most results) is created, written and hashed as one job.
    ``backlog`` is shared by a stream's files and bounds the blocks waiting for the
    threads: every job counts (one-block jobs left out of it piled up and raised the
    laptop's peak RSS from 70 to 220-270 MiB over 1,000 files).
    """

    def __init__(self, part: Path, backlog: Backlog, size: int) -> None:
        self.part, self.backlog, self.pos, self.size = part, backlog, 0, size
        self._hash = hashlib.sha256()
        self._fd: concurrent.futures.Future[int] | None = None
        #: a file that comes as one block: created, written and hashed as one job
        self._whole: concurrent.futures.Future[tuple[str, str]] | None = None

    def write(self, data: bytes) -> None:
        if self._fd is None and self._whole is None and len(data) == self.size:
            while len(self.backlog) >= STREAM_BACKLOG:
                self.backlog.popleft().result()  # the threads are behind: wait for them
            self._whole = pull_thread("pull-write").submit(_land_whole, self.part, data)
            self.backlog.append(self._whole)
            self.pos += len(data)
            return
        if self._fd is None:
            self._fd = pull_thread("pull-write").submit(_create, self.part)
        while len(self.backlog) >= STREAM_BACKLOG:
            self.backlog.popleft().result()  # the threads are behind: wait for them
        self.backlog.append(pull_thread("pull-write").submit(self._write, data))
        self.backlog.append(pull_thread("pull-sha256").submit(self._hash.update, data))
        self.pos += len(data)

    def _write(self, data: bytes) -> None:
        assert self._fd is not None  # set before any write was submitted
        if self._fd.exception() is None:  # done: its open ran earlier on this thread
            _write_all(self._fd.result(), data)

    def finish(self, dest: Path, digest: str) -> concurrent.futures.Future[tuple[str, str]]:
        """(``ok``, digest) once renamed to ``dest``; (``why``, text) if it cannot be
        written here; (``bad``, its digest) if it differs (its ``.rmpart`` removed)."""
        whole = self._whole
        if whole is not None:

            def settle() -> tuple[str, str]:
                verdict, got = whole.result()
                return (verdict, got) if verdict == "why" else _settle(self.part, dest, got, digest)

            return pull_thread("pull-write").submit(settle)
        if self._fd is None:  # an empty file
            self._fd = pull_thread("pull-write").submit(_create, self.part)
        fd = self._fd
        hashed = pull_thread("pull-sha256").submit(self._hash.hexdigest)

        def done() -> tuple[str, str]:
            if fd.exception() is not None:
                return _refused(fd.exception())
            os.close(fd.result())
            return _settle(self.part, dest, hashed.result(), digest)

        return pull_thread("pull-write").submit(done)

    def abandon(self) -> None:
        """Stop here (a cut, a failure): what was written stays, a clean prefix."""
        for fut in list(self.backlog):
            with contextlib.suppress(Exception):
                fut.result()
        if self._fd is not None:
            with contextlib.suppress(Exception):
                os.close(self._fd.result())


def _create(part: Path) -> int:
    return os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o600)


def _land_whole(part: Path, data: bytes) -> tuple[str, str]:
    """A file of one block into its ``.rmpart`` (on the writing thread): (``hashed``,
    its digest), or (``why``, text) when it cannot be created here."""
    try:
        fd = _create(part)
    except OSError as exc:
        return _refused(exc)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)
    return "hashed", hashlib.sha256(data).hexdigest()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _refused(error: BaseException | None) -> tuple[str, str]:
    """A local name that cannot be created is a skip; anything else is raised."""
    if isinstance(error, OSError) and error.errno in LOCAL_REFUSALS:
        return "why", f"cannot be written here: {error.strerror}"
    raise error or RuntimeError("no error")


def _settle(part: Path, dest: Path, got: str, digest: str) -> tuple[str, str]:
    if got != digest:
        part.unlink(missing_ok=True)
        return "bad", got
    os.replace(part, dest)
    return "ok", got


def choose_window(rtt: float, streams: int = 1) -> int:
    """Each of ``streams`` channels' window, together carrying TARGET_RATE over ``rtt``."""
    return max(BASE_WINDOW, min(MAX_WINDOW, int(TARGET_RATE * rtt * 1.25 / streams)))


def sender_argv(python: str, agent_dir: str) -> list[str]:
    """The host's sender; ``-S``: no site-packages (stdlib only, and a faster start)."""
    return [python, "-S", f"{agent_dir}/pullops.py", "send"]


def split_streams(files: list[StreamFile], streams: int | None = None) -> list[list[StreamFile]]:
    """Consecutive runs of about equal bytes, one per stream (files with one key together)."""
    total = sum(f.size for f in files)
    count = max(1, min(streams or STREAMS, len(files), total // MIN_STREAM_BYTES or 1))
    groups: list[list[StreamFile]] = [[] for _ in range(count)]
    home: dict[str, int] = {}
    done = 0
    for f in files:
        slot = home.get(f.key)
        if slot is None:
            slot = min(count - 1, (2 * done + f.size) * count // (2 * total)) if total else 0
            home[f.key] = slot
        groups[slot].append(f)
        done += f.size
    return [g for g in groups if g]


class EarlyChannel:
    """The sender's first channel, opened while the laptop checks the listing's names.

    Why: opening it (open and exec, each a round trip) and the laptop's work on a long
    listing (each name validated, its directories made, its ``.rmpart`` looked for:
    0.28 s for 2,000 files at load 6) need not wait for each other (issue 36). Not
    taken by a stream (a pull that fails first, or has nothing to fetch), it is closed.
    """

    def __init__(self, transport: Transport, argv: list[str]) -> None:
        self.argv = argv
        self.started = time.monotonic()
        self._task: asyncio.Future[RemoteProcess] | None = asyncio.ensure_future(
            transport.open_process(
                argv, reconnect_within=transport.reconnect_deadline, window=BASE_WINDOW
            )
        )

    def take(self) -> asyncio.Future[RemoteProcess] | None:
        """The opening, to the first stream that asks (None after)."""
        task, self._task = self._task, None
        return task

    async def close(self) -> None:
        """Close the channel if no stream took it: at once when it is open, else once it
        is (never cancelled half-way: a channel cut off mid-opening would keep its
        slot on the connection)."""
        task, self._task = self._task, None
        if task is None:
            return
        if not task.done():
            try:  # two round trips, or a Python start on a local host
                await asyncio.wait({task}, timeout=EARLY_CLOSE_WAIT_S)
            except asyncio.CancelledError:
                task.add_done_callback(_close_when_opened)
                raise
        if task.done():
            await _close_opened(task)
        else:  # still opening (a link down): closed once it is open
            task.add_done_callback(_close_when_opened)


#: how long a failed pull waits for its early channel's opening, to close it
EARLY_CLOSE_WAIT_S = 10.0
#: closings started from a callback: held here so none is collected before it ran
_CLOSING: set[asyncio.Future[None]] = set()


def _close_when_opened(task: asyncio.Future[RemoteProcess]) -> None:
    closing = asyncio.ensure_future(_close_opened(task))
    _CLOSING.add(closing)
    closing.add_done_callback(_CLOSING.discard)


async def _close_opened(task: asyncio.Future[RemoteProcess]) -> None:
    """Close what ``task`` opened, if it opened anything."""
    if not task.cancelled() and task.exception() is None:
        await task.result().close()


async def pull_streamed(
    transport: Transport,
    argv: list[str],
    remote_dir: str,
    files: list[StreamFile],
    progress: ProgressSink,
    streams: int | None = None,
    rtt_hint: float | None = None,
    early: EarlyChannel | None = None,
) -> None:
    """Fetch ``files`` over up to ``streams`` channels; each ends with ``sha256`` or ``why``.
    ``rtt_hint``: an upper bound of the round trip (the listing's call), if known;
    ``early``: the first channel, already opening (the caller closes it if not taken).

    Raises IntegrityError on a checksum failure or a host breaking the protocol, and
    TransientHostError when the link stays down past the reconnect deadline (every
    ``.rmpart`` then holds a clean prefix for the next pull)."""
    seen: set[str] = set()
    for f in files:
        f.plan(progress, f.key not in seen)
        seen.add(f.key)
    groups = split_streams(files, streams)
    runs = [
        _Stream(transport, argv, remote_dir, g, progress, len(groups), rtt_hint) for g in groups
    ]
    if runs and early is not None and early.argv == argv:
        runs[0].early = early
    try:
        await run_all([run.run() for run in runs])
    finally:
        for f in files:
            f.close()


async def run_all(jobs: list[Awaitable[None]]) -> None:
    """Run together; the first failure cancels the rest and is raised."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Stream:
    """One channel's files, asked for again after a cut from what each file holds."""

    def __init__(
        self,
        transport: Transport,
        argv: list[str],
        remote_dir: str,
        files: list[StreamFile],
        progress: ProgressSink,
        streams: int = 1,
        rtt_hint: float | None = None,
    ) -> None:
        self.t, self.argv, self.remote_dir, self.progress = transport, argv, remote_dir, progress
        self.streams = streams  # how many share the link (their windows add up)
        self.queue: collections.deque[StreamFile] = collections.deque(files)
        self.asked = 0  # files at the queue's head that the current request covers
        self.last = time.monotonic()  # the last time bytes or a verdict arrived
        self.window: int | None = None  # chosen on the first channel by its round trip
        self.rtt_hint = rtt_hint  # a round trip's upper bound measured before (or None)
        self.early: EarlyChannel | None = None  # its first channel, opened by the caller
        self.backlog: Backlog = collections.deque()  # blocks waiting for the pull's threads
        #: files whose last frame came, being checked and renamed on the pull's threads
        self.finishing: collections.deque[tuple[StreamFile, asyncio.Future[Any]]] = (
            collections.deque()
        )

    async def run(self) -> None:
        try:
            await self._run()
        except Exception:
            # a damaged file already received tells more than what broke after it
            while self.finishing:
                await self._collect()
            raise

    async def _run(self) -> None:
        pause = 0.05
        while self.queue:
            before = self.last
            left = self.t.reconnect_deadline - (time.monotonic() - self.last)
            try:
                await self._once(max(0.0, left))
            except TransientHostError:
                if time.monotonic() - self.last >= self.t.reconnect_deadline:
                    raise
                for f in self.queue:  # what landed is kept (and a resumed file's hash state)
                    f.offset = f.held
                    if f._landing is not None:  # checked against the host's prefix digest
                        f._landing.abandon()
                        f._landing = None
                # a channel refused again and again on a live link: do not spin
                pause = 0.05 if self.last != before else min(1.0, pause * 2)
                await asyncio.sleep(pause)
        while self.finishing:
            await self._collect()

    async def _collect(self) -> None:
        """The oldest finishing file's verdict: in place, not writable here, or damaged."""
        f, fut = self.finishing.popleft()
        verdict, value = await fut
        if verdict == "ok":
            f.sha256 = value
        elif verdict == "why":
            f.why = value
        else:
            raise IntegrityError(
                f"{self.t.name}: result {f.remote} failed its checksum after transfer "
                f"(got {value[:12]}…, not the host's digest)",
                hint="the file changed on the host or was damaged; pull again",
            )

    async def _once(self, reconnect_within: float) -> None:
        window = self.window or BASE_WINDOW
        started = time.monotonic()
        early, self.early = self.early, None
        opening = early.take() if early is not None else None
        if early is not None and opening is not None:  # opened with BASE_WINDOW
            started = early.started
            proc = await opening
            if self.window is not None and not proc.grow_window(self.window):
                window = BASE_WINDOW
        else:
            proc = await self.t.open_process(
                self.argv, reconnect_within=reconnect_within, window=window
            )
        try:
            if self.window is None:
                # the channel's opening (open and exec, each answered by sshd) took two
                # round trips: no ping through the host's Python start (issue 36)
                rtt = min((time.monotonic() - started) / 2, self.rtt_hint or float("inf"))
                self.window = choose_window(rtt, self.streams)
                if self.window > window and not proc.grow_window(self.window):
                    return  # asked again on a channel with the bigger window
            request = {
                "dir": self.remote_dir,
                "files": [[f.index, f.name.hex(), f.offset, f.size] for f in self.queue],
            }
            self.asked = len(self.queue)
            await proc.write(json.dumps(request).encode() + b"\n")
            while True:
                kind, index, length = FRAME.unpack(await self._read(proc, FRAME.size))
                if kind == PullFrame.END and self.asked == 0:
                    return
                if kind == PullFrame.ERROR:
                    note = _note(await self._read(proc, min(length, MAX_NOTE)))
                    raise HostError(f"{self.t.name}: the pull sender failed on the host: {note}")
                head = self.queue[0] if self.asked else None
                if (
                    head is None
                    or index != head.index
                    or kind
                    not in (
                        PullFrame.DATA,
                        PullFrame.HASH,
                        PullFrame.SKIP,
                        PullFrame.VERIFY,
                    )
                ):
                    raise self._broken(f"a {kind!r} frame for file #{index}", head)
                if kind == PullFrame.DATA:
                    if not 0 < length <= MAX_CHUNK or head.held + length > head.size:
                        raise self._broken(
                            f"{length} bytes at {head.held} of a file listed with "
                            f"{head.size} bytes",
                            head,
                        )
                    await self._land(head, await self._read(proc, length))
                elif kind == PullFrame.VERIFY:
                    if length != 32 or head.held != head.offset or not head.offset:
                        raise self._broken(f"a prefix digest of {length} bytes", head)
                    same = await self._prefix(head, (await self._read(proc, 32)).hex())
                    await proc.write(b"go\n" if same else b"restart\n")
                elif kind == PullFrame.SKIP:
                    if length > MAX_NOTE:
                        raise self._broken(f"a skip note of {length} bytes", head)
                    head.why = _note(await self._read(proc, length))
                    head.drop_part()
                    self._next()
                else:
                    if length != 32:
                        raise self._broken(f"a digest of {length} bytes", head)
                    await self._verify(head, (await self._read(proc, 32)).hex())
        finally:
            await proc.close()

    async def _read(self, proc: RemoteProcess, size: int) -> bytes:
        data = await proc.readexactly(size)
        if len(data) == size:
            return data
        code = await _exit_code(proc)
        raise HostError(
            f"{self.t.name}: the pull sender on the host stopped mid-stream (exit {code}): "
            f"{proc.stderr_tail() or 'no message'}",
            hint="check the host's agent.python; a pull started again continues",
        )

    def _broken(self, what: str, head: StreamFile | None) -> IntegrityError:
        about = f" while sending {head.remote}" if head is not None else ""
        return IntegrityError(
            f"{self.t.name}: the host broke the pull protocol{about}: {what}; nothing more "
            "was written",
            hint="the host's agent is not remotemac's; check the host",
        )

    def _next(self) -> None:
        self.queue.popleft()
        self.asked -= 1
        self.last = time.monotonic()

    async def _open(self, f: StreamFile) -> None:
        """``.<name>.rmpart``, opened without following a link, its prefix hashed."""
        try:
            fd = os.open(f.part, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
        except OSError as exc:
            if exc.errno not in LOCAL_REFUSALS:
                raise
            f._discard, f.why = True, f"cannot be written here: {exc.strerror}"
            return
        fh = os.fdopen(fd, "r+b")
        try:
            # a prefix is read back and hashed off the event loop
            sink = (
                await asyncio.to_thread(HashingSink, fh, f.offset) if f.offset else HashingSink(fh)
            )
            if sink.pos != f.offset:
                raise IntegrityError(
                    f"{f.part} changed while it was pulled into (another pull of this --out?)",
                    hint="let one pull finish, then pull again",
                )
            sink.truncate()
        except BaseException:
            fh.close()
            raise
        f._fh, f._sink = fh, sink

    async def _prefix(self, f: StreamFile, digest: str) -> bool:
        """Whether the ``.rmpart``'s prefix (or the whole local file) is the host's; if
        not, the file comes again from 0."""
        if f.whole:
            if await asyncio.to_thread(sha256_file, f.dest) == digest:
                f.sha256 = digest
                return True
            f.offset, f.whole = 0, False  # the local copy is another version
            return False
        if f._sink is None and not f._discard:
            await self._open(f)
        if f._sink is None or f._sink.prefix_hexdigest() == digest:
            return True
        self.progress.unskip(f.reused)  # that prefix came from another version of the file
        f.offset = f.reused = 0
        f._sink.seek(0)
        f._sink.truncate()
        return False

    async def _land(self, f: StreamFile, data: bytes) -> None:
        if f.whole:
            raise self._broken("data for a file asked for its digest only", f)
        if f.offset == 0 and f._sink is None:  # from its start: on the pull's threads
            if f._landing is None:
                f._landing = _Landing(f.part, self.backlog, f.size)
            f._landing.write(data)
        else:
            if f._sink is None and not f._discard:
                await self._open(f)
            if f._sink is not None:
                f._sink.write(data)
        self.progress.add(len(data))
        self.last = time.monotonic()

    async def _verify(self, f: StreamFile, digest: str) -> None:
        """The file's last frame: rename it into place, fetch it again, or fail."""
        if f._discard:
            self._next()
            return
        if f.whole:  # its prefix check found the local file the same: nothing moved
            if digest != f.sha256:
                raise self._broken("a digest that differs from its prefix digest", f)
            self.progress.skip(f.size)
            self._next()
            return
        if f.offset == 0 and f._sink is None:
            landing, f._landing = f._landing or _Landing(f.part, self.backlog, f.size), None
            if landing.pos != f.size:
                landing.abandon()
                f.drop_part()
                raise self._changed_size(f, landing.pos)
            fut = asyncio.wrap_future(landing.finish(f.dest, digest))
            self.finishing.append((f, fut))
            self._next()
            while len(self.finishing) > 256:
                await self._collect()
            return
        if f._sink is None:
            await self._open(f)  # an empty file, or a prefix that held it all
        assert f._sink is not None
        got, held = f._sink.hexdigest(), f._sink.pos
        if held != f.size:
            f.drop_part()
            raise self._changed_size(f, held)
        if got == digest:
            f.close()
            os.replace(f.part, f.dest)
            f.sha256 = digest
            self._next()
            return
        if f.offset > 0:
            self.progress.unskip(f.reused)  # the resumed prefix came from another version
            f.close()
            self._again(f)
            return
        f.drop_part()
        raise IntegrityError(
            f"{self.t.name}: result {f.remote} failed its checksum after transfer "
            f"(expected {digest[:12]}…, got {got[:12]}…)",
            hint="the file changed on the host or was damaged; pull again",
        )

    def _changed_size(self, f: StreamFile, held: int) -> IntegrityError:
        return IntegrityError(
            f"{self.t.name}: result {f.remote} changed size on the host while it was "
            f"pulled ({f.size} bytes listed, {held} there)",
            hint="let the job finish writing its outputs, then pull again",
        )

    def _again(self, f: StreamFile) -> None:
        """Ask for ``f`` once more from its start, after the files already asked for."""
        f.offset, f.whole, f.reused = 0, False, 0  # its .rmpart is cut to 0 when reopened
        self._next()
        self.queue.append(f)


@dataclass
class FrameNote(Message):
    """The JSON of a ``PullFrame.SKIP`` (``why``) or ``ERROR`` (``error``, ``code``) frame."""

    why: Any = None
    error: Any = None
    code: Any = None


def _note(raw: bytes) -> str:
    """A host's skip or error note, as one printable line."""
    try:
        note = FrameNote.from_json(json.loads(raw.decode("utf-8")))
        text = note.why or note.error
    except ValueError:  # (ProtocolError too: a note that is not an object)
        text = None
    text = str(text) if text else raw[:200].decode("utf-8", "replace")
    return "".join(c if c.isprintable() else "?" for c in text)[:300]


async def _exit_code(proc: RemoteProcess) -> int | str:
    try:
        return await proc.wait(timeout=5)
    except (TimeoutError, asyncio.TimeoutError):
        return "none yet"
