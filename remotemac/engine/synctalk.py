"""Sync's talk with the receiver on the host: the hello, the streams, the acks, the end.

One :class:`Session` per sync; ``run`` is called again after a cut link
(engine/sync.py retries it). The files themselves are read by engine/syncpieces.py.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import ErrorCode, JsonObject, Message
from remotemac.data.manifest import Manifest, ManifestEntry
from remotemac.engine import syncsplit
from remotemac.engine.agentclient import AgentClient
from remotemac.engine.agentship import AGENT_BOOT, agent_argv
from remotemac.engine.streamtuner import StreamTuner, probe_cap
from remotemac.engine.syncpieces import (
    Batch,
    FileDone,
    Lane,
    next_batch,
    pack_frame,
    read_pieces,
)
from remotemac.engine.syncplan import (
    AHEAD_BYTES,
    AHEAD_MISS_SHARE,
    BATCH_BYTES,
    LINK_STREAMS,
    MANY_STREAMS_BATCH_BYTES,
    MAX_STREAMS,
    PARTIAL_MIN_BYTES,
    PROGRESS_EVERY_S,
    QUEUE_BATCHES,
    QUEUE_BATCHES_TOTAL,
    SPARE_STREAMS,
    TUNE_EVERY_S,
    Emit,
    Job,
    LocalFile,
    PartialTransfer,
    SyncStats,
    choose_streams,
    plan_todo,
    streams_per_link,
)
from remotemac.engine.syncsplitfiles import SplitFiles
from remotemac.errors import (
    HostEnvironmentError,
    HostError,
    HostKeyError,
    IntegrityError,
    TransientHostError,
)
from remotemac.events import PhaseProgress
from remotemac.transport.base import RemoteProcess, Transport

#: the agent's one boot (agent/shared.py): ``<agent dir>/dataops.py`` runs imported, as
#: part of the agent package, and so loads from its cached bytecode (~7 ms of the host's
#: start, which a re-sync's hello waits for, where a script is compiled on every start)
RECEIVER_BOOT = AGENT_BOOT

#: how long closing a channel no stream took may take (a dead link: give up)
CLOSE_UNUSED_S = 5.0
#: how often the first channel, its files all sent, looks for hints to pass on
HINT_PUMP_S = 0.02
#: how long a push that took none of its early workers waits for their opening, to end them
EARLY_CLOSE_WAIT_S = 10.0
#: jobs this small are sent in the slice's order, after the larger ones (see _open_streams)
TAIL_BYTES = 512 << 10
#: endings started from a done callback: held here so none is collected before it ran
_ENDING: set[asyncio.Future[None]] = set()


def receiver_argv(python: str, agent_dir: str, runtime_dir: str | None = None) -> list[str]:
    # -S: stdlib only (cryptography comes from the runtime dir it names), and a host
    # python with a large site-packages costs 0.2-0.4 s per start without it; the
    # runtime in argv is imported while the laptop stats the slice (not a secret)
    return agent_argv(
        python, agent_dir, "dataops", "sync", *(["--runtime", runtime_dir] if runtime_dir else [])
    )


@dataclass
class SyncHello:
    """The first line laptop → host on a sync channel (agent/dataops.py reads it): the
    run, where the data goes, and the slice as four columns (json encodes 7,681 entries
    as dicts in 25-45 ms, as four lists in 2-3 ms, and the host parses them faster too).
    Encrypted: the data key (never in argv, logs or a repr) and the runtime dir."""

    run_dir: str
    run_id: str
    src: str
    ram_bytes: int
    paths: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    sha256s: list[str | None] = field(default_factory=list)
    mtimes_ns: list[int] = field(default_factory=list)
    key_hex: str | None = field(default=None, repr=False)
    runtime_dir: str | None = None

    def to_json(self, worker: bool = False) -> JsonObject:
        """``worker``: a further channel's hello (it only receives files)."""
        out: JsonObject = {
            "run_dir": self.run_dir,
            "run_id": self.run_id,
            "src": self.src,
            "encrypted": self.key_hex is not None,
            "ram_bytes": self.ram_bytes,
            "columns": {
                "path": self.paths,
                "size": self.sizes,
                "sha256": self.sha256s,
                "mtime_ns": self.mtimes_ns,
            },
        }
        if self.key_hex is not None:
            out["key_hex"] = self.key_hex
            out["runtime_dir"] = self.runtime_dir
        if worker:
            out["worker"] = True
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> SyncHello:
        columns = data["columns"]
        return cls(
            run_dir=data["run_dir"],
            run_id=data["run_id"],
            src=data["src"],
            ram_bytes=data["ram_bytes"],
            paths=list(columns["path"]),
            sizes=list(columns["size"]),
            sha256s=list(columns["sha256"]),
            mtimes_ns=list(columns["mtime_ns"]),
            key_hex=data["key_hex"] if data["encrypted"] else None,
            runtime_dir=data["runtime_dir"] if data["encrypted"] else None,
        )


@dataclass
class ReceiverLine(Message):
    """One JSON line host → laptop on a sync channel (agent/dataops.py says them).

    The start answer (``ok``, ``todo``, ``partial``; a worker's ``ram``), the files
    verified since the last such line (``acks``), a piece of a split file stored
    (``piece``), the end (``ok``, ``result``), or an error (``error``, ``code``).
    ``eof``: this side's note that the channel closed."""

    ok: bool = False
    error: Any = None
    code: str | None = None
    result: Any = None
    todo: list[list[Any]] = field(default_factory=list)
    partial: list[list[Any]] = field(default_factory=list)
    ram: Any = None
    acks: list[Any] | None = None
    piece: Any = None
    eof: bool = False

    @classmethod
    def read(cls, line: bytes) -> ReceiverLine:
        """A line as it arrived (an empty one: the channel closed)."""
        if not line:
            return cls(eof=True)
        return cls.from_json(json.loads(line.decode("utf-8", "replace")))

    def partials(self) -> dict[int, PartialTransfer]:
        """The start answer's kept cut transfers by file index."""
        return {int(i): PartialTransfer.from_json(info) for i, info in self.partial}


async def link_round_trip(transport: Transport, probes: int = 2) -> float | None:
    """The fastest of a few round trips of the link itself (Transport.round_trip), sent
    together (known one round trip after the sync began); None where the link cannot
    say.

    Probes sent together wait together: right after a login sshd's last packets (its
    host keys) sit behind Nagle until the laptop's delayed ACK, 40 ms, and all of them
    read 43 ms on loopback. Session._round_trip takes one more, sent behind them."""
    took = await asyncio.gather(*(transport.round_trip() for _ in range(probes)))
    return min((t for t in took if t is not None), default=None)


async def discard(opening: asyncio.Future) -> None:
    """Close a channel opened ahead that will not be used (or stop its opening)."""
    opening.cancel()
    with contextlib.suppress(BaseException):
        proc = await opening
        await proc.close()


class Session:
    """One sync attempt's channels on the host; ``run`` may be called again after a cut link.

    The first channel says what the host holds and finishes the sync; when one
    channel's window cannot fill the link (long round trip), more are opened and
    every channel takes the next file from one shared queue (the large first).
    """

    def __init__(
        self,
        transport: Transport,
        agent: AgentClient,
        root: Path,
        files: list[LocalFile],
        run_dir: str,
        run_id: str,
        key: bytes | None,
        python: str,
        emit: Emit,
        stats: SyncStats,
        ram_bytes: int,
        runtime_dir: str | None = None,
        streams: int | None = None,
        opening: asyncio.Future | None = None,
        send_ahead: bool = False,
    ) -> None:
        self.transport, self.agent, self.root, self.files = transport, agent, root, files
        self._opening = opening  # the first attempt's channel, opened while stat'ing
        self.run_dir, self.run_id, self.key, self.python = run_dir, run_id, key, python
        self.emit, self.stats, self.ram_bytes = emit, stats, ram_bytes
        self.runtime_dir = runtime_dir
        self.streams = streams
        #: a hash cache stands behind the hello: a file without a hash changed (see _ahead)
        self.send_ahead = send_ahead
        self._done = 0
        self._last_progress = 0.0
        self._halt = False  # a channel's agent spoke up early: the others stop taking files
        #: files sent whole whose acknowledgement has not come (the host batches them: a
        #: cut can lose the last line; the next attempt's hello lists them as known)
        self._unacked: set[int] = set()
        self._acked: set[int] = set()  # (an ack can overtake its own file's FileDone)
        self._manifest: Manifest | None = None  # built once every file's hash is known
        #: this attempt's files sent as pieces, and their whole-file SHA-256 being read
        self._split_files = SplitFiles(root, key)
        #: every chunk this sync sealed (a continued transfer seals some again)
        self._sealed = syncsplit.SealLog()
        #: an attempt's second connection (streams past one connection's channels) and
        #: its workers being opened while the first connection's streams already send
        self._spares: list[Transport] = []
        self._late: asyncio.Future[list[tuple[RemoteProcess, bool]]] | None = None
        self._spare_refused = False  # this attempt's second login failed: no more tries
        #: an attempt's stream count: its tuner (None: fixed), the count it wants now
        self._tuner: StreamTuner | None = None
        self._target = 1
        self._argv: list[str] = []
        #: the link's round trip, measured by sshd's own answers while the first channel
        #: opens (Transport.round_trip; None: pinged through the channel instead)
        self._link_rtt: asyncio.Future[float | None] | None = None
        self._rtt_again: asyncio.Future[float | None] | None = None
        #: an attempt's workers opened before the start answer (a push the laptop can
        #: tell is large: files it has no hash of), and the channels whose receiver has
        #: its hello but has not answered it yet (their lane reads the answer first)
        self._early: asyncio.Future[list[RemoteProcess]] | None = None
        self._starting: set[RemoteProcess] = set()

    def manifest(self) -> Manifest:
        if self._manifest is None:
            self._manifest = Manifest.from_entries(
                (ManifestEntry(f.path, f.size, f.sha256 or "") for f in self.files),
                checked=True,  # stat_all checked every path
            )
        return self._manifest

    async def run(self) -> JsonObject:
        """The receiver's ``result`` as it answered the end (engine/sync.py reads it)."""
        argv = receiver_argv(
            self.python, self.agent.agent_dir, self.runtime_dir if self.key is not None else None
        )
        started = time.monotonic()
        procs: list[RemoteProcess] = []
        code: int | None = None
        try:
            opening, self._opening = self._opening, None
            if self._link_rtt is None or self._link_rtt.cancelled():
                self._link_rtt = asyncio.ensure_future(link_round_trip(self.transport))
            # (each attempt: after a cut it is a new connection's)
            self._rtt_again = asyncio.ensure_future(self._probe_again(self._link_rtt))
            hello = self._hello()
            # (while the first channel opens: by the round trip, they may be wanted)
            self._early = asyncio.ensure_future(self._open_early(argv, hello))
            procs.append(await (opening or self.transport.open_process(argv)))
            self.stats.mark("open")
            answer = await self._talk(argv, procs, hello)
            code = await procs[0].wait(timeout=60)
            self.stats.mark("exit")
            return answer
        finally:
            await self._drop_early()
            if self._rtt_again is not None:
                self._rtt_again.cancel()
            if self._late is not None:
                self._late.cancel()
                with contextlib.suppress(BaseException):
                    await self._late
                self._late = None
            for proc in procs:  # (one that fails to close leaves no other, nor a spare link, open)
                with contextlib.suppress(Exception):
                    await proc.close()
            spares, self._spares, self._spare_refused = self._spares, [], False
            for spare in spares:
                with contextlib.suppress(Exception):
                    await spare.close()
            self.stats.mark("closed")
            self.agent.ledger.append(
                self.transport.name,
                " ".join(argv) + _streams_note(self.stats, len(procs)),
                code,
                op="sync-data",
                seconds=time.monotonic() - started,
            )

    def _hello(self) -> SyncHello:
        return SyncHello(
            run_dir=self.run_dir,
            run_id=self.run_id,
            src=f"{self.run_dir}/data",
            ram_bytes=self.ram_bytes,
            paths=[f.path for f in self.files],
            sizes=[f.size for f in self.files],
            sha256s=[f.sha256 for f in self.files],
            mtimes_ns=[f.mtime_ns for f in self.files],
            key_hex=self.key.hex() if self.key is not None else None,
            runtime_dir=self.runtime_dir,
        )

    async def _talk(
        self, argv: list[str], procs: list[RemoteProcess], hello: SyncHello
    ) -> JsonObject:
        main = procs[0]
        self._argv, self._tuner, self._target = argv, None, 1
        self.stats.stream_steps = []
        await main.write(json.dumps(hello.to_json()).encode() + b"\n")
        self.stats.mark("hello")
        self.stats.per_attempt.append(0)
        self._done, self._halt = 0, False
        self._split_files.drop()
        plan, rest, ahead_ok, todo_bytes = await self._start(main)
        self.stats.mark("start")
        skipped = len(self.files) - len(plan)
        if rest:
            rest = await self._open_streams(argv, hello, rest, procs)
        else:
            await self._drop_early()
        self.stats.streams, self.stats.spare_streams = 0, 0
        self.emit(
            PhaseProgress(
                self.run_id,
                phase="sync",
                done=0,
                total=todo_bytes,
                detail=f"{skipped} files already verified on the host; "
                f"checking or sending {len(plan)}"
                + (f" over {len(procs)} streams" if len(procs) > 1 else "")
                + (f" (adapting up to {self._tuner.cap})" if self._tuner is not None else ""),
            )
        )
        return await self._stream(procs, rest, ahead_ok, todo_bytes, hello)

    async def _start(self, main: RemoteProcess) -> tuple[list[Job], list[Job], bool, int]:
        """Send the files known to be new or changed while the host answers the hello;
        (every file that may need sending, those of them still to send, whether the
        files sent ahead went through, the plan's bytes) from its start answer."""
        # the previous attempts' files sent whole whose ack a cut lost (see _learn_held)
        unacked, self._unacked = self._unacked, set()
        # the files known to be new or changed go now: the host reads them once it has
        # answered, instead of waiting for the laptop to plan and read its first files
        ahead = self._ahead()
        ahead_bytes = sum(self.files[job.index].size for job in ahead)
        early = asyncio.ensure_future(
            self._send_safely(main, collections.deque(ahead), ahead_bytes, asyncio.Queue())
        )
        try:
            first = await self._answer(main, "start")
        except BaseException:
            self._unacked |= unacked
            early.cancel()
            with contextlib.suppress(BaseException):
                await early
            raise
        self._learn_held({int(i) for i, _ in first.todo}, unacked)
        partial = first.partials()
        sent_ahead = {job.index for job in ahead}
        plan = plan_todo(first.todo, partial)
        todo_bytes = sum(self.files[j.index].size for j in plan)
        self.stats.skipped_files = len(self.files) - len(plan)
        self.stats.skipped_bytes = sum(f.size for f in self.files) - todo_bytes
        ahead_ok = await early  # (before a ping: a frame never lands inside a file's)
        rest = [job for job in plan if job.index not in sent_ahead]
        return plan, rest, ahead_ok, todo_bytes

    async def _open_streams(
        self, argv: list[str], hello: SyncHello, rest: list[Job], procs: list[RemoteProcess]
    ) -> list[Job]:
        """Open the streams the push starts with; ``rest`` as they will take it.

        Forced (``streams``), that many for the whole push. Otherwise, on a long round
        trip, one connection's worth of the window count to start with and a
        :class:`StreamTuner` that adds streams while the rate grows with them, up to
        twice the window count (engine/streamtuner.py)."""
        rest_bytes = sum(self.files[j.index].size for j in rest)
        # a large file can go as pieces on several channels: it counts as that many jobs
        jobs = self._split_files.units(self.files, rest)
        self._tuner = None
        if self.streams is None and choose_streams(1.0, rest_bytes, jobs) == 1:
            wanted = cap = 1  # one stream even on a 1 s round trip: no ping
        elif self.streams is None:
            rtt = await self._round_trip(procs[0])
            self.stats.mark("rtt")
            self.stats.rtt_ms = round(rtt * 1000, 2)
            window = choose_streams(rtt, rest_bytes, jobs)
            wanted = min(window, LINK_STREAMS)
            # a near link (one window carries it) is not tuned: there the CPU decides
            cap = wanted
            if window > 1:
                cap = probe_cap(window, choose_streams(rtt, rest_bytes, jobs, target_rate=1e15))
            if cap > wanted:
                self._tuner = StreamTuner(start=wanted, cap=cap, rtt=rtt)
        else:
            wanted = cap = max(1, min(self.streams, MAX_STREAMS, jobs))
        first, spare = streams_per_link(wanted)
        if spare:  # its handshake overlaps the first connection's streams
            self._late = asyncio.ensure_future(self._spare_lanes(argv, hello, spare))
        self._target = wanted
        early = await self._take_early(first - 1)
        procs.extend(early)
        await self._open_workers(argv, hello, first - 1 - len(early), procs)
        self.stats.mark("workers")
        rest = await self._split(rest, cap)
        self.stats.mark("split")
        if cap > 1:
            # the large first, so no channel is left with one at the end; those below
            # TAIL_BYTES after them as they come (stable): sorted too, the push ended
            # on hundreds of the very smallest, the host's per-file work after the
            # link's last byte
            rest.sort(key=lambda j: -max(self._job_bytes(j), TAIL_BYTES))
        return rest

    async def _stream(
        self,
        procs: list[RemoteProcess],
        rest: list[Job],
        ahead_ok: bool,
        todo_bytes: int,
        hello: SyncHello,
    ) -> JsonObject:
        """Every channel takes files from one queue; then each is ended, the first last.

        Channels being opened (``_late``: a second connection's, or a tuner's probe)
        join the queue when they are open; if the queue is empty by then they are not
        waited for. A channel the tuner retires takes no new file, ends once its last
        one is written (its receiver verifies it and says so) and is closed."""
        # (the agent spoke up during the files sent ahead: its line is read below)
        work = collections.deque(rest if ahead_ok else [])
        lanes: list[_Lane] = []
        ending: list[asyncio.Future[None]] = []
        tuner, argv = self._tuner, self._argv

        def start(proc: RemoteProcess, spare: bool = False) -> None:
            lane = _Lane(proc, asyncio.Queue(), spare=spare)
            first = not lanes  # (the channel that ends the push: hints go on it)
            lane.reader = asyncio.ensure_future(self._read_acks(proc, lane.queue))
            target = max(self._target, len(lanes) + 1)
            lane.sender = asyncio.ensure_future(
                self._send_safely(
                    proc,
                    work,
                    todo_bytes,
                    lane.queue,
                    halted=lambda: self._halt or lane.retired,
                    batches=max(1, min(QUEUE_BATCHES, QUEUE_BATCHES_TOTAL // target)),
                    batch_bytes=BATCH_BYTES if target <= LINK_STREAMS else MANY_STREAMS_BATCH_BYTES,
                    hints=self._split_files.hints if first else None,
                )
            )
            lanes.append(lane)
            live = sum(not ln.retired for ln in lanes)
            self.stats.streams = max(self.stats.streams, live)
            self.stats.spare_streams += spare

        for proc in procs:
            start(proc)
        began = time.monotonic()
        late, self._late = self._late, None
        pump = asyncio.ensure_future(self._pump_hints(lanes[0]))
        try:
            while True:
                if late is not None and late.done():
                    opened = late.result()
                    for proc, spare in opened:
                        procs.append(proc)
                        start(proc, spare)
                    late = None
                    if tuner is not None and len(self._live(lanes)) < tuner.level:
                        tuner.refused(len(self._live(lanes)))
                for lane in lanes[1:]:  # its last file written (or retired): end it now
                    if lane.ended is None and _sent_all(lane):
                        lane.ended = asyncio.ensure_future(self._end_lane(lane))
                        ending.append(lane.ended)
                waiting: list[asyncio.Future[Any]] = [
                    lane.sender for lane in lanes if not lane.sender.done()
                ]
                if not waiting:
                    break
                if late is not None:
                    waiting.append(late)
                waiting += [task for task in ending if not task.done()]
                await asyncio.wait(
                    waiting,
                    timeout=TUNE_EVERY_S if tuner is not None else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                checked: list[asyncio.Future[Any]] = [lane.sender for lane in lanes]
                for task in [*checked, *ending]:
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                if tuner is not None and work and not self._halt:
                    opening = self._tune(tuner, lanes, todo_bytes, argv, hello, late is None)
                    late = opening or late
            self._record_steps(tuner)
            self.stats.mark("streams")
            self.stats.stream_s = round(time.monotonic() - began, 3)
            self.emit(PhaseProgress(self.run_id, phase="sync", done=self._done, total=todo_bytes))
            # (every other stream has its end frame now; one that failed raises below)
            whole = ahead_ok and all(lane.sender.result() for lane in lanes)
            main = lanes[0]
            if whole and self._split_files.all_in():
                # nothing is on its way but files: the end frame goes now, right behind
                # the workers' D frames, and the host waits there for their last files'
                # record lines (agent/datafinish.py), rather than the laptop waiting for
                # their answers and then sending it (a round trip, and the host's check
                # after their last groups instead of with them)
                await self._stop_hints(pump, main)
                await self._finish(procs[0], hello)
                self.stats.mark("end sent")

                async def workers() -> None:
                    await _all(list(ending))
                    self.stats.mark("workers done")

                final, _ = await _all([self._final(main.reader, main.queue), workers()])
                self.stats.mark("final")
                return final  # type: ignore[no-any-return]
            await _all(list(ending))
            self.stats.mark("workers done")
            await self._stop_hints(pump, main)
            if whole:
                await self._finish(procs[0], hello)
                self.stats.mark("end sent")
            final = await self._final(main.reader, main.queue)
            self.stats.mark("final")
            return final
        finally:
            self._split_files.drop()
            pending: list[asyncio.Future[Any]] = [
                *(lane.sender for lane in lanes),
                *(lane.reader for lane in lanes),
                *ending,
                pump,
            ]
            if late is not None:
                if late.done() and not late.cancelled() and late.exception() is None:
                    await _close_all([proc for proc, _spare in late.result()])  # never adopted
                pending.append(late)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(BaseException):
                    await task

    async def _stop_hints(self, pump: asyncio.Future[None], main: _Lane) -> None:
        """Stop the hint pump and send the hints it had not sent yet (the host hashes
        them before the join frames that follow)."""
        pump.cancel()
        with contextlib.suppress(BaseException):
            await pump
        hints = self._split_files.hints
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while hints and main.sender.result():
                await main.proc.write(hints.popleft())

    async def _pump_hints(self, main: _Lane) -> None:
        """Once the first stream has sent its last file, the hints (syncsplitfiles.py)
        go straight onto its channel while the other streams finish: no file's frame can
        be cut by one now, and the host hashes the split files' last pieces as they land
        instead of after the end (the join then hashes what the last hint did not see)."""
        with contextlib.suppress(Exception):
            if not await main.sender:
                return
            hints = self._split_files.hints
            while True:
                while hints:
                    await main.proc.write(hints.popleft())
                await asyncio.sleep(HINT_PUMP_S)

    @staticmethod
    def _live(lanes: list[_Lane]) -> list[_Lane]:
        """The lanes that take work: not retired, their sender still running."""
        return [lane for lane in lanes if not lane.retired and not lane.sender.done()]

    def _tune(
        self,
        tuner: StreamTuner,
        lanes: list[_Lane],
        todo_bytes: int,
        argv: list[str],
        hello: SyncHello,
        may_open: bool,
    ) -> asyncio.Future[list[tuple[RemoteProcess, bool]]] | None:
        """Feed the tuner a sample; retire streams (the newest first, never the first)
        or start opening more (``may_open``: none is being opened). Returns the opening,
        if any."""
        live = self._live(lanes)
        left = max(0, todo_bytes - self._done)  # (files a stream holds are not yet sent)
        before = tuner.level
        target = tuner.observe(time.monotonic(), _delivered(lanes, self.stats), len(live), left)
        self._target = target
        if target != before:
            rate = tuner.base_rate or 0.0
            self.emit(
                PhaseProgress(
                    self.run_id,
                    phase="sync",
                    done=self._done,
                    total=None,
                    detail=f"streams {before}→{target} (kept level measured {rate / 1e6:.1f} MB/s)",
                )
            )
        if target < len(live) and may_open:
            for lane in reversed(live[1:][-(len(live) - target) :]):
                lane.retired = True
            return None
        if target > len(live) and may_open:
            return asyncio.ensure_future(self._grow(argv, hello, lanes, target - len(live)))
        return None

    async def _grow(
        self, argv: list[str], hello: SyncHello, lanes: list[_Lane], count: int
    ) -> list[tuple[RemoteProcess, bool]]:
        """Open ``count`` more receivers: on the sync's own connection while it has
        channels (LINK_STREAMS, those retired and closed given back), then on a second."""
        open_here = LINK_STREAMS - sum(not lane.spare and not lane.closed for lane in lanes)
        here = max(0, min(count, open_here))
        procs: list[RemoteProcess] = []
        try:
            if here:
                await self._open_workers(argv, hello, here, procs)
            out = [(proc, False) for proc in procs]
            open_there = SPARE_STREAMS - sum(lane.spare and not lane.closed for lane in lanes)
            there = max(0, min(count - len(out), open_there))
            if there:
                out += [(proc, True) for proc in await self._open_spare(argv, hello, there)]
        except BaseException:
            # the push ended or failed while this probe opened: the channels it opened on
            # the run's own link would stay open (a receiver waiting on stdin, one session
            # of the host's MaxSessions each) on a link that outlives the sync
            await _close_all(procs)
            raise
        return out

    async def _end_lane(self, lane: _Lane) -> None:
        """A stream that sent its last file (or was retired): its end frame right
        behind that file (the receiver stores its last group on it), its receiver's
        last acks and answer, closed."""
        if lane.sender.result():
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await lane.proc.write(pack_frame("D", 0, 0))
        await self._final(lane.reader, lane.queue)
        lane.reader.cancel()
        lane.taken()  # (its last count, kept once it is closed)
        with contextlib.suppress(Exception):
            await lane.proc.close()
        lane.closed = True

    def _record_steps(self, tuner: StreamTuner | None) -> None:
        """The stream counts this attempt went through, for the result and the ledger."""
        if tuner is not None:
            self.stats.stream_steps = [[t, n] for t, n in tuner.steps]
        else:
            self.stats.stream_steps = [[0.0, self.stats.streams]]

    async def _finish(self, main: RemoteProcess, hello: SyncHello) -> None:
        """Every file is sent: assemble the split ones, then the end frame."""
        # every piece of a split file is on the host now (the other channels
        # answered their last frame; the first reads in order): put each together
        await self._split_files.assemble(main, self.files, self._file_done)
        # the host holds the hello's entries: only what changed since travels
        final = json.dumps(
            {
                "changed": [
                    [i, f.size, f.sha256]
                    for i, f in enumerate(self.files)
                    if (f.size, f.sha256) != (hello.sizes[i], hello.sha256s[i])
                ],
                # sent, not yet acknowledged: the host waits for them (another stream
                # may still be storing them)
                "pending": sorted(self._unacked),
            }
        ).encode()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await main.write(pack_frame("E", 0, len(final)) + final)
        # every hash is known now: build the manifest while the host checks
        self._manifest = None
        self.manifest()

    async def _round_trip(self, proc: RemoteProcess) -> float:
        """The round trip the streams are sized by: the link's own (measured while the
        first channel opened), else pings through ``proc``."""
        measured = await self._link_rtt if self._link_rtt is not None else None
        if measured is None:
            return await self._rtt(proc)
        again = self._rtt_again
        if again is not None and not again.done():  # (sent behind the first ones: due by now)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(again), measured)
        second = (
            again.result() if again is not None and again.done() and not again.cancelled() else None
        )
        return measured if second is None else min(measured, second)

    async def _probe_again(self, first: asyncio.Future) -> float | None:
        """One more round trip, sent once the first ones are answered (at once when
        they were, on a run again after a cut): they can all have waited behind the
        same stall (see link_round_trip); this one seldom does."""
        with contextlib.suppress(Exception):
            await asyncio.shield(first)
        try:
            return await self.transport.round_trip()
        except Exception:
            return None

    async def _open_early(self, argv: list[str], hello: SyncHello) -> list[RemoteProcess]:
        """Workers opened while the host answers the hello, when the files the laptop has
        no hash of (new or changed since the last sync: the host cannot hold them as
        the hello says) would get more than one stream by the link's round trip.

        Why: each worker costs a channel open, an exec and a python start on the host
        (~4 round trips after the start answer, 0.3 s at 80 ms); opened now, they are
        up when the start answer comes. Those the plan does not want are ended unused
        (:meth:`_take_early`); a re-sync the cache knows opens none."""
        rtt = await self._link_rtt if self._link_rtt is not None else None
        new = [Job(i, None, None) for i, f in enumerate(self.files) if f.sha256 is None]
        new_bytes = sum(self.files[job.index].size for job in new)
        jobs = self._split_files.units(self.files, new)
        if self.streams is not None:
            wanted = max(1, min(self.streams, MAX_STREAMS, jobs))
        elif rtt is None or choose_streams(1.0, new_bytes, jobs) == 1:
            return []
        else:
            wanted = min(choose_streams(rtt, new_bytes, jobs), LINK_STREAMS)
        procs: list[RemoteProcess] = []
        try:
            await self._open_workers(argv, hello, streams_per_link(wanted)[0] - 1, procs)
        except BaseException:
            await self._end_unused(procs)
            raise
        return procs

    async def _take_early(self, count: int) -> list[RemoteProcess]:
        """Up to ``count`` of the workers opened early; the others are ended unused."""
        early, self._early = self._early, None
        if early is None:
            return []
        try:
            procs = await early
        except (HostError, TransientHostError):
            return []  # opened again below, where a failure says what it is
        await self._end_unused(procs[count:])
        return procs[:count]

    async def _drop_early(self) -> None:
        """End the workers opened early that no stream took: at once when they are
        open, else once they are. Never cancelled half-way: a channel cut off while it
        opens keeps its slot of the link's channels and, once its exec went out, a
        receiver on the host until the connection closes (review of issue 36)."""
        early, self._early = self._early, None
        if early is None:
            return
        if not early.done():
            try:  # each opening is a round trip or two, or a Python start on a local host
                await asyncio.wait({early}, timeout=EARLY_CLOSE_WAIT_S)
            except asyncio.CancelledError:
                early.add_done_callback(self._end_when_opened)
                raise
        if early.done():
            if not early.cancelled() and early.exception() is None:
                with contextlib.suppress(Exception):
                    await self._end_unused(early.result())
        else:  # still opening (a link down): ended once they are open
            early.add_done_callback(self._end_when_opened)

    def _end_when_opened(self, early: asyncio.Future[list[RemoteProcess]]) -> None:
        """Done callback: end the workers ``early`` opened, if it opened any."""
        if early.cancelled() or early.exception() is not None:
            return
        ending = asyncio.ensure_future(self._end_unused(early.result()))
        _ENDING.add(ending)
        ending.add_done_callback(_ENDING.discard)

    async def _end_unused(self, procs: list[RemoteProcess]) -> None:
        """End workers that took no file: their end frame (the receiver answers it and
        exits having written nothing), then their channel closed."""
        for proc in procs:
            self._starting.discard(proc)
            with contextlib.suppress(Exception):
                await proc.write(pack_frame("D", 0, 0))
        await _close_all(procs)

    async def _rtt(self, proc: RemoteProcess, probes: int = 2) -> float:
        """The round trip through the channel (the fastest of a few pings)."""
        best = math.inf
        for _ in range(probes):
            started = time.monotonic()
            await proc.write(pack_frame("P", 0, 0))
            while True:
                msg = ReceiverLine.read(await proc.readline())
                if msg.acks is None:  # (files sent ahead of the start answer)
                    break
                for index in msg.acks:
                    self._verified(int(index))
            self._check(msg, "ping")
            best = min(best, time.monotonic() - started)
        return best

    async def _open_workers(
        self, argv: list[str], hello: SyncHello, count: int, procs: list[RemoteProcess]
    ) -> None:
        """Open up to ``count`` more receivers; the host refusing a channel just means fewer."""
        line = json.dumps(hello.to_json(worker=True)).encode() + b"\n"

        async def one() -> bool:
            try:
                proc = await self.transport.open_process(argv)
            except TransientHostError:
                raise
            except HostError:
                return False  # MaxSessions reached: go on with the channels we have
            procs.append(proc)
            await self._hello_worker(proc, line)
            return True

        await _all([one() for _ in range(count)])  # together: each costs round trips

    async def _hello_worker(self, proc: RemoteProcess, line: bytes) -> None:
        """A worker's hello; its start answer is read by its lane (:meth:`_read_acks`)
        while its first files are already on their way: a receiver that refuses
        answers an error the lane raises, as any other line that is not an ack."""
        self._starting.add(proc)
        await proc.write(line)

    async def _spare_lanes(
        self, argv: list[str], hello: SyncHello, count: int
    ) -> list[tuple[RemoteProcess, bool]]:
        return [(proc, True) for proc in await self._open_spare(argv, hello, count)]

    async def _open_spare(
        self, argv: list[str], hello: SyncHello, count: int
    ) -> list[RemoteProcess]:
        """Up to ``count`` receivers on a second connection to the host (one per attempt,
        kept for later probes), each past its start answer; none when there is no such
        link to be had (a host refusing a second login or a channel just means fewer
        streams)."""
        if self._spare_refused:
            return []
        if self._spares:
            spare = self._spares[0]
            connected = True
        else:
            made = self.transport.spare_link()
            if made is None:
                self._spare_refused = True
                return []
            spare, connected = made, False
            self._spares.append(spare)
        line = json.dumps(hello.to_json(worker=True)).encode() + b"\n"

        async def one() -> RemoteProcess:
            proc = await spare.open_process(argv)
            try:
                await self._hello_worker(proc, line)
            except BaseException:
                await proc.close()
                raise
            return proc

        try:
            if not connected:
                await spare.connect()
        except HostKeyError:
            raise  # a changed or unknown key stops the run, on any connection
        except Exception:
            self._spare_refused = True
            return []  # a host that refuses a second login: the first one's streams do
        opened = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
        return [proc for proc in opened if isinstance(proc, RemoteProcess)]

    async def _send_safely(
        self,
        proc: RemoteProcess,
        work: collections.deque,
        total: int,
        acks: asyncio.Queue,
        halted: Callable[[], bool] | None = None,
        batches: int = QUEUE_BATCHES,
        batch_bytes: int = BATCH_BYTES,
        hints: collections.deque[bytes] | None = None,
    ) -> bool:
        try:
            return await self._send(proc, work, total, acks, halted, batches, batch_bytes, hints)
        except (BrokenPipeError, ConnectionResetError):
            self._halt = True
            return False  # the agent stopped reading: its last line says why

    async def _send(
        self,
        proc: RemoteProcess,
        work: collections.deque,
        total: int,
        acks: asyncio.Queue,
        halted: Callable[[], bool] | None = None,
        batches: int = QUEUE_BATCHES,
        batch_bytes: int = BATCH_BYTES,
        hints: collections.deque[bytes] | None = None,
    ) -> bool:
        """Producer (read, hash, seal: ``produce``) → bounded queue → consumer (the channel).

        Returns False when the agent spoke up early (an error line is waiting).
        ``halted``: this stream takes no more files (by default: when the agent spoke).
        ``hints``: frames for the host sent between files (the first channel's).
        """
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=batches)
        pieces = read_pieces(
            self.root,
            self.files,
            work,
            self.key,
            halted or (lambda: self._halt),
            self._split_files.splits,
            self._sealed,
            hints,
            lanes=True,
        )

        async def produce() -> None:
            """Small files' batches on the loop, a large file's in a thread (``Lane``)."""
            lane = Lane.LOOP
            try:
                while True:
                    if lane is Lane.LOOP:
                        batch = next_batch(pieces, batch_bytes, lane)
                        await asyncio.sleep(0)  # (the channel's writes and timers between)
                    else:
                        batch = await asyncio.to_thread(next_batch, pieces, batch_bytes, lane)
                    lane = batch.lane
                    if batch.data or batch.done:
                        await queue.put(batch)
                    if batch.ended:
                        await queue.put(None)
                        return
            except Exception as exc:  # handed to the consumer, which raises it
                await queue.put(exc)

        producer = asyncio.ensure_future(produce())
        try:
            while True:
                batch = await queue.get()
                if batch is None:
                    break
                if isinstance(batch, BaseException):
                    raise batch
                if not acks.empty():
                    self._halt = True
                    return False
                await self._write_batch(proc, batch)
                now = time.monotonic()
                if now - self._last_progress >= PROGRESS_EVERY_S:
                    self._last_progress = now
                    self.emit(
                        PhaseProgress(self.run_id, phase="sync", done=self._done, total=total)
                    )
        finally:
            producer.cancel()
            with contextlib.suppress(BaseException):
                await producer
        return True

    async def _write_batch(self, proc: RemoteProcess, batch: Batch) -> None:
        """One channel write per batch (1 MiB, spanning file ends): a file's frame header
        and hash would otherwise each be an SSH packet, a wake-up of sshd and a pipe
        write on the host; a re-sync of small files is mostly such pieces."""
        if batch.data:
            await proc.write(batch.data)
        self.stats.sent_bytes += len(batch.data)
        self.stats.per_attempt[-1] += len(batch.data)
        self._done += batch.plain
        for done in batch.done:
            self._file_done(done)

    def _file_done(self, item: FileDone) -> None:
        self.files[item.index] = item.local
        if not item.sent:
            self.stats.skipped_files += 1
            self.stats.skipped_bytes += item.local.size
            return
        self.stats.sent_files += 1
        if item.index not in self._acked:
            self._unacked.add(item.index)
        if item.resumed:
            self.stats.resumed_files += 1
            self.stats.resumed_bytes += item.resumed

    def _job_bytes(self, job: Job) -> int:
        if job.piece is None:
            return self.files[job.index].size
        return job.piece.nbytes

    async def _split(self, rest: list[Job], streams: int) -> list[Job]:
        """``rest`` with each large file as pieces when there are channels to spread
        them over (or the host holds some pieces of it already)."""
        out = await self._split_files.split(self.files, rest, streams)
        self.stats.split_files = len(self._split_files.splits)
        return out

    def _learn_held(self, todo: set[int], unacked: set[int] | None = None) -> None:
        """An attempt's start answer: files sent whole before whose ack a cut lost
        (``unacked``: those set aside when the hello went, by default the session's,
        then forgotten), and which the host now holds as the hello says (not in its
        ``todo``), count as verified now (once)."""
        if unacked is None:
            unacked, self._unacked = self._unacked, set()
        for index in sorted(unacked - todo):
            if index not in self._acked:
                self._verified(index)

    def _ahead(self) -> list[Job]:
        """The files to send before the start answer: with a hash cache that knows the
        slice, every file with no hash cached (new or changed since the last sync: the
        host cannot hold it as the hello says) when they are few: AHEAD_BYTES in all, none big enough for the host to
        keep a cut transfer of (resuming one needs its answer); otherwise none. One the
        host holds unchanged after all (its mtime moved) is then sent once more,
        bytes the budget bounds."""
        out, budget = [], AHEAD_BYTES
        misses = sum(f.sha256 is None for f in self.files)
        if not self.send_ahead or misses * AHEAD_MISS_SHARE > len(self.files):
            return []  # no cache, or one that does not know this slice: hash first
        for index, f in enumerate(self.files):
            if f.sha256 is None:
                if f.size >= PARTIAL_MIN_BYTES or f.size > budget:
                    return []  # a larger change: the start answer plans it (streams)
                out.append(Job(index, None, None))
                budget -= f.size
        return out

    def _verified(self, index: int) -> None:
        """The host verified file ``index``: count it and say so (one event per file)."""
        self._unacked.discard(index)
        self._acked.add(index)
        path = self.files[index].path
        self.stats.acked.append(path)
        self.emit(
            PhaseProgress(
                self.run_id,
                phase="sync",
                done=len(self.stats.acked),
                total=None,
                unit="verified",
                detail=path,
            )
        )

    async def _read_acks(self, proc: RemoteProcess, acks: asyncio.Queue[ReceiverLine]) -> None:
        if proc in self._starting:  # a worker's start answer comes first (_hello_worker)
            try:
                await self._answer(proc, "start")
            except Exception:
                self._halt = True  # no stream takes another file: the attempt ends
                raise
            finally:
                self._starting.discard(proc)
        while True:
            msg = ReceiverLine.read(await proc.readline())
            if msg.eof:
                await acks.put(msg)
                return
            if msg.acks is not None:  # files the host verified since its last such line
                for index in msg.acks:
                    self._verified(int(index))
                continue
            if msg.piece is not None:  # a piece of a split file is in: the host may hash ahead
                with contextlib.suppress(TypeError, ValueError, IndexError):
                    self._split_files.piece_in(int(msg.piece[0]), int(msg.piece[1]))
                continue
            await acks.put(msg)

    async def _final(self, reader: asyncio.Future, acks: asyncio.Queue[ReceiverLine]) -> JsonObject:
        getter = asyncio.ensure_future(acks.get())
        await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()
            reader.result()  # re-raises the link error
            raise TransientHostError(f"the agent on {self.transport.name} stopped answering")
        result: JsonObject = self._check(getter.result(), "finish").result
        return result

    async def _answer(self, proc: RemoteProcess, what: str) -> ReceiverLine:
        line = await proc.readline()
        if not line:
            code = await proc.wait(timeout=30)
            message = (
                f"{self.transport.name}: the data agent under {self.python} exited "
                f"({code}) at {what} (phase sync): {proc.stderr_tail() or 'no output'}"
            )
            if code not in (None, 255):  # it ran and failed: the host's environment
                raise HostEnvironmentError(
                    message,
                    hint=f"check that {self.python} is "
                    "CPython 3.9+ on the host, or set agent.python",
                )
            raise HostError(message)
        return self._check(ReceiverLine.read(line), what)

    def _check(self, msg: ReceiverLine, what: str) -> ReceiverLine:
        if msg.eof:
            raise TransientHostError(f"the agent on {self.transport.name} stopped at {what}")
        if msg.ok:
            return msg
        error = f"{self.transport.name}: {'unknown error' if msg.error is None else msg.error}"
        if msg.code == ErrorCode.INTEGRITY:
            raise IntegrityError(error, hint="run again to resend, or wipe the run")
        if msg.code == ErrorCode.RAM:
            raise HostError(error, hint="free memory on the host or lower data.max_bytes")
        if msg.code == ErrorCode.HOST_ENV:
            raise HostEnvironmentError(
                f"{error} (phase sync, at {what})",
                hint="the agent runtime is installed at the start of "
                "sync; run again, or see `remotemac doctor`",
            )
        raise HostError(f"{error} (phase sync, at {what})")


class _Lane:
    """One stream of an attempt: its channel, its receiver's lines, its sender (the
    reader and the sender are set right after: the sender asks whether it is retired)."""

    reader: asyncio.Future[None]
    sender: asyncio.Future[bool]

    def __init__(
        self, proc: RemoteProcess, queue: asyncio.Queue[ReceiverLine], spare: bool = False
    ) -> None:
        self.proc, self.queue = proc, queue
        self.spare = spare  # on the second connection
        self.retired = False  # the tuner dropped it: it takes no new file
        self.ended: asyncio.Future[None] | None = None  # its end (D, last answer, close)
        self.closed = False
        self.delivered: int | None = 0  # what the host had taken of it when last asked

    def taken(self) -> int | None:
        """Bytes the host has taken from this stream (RemoteProcess.delivered), kept
        once it is closed."""
        if not self.closed:
            self.delivered = self.proc.delivered()
        return self.delivered


def _delivered(lanes: list[_Lane], stats: SyncStats) -> int:
    """What the tuner measures the rate by: the bytes the host has taken over every
    stream; the bytes written when the link cannot tell."""
    taken = [lane.taken() for lane in lanes]
    if any(n is None for n in taken):
        return stats.sent_bytes
    return sum(n for n in taken if n is not None)


def _sent_all(lane: _Lane) -> bool:
    """Whether the stream's sender has ended (its last file written, or it stopped
    taking files) without raising: its end frame may go."""
    sender = lane.sender
    return sender.done() and not sender.cancelled() and sender.exception() is None


async def _close_all(procs: list[RemoteProcess]) -> None:
    """Close channels no stream took (a probe's, when the push ended while it opened);
    a close that fails or hangs on a dead link gives up after a few seconds."""
    for proc in procs:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.close(), CLOSE_UNUSED_S)


async def _all(coros: list[Awaitable[Any]]) -> list[Any]:
    """Run the streams together; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    if not tasks:
        return []
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


def _streams_note(stats: SyncStats, opened: int) -> str:
    """The ledger's note on an attempt's streams: `` ×6 streams``, or as they were
    adapted, `` ×streams 6→8→6``."""
    if len(stats.stream_steps) > 1:
        return " ×" + stats.streams_text()
    return f" ×{opened} streams" if opened > 1 else ""
