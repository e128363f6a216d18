"""Resume inside a file and the choice of parallel streams: the pieces, without a host.

The end-to-end promises (a cut 1/2-way resumes, stale partials go, several streams
keep the host's record whole) are in tests/test_sync_sshd.py, over the real sshd.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

from remotemac.agent import datarecords
from remotemac.agent import streamcrypt as sc
from remotemac.engine.sync import MAX_STREAMS, SMALL_FILE_STREAMS, choose_streams
from remotemac.engine.syncplan import LINK_STREAMS, SPARE_STREAMS, streams_per_link

CS = sc.MIN_CHUNK
KEY = os.urandom(32)


def _sealed(plain: bytes, path: str = "train.bin") -> bytes:
    out = io.BytesIO()
    sc.encrypt_stream(KEY, path, io.BytesIO(plain), out, CS)
    return out.getvalue()


def test_verified_prefix_stops_before_a_torn_or_damaged_chunk():
    plain = os.urandom(10 * CS + 123)
    blob = _sealed(plain)
    whole = (CS + sc.TAG_LEN) * 10
    # cut inside chunk 6: chunks 0..5 verify, their plaintext comes out
    out = io.BytesIO()
    header, n = sc.verified_prefix(
        KEY, "train.bin", io.BytesIO(blob[: sc.HEADER_LEN + 6 * (CS + sc.TAG_LEN) + 99]), out
    )
    assert n == 6 and header == blob[: sc.HEADER_LEN] and out.getvalue() == plain[: 6 * CS]
    # a bit flipped in chunk 3: only 0..2 count, whatever follows
    bad = bytearray(blob)
    bad[sc.HEADER_LEN + 3 * (CS + sc.TAG_LEN) + 7] ^= 1
    assert sc.verified_prefix(KEY, "train.bin", io.BytesIO(bytes(bad)), io.BytesIO())[1] == 3
    # the whole file: the final chunk (flag 1) never counts, so one is always left to send
    assert (
        sc.verified_prefix(
            KEY, "train.bin", io.BytesIO(blob[: sc.HEADER_LEN + whole]), io.BytesIO()
        )[1]
        == 10
    )
    assert sc.verified_prefix(KEY, "train.bin", io.BytesIO(blob), io.BytesIO())[1] == 10
    # another key or path: nothing is ours
    assert sc.verified_prefix(os.urandom(32), "train.bin", io.BytesIO(blob), io.BytesIO()) == (
        b"",
        0,
    )
    assert sc.verified_prefix(KEY, "other.bin", io.BytesIO(blob), io.BytesIO()) == (b"", 0)


def test_resumed_tail_decrypts_after_the_kept_prefix():
    """The kept prefix + a tail sealed later from chunk k decrypts to the file, and a
    tail sealed under a foreign header is refused before any chunk is made."""
    plain = os.urandom(7 * CS + 5)
    blob = _sealed(plain)
    header, k = blob[: sc.HEADER_LEN], 4
    src = io.BytesIO(plain)
    src.seek(k * CS)
    tail = b"".join(sc.iter_encrypt(KEY, "train.bin", src, CS, resume=(header, k)))
    prefix = blob[: sc.HEADER_LEN + k * (CS + sc.TAG_LEN)]
    assert prefix + tail == blob  # same key, nonces and plaintext: the very same bytes
    out = io.BytesIO()
    sc.decrypt_stream(KEY, "train.bin", io.BytesIO(tail), out, limit=len(tail), resume=(header, k))
    assert (
        hashlib.sha256(plain[: k * CS] + out.getvalue()).digest() == hashlib.sha256(plain).digest()
    )
    try:
        next(sc.iter_encrypt(os.urandom(32), "train.bin", io.BytesIO(b"x"), CS, resume=(header, k)))
    except sc.DecryptError:
        pass
    else:
        raise AssertionError("a header sealed under another key was accepted")


def test_streams_follow_the_round_trip():
    many = 1 << 30
    big = 200  # files of ~5 MiB
    assert choose_streams(0.0002, many, big) == 1  # loopback, large files: one stream
    assert choose_streams(0.005, many, big) == 1
    # the bandwidth-delay product over the 1 MiB a channel carries per round trip
    assert choose_streams(0.04, many, big) == 5  # 125 MB/s x 40 ms / 1 MiB = 4.8
    assert choose_streams(0.08, many, big) == 10  # 9.5: more than one connection's 6
    assert choose_streams(0.15, many, big) == MAX_STREAMS == 14  # 17.9, capped
    assert choose_streams(0.15, many, big, target_rate=50e6) == 8  # a slower link: 7.2
    assert choose_streams(0.08, many, 2) == 2  # never more streams than files
    assert choose_streams(0.08, 10 << 20, 5000) == 1  # too little data to open channels


def test_many_small_files_get_several_receivers_even_on_a_near_link():
    """Each receiver creates and decrypts its own files: 1 GiB in 16-256 KiB files is
    spread over SMALL_FILE_STREAMS on loopback; the far link's own count still wins, up
    to one connection's LINK_STREAMS."""
    many = 1 << 30
    assert choose_streams(0.0002, many, 7681) == SMALL_FILE_STREAMS
    # far, small files: one connection's streams (the host's per-file work holds them)
    assert choose_streams(0.08, many, 7681) == LINK_STREAMS
    assert choose_streams(0.0002, 12 << 20, 200) == 1  # 8 MiB per stream at least


def _session(src: str, entries: list[dict], frames: bytes) -> dict:
    """One in-process dataops sync session on public data: hello, ``frames``, finish."""
    from remotemac.agent import dataops

    hello = {"run_dir": src, "run_id": "t", "src": src, "encrypted": False, "entries": entries}
    manifest = json.dumps([{k: e[k] for k in ("path", "size", "sha256")} for e in entries])
    stdin = io.BytesIO(
        json.dumps(hello).encode()
        + b"\n"
        + frames
        + dataops.FRAME.pack(b"E", 0, len(manifest))
        + manifest.encode()
    )
    out = io.BytesIO()
    assert dataops.serve(stdin, out) == 0
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    return {"hello": lines[0], "final": lines[-1]}


def test_resync_of_unchanged_files_is_one_lstat_each_and_no_record_rewrite(tmp_path, monkeypatch):
    """A re-sync of an unchanged slice costs the host one lstat per file (its stored
    copy, seen when it says what it holds; finish trusts that sighting), parses the
    record once and leaves it as it is (no compaction of an unchanged record)."""
    from remotemac.agent import dataops

    src = str(tmp_path / "data")
    blobs = {f"d{i % 3}/f{i:03d}.bin": os.urandom(100 + i) for i in range(60)}
    entries = [
        {"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest(), "mtime_ns": 1}
        for p, b in sorted(blobs.items())
    ]
    frames = b"".join(
        dataops.FRAME.pack(b"F", i, e["size"]) + blobs[e["path"]] + bytes.fromhex(e["sha256"])
        for i, e in enumerate(entries)
    )
    first = _session(src, entries, frames)
    assert first["final"]["result"]["received"] == len(entries)
    record = os.path.join(src, datarecords.RECORD)
    before = os.stat(record)
    calls = []
    real_lstat = os.lstat
    monkeypatch.setattr(dataops.os, "lstat", lambda p: calls.append(p) or real_lstat(p))
    again = _session(src, entries, b"")
    assert again["hello"]["todo"] == []  # every file held as the hello says
    result = again["final"]["result"]
    assert result["mismatches"] == [] and result["received"] == 0
    per_file = [p for p in calls if p.endswith(".bin")]
    assert len(per_file) <= len(entries), f"{len(per_file)} lstats for {len(entries)} files"
    after = os.stat(record)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_file_whose_ack_a_cut_lost_counts_as_verified_once_from_the_next_hello():
    """The host sends its acks in batches: a cut can lose the last line. The next
    attempt's start answer leaves those files out of its ``todo`` (held as the hello
    says); each is then reported verified once (one event), and one already
    acknowledged, or still in the todo (not held by the host), is not."""
    from remotemac.engine.syncpieces import FileDone
    from remotemac.engine.syncplan import LocalFile, SyncStats
    from remotemac.engine.synctalk import Session
    from remotemac.events import PhaseProgress

    files = [LocalFile(f"f{i}", 10, 0, i, None) for i in range(5)]
    events: list = []
    args = (None, None, Path("."), files, "run", "r1", None, "python3", events.append)
    session = Session(*args, SyncStats(), 1 << 20)  # type: ignore[arg-type]
    for i in range(5):
        session._file_done(FileDone(i, files[i], sent=True))
    session._verified(0)  # acknowledged before the cut
    session._verified(1)
    session._learn_held({4})  # 4: the cut one, not held
    assert session.stats.acked == ["f0", "f1", "f2", "f3"]
    verified = [e.detail for e in events if isinstance(e, PhaseProgress)]
    assert verified == ["f0", "f1", "f2", "f3"]
    session._learn_held(set())  # a later attempt
    assert session.stats.acked == ["f0", "f1", "f2", "f3"]


def test_a_header_replayed_for_a_changed_file_is_never_resumed(tmp_path):
    """The single-stream resume: a host that kept an earlier version's ciphertext of this
    path knows its plaintext; it answers that header as a cut transfer whose verified
    prefix is a chunk the new version did not change, with the size and mtime the hello
    told it. Resuming would seal the changed tail under the old nonces. Before: resumed."""
    from remotemac.engine.syncpieces import HashingReader, resume_point
    from remotemac.engine.syncplan import Job, PartialTransfer

    path = tmp_path / "train.bin"
    plain = os.urandom(8 * sc.DEFAULT_CHUNK)
    path.write_bytes(plain)
    with open(path, "rb") as fh:  # the earlier version, sent whole: its header is stored
        old_header = next(sc.iter_encrypt(KEY, "train.bin", fh))
    with open(path, "r+b") as fh:
        fh.seek(5 * sc.DEFAULT_CHUNK)
        fh.write(os.urandom(100))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    st = path.stat()
    partial = {
        "partial": "x",
        "chunks": 1,
        "offset": sc.DEFAULT_CHUNK,
        "prefix_sha256": hashlib.sha256(plain[: sc.DEFAULT_CHUNK]).hexdigest(),
        "header": old_header.hex(),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }
    with open(path, "rb") as fh:
        reader = HashingReader(fh, st.st_size, "train.bin")
        got = resume_point(
            Job(0, None, PartialTransfer.from_json(partial)),
            reader,
            os.fstat(fh.fileno()),
            KEY,
            "train.bin",
        )
    assert got is None


def test_streams_past_one_connection_go_on_a_second():
    """One connection gives the sync LINK_STREAMS channels (its 8 exec channels minus the
    agent's and a spare); the rest go on a second connection, up to its SPARE_STREAMS."""
    assert (LINK_STREAMS, SPARE_STREAMS) == (6, 8)
    assert streams_per_link(1) == (1, 0)
    assert streams_per_link(6) == (6, 0)
    assert streams_per_link(10) == (6, 4)
    assert streams_per_link(MAX_STREAMS) == (6, 8)
