"""Where the push's batches are made (issue 36): small files' on the event loop, a large
file's, a split file's piece's and a resumed file's in a worker thread.

Made in a thread, every small file cost a few hand-offs of the GIL between the thread
and the loop (~0.4 s of the laptop's CPU per GiB of 7,681 files); a large file's reads,
hashes and seals release the GIL long enough for the thread to pay, and a resumed one
hashes its whole kept prefix before it sends a byte, which must not stall the loop.
The last test pushes through the real sshd and checks, read by read, which thread
read which file, and that every file is verified on the host as before.
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from remotemac.agent.streamcrypt import DEFAULT_CHUNK
from remotemac.engine import syncpieces, syncsplit
from remotemac.engine.syncpieces import FileDone, Lane, next_batch, read_pieces
from remotemac.engine.syncplan import Job, stat_all
from tests.test_sync_sshd import host_factory as host_factory  # the fixtures, shared
from tests.test_sync_sshd import runtime_dir as runtime_dir

KEY = bytes(range(32))
MiB = 1 << 20


def _files(root: Path, sizes: list[int]) -> list:
    names = [f"d/f{i:02d}.bin" for i in range(len(sizes))]
    (root / "d").mkdir(parents=True, exist_ok=True)
    for name, size in zip(names, sizes, strict=True):
        (root / name).write_bytes(os.urandom(size))
    return stat_all(root, names, None)


def _reads_by_file(monkeypatch) -> list[tuple[str, int]]:
    """(path, thread id) of every read the pieces make of a file."""
    seen: list[tuple[str, int]] = []
    read = syncpieces.HashingReader.read

    def spy(self, n):
        seen.append((self.path, threading.get_ident()))
        return read(self, n)

    monkeypatch.setattr(syncpieces.HashingReader, "read", spy)
    return seen


def test_a_batch_made_on_the_loop_stops_before_a_large_files_first_read(tmp_path, monkeypatch):
    """Small files, a 3 MiB file, small files: the batch made on the loop carries the
    first small files and stops before the large file is read; the thread's batches
    then carry the large file and stop after it, before the next small file is read;
    together they carry every byte and every file, as batches made without lanes do."""
    sizes = [3000, DEFAULT_CHUNK, 70_000, 3 * MiB + 5, 100, 0, 5000]
    files = _files(tmp_path, sizes)
    reads = _reads_by_file(monkeypatch)
    pieces = read_pieces(
        tmp_path, files, collections.deque(Job(i, None, None) for i in range(len(files))), KEY,
        lanes=True,
    )  # fmt: skip
    first = next_batch(pieces, 64 * MiB, Lane.LOOP)
    assert [d.index for d in first.done] == [0, 1, 2]
    assert first.lane is Lane.THREAD and not first.ended
    assert {path for path, _ in reads} == {"d/f00.bin", "d/f01.bin", "d/f02.bin"}
    batches, lane, read_by = [first], first.lane, [len(reads)]
    while not batches[-1].ended:
        batches.append(next_batch(pieces, MiB, lane))
        lane = batches[-1].lane
        read_by.append(len(reads))
    large = [i for i, b in enumerate(batches) if any(d.index == 3 for d in b.done)]
    assert len(large) == 1 and batches[large[0]].lane is Lane.LOOP
    assert "d/f04.bin" not in {path for path, _ in reads[: read_by[large[0]]]}
    assert [d.index for b in batches for d in b.done] == list(range(len(sizes)))
    assert sum(b.plain for b in batches) == sum(sizes)

    plain = read_pieces(
        tmp_path, files, collections.deque(Job(i, None, None) for i in range(len(files))), KEY
    )
    alone = []
    while (batch := next_batch(plain, MiB)).data or batch.done:
        alone.append(batch)
    assert sum(len(b.data) for b in batches) == sum(len(b.data) for b in alone)


def test_a_resumed_file_even_a_small_one_and_a_split_files_piece_go_to_the_thread(tmp_path):
    """A file the host holds part of is hashed up to the kept prefix before anything is
    sent, and a piece of a split file is read and sealed whole: the lane turns to the
    thread before either is opened (a small resumed file too), and back after each."""
    files = _files(tmp_path, [9000, 9 * MiB])
    split, pieces = syncsplit.plan(tmp_path, 1, files[1].path, KEY, None, 2 * MiB)
    partial = SimpleNamespace(size=1, mtime_ns=0)  # (not this version: sent whole)
    jobs = [Job(0, None, partial), Job(1, None, None, pieces[1])]  # type: ignore[arg-type]
    items = list(
        read_pieces(tmp_path, files, collections.deque(jobs), KEY, splits={1: split}, lanes=True)
    )
    marks = [(i, item) for i, item in enumerate(items) if type(item) is Lane]
    assert [lane for _, lane in marks] == [Lane.THREAD, Lane.LOOP, Lane.THREAD, Lane.LOOP]
    done = next(i for i, item in enumerate(items) if isinstance(item, FileDone))
    assert marks[0][0] == 0 and marks[1][0] == done + 1
    assert marks[2][0] == done + 2 and marks[3][0] == len(items) - 1
    assert sum(n for item in items[done + 3 : -1] for n in [item[1]]) == pieces[1].nbytes


def test_without_lanes_the_pieces_carry_no_marks(tmp_path):
    """Readers of the pieces other than the push (benches, the host's tests) see only
    bytes and FileDones, as before."""
    files = _files(tmp_path, [100, 2 * MiB])
    items = list(
        read_pieces(
            tmp_path, files, collections.deque([Job(0, None, None), Job(1, None, None)]), KEY
        )
    )
    assert not any(type(item) is Lane for item in items)


def test_files_the_host_holds_make_batches_bounded_by_what_was_read(tmp_path):
    """Files the host already holds are read and hashed and send nothing: made on the
    loop, a run of them is cut into batches by the bytes read (and tiny files by the
    count), so no one batch holds the loop for the whole slice."""
    sizes = [100_000] * 50
    files = _files(tmp_path, sizes)
    held = [hashlib.sha256((tmp_path / f.path).read_bytes()).hexdigest() for f in files]
    pieces = read_pieces(
        tmp_path, files, collections.deque(Job(i, held[i], None) for i in range(50)), KEY,
        lanes=True,
    )  # fmt: skip
    batches = [next_batch(pieces, MiB, Lane.LOOP)]
    while not batches[-1].ended:
        batches.append(next_batch(pieces, MiB, Lane.LOOP))
    assert [d.index for b in batches for d in b.done] == list(range(50))
    assert all(not d.sent for b in batches for d in b.done)
    assert max(sum(d.local.size for d in b.done) for b in batches) <= MiB + 100_000
    assert len(batches) >= 5

    tiny = _files(tmp_path / "tiny", [0] * 600)
    pieces = read_pieces(
        tmp_path / "tiny", tiny, collections.deque(Job(i, None, None) for i in range(600)), KEY,
        lanes=True,
    )  # fmt: skip
    counts = []
    while True:
        batch = next_batch(pieces, MiB, Lane.LOOP)
        counts.append(len(batch.done))
        if batch.ended:
            break
    assert sum(counts) == 600 and max(counts) == syncpieces.BATCH_FILES


def test_a_file_grown_past_small_since_the_scan_is_read_in_the_thread(tmp_path, monkeypatch):
    """The lane is chosen from the scan's size, and checked again once the file is open:
    a file small when scanned and 2 MiB now turns the lane to the thread before it is
    read, and back after it."""
    files = _files(tmp_path, [5000, 5000, 5000])
    (tmp_path / files[1].path).write_bytes(os.urandom(2 * MiB))
    reads = _reads_by_file(monkeypatch)
    pieces = read_pieces(
        tmp_path, files, collections.deque(Job(i, None, None) for i in range(3)), KEY,
        lanes=True,
    )  # fmt: skip
    first = next_batch(pieces, 64 * MiB, Lane.LOOP)
    assert [d.index for d in first.done] == [0] and first.lane is Lane.THREAD
    assert {path for path, _ in reads} == {"d/f00.bin"}
    grown = next_batch(pieces, 64 * MiB, Lane.THREAD)
    assert [d.index for d in grown.done] == [1] and grown.lane is Lane.LOOP
    assert "d/f02.bin" not in {path for path, _ in reads}
    last = next_batch(pieces, 64 * MiB, Lane.LOOP)
    assert [d.index for d in last.done] == [2] and last.ended


@pytest.mark.asyncio
async def test_a_push_reads_small_files_on_the_loop_and_large_ones_in_a_thread(
    sshd, host_factory, tmp_path, monkeypatch
):
    """Through the real sshd: 40 small files and two of 3 MiB over two streams. Every
    read of a small file happens on the event loop's thread, every read of a large one
    in another thread, and the host verifies every file against the laptop's hash."""
    root = tmp_path / "data"
    sizes = (
        [20_000 + 97 * i for i in range(20)]
        + [3 * MiB, 3 * MiB + 7]
        + [150_000 + i for i in range(20)]
    )
    _files(root, sizes)
    loop_thread = threading.get_ident()
    reads = _reads_by_file(monkeypatch)
    host = await host_factory(sshd)
    try:
        manifest, answer, stats = await host.sync(root, os.urandom(32), streams=2)
    finally:
        await host.transport.close()
    assert answer["mismatches"] == []
    assert stats.attempts == 1 and stats.sent_files == 42  # (no file lost at a lane's turn)
    assert sorted(e.path for e in manifest.entries) == [f"d/f{i:02d}.bin" for i in range(42)]
    for entry in manifest.entries:
        held = (Path(answer["data_dir"]) / entry.path).read_bytes()
        assert hashlib.sha256(held).hexdigest() == entry.sha256
    large = {"d/f20.bin", "d/f21.bin"}
    on_loop = {path for path, tid in reads if tid == loop_thread}
    off_loop = {path for path, tid in reads if tid != loop_thread}
    assert off_loop == large, off_loop
    assert on_loop == {f"d/f{i:02d}.bin" for i in range(42)} - large
