"""What the host checks before the job sees a file (docs/contract.md, "Promises"), in process.

A file received whole in one encrypted stream is checked by its authenticated
decryption of the bytes the laptop hashed; a resumed transfer (its kept prefix comes
from the host's disk) is hashed again on the host and compared with the laptop's
SHA-256. The laptop's own framing (engine/syncpieces.py) makes the streams; the agent
runtime's activation and the RAM store are faked as in tests/test_dataops_behind.py,
the encryption, hashing and files are real.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from remotemac.agent import datafiles, datarecords, receiver
from remotemac.agent import streamcrypt as sc
from tests import test_dataops_behind as behind
from tests.test_dataops_behind import _hello, _run, _slice, _stream

dataops = behind.dataops  # the fixture: the receiver module, runtime and RAM store faked

#: a file that streams (and is kept when cut): RESUMABLE and a few chunks more
BIG = datarecords.RESUMABLE + 5 * sc.DEFAULT_CHUNK + 1234


class _Counting:
    """A stand-in for the receiver modules' ``hashlib``: counts the bytes fed to SHA-256."""

    def __init__(self) -> None:
        self.fed = 0
        outer = self

        class _Sha:
            def __init__(self, data: bytes = b"") -> None:
                self._h = hashlib.sha256()
                self.update(data)

            def update(self, data: bytes) -> None:
                outer.fed += len(data)
                self._h.update(data)

            def hexdigest(self) -> str:
                return self._h.hexdigest()

            def digest(self) -> bytes:
                return self._h.digest()

        self.sha256 = _Sha


@pytest.fixture
def counted(monkeypatch):
    """Bytes the receiver and its sinks feed to SHA-256 (datapartial, which hashes only
    a path to name a kept transfer, hashes its prefix through a datafiles sink)."""
    fake = _Counting()
    for module in (receiver, datafiles):
        monkeypatch.setattr(module, "hashlib", fake, raising=False)
    return fake


def _cut_transfer(dataops, root: Path, key: bytes) -> tuple[str, int, bytes]:
    """Session 1 sends ``big.bin`` and is cut inside it: the host keeps its ciphertext.
    (the kept transfer's name, its whole chunks that authenticate, its header)."""
    stream = _stream(root, ["big.bin"], key)
    hello_end = stream.index(b"\n") + 1
    code, _ = _run(dataops, stream[: hello_end + 13 + sc.HEADER_LEN + 4 * sc.DEFAULT_CHUNK])
    assert code == 3  # cut
    kept = root.parent / "run" / "data" / datarecords.PARTIAL
    (note,) = kept.glob("*.json")
    with open(note.with_suffix(".rmenc"), "rb") as fh:
        header, chunks = sc.verified_prefix(key, "big.bin", fh, io.BytesIO())
    assert chunks >= 3
    return note.stem, chunks, header


def _resume_stream(
    root: Path, key: bytes, name: str, chunks: int, header: bytes, prefix_sha256: str
) -> bytes:
    """Session 2: hello + an R frame continuing ``name`` after ``chunks`` (the tail sealed
    from the laptop's file) + the laptop's SHA-256 of the whole file + the E frame."""
    from remotemac.engine.syncpieces import pack_frame

    plain = (root / "big.bin").read_bytes()
    st = os.stat(root / "big.bin")
    entry = {"path": "big.bin", "size": st.st_size, "sha256": None, "mtime_ns": st.st_mtime_ns}
    src = io.BytesIO(plain)
    src.seek(chunks * sc.DEFAULT_CHUNK)
    tail = b"".join(sc.iter_encrypt(key, "big.bin", src, resume=(header, chunks)))
    meta = json.dumps({"partial": name, "chunks": chunks, "prefix_sha256": prefix_sha256}).encode()
    sha = hashlib.sha256(plain).hexdigest()
    final = json.dumps({"changed": [[0, len(plain), sha]]}).encode()
    return b"".join(
        [
            json.dumps(_hello(root, key, [entry])).encode() + b"\n",
            pack_frame("R", 0, len(tail)) + len(meta).to_bytes(4, "big") + meta,
            tail,
            bytes.fromhex(sha),
            pack_frame("E", 0, len(final)) + final,
        ]
    )


def _prefix_sha(key: bytes, kept: Path, chunks: int) -> str:
    with open(kept, "rb") as fh:
        out = io.BytesIO()
        assert sc.verified_prefix(key, "big.bin", fh, out, chunks)[1] == chunks
    return hashlib.sha256(out.getvalue()).hexdigest()


def test_whole_files_are_not_hashed_again_on_the_host_and_a_resumed_one_is(
    dataops, tmp_path, counted
):
    """Bytes fed to SHA-256 by the receiver: none for a small file or a large streamed
    one received whole (each checked by its decryption), at least the whole file for a
    resumed one (its kept prefix and its tail). Re-adding the hash where it is not
    needed, or dropping it where it is promised, fails this."""
    root = tmp_path / "data"
    key = os.urandom(32)
    _slice(root, {"small.bin": 300_000, "whole.bin": BIG})
    code, lines = _run(dataops, _stream(root, ["small.bin", "whole.bin"], key))
    assert code == 0 and lines[-1]["result"]["received"] == 2, lines[-1]
    assert lines[-1]["result"]["mismatches"] == []
    assert counted.fed == 0
    ram = tmp_path / "ram"
    for rel in ("small.bin", "whole.bin"):
        assert (ram / rel).read_bytes() == (root / rel).read_bytes()

    _slice(root, {"big.bin": BIG})
    name, chunks, header = _cut_transfer(dataops, root, key)
    kept = root.parent / "run" / "data" / datarecords.PARTIAL / (name + ".rmenc")
    prefix = _prefix_sha(key, kept, chunks)
    counted.fed = 0
    code, lines = _run(dataops, _resume_stream(root, key, name, chunks, header, prefix))
    assert code == 0 and lines[-1]["result"]["received"] == 1, lines[-1]
    assert (ram / "big.bin").read_bytes() == (root / "big.bin").read_bytes()
    assert counted.fed >= BIG  # (the start answer's look at the kept prefix adds more)


def test_a_resumed_transfer_whose_kept_prefix_was_altered_is_refused_by_the_hash(dataops, tmp_path):
    """The AEAD does not cover this: the kept prefix comes from the host's disk, and a
    chunk sealed again under the same header with other bytes (simulated here with the
    key; the laptop's seal log refuses to do it, but the host takes nothing on trust)
    still authenticates. Even when the R frame vouches for that prefix, the host's hash
    of the whole file differs from the laptop's: integrity, nothing recorded, no
    plaintext in RAM."""
    root = tmp_path / "data"
    key = os.urandom(32)
    _slice(root, {"big.bin": BIG})
    name, chunks, header = _cut_transfer(dataops, root, key)
    kept = root.parent / "run" / "data" / datarecords.PARTIAL / (name + ".rmenc")
    other = os.urandom(sc.DEFAULT_CHUNK)
    (resealed,) = sc.seal_chunks(key, "big.bin", header, io.BytesIO(other), BIG, 1, 1)
    with open(kept, "r+b") as fh:
        fh.seek(sc.HEADER_LEN + (sc.DEFAULT_CHUNK + sc.TAG_LEN))
        fh.write(resealed)
    prefix = _prefix_sha(key, kept, chunks)  # what the host's start answer reports now
    code, lines = _run(dataops, _resume_stream(root, key, name, chunks, header, prefix))
    assert code == 1
    assert lines[-1]["code"] == "integrity", lines[-1]
    assert "big.bin" in lines[-1]["error"] and "differs from the laptop's" in lines[-1]["error"]
    assert "big.bin" not in datarecords.load_records(str(root.parent / "run" / "data"))
    ram = tmp_path / "ram"
    assert not (ram / "big.bin").exists()
    assert not [p for p in ram.rglob("*") if p.is_file()]


def _sent(root: Path, rel: str, key: bytes, job) -> tuple[bytes, bytes]:
    """(what the F frame's ciphertext decrypts to, the SHA-256 sent after it) for one
    file as the laptop's framing sends it."""
    from remotemac.engine.syncpieces import FileDone, read_pieces
    from remotemac.engine.syncplan import stat_all

    files = stat_all(root, [rel], None)
    items = [
        item[0]
        for item in read_pieces(root, files, collections.deque([job]), key)
        if not isinstance(item, FileDone)
    ]
    frame, claim = items[0], items[-1]
    assert frame[:1] == b"F" and len(claim) == 32
    out = io.BytesIO()
    sealed = b"".join(items[1:-1])
    sc.decrypt_stream(key, rel, io.BytesIO(sealed), out, limit=len(sealed))
    return out.getvalue(), claim


def test_the_laptops_claim_is_the_digest_of_the_very_bytes_it_sealed(tmp_path):
    """What dropping the host's second hash rests on (engine/syncpieces.py HashingReader):
    for a large file sent whole, and for one whose cut transfer the laptop refused to
    continue after hashing the host's reported prefix (the reader rewinds, the file is
    sealed from its first byte), the SHA-256 sent is that of the plaintext the stream
    decrypts to. A rewind that kept the prefix's digest fails this."""
    from remotemac.engine import syncsplit
    from remotemac.engine.syncplan import Job, PartialTransfer

    root = tmp_path / "data"
    key = os.urandom(32)
    _slice(root, {"big.bin": BIG})
    plain = (root / "big.bin").read_bytes()
    got, claim = _sent(root, "big.bin", key, Job(0, None, None))
    assert got == plain and claim == hashlib.sha256(plain).digest()

    st = os.stat(root / "big.bin")
    header = sc.new_header(key, "big.bin", version=syncsplit.file_version(st))
    partial = PartialTransfer(
        partial="kept",
        chunks=3,
        offset=3 * sc.DEFAULT_CHUNK,
        prefix_sha256=hashlib.sha256(b"not this prefix").hexdigest(),
        header=header.hex(),
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
    )
    got, claim = _sent(root, "big.bin", key, Job(0, None, partial))
    assert got == plain and claim == hashlib.sha256(plain).digest()


@pytest.mark.parametrize("big", [False, True], ids=["small", "streamed"])
def test_a_claim_that_is_not_the_sealed_bytes_digest_fails_the_final_check(dataops, tmp_path, big):
    """Without the host's second hash, a whole file's claim is not compared with its
    bytes on arrival; the final check compares every record with the digest the
    laptop's reader took, so a claim that differs is a mismatch in the host's answer,
    which the laptop turns into exit 5 before any job runs (engine/sync.py
    ``_refuse_mismatches``). The other files stay verified."""
    root = tmp_path / "data"
    sizes = {f"f{i:02d}.bin": 5000 + i for i in range(4)}
    if big:
        sizes["f01.bin"] = BIG
    paths = _slice(root, sizes)
    code, lines = _run(dataops, _stream(root, paths, os.urandom(32), zero_claim=1))
    assert code == 0, lines
    result = lines[-1]["result"]
    assert [m["path"] for m in result["mismatches"]] == ["f01.bin"]
    records = datarecords.load_records(str(tmp_path / "run" / "data"))
    assert {rel: rec["sha256"] for rel, rec in records.items() if rel != "f01.bin"} == {
        rel: hashlib.sha256((root / rel).read_bytes()).hexdigest()
        for rel in sizes
        if rel != "f01.bin"
    }
