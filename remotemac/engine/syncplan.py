"""Sync's plan: the numbers a sync is sized by, the local view of the slice, and the jobs.

Why a module of its own: what to send (stat and hash cache, the host's ``todo``, how
many channels) is decided before any byte is read; engine/sync.py runs the phase,
engine/synctalk.py talks to the receiver, engine/syncpieces.py reads and seals files.
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import JsonObject, Message, SyncFrame, reserved_data_path
from remotemac.data.manifest import HashCache, check_relpath
from remotemac.engine import syncsplit
from remotemac.errors import BadInput
from remotemac.events import Event

FRAME = SyncFrame.FILE.decode()  # a whole file's ciphertext (the kinds: protocol.SyncFrame)
BATCH_BYTES = 1 << 20
QUEUE_BATCHES = 4
#: sealed batches waiting over all streams at most: 14 streams of 4 would hold 56 MiB
#: (the orchestrator peaked at 195 MiB with 10 streams of 4, goal < 200 MiB); a
#: stream of a many-stream sync is slow (its window), so one or two waiting keep it fed
QUEUE_BATCHES_TOTAL = 16
#: ... and past one connection's streams each batch is half as big: a far push of one
#: 256 MiB file cut at half peaked at 195-198 MiB on 10 streams of 1 MiB batches
#: (main, 6 streams: 178 MiB); each of those streams carries ~13 MB/s, so 512 KiB
#: writes are still few
MANY_STREAMS_BATCH_BYTES = BATCH_BYTES // 2
#: OpenSSH's sshd advertises this window per session channel and gives it back in
#: halves (a window adjust once half is consumed), so one channel carries about
#: CHANNEL_BYTES per round trip: 5 channels moved 72 MB/s through the fault proxy's
#: 80 ms, 100 MB/s link (256 MiB, connection set-up taken out), 14.5 MB/s = 1.2 MB
#: per 82 ms round trip each
WINDOW_BYTES = 2 << 20
CHANNEL_BYTES = WINDOW_BYTES // 2
#: the rate the streams are sized for (1 Gbit/s); a slower link just fills sooner
TARGET_RATE = 125e6
#: streams on the sync's own connection: the transport's 8 exec channels minus the
#: agent's and a spare
LINK_STREAMS = 6
#: streams on a second connection to the host (Transport.spare_link), opened when one
#: connection's channels cannot carry TARGET_RATE: its 8 exec channels (MaxSessions
#: is 10 by default; a host that refuses one just gets fewer)
SPARE_STREAMS = 8
MAX_STREAMS = LINK_STREAMS + SPARE_STREAMS
#: a stream is only worth opening for this much data (a channel costs a round trip
#: and a python start on the host)
MIN_STREAM_BYTES = 8 << 20
#: a slice of files this small on average is spread over SMALL_FILE_STREAMS receivers
#: even on a near link (see choose_streams)
SMALL_FILE_BYTES = 1 << 20
SMALL_FILE_STREAMS = 2
#: the host keeps a cut file this big for resuming (agent/dataops.py RESUMABLE)
PARTIAL_MIN_BYTES = 8 << 20
#: files the laptop knows it must send (no hash cached: new or changed since the
#: last sync), below PARTIAL_MIN_BYTES each, this many bytes in all, are sent right
#: after the hello, while the host checks what it holds (see Session._talk)
AHEAD_BYTES = 8 << 20
#: ... only when the hash cache knows the slice: at most one file in this many missed
#: (a new or emptied cache misses every file, and the host may hold them all)
AHEAD_MISS_SHARE = 10
PROGRESS_EVERY_S = 0.2
#: how often the stream tuner is fed a sample of the bytes sent (engine/streamtuner.py)
TUNE_EVERY_S = 0.1
SHOW_FILES = 200
#: first pause before a sync attempt that verified nothing more (doubling, at most 2 s)
RETRY_PAUSE_S = 0.05

Emit = Callable[[Event], None]


@dataclass
class LocalFile:
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
    #: of those, the channels on a second connection (long fat links: syncplan.py)
    spare_streams: int = 0
    #: [seconds since the streams started, streams wanted] at every change the
    #: attempt's tuner made (engine/streamtuner.py): "streams 6→8→6"
    stream_steps: list[list[float]] = field(default_factory=list)
    #: seconds the last attempt's streams carried files (from the first stream taking a
    #: file to the last one done): the rest of a push is set-up, the host's answers and
    #: the end (the split files put together and checked)
    stream_s: float = 0.0
    #: [step, seconds since the sync began] of the last attempt: where a push's time
    #: outside its streams goes (channel open, start answer, round trip, ..., the end)
    steps: list[list[Any]] = field(default_factory=list)
    _began: float = field(default=0.0, repr=False)
    acked: list[str] = field(default_factory=list)
    #: bytes written into the channel by each attempt (a cut link starts a new one)
    per_attempt: list[int] = field(default_factory=list)

    def mark(self, step: str, began: float | None = None) -> None:
        """Note ``step`` at the time since the attempt began (``began``: it begins now)."""
        now = time.monotonic()
        if began is not None:
            self._began, self.steps = began, []
        self.steps.append([step, round(now - self._began, 3)])

    def steps_text(self) -> str:
        """The steps as the bench prints them: ``open 0.16, start 0.33, ...``."""
        return ", ".join(f"{step} {at:.2f}" for step, at in self.steps)

    def streams_text(self) -> str:
        """The streams as a user reads them: ``5 streams``, or adapted ``streams 6→8→6``."""
        steps = [int(n) for _, n in self.stream_steps]
        if len(steps) > 1:
            return "streams " + "→".join(str(n) for n in steps)
        return f"{self.streams} streams"

    def to_dict(self) -> JsonObject:
        """The sync result's ``transfer`` figures (every field but the paths acked)."""
        data = dict(self.__dict__)
        data.pop("acked")
        data.pop("_began", None)
        return data


def stat_all(root: Path, paths: list[str], cache: HashCache | None) -> list[LocalFile]:
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
        if reserved_data_path(rel):  # the host would take it for its own file
            raise BadInput(
                f"data file {rel!r}: names starting with .remotemac- or .verified.jsonl are "
                "kept for remotemac's own files on the host; rename it or leave it out of data.include"
            )
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
        out.append(LocalFile(rel, st.st_size, st.st_mtime_ns, st.st_ino, sha, st.st_ctime_ns))
    return out


def choose_streams(
    rtt: float,
    todo_bytes: int,
    files: int,
    cap: int = MAX_STREAMS,
    target_rate: float = TARGET_RATE,
) -> int:
    """Parallel channels for one sync: enough windows in flight to carry ``target_rate``
    over ``rtt`` seconds (the bandwidth-delay product over what one channel carries per
    round trip, CHANNEL_BYTES), never more than ``cap``, the files to send, or one per
    MIN_STREAM_BYTES. Past LINK_STREAMS the rest go on a second connection
    (:func:`streams_per_link`).

    Files under SMALL_FILE_BYTES on average get SMALL_FILE_STREAMS even on a near link:
    each receiver creates, stores and decrypts its own files, and once creating a file
    cost the host 0.1-1 ms (1,916 files of 16-256 KiB: 41 MB/s on one stream, 62 on
    three). Since the host's per-file work fell (issue 36) two are enough, and each
    receiver more is one more process for the cores: on loopback, both ends on the same
    2 cores, 1 GiB of 7,681 files, `bench_sync.py --streams N`, 9 rounds each at load
    1-3.5, small files' batches made on the loop: 0.96x rsync on two streams, 0.98x on
    one, 0.88x on three (medians). One was as fast here; two keep a second receiver
    for a host whose per-file work is slower than this machine's. Links past ~17 ms
    get more from their window sizing.
    A few large files stay on one stream there: more measured no faster.

    Such small files also stay on one connection's LINK_STREAMS on a far link: there
    the host's per-file work, not the window, is what holds them, and every receiver
    more costs the host a python start (80 ms, 256 MiB of 1,916 files, on the 2 shared
    cores at load 6-10, interleaved: 37.8 and 25.2 MB/s on 5-6 streams, 18.2 and 26.2
    on 11-12, whose host used 7.8-8.7 s of CPU)."""
    want = math.ceil(target_rate * rtt / CHANNEL_BYTES)
    if files and todo_bytes // files < SMALL_FILE_BYTES:
        want = max(min(want, LINK_STREAMS), SMALL_FILE_STREAMS)
    return max(1, min(want, cap, files, todo_bytes // MIN_STREAM_BYTES))


def streams_per_link(streams: int) -> tuple[int, int]:
    """``streams`` as (on the sync's own connection, on a second one)."""
    first = min(streams, LINK_STREAMS)
    return first, min(streams - first, SPARE_STREAMS)


def plan_todo(todo: list[list[Any]], partial: dict[int, PartialTransfer]) -> list[Job]:
    """Every file that may need sending: the host's ``todo`` (the entries it does not
    hold as the hello described them), with the hash of the copy it holds of that
    path (hashed here first: an unchanged file whose mtime moved is not sent) and
    its kept cut transfer."""
    return [Job(int(i), str(sha) if sha else None, partial.get(int(i))) for i, sha in todo]


@dataclass
class PartialTransfer(Message):
    """A cut transfer the host kept of one file (its start answer's ``partial``, from
    agent/datapartial.py), to be continued rather than sent again.

    Sent whole: ``partial`` (the kept file's name), ``chunks`` verified, the plaintext
    ``offset`` they cover and its ``prefix_sha256``, the stream ``header``. Sent as pieces
    (``split``): the ``header`` and the ``pieces`` held, ``[first, count, sha256]``. Both:
    the ``size`` and ``mtime_ns`` the file had when the transfer began. The host is not
    trusted: each field is checked where it is used (syncpieces.resume_point,
    syncsplit.kept_pieces), so they stay as sent here."""

    partial: Any = None
    chunks: Any = 0
    offset: Any = None
    prefix_sha256: Any = None
    header: Any = ""
    size: Any = None
    mtime_ns: Any = None
    split: Any = False
    pieces: Any = None


@dataclass
class Job:
    """One file to send: what the host holds of it (a verified copy, a cut transfer)."""

    index: int
    host_sha: str | None
    partial: PartialTransfer | None
    piece: syncsplit.Piece | None = None  # a chunk range of a file sent as pieces
