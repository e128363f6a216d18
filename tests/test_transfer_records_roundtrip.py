"""What sync and pull say to the host and keep of it reads into named types and writes
back key for key: the sync hello and the receiver's lines, the cut transfers the host
kept, the host's output listing and a side's pull result (the journal's form).

Fast tier (no marker): pure data, no host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from remotemac.engine.pull import entry_name
from remotemac.engine.pulled import ListingEntry, PullBytes, PulledFile, PulledSide, SkippedFile
from remotemac.engine.pullstream import _note
from remotemac.engine.syncplan import LocalFile, PartialTransfer, SyncStats
from remotemac.engine.synctalk import ReceiverLine, Session, SyncHello

SHA = "ab" * 32


def test_a_pull_result_writes_the_keys_it_always_had_and_reads_back() -> None:
    side = PulledSide(
        dir="/out/results/mps",
        files=[PulledFile("a.pt", 3, SHA)],
        skipped=[SkippedFile("'pipe'", "'fifo' not pulled (only regular files are)")],
        downloaded=3,
        bytes=PullBytes(total=3, moved=3, reused=0),
    )
    data = side.to_json()
    assert data == {
        "dir": "/out/results/mps",
        "files": [{"path": "a.pt", "size": 3, "sha256": SHA}],
        "skipped": [{"path": "'pipe'", "why": "'fifo' not pulled (only regular files are)"}],
        "downloaded": 3,
        "bytes": {"total": 3, "moved": 3, "reused": 0},
    }  # pull_dir's result: no evidence key
    assert PulledSide.from_json(json.loads(json.dumps(data))) == side
    side.evidence = ["mps.obs.json"]  # pull_side adds the evidence copied next to the log
    assert side.to_json()["evidence"] == ["mps.obs.json"]
    assert PulledSide.from_json(side.to_json()).to_json() == side.to_json()


@pytest.mark.parametrize(
    "raw",
    [
        {"path": "sub/a.bin", "name_hex": "7375622f612e62696e", "kind": "file", "size": 5},
        {"path": "d", "kind": "dir", "size": 0, "sha256": None},
        {"path": "x", "kind": "file", "size": True, "sha256": "zz", "mode": 420},  # lies kept
    ],
)
def test_a_listing_entry_keeps_what_the_host_sent(raw: dict[str, Any]) -> None:
    entry = ListingEntry.from_json(raw)
    assert entry.to_json() == raw  # nothing checked or coerced here: _refuse judges it
    assert (entry.kind, entry.size) == (raw["kind"], raw["size"])


def test_the_entry_name_is_the_hosts_bytes_else_its_path() -> None:
    assert entry_name(ListingEntry.from_json({"name_hex": "ff00", "path": "x"})) == b"\xff\x00"
    assert entry_name(ListingEntry.from_json({"path": "x"})) == "x"
    assert entry_name(ListingEntry.from_json({"name_hex": "zz"})) is None
    assert entry_name(ListingEntry.from_json({"path": 5})) is None


@pytest.mark.parametrize(
    "raw",
    [
        {  # a file sent whole, cut: agent/datapartial.py's start answer entry
            "partial": "a.bin-1",
            "chunks": 4,
            "offset": 1 << 20,
            "prefix_sha256": SHA,
            "header": "00" * 40,
            "size": 9 << 20,
            "mtime_ns": 17,
        },
        {"split": True, "header": "11" * 40, "pieces": [[0, 32, SHA]], "size": 1, "mtime_ns": 2},
    ],
)
def test_a_cut_transfer_the_host_kept_reads_and_writes_back(raw: dict[str, Any]) -> None:
    partial = PartialTransfer.from_json(raw)
    assert partial.to_json() == raw
    line = ReceiverLine.from_json({"ok": True, "todo": [[3, None]], "partial": [[3, raw]]})
    assert line.partials() == {3: partial} and line.todo == [[3, None]]


def test_an_old_hosts_cut_transfer_without_optional_keys_has_the_old_defaults() -> None:
    partial = PartialTransfer.from_json({"partial": "x"})
    assert (partial.chunks, partial.header, partial.split, partial.size) == (0, "", False, None)


def _session(key: bytes | None) -> Session:
    files = [LocalFile("a.bin", 3, 10, 1, SHA), LocalFile("b/c.txt", 0, 11, 2, None)]
    return Session(
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        Path("/data"),
        files,
        "/r/run-1",
        "run-1",
        key,
        "python3",
        lambda _e: None,
        SyncStats(),
        1 << 26,
        runtime_dir="/r/runtime/k" if key else None,
    )


def test_the_sync_hello_is_the_line_the_receiver_always_read() -> None:
    columns = {
        "path": ["a.bin", "b/c.txt"],
        "size": [3, 0],
        "sha256": [SHA, None],
        "mtime_ns": [10, 11],
    }
    base = {
        "run_dir": "/r/run-1",
        "run_id": "run-1",
        "src": "/r/run-1/data",
        "encrypted": False,
        "ram_bytes": 1 << 26,
        "columns": columns,
    }
    plain = _session(None)._hello()
    assert plain.to_json() == base
    assert plain.to_json(worker=True) == dict(base, worker=True)
    key = bytes(range(32))
    sealed = _session(key)._hello()
    wire = dict(base, encrypted=True, key_hex=key.hex(), runtime_dir="/r/runtime/k")
    assert sealed.to_json() == wire
    assert list(sealed.to_json()) == list(wire)  # the same key order too
    for hello in (plain, sealed):
        assert SyncHello.from_json(json.loads(json.dumps(hello.to_json()))) == hello
    assert key.hex() not in repr(sealed)  # the data key never lands in a log via repr


@pytest.mark.parametrize(
    "raw",
    [
        {"ok": True, "todo": [[0, None]], "partial": []},
        {"ok": True, "ram": {"path": "/Volumes/rm", "kind": "hdiutil"}},
        {"acks": [0, 1]},
        {"piece": [2, 0]},
        {"ok": True, "result": {"received": 2}},
        {"ok": False, "error": "no space left", "code": "no-space"},
    ],
)
def test_a_receiver_line_reads_and_writes_back(raw: dict[str, Any]) -> None:
    line = ReceiverLine.read(json.dumps(raw).encode())
    assert line.to_json() == raw and not line.eof


def test_a_closed_channel_reads_as_the_end_and_not_as_acks() -> None:
    line = ReceiverLine.read(b"")
    assert line.eof and line.acks is None and line.piece is None and not line.ok


def test_a_pull_frames_note_is_its_why_or_error_as_one_printable_line() -> None:
    assert _note(b'{"why": "a fifo"}') == "a fifo"
    assert _note(b'{"error": "gone\\nnow", "code": "x"}') == "gone?now"
    assert _note(b"[1, 2]") == "[1, 2]" and _note(b"\xff") == "\ufffd"
