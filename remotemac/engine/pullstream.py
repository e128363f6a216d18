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
byte each file holds (its hash state kept), within the transport's reconnect
deadline. A resumed prefix that turns out to be another version of the file (its
digest differs) is fetched once more from its start.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import json
import os
import stat
import struct
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from remotemac.data.manifest import sha256_file
from remotemac.engine.hashsink import HashingSink
from remotemac.errors import HostError, IntegrityError, TransientHostError
from remotemac.transport.base import RemoteProcess, Transport

#: agent/pullops.py FRAME: kind, file index, length
FRAME = struct.Struct(">cIQ")
PART = ".rmpart"
#: the largest data frame accepted (the host sends 1 MiB): bounds what one frame holds
MAX_CHUNK = 8 << 20
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
#: channels at once; on one host both ends share the same cores, and one stream per
#: channel keeps files whole (each is hashed in order as it lands)
STREAMS = 2
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
    _discard: bool = False

    @property
    def part(self) -> Path:
        return self.dest.parent / f".{self.dest.name}{PART}"

    @property
    def held(self) -> int:
        """Bytes of this file in its ``.rmpart`` so far (its prefix and what landed)."""
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
        self._fh, self._sink = None, None

    def drop_part(self) -> None:
        self.close()
        self.part.unlink(missing_ok=True)


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


async def pull_streamed(
    transport: Transport,
    argv: list[str],
    remote_dir: str,
    files: list[StreamFile],
    progress: ProgressSink,
    streams: int | None = None,
) -> None:
    """Fetch ``files`` over up to ``streams`` channels; each ends with ``sha256`` or ``why``.

    Raises IntegrityError on a checksum failure or a host breaking the protocol, and
    TransientHostError when the link stays down past the reconnect deadline (every
    ``.rmpart`` then holds a clean prefix for the next pull)."""
    seen: set[str] = set()
    for f in files:
        f.plan(progress, f.key not in seen)
        seen.add(f.key)
    groups = split_streams(files, streams)
    runs = [_Stream(transport, argv, remote_dir, g, progress, len(groups)) for g in groups]
    try:
        await _all([run.run() for run in runs])
    finally:
        for f in files:
            f.close()


async def _all(jobs: list[Awaitable[None]]) -> None:
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
    ) -> None:
        self.t, self.argv, self.remote_dir, self.progress = transport, argv, remote_dir, progress
        self.streams = streams  # how many share the link (their windows add up)
        self.queue: collections.deque[StreamFile] = collections.deque(files)
        self.asked = 0  # files at the queue's head that the current request covers
        self.last = time.monotonic()  # the last time bytes or a verdict arrived
        self.window: int | None = None  # chosen on the first channel by its round trip

    async def run(self) -> None:
        pause = 0.05
        while self.queue:
            before = self.last
            left = self.t.reconnect_deadline - (time.monotonic() - self.last)
            try:
                await self._once(max(0.0, left))
            except TransientHostError:
                if time.monotonic() - self.last >= self.t.reconnect_deadline:
                    raise
                for f in self.queue:  # what landed is kept; the hash state too
                    f.offset = f.held
                # a channel refused again and again on a live link: do not spin
                pause = 0.05 if self.last != before else min(1.0, pause * 2)
                await asyncio.sleep(pause)

    async def _once(self, reconnect_within: float) -> None:
        window = self.window or BASE_WINDOW
        proc = await self.t.open_process(
            self.argv, reconnect_within=reconnect_within, window=window
        )
        try:
            if self.window is None:
                self.window = choose_window(await self._rtt(proc), self.streams)
                if self.window > window:
                    return  # asked again on a channel with the bigger window
            request = {
                "dir": self.remote_dir,
                "files": [[f.index, f.name.hex(), f.offset, f.size] for f in self.queue],
            }
            self.asked = len(self.queue)
            await proc.write(json.dumps(request).encode() + b"\n")
            while True:
                kind, index, length = FRAME.unpack(await self._read(proc, FRAME.size))
                if kind == b"Z" and self.asked == 0:
                    return
                if kind == b"E":
                    note = _note(await self._read(proc, min(length, MAX_NOTE)))
                    raise HostError(f"{self.t.name}: the pull sender failed on the host: {note}")
                head = self.queue[0] if self.asked else None
                if head is None or index != head.index or kind not in (b"D", b"H", b"X", b"V"):
                    raise self._broken(f"a {kind!r} frame for file #{index}", head)
                if kind == b"D":
                    if not 0 < length <= MAX_CHUNK or head.held + length > head.size:
                        raise self._broken(
                            f"{length} bytes at {head.held} of a file listed with "
                            f"{head.size} bytes",
                            head,
                        )
                    await self._land(head, await self._read(proc, length))
                elif kind == b"V":
                    if length != 32 or head.held != head.offset or not head.offset:
                        raise self._broken(f"a prefix digest of {length} bytes", head)
                    same = await self._prefix(head, (await self._read(proc, 32)).hex())
                    await proc.write(b"go\n" if same else b"restart\n")
                elif kind == b"X":
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

    async def _rtt(self, proc: RemoteProcess, probes: int = 2) -> float:
        """The round trip through the channel and the host's sender (the fastest ping)."""
        best = float("inf")
        for _ in range(probes):
            started = time.monotonic()
            await proc.write(b'{"ping": true}\n')
            kind, _index, length = FRAME.unpack(await self._read(proc, FRAME.size))
            if kind != b"P" or length:
                raise self._broken(f"a {kind!r} frame for a ping", None)
            best = min(best, time.monotonic() - started)
        return best

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
        if f._sink is None:
            await self._open(f)  # an empty file, or a prefix that held it all
        assert f._sink is not None
        got, held = f._sink.hexdigest(), f._sink.pos
        if held != f.size:
            f.drop_part()
            raise IntegrityError(
                f"{self.t.name}: result {f.remote} changed size on the host while it was "
                f"pulled ({f.size} bytes listed, {held} there)",
                hint="let the job finish writing its outputs, then pull again",
            )
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

    def _again(self, f: StreamFile) -> None:
        """Ask for ``f`` once more from its start, after the files already asked for."""
        f.offset, f.whole, f.reused = 0, False, 0  # its .rmpart is cut to 0 when reopened
        self._next()
        self.queue.append(f)


def _note(raw: bytes) -> str:
    """A host's skip or error note, as one printable line."""
    try:
        value = json.loads(raw.decode("utf-8"))
        text = value.get("why") or value.get("error") if isinstance(value, dict) else None
    except ValueError:
        text = None
    text = str(text) if text else raw[:200].decode("utf-8", "replace")
    return "".join(c if c.isprintable() else "?" for c in text)[:300]


async def _exit_code(proc: RemoteProcess) -> int | str:
    try:
        return await proc.wait(timeout=5)
    except (TimeoutError, asyncio.TimeoutError):
        return "none yet"
