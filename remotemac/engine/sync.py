"""Sync: choose the dataset slice, then hash, encrypt and send it in pipelined streams.

Why a stream: each file is read once; while it is read it is hashed and sealed
(streamcrypt's chunked AEAD) in a worker thread, the event loop writes the sealed
chunks into an SSH channel, and on the host ``agent/dataops.py sync`` stores the
ciphertext, decrypts it into RAM-backed storage and checks the SHA-256, all at
the same time. A bounded queue between the stages keeps memory flat (a few MiB in
flight per stream whatever the slice size).

Why several streams on a far link: sshd gives each channel a 2 MiB window, so one
channel carries at most WINDOW_BYTES per round trip (~25 MB/s at 80 ms). The first
channel pings the agent; :func:`choose_streams` turns that round trip into a number
of channels, which take files from one shared queue, largest first. Many small files
get a few channels even on a near link: each receiver on the host creates, stores and
hashes its own files (there, the host's per-file cost is the limit, not the window).

Why it resumes and is incremental: the host acknowledges each file once it is
verified and keeps a record keyed by (relative path, plaintext SHA-256); a later
sync (after a cut link, a Ctrl-C, or with a slightly changed slice) asks first and
sends only what the host does not hold (the files the hash cache says changed go
right after the question, while the host checks what it holds). A large file cut mid-way continues after
its last chunk that authenticated on the host (see :func:`_resume_point` for why
that is safe). The journal's hash cache means unchanged local files are not even
read. A dropped link inside one sync is retried at once.

The data key reaches the agent inside the stream (stdin), never in argv, the
environment or a file on the host.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import math
import os
import stat
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from remotemac.agent.protocol import FRAME as FRAME_HEADER
from remotemac.agent.protocol import SyncFrame
from remotemac.data.manifest import HashCache, Manifest, ManifestEntry, check_relpath
from remotemac.engine import syncsplit
from remotemac.engine.agentclient import AgentClient
from remotemac.engine.context import HostBinding, RunContext
from remotemac.errors import (
    BadInput,
    HostEnvironmentError,
    HostError,
    IntegrityError,
    TransientHostError,
)
from remotemac.events import Event, PhaseProgress, Warning
from remotemac.transport.base import RemoteProcess, Transport

FRAME = SyncFrame.FILE.decode()  # a whole file's ciphertext (the kinds: protocol.SyncFrame)
BATCH_BYTES = 1 << 20
QUEUE_BATCHES = 4
#: OpenSSH's sshd advertises this window per session channel: one channel carries at
#: most WINDOW_BYTES per round trip, ~25 MB/s at 80 ms
WINDOW_BYTES = 2 << 20
#: the rate the streams are sized for (1 Gbit/s); a slower link just fills sooner
TARGET_RATE = 125e6
#: the transport's 8 exec channels (MaxSessions is 10) minus the agent's and a spare
MAX_STREAMS = 6
#: a stream is only worth opening for this much data (a channel costs a round trip
#: and a python start on the host)
MIN_STREAM_BYTES = 8 << 20
#: a slice of files this small on average is spread over SMALL_FILE_STREAMS receivers
#: even on a near link (see choose_streams)
SMALL_FILE_BYTES = 1 << 20
SMALL_FILE_STREAMS = 3
#: the host keeps a cut file this big for resuming (agent/dataops.py RESUMABLE)
PARTIAL_MIN_BYTES = 8 << 20
#: files the laptop knows it must send (no hash cached: new or changed since the
#: last sync), below PARTIAL_MIN_BYTES each, this many bytes in all, are sent right
#: after the hello, while the host checks what it holds (see _Session._talk)
AHEAD_BYTES = 8 << 20
#: ... only when the hash cache knows the slice: at most one file in this many missed
#: (a new or emptied cache misses every file, and the host may hold them all)
AHEAD_MISS_SHARE = 10
PROGRESS_EVERY_S = 0.2
SHOW_FILES = 200
#: first pause before a sync attempt that verified nothing more (doubling, at most 2 s)
RETRY_PAUSE_S = 0.05

Emit = Callable[[Event], None]


def choose_slice(ctx: RunContext):
    from remotemac.data.slice import select_slice

    data = ctx.playbook.data
    root = ctx.playbook.data_dir()
    if data is None or root is None:
        return None
    if not root.is_dir():
        raise BadInput(f"data.path: {root} is not a directory")
    return select_slice(
        root,
        include=list(data.include),
        exclude=list(data.exclude),
        max_bytes=data.max_bytes,
        sample_files=data.sample.files if data.sample else None,
        seed=data.sample.seed if data.sample else 0,
        files=list(data.files) if data.files is not None else None,
    )


@dataclass
class _Local:
    """One slice file as seen locally before the stream starts."""

    path: str
    size: int
    mtime_ns: int
    inode: int
    sha256: str | None
    #: with size, mtime and inode the identity the hash cache trusts: an edit whose
    #: mtime was put back (``cp -p``, ``rsync -t``) still moves the ctime
    ctime_ns: int = 0


@dataclass
class SyncStats:
    """What one sync moved; the tests and the bench read it."""

    files: int = 0
    bytes: int = 0
    sent_files: int = 0
    sent_bytes: int = 0  # bytes written into the channel (frames), over all attempts
    skipped_files: int = 0
    skipped_bytes: int = 0
    attempts: int = 0
    #: files continued from the host's verified prefix of a cut transfer, and the
    #: plaintext bytes that therefore did not travel again
    resumed_files: int = 0
    resumed_bytes: int = 0
    #: large files the last attempt sent as pieces over several channels (syncsplit.py)
    split_files: int = 0
    #: parallel channels the last attempt used, and the round trip they were sized by
    streams: int = 0
    rtt_ms: float | None = None
    acked: list[str] = field(default_factory=list)
    #: bytes written into the channel by each attempt (a cut link starts a new one)
    per_attempt: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data.pop("acked")
        return data


async def sync_host(
    ctx: RunContext, binding: HostBinding, provisioned: dict[str, Any]
) -> dict[str, Any]:
    """The pipeline's sync phase for one host: show the selection, stream, verify."""
    data = ctx.playbook.data
    run_dir = provisioned["run_dir"]
    if data is None:
        return {
            "data_dir": f"{run_dir}/data",
            "files": 0,
            "bytes": 0,
            "encrypted": False,
            "revision": None,
        }
    selection = choose_slice(ctx)
    root = ctx.playbook.data_dir()
    assert root is not None and selection is not None
    show_selection(ctx.emit, ctx.run_id, selection)
    encrypted = bool(data.encrypt)
    key = None
    if encrypted:
        from remotemac.data.keys import load_data_key, new_data_key

        try:
            key = load_data_key(ctx.home, ctx.run_id)
        except IntegrityError:
            key = new_data_key(ctx.home, ctx.run_id)
    runtime_dir = None
    runtime: dict[str, Any] = {}
    if encrypted:
        from remotemac.engine.runtime import ensure_runtime, install_method

        runtime = await ensure_runtime(
            binding.agent,
            home=ctx.home,
            method=install_method(ctx.playbook.agent.runtime_install),
            phase="sync",
            run_id=ctx.run_id,
            emit=ctx.emit,
        )
        runtime_dir = runtime["dir"]
        ctx.journal.record_created(binding.transport.name, "runtime", runtime_dir, ctx.run_id)
    # the agent's own interpreter decrypts, never the workload's venv (it may lack modules)
    manifest, answer, stats = await sync_slice(
        binding.transport,
        binding.agent,
        root=root,
        paths=[f.path for f in selection.files],
        run_dir=run_dir,
        run_id=ctx.run_id,
        key=key,
        runtime_dir=runtime_dir,
        cache=ctx.journal,
        emit=ctx.emit,
    )
    (ctx.out_dir / "manifest.json").write_text(manifest.to_json(), encoding="utf-8")
    if answer.get("ram"):  # hdiutil/diskutil/mdutil/tmutil on a Mac: the ledger shows them
        ctx.ledger.append_steps(binding.transport.name, "ramstore", answer["ram"].get("steps"))
    if answer.get("ram", {}) and answer["ram"].get("kind") in ("shm", "ramdisk"):
        ctx.journal.record_created(
            binding.transport.name, "ramstore", answer["ram"]["path"], ctx.run_id
        )
    if answer.get("ram") and answer["ram"].get("warning"):
        ctx.emit(Warning(ctx.run_id, message=str(answer["ram"]["warning"]), code="ram-store"))
    return {
        "data_dir": answer["data_dir"],
        "files": len(manifest.entries),
        "bytes": manifest.total_bytes,
        "encrypted": encrypted,
        "revision": manifest.root_digest,
        "ram": answer.get("ram"),
        "transfer": stats.to_dict(),
        "selection": [
            {"path": f.path, "size": f.size, "reason": f.reason} for f in selection.files
        ],
        "summary": f"{stats.sent_files} sent, {stats.skipped_files} already on the host"
        + (f", {stats.resumed_files} resumed mid-file" if stats.resumed_files else "")
        + (f", {stats.streams} streams" if stats.streams > 1 else ""),
        "runtime": {k: runtime.get(k) for k in ("dir", "reused", "method", "cryptography")}
        if runtime
        else None,
    }


def _progress(stats: SyncStats) -> int:
    """What a cut attempt did not lose: files verified plus 8 MiB steps of bytes sent."""
    return len(stats.acked) + stats.sent_bytes // PARTIAL_MIN_BYTES


def show_selection(emit: Emit, run_id: str, selection: Any) -> None:
    """Say which files will travel and why, before any byte is sent (unit ``files``)."""
    from remotemac.units import format_size

    files = selection.files
    emit(
        PhaseProgress(
            run_id,
            phase="sync",
            done=0,
            total=len(files),
            unit="files",
            detail=f"slice: {len(files)} files, {format_size(selection.total_bytes)}, "
            f"{len(selection.skipped)} left out",
        )
    )
    for i, chosen in enumerate(files[:SHOW_FILES], 1):
        emit(
            PhaseProgress(
                run_id,
                phase="sync",
                done=i,
                total=len(files),
                unit="files",
                detail=f"{chosen.path} ({format_size(chosen.size)}): {chosen.reason}",
            )
        )
    if len(files) > SHOW_FILES:
        emit(
            PhaseProgress(
                run_id,
                phase="sync",
                done=len(files),
                total=len(files),
                unit="files",
                detail=f"… and {len(files) - SHOW_FILES} more (see manifest.json)",
            )
        )


# ---------------------------------------------------------------- the stream


async def sync_slice(
    transport: Transport,
    agent: AgentClient,
    *,
    root: Path,
    paths: list[str],
    run_dir: str,
    run_id: str,
    key: bytes | None,
    runtime_dir: str | None = None,
    python: str | None = None,
    cache: HashCache | None = None,
    emit: Emit | None = None,
    ram_bytes: int | None = None,
    max_attempts: int | None = None,
    stats: SyncStats | None = None,
    streams: int | None = None,
) -> tuple[Manifest, dict[str, Any], SyncStats]:
    """Make the host hold ``paths`` (relative to ``root``), verified; resume after a cut link.

    With a ``key``, ``runtime_dir`` is the agent runtime (engine/runtime.py) the host
    decrypts with; ``python`` defaults to the agent's interpreter. Returns the
    manifest, the agent's final answer (``data_dir``, ``ram``, …) and the transfer
    statistics. Raises IntegrityError (exit 5) when the host finds a file that does
    not match, HostEnvironmentError (exit 6) when the host's environment cannot
    decrypt, HostError when the host cannot take the data. ``streams`` forces the
    number of parallel channels; by default it follows the measured round trip
    (:func:`choose_streams`).
    """
    if key is not None and not runtime_dir:
        raise ValueError("an encrypted sync needs the agent runtime (ensure_runtime) first")
    emit = emit or (lambda _e: None)
    stats = stats or SyncStats()
    if not agent.agent_dir:
        await agent.install()
    python = python or agent.python
    # the host opens the channel and starts its receiver while the slice is stat'ed here
    # (on a re-sync of thousands of unchanged files both are a good part of the time)
    argv = _receiver_argv(python, agent.agent_dir, runtime_dir if key is not None else None)
    opening = asyncio.ensure_future(transport.open_process(argv))
    try:
        files = await asyncio.to_thread(_stat_all, Path(root), paths, cache)
    except BaseException:
        await _discard(opening)
        raise
    stats.files, stats.bytes = len(files), sum(f.size for f in files)
    if ram_bytes is None:
        ram_bytes = max(stats.bytes * 2, 64 << 20)
    session = _Session(
        transport,
        agent,
        Path(root),
        files,
        run_dir,
        run_id,
        key,
        python,
        emit,
        stats,
        ram_bytes,
        runtime_dir,
        streams,
        opening,
        send_ahead=cache is not None,
    )
    # retried by deadline, not by count (issue 16): a link that stays up two seconds at a
    # time still verifies files on every attempt; the sync gives up when it has lost the
    # link for the whole reconnect deadline since it last made progress: a verified
    # file, or 8 MiB more sent (the host keeps a cut file of that size to resume it)
    verified, first_loss, idle = _progress(stats), None, 0
    while True:
        stats.attempts += 1
        try:
            answer = await session.run()
            break
        except TransientHostError as exc:
            now = time.monotonic()
            if _progress(stats) > verified or first_loss is None:
                verified, first_loss, idle = _progress(stats), now, 0
            else:
                idle += 1
            if (max_attempts is not None and stats.attempts >= max_attempts) or (
                now - first_loss >= transport.reconnect_deadline
            ):
                raise
            emit(
                Warning(
                    run_id,
                    message=f"sync interrupted ({exc.message}); resuming with "
                    f"{len(stats.acked)} files already verified",
                    code="sync-resume",
                )
            )
            await asyncio.sleep(min(RETRY_PAUSE_S * 2**idle, 2.0))
    if cache is not None:
        for f in files:
            if f.sha256 is not None:
                cache.put(f.path, f.size, f.mtime_ns, f.inode, f.ctime_ns, f.sha256)
    manifest = session.manifest()
    bad = answer.get("mismatches") or []
    if bad:
        raise IntegrityError(
            f"{transport.name}: dataset file {bad[0]['path']} failed "
            f"verification on the host ({bad[0]['why']})"
            + (f"; {len(bad) - 1} more" if len(bad) > 1 else ""),
            hint="run again to resend it, or wipe the run if it persists",
        )
    return manifest, answer, stats


#: runs ``<agent dir>/dataops.py`` (argv[1]) imported, not as a script: an imported
#: module loads from its cached bytecode (__pycache__ beside it, written by the first
#: run), a script is compiled on every start (~7 ms of the host's start, which a
#: re-sync's hello waits for)
RECEIVER_BOOT = (
    "import sys; d = sys.argv[1].rpartition('/')[0]; sys.path.insert(0, d); "
    "import dataops; dataops.main(sys.argv[2:])"
)


def _receiver_argv(python: str, agent_dir: str, runtime_dir: str | None = None) -> list[str]:
    # -S: stdlib only (cryptography comes from the runtime dir it names), and a host
    # python with a large site-packages costs 0.2-0.4 s per start without it; the
    # runtime in argv is imported while the laptop stats the slice (not a secret)
    return [python, "-S", "-c", RECEIVER_BOOT, f"{agent_dir}/dataops.py", "sync"] + (
        ["--runtime", runtime_dir] if runtime_dir else []
    )


async def _discard(opening: asyncio.Future) -> None:
    """Close a channel opened ahead that will not be used (or stop its opening)."""
    opening.cancel()
    with contextlib.suppress(BaseException):
        proc = await opening
        await proc.close()


def _stat_all(root: Path, paths: list[str], cache: HashCache | None) -> list[_Local]:
    """stat every file (no read); the hash cache fills in unchanged files' SHA-256.

    A re-sync of thousands of unchanged files is mostly this loop, so each directory
    is resolved once (not every file's whole path) and a file costs one lstat, plus
    a resolve only when it is itself a symlink.
    """
    real_root = os.path.realpath(root)
    inside_root = real_root.rstrip(os.sep) + os.sep
    base = str(root).rstrip(os.sep) + os.sep
    dirs: dict[str, bool] = {}
    out = []
    for rel in sorted(set(paths)):
        check_relpath(rel)
        full = base + rel
        try:
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                inside = os.path.realpath(full).startswith(inside_root)
                st = os.stat(full)
            else:
                parent = full.rpartition(os.sep)[0]
                inside = dirs.get(parent)  # type: ignore[assignment]
                if inside is None:
                    real = os.path.realpath(parent)
                    inside = dirs[parent] = real == real_root or real.startswith(inside_root)
        except OSError as exc:
            raise BadInput(f"cannot read data file {full}: {exc.strerror}") from None
        if not inside:
            raise BadInput(f"data file {full} escapes the data root through a symlink")
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"data file {full} is not a regular file")
        identity = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
        sha = cache.get(rel, *identity) if cache is not None else None
        out.append(_Local(rel, st.st_size, st.st_mtime_ns, st.st_ino, sha, st.st_ctime_ns))
    return out


def choose_streams(
    rtt: float,
    todo_bytes: int,
    files: int,
    cap: int = MAX_STREAMS,
    target_rate: float = TARGET_RATE,
) -> int:
    """Parallel channels for one sync: enough windows in flight to carry ``target_rate``
    over ``rtt`` seconds, never more than ``cap``, the files to send, or one per
    MIN_STREAM_BYTES.

    Files under SMALL_FILE_BYTES on average get SMALL_FILE_STREAMS even on a near link:
    each receiver creates, stores, decrypts and hashes its own files, and creating a
    file costs the host 0.1-1 ms (measured on loopback, both ends on the same 2 busy
    cores, 1,916 files of 16-256 KiB: 41 MB/s on one stream, 62 on three, median of 5).
    A few large files stay on one stream there: more measured no faster."""
    want = math.ceil(target_rate * rtt / WINDOW_BYTES)
    if files and todo_bytes // files < SMALL_FILE_BYTES:
        want = max(want, SMALL_FILE_STREAMS)
    return max(1, min(want, cap, files, todo_bytes // MIN_STREAM_BYTES))


def _plan_todo(todo: list[list[Any]], partial: dict[int, dict[str, Any]]) -> list[_Job]:
    """Every file that may need sending: the host's ``todo`` (the entries it does not
    hold as the hello described them), with the hash of the copy it holds of that
    path (hashed here first: an unchanged file whose mtime moved is not sent) and
    its kept cut transfer."""
    return [_Job(int(i), str(sha) if sha else None, partial.get(int(i))) for i, sha in todo]


@dataclass
class _Job:
    """One file to send: what the host holds of it (a verified copy, a cut transfer)."""

    index: int
    host_sha: str | None
    partial: dict[str, Any] | None
    piece: syncsplit.Piece | None = None  # a chunk range of a file sent as pieces


class _Session:
    """One sync attempt's channels on the host; ``run`` may be called again after a cut link.

    The first channel says what the host holds and finishes the sync; when one
    channel's window cannot fill the link (long round trip), more are opened and
    every channel takes the next file from one shared queue (largest first).
    """

    def __init__(
        self,
        transport: Transport,
        agent: AgentClient,
        root: Path,
        files: list[_Local],
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
        self._acked: set[int] = set()  # (an ack can overtake its own file's _Done)
        self._manifest: Manifest | None = None  # built once every file's hash is known
        #: this attempt's files sent as pieces, and their whole-file SHA-256 being read
        self._splits: dict[int, syncsplit.Split] = {}
        self._split_digests: dict[int, asyncio.Future[str]] = {}
        #: every chunk this sync sealed (a continued transfer seals some again)
        self._sealed = syncsplit.SealLog()

    def manifest(self) -> Manifest:
        if self._manifest is None:
            self._manifest = Manifest.from_entries(
                (ManifestEntry(f.path, f.size, f.sha256 or "") for f in self.files),
                checked=True,  # _stat_all checked every path
            )
        return self._manifest

    async def run(self) -> dict[str, Any]:
        argv = _receiver_argv(
            self.python, self.agent.agent_dir, self.runtime_dir if self.key is not None else None
        )
        started = time.monotonic()
        procs: list[RemoteProcess] = []
        code: int | None = None
        try:
            opening, self._opening = self._opening, None
            procs.append(await (opening or self.transport.open_process(argv)))
            answer = await self._talk(argv, procs)
            code = await procs[0].wait(timeout=60)
            return answer
        finally:
            for proc in procs:
                await proc.close()
            self.agent.ledger.append(
                self.transport.name,
                " ".join(argv) + (f" ×{len(procs)} streams" if len(procs) > 1 else ""),
                code,
                op="sync-data",
                seconds=time.monotonic() - started,
            )

    def _hello(self) -> dict[str, Any]:
        hello: dict[str, Any] = {
            "run_dir": self.run_dir,
            "run_id": self.run_id,
            "src": f"{self.run_dir}/data",
            "encrypted": self.key is not None,
            "ram_bytes": self.ram_bytes,
            # one list per field: json encodes 7,681 entries as dicts in 25-45 ms, as
            # four lists in 2-3 ms (and the host parses them faster too)
            "columns": {
                "path": [f.path for f in self.files],
                "size": [f.size for f in self.files],
                "sha256": [f.sha256 for f in self.files],
                "mtime_ns": [f.mtime_ns for f in self.files],
            },
        }
        if self.key is not None:
            hello["key_hex"] = self.key.hex()
            hello["runtime_dir"] = self.runtime_dir
        return hello

    async def _talk(self, argv: list[str], procs: list[RemoteProcess]) -> dict[str, Any]:
        main = procs[0]
        hello = self._hello()
        await main.write(json.dumps(hello).encode() + b"\n")
        self.stats.per_attempt.append(0)
        self._done, self._halt = 0, False
        self._drop_digests()
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
        self._learn_held({int(i) for i, _ in first["todo"]}, unacked)
        partial = {int(i): dict(info) for i, info in first.get("partial", [])}
        sent_ahead = {job.index for job in ahead}
        plan = _plan_todo(first["todo"], partial)
        todo_bytes = sum(self.files[j.index].size for j in plan)
        skipped = len(self.files) - len(plan)
        self.stats.skipped_files = skipped
        self.stats.skipped_bytes = sum(f.size for f in self.files) - todo_bytes
        ahead_ok = await early  # (before a ping: a frame never lands inside a file's)
        rest = [job for job in plan if job.index not in sent_ahead]
        rest_bytes = sum(self.files[j.index].size for j in rest)
        # a large file can go as pieces on several channels: it counts as that many jobs
        jobs = self._units(rest)
        if rest:
            if self.streams is None and choose_streams(1.0, rest_bytes, jobs) == 1:
                wanted = 1  # one stream even on a 1 s round trip: no ping
            elif self.streams is None:
                rtt = await self._rtt(main)
                self.stats.rtt_ms = round(rtt * 1000, 2)
                wanted = choose_streams(rtt, rest_bytes, jobs)
            else:
                wanted = max(1, min(self.streams, MAX_STREAMS, jobs))
            await self._open_workers(argv, hello, wanted - 1, procs)
            rest = await self._split(rest, len(procs))
            if len(procs) > 1:  # largest first, so no channel is left with a big file at the end
                rest.sort(key=lambda j: -self._job_bytes(j))
        self.stats.streams = len(procs)
        self.emit(
            PhaseProgress(
                self.run_id,
                phase="sync",
                done=0,
                total=todo_bytes,
                detail=f"{skipped} files already verified on the host; "
                f"checking or sending {len(plan)}"
                + (f" over {len(procs)} streams" if len(procs) > 1 else ""),
            )
        )
        # (the agent spoke up during the files sent ahead: its line is read below)
        work = collections.deque(rest if ahead_ok else [])
        queues: list[asyncio.Queue[dict[str, Any]]] = [asyncio.Queue() for _ in procs]
        readers = [
            asyncio.ensure_future(self._read_acks(p, q)) for p, q in zip(procs, queues, strict=True)
        ]
        try:
            sent = await _all(
                [
                    self._send_safely(p, work, todo_bytes, q)
                    for p, q in zip(procs, queues, strict=True)
                ]
            )
            self.emit(PhaseProgress(self.run_id, phase="sync", done=self._done, total=todo_bytes))
            for i in range(1, len(procs)):
                if sent[i]:
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        await procs[i].write(_frame("D", 0, 0))
            await _all([self._final(readers[i], queues[i]) for i in range(1, len(procs))])
            if ahead_ok and all(sent):
                # every piece of a split file is on the host now (the other channels
                # answered their last frame; the first reads in order): put each together
                await self._assemble(main)
                # the host holds the hello's entries: only what changed since travels
                said = hello["columns"]
                final = json.dumps(
                    {
                        "changed": [
                            [i, f.size, f.sha256]
                            for i, f in enumerate(self.files)
                            if (f.size, f.sha256) != (said["size"][i], said["sha256"][i])
                        ]
                    }
                ).encode()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    await main.write(_frame("E", 0, len(final)) + final)
                # every hash is known now: build the manifest while the host checks
                self._manifest = None
                self.manifest()
            return await self._final(readers[0], queues[0])
        finally:
            self._drop_digests()
            for reader in readers:
                reader.cancel()
                with contextlib.suppress(BaseException):
                    await reader

    async def _rtt(self, proc: RemoteProcess, probes: int = 2) -> float:
        """The round trip through the channel (the fastest of a few pings)."""
        best = math.inf
        for _ in range(probes):
            started = time.monotonic()
            await proc.write(_frame("P", 0, 0))
            while True:
                msg = json.loads((await proc.readline()) or b'{"eof": true}')
                if "acks" not in msg:  # (files sent ahead of the start answer)
                    break
                for index in msg["acks"]:
                    self._verified(int(index))
            self._check(msg, "ping")
            best = min(best, time.monotonic() - started)
        return best

    async def _open_workers(
        self, argv: list[str], hello: dict[str, Any], count: int, procs: list[RemoteProcess]
    ) -> None:
        """Open up to ``count`` more receivers; the host refusing a channel just means fewer."""
        line = json.dumps(dict(hello, worker=True)).encode() + b"\n"

        async def one() -> bool:
            try:
                proc = await self.transport.open_process(argv)
            except TransientHostError:
                raise
            except HostError:
                return False  # MaxSessions reached: go on with the channels we have
            procs.append(proc)
            await proc.write(line)
            await self._answer(proc, "start")
            return True

        await _all([one() for _ in range(count)])  # together: each costs round trips

    async def _send_safely(
        self, proc: RemoteProcess, work: collections.deque, total: int, acks: asyncio.Queue
    ) -> bool:
        try:
            return await self._send(proc, work, total, acks)
        except (BrokenPipeError, ConnectionResetError):
            self._halt = True
            return False  # the agent stopped reading: its last line says why

    async def _send(
        self,
        proc: RemoteProcess,
        work: collections.deque,
        total: int,
        acks: asyncio.Queue,
    ) -> bool:
        """Producer (thread: read, hash, seal) → bounded queue → consumer (the channel).

        Returns False when the agent spoke up early (an error line is waiting).
        """
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=QUEUE_BATCHES)
        pieces = _pieces(
            self.root, self.files, work, self.key, lambda: self._halt, self._splits, self._sealed
        )

        async def produce() -> None:
            try:
                while True:
                    batch = await asyncio.to_thread(_next_batch, pieces)
                    await queue.put(batch if batch.data or batch.done else None)
                    if not (batch.data or batch.done):
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

    async def _write_batch(self, proc: RemoteProcess, batch: _Batch) -> None:
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

    def _file_done(self, item: _Done) -> None:
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

    def _units(self, rest: list[_Job]) -> int:
        """Jobs ``rest`` can make: a large file may go as pieces (syncsplit.py)."""
        if self.key is None:
            return len(rest)
        return syncsplit.units(
            [self.files[j.index].size if self._splittable(j) else 0 for j in rest]
        )

    def _splittable(self, job: _Job) -> bool:
        # (a file the host holds a verified copy of is hashed first: it may not travel)
        return job.host_sha is None and syncsplit.splittable(
            self.files[job.index].size, job.partial
        )

    def _job_bytes(self, job: _Job) -> int:
        if job.piece is None:
            return self.files[job.index].size
        return job.piece.nbytes

    async def _split(self, rest: list[_Job], streams: int) -> list[_Job]:
        """``rest`` with each large file as pieces when there are channels to spread
        them over (or the host holds some pieces of it already)."""
        self._drop_digests()
        out: list[_Job] = []
        for job in rest:
            f = self.files[job.index]
            resuming = bool(job.partial and job.partial.get("split"))
            if self.key is None or not self._splittable(job) or (streams < 2 and not resuming):
                out.append(job)
                continue
            split, pieces = await asyncio.to_thread(
                syncsplit.plan, self.root, job.index, f.path, self.key, job.partial
            )
            self._splits[job.index] = split
            if f.sha256 is None or (f.size, f.mtime_ns) != (split.size, split.mtime_ns):
                # the pieces are read apart: the whole file's SHA-256 is read in order here
                self._split_digests[job.index] = asyncio.ensure_future(
                    asyncio.to_thread(syncsplit.whole_digest, self.root, split)
                )
            out.extend(_Job(job.index, None, None, piece) for piece in pieces)
        self.stats.split_files = len(self._splits)
        return out

    def _drop_digests(self) -> None:
        """An attempt's whole-file hashing that will not be used (a cut, a failure)."""
        for pending in self._split_digests.values():
            pending.cancel()
        self._splits, self._split_digests = {}, {}

    async def _assemble(self, main: RemoteProcess) -> None:
        """Ask the host to put each split file together, checked against its SHA-256."""
        for index, split in self._splits.items():
            pending = self._split_digests.get(index)
            digest = await pending if pending is not None else self.files[index].sha256
            assert digest is not None
            body = json.dumps({"sha256": digest, "header": split.header.hex()}).encode()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await main.write(_frame("J", index, len(body)) + body)
            local = _Local(
                split.path, split.size, split.mtime_ns, split.inode, digest, split.ctime_ns
            )
            self._file_done(_Done(index, local, sent=True, resumed=split.kept))

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

    def _ahead(self) -> list[_Job]:
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
                out.append(_Job(index, None, None))
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

    async def _read_acks(self, proc: RemoteProcess, acks: asyncio.Queue) -> None:
        while True:
            line = await proc.readline()
            if not line:
                await acks.put({"eof": True})
                return
            msg = json.loads(line.decode("utf-8", "replace"))
            if "acks" in msg:  # files the host verified since its last such line
                for index in msg["acks"]:
                    self._verified(int(index))
                continue
            if "piece" in msg:  # a piece of a split file is in (the assemble checks them all)
                continue
            await acks.put(msg)

    async def _final(self, reader: asyncio.Future, acks: asyncio.Queue) -> dict[str, Any]:
        getter = asyncio.ensure_future(acks.get())
        await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()
            reader.result()  # re-raises the link error
            raise TransientHostError(f"the agent on {self.transport.name} stopped answering")
        return self._check(getter.result(), "finish")["result"]

    async def _answer(self, proc: RemoteProcess, what: str) -> dict[str, Any]:
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
        return self._check(json.loads(line.decode("utf-8", "replace")), what)

    def _check(self, msg: dict[str, Any], what: str) -> dict[str, Any]:
        if msg.get("eof"):
            raise TransientHostError(f"the agent on {self.transport.name} stopped at {what}")
        if msg.get("ok"):
            return msg
        error = f"{self.transport.name}: {msg.get('error', 'unknown error')}"
        if msg.get("code") == "integrity":
            raise IntegrityError(error, hint="run again to resend, or wipe the run")
        if msg.get("code") == "ram":
            raise HostError(error, hint="free memory on the host or lower data.max_bytes")
        if msg.get("code") == "host-env":
            raise HostEnvironmentError(
                f"{error} (phase sync, at {what})",
                hint="the agent runtime is installed at the start of "
                "sync; run again, or see `remotemac doctor`",
            )
        raise HostError(f"{error} (phase sync, at {what})")


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


def _frame(kind: str, index: int, length: int) -> bytes:
    """A sync frame header (``protocol.FRAME``; the kinds are ``protocol.SyncFrame``)."""
    return FRAME_HEADER.pack(kind.encode(), index, length)


@dataclass
class _Done:
    index: int
    local: _Local
    sent: bool
    resumed: int = 0  # plaintext bytes the host already held (a resumed cut transfer)


class _HashingReader:
    """Reads exactly ``size`` bytes of a file while hashing them (one read, two uses)."""

    def __init__(self, fh: BinaryIO, size: int, path: str) -> None:
        self.fh, self.left, self.path, self.size = fh, size, path, size
        self.digest = hashlib.sha256()

    def rewind(self) -> None:
        self.fh.seek(0)
        self.left, self.digest = self.size, hashlib.sha256()

    def read(self, n: int) -> bytes:
        data = self.fh.read(min(n, self.left))
        self.left -= len(data)
        self.digest.update(data)
        if not data and self.left:
            raise IntegrityError(
                f"data file {self.path} shrank while it was sent",
                hint="stop whatever writes to the dataset and sync again",
            )
        return data


def _pieces(
    root: Path,
    files: list[_Local],
    work: collections.deque,
    key: bytes | None,
    halted: Callable[[], bool] = lambda: False,
    splits: dict[int, syncsplit.Split] | None = None,
    log: syncsplit.SealLog | None = None,
) -> Iterator[Any]:
    """Yield (bytes, plaintext bytes covered) to send, and a _Done after each file.

    Takes the next file from ``work`` (shared by every stream) only when ready for it.
    A piece of a split file (``splits``) yields no _Done: the assemble frame ends it.
    ``log`` (the session's) refuses a chunk sealed again with other bytes.
    """
    from remotemac.agent.streamcrypt import DEFAULT_CHUNK, ciphertext_size, iter_encrypt

    while not halted():
        try:
            job = work.popleft()
        except IndexError:
            return
        if job.piece is not None:
            assert key is not None and splits is not None
            yield from syncsplit.sealed_piece(root, splits[job.index], job.piece, key, _frame, log)
            continue
        f = files[job.index]
        full = root / f.path
        fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb", buffering=0) as fh:
            before = os.fstat(fh.fileno())
            size = before.st_size
            if job.host_sha is not None and f.sha256 is None:
                # the host holds a verified copy of this path: hash first, maybe skip sending
                sha = _hash_all(fh, size, f.path)
                local = _Local(
                    f.path, size, before.st_mtime_ns, before.st_ino, sha, before.st_ctime_ns
                )
                if sha == job.host_sha and _unchanged(fh, before):
                    yield _Done(job.index, local, sent=False)
                    continue
                fh.seek(0)
            reader = _HashingReader(fh, size, f.path)
            resumed = 0
            if key is not None:
                resume = _resume_point(job, reader, before, key, f.path)
                if resume is None:
                    yield _frame(FRAME, job.index, ciphertext_size(size, DEFAULT_CHUNK)), 0
                    chunk, where = DEFAULT_CHUNK, None
                else:
                    frame, chunk, where, resumed = resume
                    yield frame, resumed
                covered = resumed
                version = syncsplit.file_version(before)
                header, counter = where if where is not None else (b"", 0)
                for sealed in iter_encrypt(
                    key,
                    f.path,
                    reader,  # type: ignore[arg-type]
                    chunk,
                    resume=where,
                    version=version,
                ):
                    if not header:
                        header = sealed  # (a fresh stream's first item)
                    elif log is not None:
                        log.check(header, counter, sealed, f.path)
                        counter += 1
                    read = size - reader.left
                    yield sealed, read - covered
                    covered = read
            else:
                yield _frame(FRAME, job.index, size), 0
                while block := reader.read(BATCH_BYTES):
                    yield block, len(block)
            if reader.left or not _unchanged(fh, before):
                raise IntegrityError(
                    f"data file {full} changed while it was sent",
                    hint="stop whatever writes to the dataset and sync again",
                )
            sha = reader.digest.hexdigest()
            yield bytes.fromhex(sha), 0
            yield _Done(
                job.index,
                _Local(f.path, size, before.st_mtime_ns, before.st_ino, sha, before.st_ctime_ns),
                sent=True,
                resumed=resumed,
            )


def _resume_point(
    job: _Job, reader: _HashingReader, before: os.stat_result, key: bytes, path: str
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
    if not partial or (size, before.st_mtime_ns) != (partial.get("size"), partial.get("mtime_ns")):
        return None
    header = bytes.fromhex(str(partial.get("header", "")))
    chunk = header_chunk_size(header)
    chunks = int(partial.get("chunks", 0))
    offset = chunks * chunk
    if not chunk or not 0 < offset < size or offset != partial.get("offset"):
        return None
    try:
        open_header(key, path, header)
    except DecryptError:
        return None
    if not header_fits(key, path, header, syncsplit.file_version(before)):
        return None
    while reader.left > size - offset:
        reader.read(min(BATCH_BYTES, reader.left - (size - offset)))
    if reader.digest.hexdigest() != partial.get("prefix_sha256"):
        reader.rewind()
        return None
    meta = json.dumps(
        {"partial": partial["partial"], "chunks": chunks, "prefix_sha256": partial["prefix_sha256"]}
    ).encode()
    tail = ciphertext_size(size, chunk) - HEADER_LEN - chunks * (chunk + TAG_LEN)
    frame = _frame("R", job.index, tail) + len(meta).to_bytes(4, "big") + meta
    return frame, chunk, (header, chunks), offset


def _hash_all(fh: BinaryIO, size: int, path: str) -> str:
    reader = _HashingReader(fh, size, path)
    while reader.read(BATCH_BYTES):
        pass
    return reader.digest.hexdigest()


def _unchanged(fh: BinaryIO, before: os.stat_result) -> bool:
    after = os.fstat(fh.fileno())
    return (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@dataclass
class _Batch:
    """Up to ~BATCH_BYTES of the stream, joined: one channel write (a write per piece,
    thousands for small files, cost the event loop more than the bytes did)."""

    data: bytes
    plain: int  # plaintext bytes it covers (progress)
    done: list[_Done]  # files whose last byte is in this batch or an earlier one


def _next_batch(pieces: Iterator[Any]) -> _Batch:
    """The next batch of pieces (run in a worker thread: hashing and AES release the GIL)."""
    parts: list[bytes] = []
    done: list[_Done] = []
    size = plain = 0
    for item in pieces:
        if isinstance(item, _Done):
            done.append(item)
            continue
        parts.append(item[0])
        plain += item[1]
        size += len(item[0])
        if size >= BATCH_BYTES:
            break
    return _Batch(b"".join(parts), plain, done)
