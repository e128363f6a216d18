"""Sync: choose the dataset slice, then hash, encrypt and send it in pipelined streams.

Why a stream: each file is read once; while it is read it is hashed and sealed
(streamcrypt's chunked AEAD), small files on the event loop and large ones in a
worker thread (engine/syncpieces.Lane), the event loop writes the sealed
chunks into an SSH channel, and on the host ``agent/dataops.py sync`` stores the
ciphertext and decrypts it into RAM-backed storage (its authenticated decryption is
the check of a file sent whole; a resumed or split one is hashed again), all at the
same time. A bounded queue between the stages keeps memory flat (a few MiB in
flight per stream whatever the slice size).

Why several streams on a far link: sshd gives each channel a 2 MiB window, so one
channel carries at most WINDOW_BYTES per round trip (~25 MB/s at 80 ms). The first
channel pings the agent; :func:`choose_streams` turns that round trip into a number
of channels, which take files from one shared queue, largest first. Many small files
get a few channels even on a near link: each receiver on the host creates, stores and
decrypts its own files (there, the host's per-file cost is the limit, not the window).

Why it resumes and is incremental: the host acknowledges each file once it is
verified and keeps a record keyed by (relative path, plaintext SHA-256); a later
sync (after a cut link, a Ctrl-C, or with a slightly changed slice) asks first and
sends only what the host does not hold (the files the hash cache says changed go
right after the question, while the host checks what it holds). A large file cut mid-way continues after
its last chunk that authenticated on the host (see :func:`resume_point` for why
that is safe). The journal's hash cache means unchanged local files are not even
read. A dropped link inside one sync is retried at once.

The data key reaches the agent inside the stream (stdin), never in argv, the
environment or a file on the host.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from remotemac.data.manifest import HashCache, Manifest
from remotemac.engine.agentclient import AgentClient
from remotemac.engine.context import HostBinding, RunContext
from remotemac.engine.phaseresults import (
    ProvisionHost,
    RamStore,
    RuntimeUsed,
    Selected,
    SyncHost,
    Transfer,
)
from remotemac.engine.syncplan import (  # noqa: F401 (MAX_STREAMS ... choose_streams: re-exported)
    MAX_STREAMS,
    PARTIAL_MIN_BYTES,
    RETRY_PAUSE_S,
    SHOW_FILES,
    SMALL_FILE_STREAMS,
    Emit,
    SyncStats,
    choose_streams,
    stat_all,
)
from remotemac.engine.synctalk import RECEIVER_BOOT, Session, discard, receiver_argv  # noqa: F401
from remotemac.errors import BadInput, IntegrityError, TransientHostError
from remotemac.events import PhaseProgress, Warning
from remotemac.transport.base import Transport


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


async def sync_host(ctx: RunContext, binding: HostBinding, provisioned: ProvisionHost) -> SyncHost:
    """The pipeline's sync phase for one host: show the selection, stream, verify."""
    data = ctx.playbook.data
    run_dir = provisioned.run_dir
    if data is None:
        return SyncHost.without_data(f"{run_dir}/data")
    selection = choose_slice(ctx)
    root = ctx.playbook.data_dir()
    assert root is not None and selection is not None
    show_selection(ctx.emit, ctx.run_id, selection)
    encrypted = bool(data.encrypt)
    key = _data_key(ctx) if encrypted else None
    runtime = await _ensure_runtime(ctx, binding) if encrypted else {}
    runtime_dir = runtime["dir"] if encrypted else None
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
    _record_ram(ctx, binding, answer)
    return SyncHost(
        data_dir=answer["data_dir"],
        files=len(manifest.entries),
        bytes=manifest.total_bytes,
        encrypted=encrypted,
        revision=manifest.root_digest,
        ram=RamStore.maybe(answer.get("ram")),
        transfer=Transfer.from_json(stats.to_dict()),
        selection=[Selected(path=f.path, size=f.size, reason=f.reason) for f in selection.files],
        summary=f"{stats.sent_files} sent, {stats.skipped_files} already on the host"
        + (f", {stats.resumed_files} resumed mid-file" if stats.resumed_files else "")
        + (f", {stats.streams_text()}" if stats.streams > 1 else ""),
        runtime=RuntimeUsed.from_json(
            {k: runtime.get(k) for k in ("dir", "reused", "method", "cryptography")}
        )
        if runtime
        else None,
    )


def _data_key(ctx: RunContext) -> bytes:
    """The run's data key: the one kept for this run (a re-sync), else a new one."""
    from remotemac.data.keys import load_data_key, new_data_key

    try:
        return load_data_key(ctx.home, ctx.run_id)
    except IntegrityError:
        return new_data_key(ctx.home, ctx.run_id)


async def _ensure_runtime(ctx: RunContext, binding: HostBinding) -> dict[str, Any]:
    """The agent runtime the host decrypts with, recorded for cleanup."""
    from remotemac.engine.runtime import ensure_runtime, install_method

    runtime = await ensure_runtime(
        binding.agent,
        home=ctx.home,
        method=install_method(ctx.playbook.agent.runtime_install),
        phase="sync",
        run_id=ctx.run_id,
        emit=ctx.emit,
    )
    ctx.journal.record_created(binding.transport.name, "runtime", str(runtime.dir), ctx.run_id)
    return runtime.to_json()


def _record_ram(ctx: RunContext, binding: HostBinding, answer: dict[str, Any]) -> None:
    """The host's RAM store: its steps in the ledger, in the journal for cleanup, a warning.

    A session that reuses the volume returns the steps of the one that made it, marked
    ``earlier`` (agent/ramstore.py ``made_earlier``): that one may have been cut before
    its answer arrived, and then no ledger showed the ``hdiutil attach`` and ``diskutil
    erasevolume`` that made the disk. They are written once per run, with their own
    times, as op ``ramstore:earlier-session``: not when the journal already lists the
    volume for this run (its steps were written with it, below).
    """
    ram = answer.get("ram") or {}
    if not ram:
        return
    host = binding.transport.name
    steps = ram.get("steps") or []
    earlier = [s for s in steps if s.get("earlier")]
    if earlier and not _ram_listed(ctx, host, ram["path"]):
        ctx.ledger.append_steps(host, "ramstore:earlier-session", earlier)
    # hdiutil/diskutil/mdutil/tmutil on a Mac: the ledger shows them
    ctx.ledger.append_steps(host, "ramstore", [s for s in steps if s not in earlier])
    if ram["kind"] in ("shm", "ramdisk"):
        ctx.journal.record_created(host, "ramstore", ram["path"], ctx.run_id)
    warning = ram.get("warning")
    if warning:
        ctx.emit(Warning(ctx.run_id, message=str(warning), code="ram-store"))


def _ram_listed(ctx: RunContext, host: str, path: Any) -> bool:
    """Whether the journal lists RAM store ``path`` as this run's (its steps are in the ledger)."""
    return any(
        row["kind"] == "ramstore" and row["path"] == path and row["run_id"] == ctx.run_id
        for row in ctx.journal.inventory(host)
    )


def _progress(stats: SyncStats) -> int:
    """What a cut attempt did not lose: files verified plus 8 MiB steps of bytes sent."""
    return len(stats.acked) + stats.sent_bytes // PARTIAL_MIN_BYTES


def show_selection(emit: Emit, run_id: str, selection: Any) -> None:
    """Say which files will travel and why, before any byte is sent (unit ``files``);
    warn of files a pattern picked up under a name the host keeps (left out)."""
    from remotemac.data.slice import RESERVED_SKIP
    from remotemac.units import format_size

    reserved = [rel for rel, why in selection.skipped if why == RESERVED_SKIP]
    if reserved:
        emit(
            Warning(
                run_id,
                code="data-reserved",
                message=f"data: {len(reserved)} file(s) left out, their names are kept for "
                f"remotemac's own files on the host (.remotemac-*, .verified.jsonl): "
                f"{', '.join(reserved[:3])}"
                + (" …" if len(reserved) > 3 else "")
                + "; rename them to send them",
            )
        )

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
    argv = receiver_argv(python, agent.agent_dir, runtime_dir if key is not None else None)
    began = time.monotonic()
    opening = asyncio.ensure_future(transport.open_process(argv))
    try:
        files = await asyncio.to_thread(stat_all, Path(root), paths, cache)
    except BaseException:
        await discard(opening)
        raise
    stats.files, stats.bytes = len(files), sum(f.size for f in files)
    stats.mark("stat", began=began)
    if ram_bytes is None:
        ram_bytes = max(stats.bytes * 2, 64 << 20)
    session = Session(
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
    answer = await _run_resuming(session, transport, stats, emit, run_id, max_attempts)
    if cache is not None:  # (one write for the slice: a commit per file cost ~25 us)
        cache.put_many(
            (f.path, f.size, f.mtime_ns, f.inode, f.ctime_ns, f.sha256)
            for f in files
            if f.sha256 is not None
        )
    manifest = session.manifest()
    _refuse_mismatches(transport, answer)
    return manifest, answer, stats


async def _run_resuming(
    session: Session,
    transport: Transport,
    stats: SyncStats,
    emit: Emit,
    run_id: str,
    max_attempts: int | None,
) -> dict[str, Any]:
    """Run the session's attempts until one finishes; the agent's final answer.

    Retried by deadline, not by count (issue 16): a link that stays up two seconds at a
    time still verifies files on every attempt; the sync gives up when it has lost the
    link for the whole reconnect deadline since it last made progress: a verified
    file, or 8 MiB more sent (the host keeps a cut file of that size to resume it).
    """
    verified, first_loss, idle = _progress(stats), None, 0
    while True:
        stats.attempts += 1
        try:
            return await session.run()
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


def _refuse_mismatches(transport: Transport, answer: dict[str, Any]) -> None:
    """IntegrityError (exit 5) when the host found files that do not match."""
    bad = answer.get("mismatches") or []
    if bad:
        raise IntegrityError(
            f"{transport.name}: dataset file {bad[0]['path']} failed "
            f"verification on the host ({bad[0]['why']})"
            + (f"; {len(bad) - 1} more" if len(bad) > 1 else ""),
            hint="run again to resend it, or wipe the run if it persists",
        )
