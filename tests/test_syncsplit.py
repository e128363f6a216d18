"""Planning a split push (engine/syncsplit.py): which chunks go as which pieces, and
when a host's kept pieces may be continued under the same header."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from remotemac.agent.streamcrypt import DEFAULT_CHUNK, chunk_count, new_header
from remotemac.engine import syncsplit
from remotemac.engine.syncplan import PartialTransfer
from remotemac.errors import IntegrityError

KEY = bytes(range(32))
MiB = 1 << 20


def _file(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "big" / "train.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def _tiles(pieces: list[syncsplit.Piece], total: int) -> bool:
    covered = sorted((p.first, p.first + p.count) for p in pieces)
    at = 0
    for first, end in covered:
        if first != at:
            return False
        at = end
    return at == total


def test_missing_ranges_and_pieces_tile_what_the_host_lacks():
    assert syncsplit.missing(10, []) == [(0, 10)]
    assert syncsplit.missing(10, [(2, 3), (0, 1), (8, 2)]) == [(1, 2), (5, 8)]
    assert syncsplit.missing(4, [(0, 4)]) == []
    pieces = syncsplit.cut([(1, 2), (5, 12)], 3, b"h")
    assert [(p.first, p.count) for p in pieces] == [(1, 1), (5, 3), (8, 3), (11, 1)]
    assert syncsplit.units([64 * MiB, MiB, 31 * MiB, 0]) == 8 + 1 + 1 + 1


def test_a_fresh_split_covers_every_chunk_once_under_a_new_header(tmp_path):
    path = _file(tmp_path, 40 * MiB + 123)
    split, pieces = syncsplit.plan(tmp_path, 3, "big/train.bin", KEY, None, 9 * MiB)
    total = chunk_count(40 * MiB + 123, DEFAULT_CHUNK)
    assert split.index == 3 and split.size == path.stat().st_size and split.kept == 0
    assert _tiles(pieces, total) and len(pieces) == 5
    assert all(p.header == split.header for p in pieces)
    other, _ = syncsplit.plan(tmp_path, 3, "big/train.bin", KEY, None, 9 * MiB)
    assert other.header != split.header  # a fresh salt each time


def _host_partial(path: Path, split: syncsplit.Split, kept: list[tuple[int, int]]) -> dict:
    data = path.read_bytes()
    pieces = []
    for first, count in kept:
        plain = data[first * DEFAULT_CHUNK : (first + count) * DEFAULT_CHUNK]
        pieces.append([first, count, hashlib.sha256(plain).hexdigest()])
    st = path.stat()
    return {
        "split": True,
        "header": split.header.hex(),
        "pieces": pieces,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }


def test_the_hosts_pieces_are_kept_only_for_the_same_file(tmp_path):
    path = _file(tmp_path, 20 * MiB)
    first, _ = syncsplit.plan(tmp_path, 0, "big/train.bin", KEY, None, 8 * MiB)
    partial = _host_partial(path, first, [(0, 32), (64, 16)])
    split, pieces = syncsplit.plan(
        tmp_path, 0, "big/train.bin", KEY, PartialTransfer.from_json(partial), 8 * MiB
    )
    assert split.header == first.header and split.kept == 48 * DEFAULT_CHUNK
    assert [(p.first, p.count) for p in pieces] == [(32, 32)]
    assert _tiles(pieces + [syncsplit.Piece(b"", 0, 32), syncsplit.Piece(b"", 64, 16)], 80)

    # the same size and mtime, other bytes in a kept piece: never sealed again under
    # those nonces (a fresh header, everything sent)
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(70 * DEFAULT_CHUNK)
        fh.write(b"\0" * 8)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    again, pieces = syncsplit.plan(
        tmp_path, 0, "big/train.bin", KEY, PartialTransfer.from_json(partial), 8 * MiB
    )
    assert again.header != first.header and again.kept == 0 and _tiles(pieces, 80)

    # another mtime, a header for another path or key: afresh too
    for bad in (
        dict(partial, mtime_ns=partial["mtime_ns"] + 1),
        dict(partial, header=new_header(KEY, "big/other.bin").hex()),
        dict(partial, header=new_header(bytes(32), "big/train.bin").hex()),
        dict(partial, pieces=[[79, 2, "00" * 32]]),
        dict(partial, split=False),
    ):
        fresh, pieces = syncsplit.plan(
            tmp_path, 0, "big/train.bin", KEY, PartialTransfer.from_json(bad), 8 * MiB
        )
        assert fresh.header != first.header and fresh.kept == 0 and _tiles(pieces, 80)


def test_a_piece_of_a_file_changed_since_planning_is_refused(tmp_path):
    path = _file(tmp_path, 33 * MiB)
    split, pieces = syncsplit.plan(tmp_path, 0, "big/train.bin", KEY, None, 8 * MiB)
    sent = list(syncsplit.sealed_piece(tmp_path, split, pieces[0], KEY, pack_frame))
    assert sent[0][0][:1] == b"S" and sum(n for _, n in sent) == pieces[0].nbytes
    with open(path, "ab") as fh:
        fh.write(b"more")
    with pytest.raises(IntegrityError, match="changed while it was sent"):
        list(syncsplit.sealed_piece(tmp_path, split, pieces[1], KEY, pack_frame))
    with pytest.raises(IntegrityError, match="changed while it was sent"):
        syncsplit.whole_digest(tmp_path, split)


def pack_frame(kind: str, index: int, length: int) -> bytes:
    return kind.encode() + index.to_bytes(4, "big") + length.to_bytes(8, "big")


def _replayed(path: Path, header: bytes, pieces: list) -> dict:
    """What a host that is not to be trusted can answer: a header it saw for this path
    earlier (it authenticates: the laptop made it), with the size and mtime the hello
    just told it, so the laptop's own size/mtime comparison passes."""
    st = path.stat()
    return {
        "split": True,
        "header": header.hex(),
        "pieces": pieces,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }


def test_a_header_replayed_for_a_changed_file_is_never_continued(tmp_path):
    """A host that kept the header of an earlier version of this path (any stored
    ``.rmenc`` starts with one) answers it as a split it holds, with no piece or with
    pieces whose plaintext did not change: continuing would seal the new bytes under
    the old nonces (AES-GCM's two-time pad, and its authentication key falls out).
    Before: ``plan`` took the header whenever the size and mtime the host said matched."""
    path = _file(tmp_path, 33 * MiB)
    old, _ = syncsplit.plan(tmp_path, 0, "big/train.bin", KEY, None, 8 * MiB)
    head = path.read_bytes()[:DEFAULT_CHUNK]
    with open(path, "r+b") as fh:  # a new version: same size, other bytes after chunk 0
        fh.seek(40 * DEFAULT_CHUNK)
        fh.write(os.urandom(DEFAULT_CHUNK))
    os.utime(path, ns=(path.stat().st_atime_ns, old.mtime_ns + 10**9))
    for pieces in ([], [[0, 1, hashlib.sha256(head).hexdigest()]]):
        split, planned = syncsplit.plan(
            tmp_path,
            0,
            "big/train.bin",
            KEY,
            PartialTransfer.from_json(_replayed(path, old.header, pieces)),
            8 * MiB,
        )
        assert split.header != old.header and split.kept == 0
        assert _tiles(planned, chunk_count(33 * MiB, DEFAULT_CHUNK))
    # a header made for this very version is still continued (the resume promise)
    same, _ = syncsplit.plan(tmp_path, 0, "big/train.bin", KEY, None, 8 * MiB)
    kept = syncsplit.plan(
        tmp_path,
        0,
        "big/train.bin",
        KEY,
        PartialTransfer.from_json(_replayed(path, same.header, [])),
    )
    assert kept[0].header == same.header


def test_a_file_edited_with_its_mtime_put_back_is_never_continued(tmp_path):
    """The chunks after the kept pieces may have reached the host before the cut (a
    piece is noted only once whole). An edit there with the size and mtime put back
    (``cp -p``, ``rsync -t``, ``touch -d`` onto the same file) is not caught by the
    kept pieces' hashes: continuing would seal the new bytes under the nonces of the
    old ones. The inode's ctime moves with any write or utime, and nothing can set it
    back. Before: continued under the same header."""
    path = _file(tmp_path, 20 * MiB)
    first, _ = syncsplit.plan(tmp_path, 0, "big/train.bin", KEY, None, 8 * MiB)
    partial = _host_partial(path, first, [(0, 32)])
    st = path.stat()
    time.sleep(0.02)  # (a later clock tick than the file's creation)
    with open(path, "r+b") as fh:
        fh.seek(40 * DEFAULT_CHUNK)  # past the kept piece
        fh.write(os.urandom(64))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    again, pieces = syncsplit.plan(
        tmp_path, 0, "big/train.bin", KEY, PartialTransfer.from_json(partial), 8 * MiB
    )
    assert again.header != first.header and again.kept == 0 and _tiles(pieces, 80)


def test_pieces_the_host_lists_in_another_shape_start_afresh(tmp_path):
    """The start answer is the host's word: pieces that are not [first, count, sha256]
    lists start the file afresh instead of ending the sync with an internal error
    (ValueError, TypeError, IndexError out of the planning thread). Before: raised."""
    path = _file(tmp_path, 20 * MiB)
    first, _ = syncsplit.plan(tmp_path, 0, "big/train.bin", KEY, None, 8 * MiB)
    partial = _host_partial(path, first, [(0, 32)])
    for bad in (5, "0,32", [["x", 1, "00"]], [[0]], [{"first": 0}], [None]):
        fresh, pieces = syncsplit.plan(
            tmp_path, 0, "big/train.bin", KEY, PartialTransfer.from_json(dict(partial, pieces=bad))
        )
        assert fresh.header != first.header and fresh.kept == 0 and _tiles(pieces, 80)


def test_a_piece_of_a_file_edited_with_its_mtime_put_back_since_planning_is_refused(tmp_path):
    """The split was planned (its header bound to this version) and the kept pieces
    checked; then the file is edited with its size and mtime put back before a piece
    goes. The piece would seal the new bytes under nonces a cut attempt may already
    have used for the old ones (the first pieces of a continued split are the ones in
    flight at the cut). Before: sealed (only size and mtime were compared)."""
    path = _file(tmp_path, 33 * MiB)
    split, pieces = syncsplit.plan(tmp_path, 0, "big/train.bin", KEY, None, 8 * MiB)
    st = path.stat()
    time.sleep(0.02)  # (a later clock tick than the file's creation)
    with open(path, "r+b") as fh:
        fh.seek(pieces[1].first * DEFAULT_CHUNK)
        fh.write(os.urandom(64))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(IntegrityError, match="changed while it was sent"):
        next(syncsplit.sealed_piece(tmp_path, split, pieces[1], KEY, pack_frame))


def test_a_chunk_sealed_again_with_other_bytes_is_never_sent(tmp_path):
    """A continued split seals again, under the same nonces, the pieces that were in
    flight when the earlier attempt was cut. The file's stat is checked as each piece
    starts, but a writer at work on the file changes bytes between two reads: the
    chunk sealed again must be the chunk sealed before (same key, nonce and plaintext
    give the same GCM tag). Before: the new bytes went out under the old nonce, and
    the change was seen only once the piece was all sent."""
    path = _file(tmp_path, 33 * MiB)
    split, pieces = syncsplit.plan(tmp_path, 0, "big/train.bin", KEY, None, 8 * MiB)
    log = syncsplit.SealLog()
    piece = pieces[1]
    first_time = [
        b for b, _ in syncsplit.sealed_piece(tmp_path, split, piece, KEY, pack_frame, log)
    ]
    again = syncsplit.sealed_piece(tmp_path, split, piece, KEY, pack_frame, log)
    sent = [next(again)[0] for _ in range(3)]  # the S frame, chunks first and first + 1
    assert sent == first_time[:3]
    with open(path, "r+b") as fh:  # a writer changes chunk first + 4 meanwhile
        fh.seek((piece.first + 4) * DEFAULT_CHUNK + 100)
        fh.write(os.urandom(64))
    with pytest.raises(IntegrityError, match="changed while it was sent"):
        for sealed, _ in again:
            sent.append(sealed)
    assert sent == first_time[: len(sent)]  # nothing under a used nonce with other bytes
    assert len(sent) == 5


def test_a_resumed_single_stream_never_sends_a_chunk_sealed_again_with_other_bytes(tmp_path):
    """The same for a file sent whole on one stream and continued after its verified
    prefix: the chunks after the prefix may have gone before the cut. Before: sent."""
    from remotemac.engine.syncpieces import FileDone, pack_frame, read_pieces
    from remotemac.engine.syncplan import Job, stat_all

    path = _file(tmp_path, 4 * MiB)
    files = stat_all(tmp_path, ["big/train.bin"], None)
    log = syncsplit.SealLog()
    import collections

    first_time = [
        item[0]
        for item in read_pieces(
            tmp_path, files, collections.deque([Job(0, None, None)]), KEY, log=log
        )
        if not isinstance(item, FileDone)
    ]
    header, chunks = first_time[1], 2  # (after the F frame) the host verified two chunks
    st = path.stat()
    partial = {
        "partial": "x",
        "chunks": chunks,
        "offset": chunks * DEFAULT_CHUNK,
        "prefix_sha256": hashlib.sha256(path.read_bytes()[: chunks * DEFAULT_CHUNK]).hexdigest(),
        "header": header.hex(),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }
    again = read_pieces(
        tmp_path,
        files,
        collections.deque([Job(0, None, PartialTransfer.from_json(partial))]),
        KEY,
        log=log,
    )
    sent = [next(again)[0] for _ in range(3)]  # the R frame, chunks 2 and 3
    assert sent[1:] == first_time[2 + chunks : 4 + chunks]
    with open(path, "r+b") as fh:
        fh.seek(6 * DEFAULT_CHUNK + 5)
        fh.write(os.urandom(64))
    with pytest.raises(IntegrityError, match="changed while it was sent"):
        for item in again:
            sent.append(item[0])
    assert sent[1:] == first_time[2 + chunks : 2 + chunks + len(sent) - 1]
    assert pack_frame("R", 0, 0)[:1] == sent[0][:1]


@pytest.mark.parametrize("change", ["grows", "rewritten", "touched"])
def test_a_small_file_changed_while_it_is_read_sends_nothing(tmp_path, monkeypatch, change):
    """A small file goes as one piece only once it is known unchanged after its read
    (engine/syncpieces.py): the host records the laptop's SHA-256 of a file received
    whole without hashing it again, so a file torn by a writer must never leave. The
    writer here acts between the read and the check, as a training job appending to a
    log in the dataset would."""
    import collections

    from remotemac.engine import syncpieces
    from remotemac.engine.syncplan import Job, stat_all

    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / "labels.csv"
    path.write_bytes(b"a,b\n" * 250)
    files = stat_all(tmp_path, ["d/labels.csv"], None)
    real_read = syncpieces.HashingReader.read

    def read_then_write(self, n):
        data = real_read(self, n)
        if data:
            st = os.stat(path)
            if change == "grows":
                with open(path, "ab") as fh:
                    fh.write(b"c,d\n")
            elif change == "rewritten":  # same size, other bytes, a later mtime
                path.write_bytes(b"x,y\n" * 250)
                os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
            else:  # the bytes as they were, only the times
                os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        return data

    monkeypatch.setattr(syncpieces.HashingReader, "read", read_then_write)
    sent = []
    with pytest.raises(IntegrityError, match="changed while it was sent"):
        for item in syncpieces.read_pieces(
            tmp_path, files, collections.deque([Job(0, None, None)]), KEY
        ):
            sent.append(item)
    assert sent == []


def test_batches_of_small_files_count_every_byte_and_stay_near_their_limit(tmp_path):
    """next_batch over small files sent as one piece each: the batches together carry
    the whole stream and every file's plaintext (progress and resume accounting read
    ``plain``), each stays within one small file of its limit, and a file's FileDone
    comes in the batch that carries its last byte or the next."""
    import collections

    from remotemac.agent.streamcrypt import ciphertext_size
    from remotemac.engine import syncpieces
    from remotemac.engine.syncplan import Job, stat_all

    sizes = [0, 1, 1000, DEFAULT_CHUNK - 1, DEFAULT_CHUNK] + [4096 + 17 * i for i in range(60)]
    (tmp_path / "d").mkdir()
    for i, size in enumerate(sizes):
        (tmp_path / "d" / f"f{i:03d}.bin").write_bytes(os.urandom(size))
    files = stat_all(tmp_path, [f"d/f{i:03d}.bin" for i in range(len(sizes))], None)
    pieces = syncpieces.read_pieces(
        tmp_path, files, collections.deque(Job(i, None, None) for i in range(len(files))), KEY
    )
    limit = 64 << 10
    batches = []
    while (batch := syncpieces.next_batch(pieces, limit)).data or batch.done:
        batches.append(batch)
    # frame 13 bytes, the ciphertext (header and sealed chunks), SHA-256 32 bytes per file
    want = sum(13 + ciphertext_size(size, DEFAULT_CHUNK) + 32 for size in sizes)
    assert sum(len(b.data) for b in batches) == want
    assert sum(b.plain for b in batches) == sum(sizes)
    assert [d.index for b in batches for d in b.done] == list(range(len(sizes)))
    biggest = 13 + ciphertext_size(DEFAULT_CHUNK, DEFAULT_CHUNK) + 32
    assert all(len(b.data) < limit + biggest for b in batches)


def test_small_files_leave_nothing_in_the_seal_log_and_a_large_one_its_tags(tmp_path):
    """The seal log guards chunks sealed again under one nonce (a continued transfer);
    a small file is never continued, so its entry would only grow the laptop's memory
    with the file count (~240 bytes a file). A large file sent whole keeps its tags."""
    import collections

    from remotemac.engine import syncpieces
    from remotemac.engine.syncplan import Job, stat_all

    (tmp_path / "d").mkdir()
    names = [f"d/s{i:03d}.bin" for i in range(50)] + ["d/big.bin"]
    for name in names[:-1]:
        (tmp_path / name).write_bytes(os.urandom(3000))
    (tmp_path / "d" / "big.bin").write_bytes(os.urandom(3 * DEFAULT_CHUNK + 5))
    files = stat_all(tmp_path, names, None)
    log = syncsplit.SealLog()
    work = collections.deque(Job(i, None, None) for i in range(len(files)))
    list(syncpieces.read_pieces(tmp_path, files, work, KEY, log=log))
    assert [len(tags) for tags in log._tags.values()] == [4 * 16]
