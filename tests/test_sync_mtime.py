"""(size, mtime) on a file system with whole-second times (HFS+), in process.

Why: HFS+ (the RAM disk remotemac formats) keeps whole-second mtimes. A same-size
rewrite of a file within the second it was recorded in leaves its (size, mtime) as
recorded, so a re-sync took the rewritten copy as the verified one and the job read
bytes the laptop never sent (issue 28 item 7). Git calls such an entry "racily
clean". Here ``os.lstat``/``os.utime`` are wrapped to truncate times to whole seconds
(as tests/harness/macfs.py does over FUSE); the files, hashing and encryption are real.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from remotemac.agent import datarecords
from tests.test_dataops_behind import _hello, _run, _slice, _stream
from tests.test_dataops_behind import dataops as dataops  # noqa: F401 (the fixture)
from tests.test_sync_resume import _session

SECOND = 10**9


class _WholeSeconds:
    """A stat result whose times are whole seconds (HFS+ dates)."""

    def __init__(self, st: os.stat_result) -> None:
        self._st = st

    def __getattr__(self, name: str):
        value = getattr(self._st, name)
        if name in ("st_mtime_ns", "st_atime_ns", "st_ctime_ns"):
            return value // SECOND * SECOND
        if name in ("st_mtime", "st_atime", "st_ctime"):
            return float(int(value))
        return value


@pytest.fixture
def hfs(monkeypatch):
    """os.lstat and os.utime as on HFS+: whole-second times."""
    real_lstat, real_utime = os.lstat, os.utime

    def lstat(path, *a, **k):
        return _WholeSeconds(real_lstat(path, *a, **k))

    def utime(path, times=None, *, ns=None, **k):
        if ns is not None:
            ns = tuple(t // SECOND * SECOND for t in ns)
            return real_utime(path, ns=ns, **k)
        return real_utime(path, times, **k)

    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setattr(os, "utime", utime)


def _in_one_second(step, tries: int = 5):
    """Run ``step`` starting just after a second boundary; retry if it crossed one
    (a loaded machine), so "within the same second" really holds."""
    for _ in range(tries):
        if time.time() % 1.0 > 0.6:  # too near the next second: start after it
            time.sleep(1.0 - time.time() % 1.0 + 0.005)
        second = int(time.time())
        out = step()
        if int(time.time()) == second:
            return out
    pytest.skip("could not do the write and the rewrite within one second")


def _rewrite(path: Path) -> None:
    """Same size, other bytes, in place (a workload editing its input)."""
    data = path.read_bytes()
    with open(path, "r+b") as fh:
        fh.write(bytes(b ^ 0xFF for b in data[:16]))


def test_a_same_second_rewrite_of_a_public_file_is_not_taken_as_unchanged(hfs, tmp_path):
    src = str(tmp_path / "data")
    blobs = {f"f{i}.bin": os.urandom(100 + i) for i in range(3)}
    entries = [
        {"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest(), "mtime_ns": 1}
        for p, b in sorted(blobs.items())
    ]
    from remotemac.agent import dataops

    frames = b"".join(
        dataops.FRAME.pack(b"F", i, e["size"]) + blobs[e["path"]] + bytes.fromhex(e["sha256"])
        for i, e in enumerate(entries)
    )

    def write_then_rewrite() -> None:
        first = _session(src, entries, frames)
        assert first["final"]["result"]["received"] == len(entries)
        _rewrite(Path(src) / "f1.bin")

    _in_one_second(write_then_rewrite)
    again = _session(src, entries, b"")
    assert [index for index, _ in again["hello"]["todo"]] == [1]
    assert again["final"]["result"]["mismatches"] == [
        {"path": "f1.bin", "why": "missing on the host"}
    ]
    # untouched files are still trusted by (size, mtime): nothing re-hashed, nothing resent
    third = _session(src, entries[:1], b"")
    assert third["hello"]["todo"] == []


def _resync(root: Path, key: bytes, paths: list[str]) -> bytes:
    """A re-sync's hello (every file as the laptop holds it) and its E frame, no files."""
    from remotemac.agent.dataops import FRAME

    entries = []
    for rel in paths:
        data = (root / rel).read_bytes()
        st = (root / rel).stat()
        entries.append(
            {
                "path": rel,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "mtime_ns": st.st_mtime_ns,
            }
        )
    final = json.dumps({"changed": []}).encode()
    hello = json.dumps(_hello(root, key, entries)).encode() + b"\n"
    return hello + FRAME.pack(b"E", 0, len(final)) + final


def test_a_same_second_rewrite_of_a_ram_copy_is_decrypted_again(hfs, dataops, tmp_path):  # noqa: F811
    root = tmp_path / "data"
    paths = _slice(root, {f"s{i}.bin": 1000 + 10 * i for i in range(3)})
    key = os.urandom(32)
    ram = tmp_path / "ram"

    def write_then_rewrite() -> None:
        code, lines = _run(dataops, _stream(root, paths, key))
        assert code == 0, lines[-1]
        _rewrite(ram / "s1.bin")

    _in_one_second(write_then_rewrite)
    code, lines = _run(dataops, _resync(root, key, paths))
    assert code == 0, lines[-1]
    result = lines[-1]["result"]
    assert result["mismatches"] == [] and result["redecrypted"] == 1
    for rel in paths:
        assert (ram / rel).read_bytes() == (root / rel).read_bytes()
    # and once settled, a re-sync trusts every copy by (size, mtime) again
    code, lines = _run(dataops, _resync(root, key, paths))
    assert code == 0 and lines[-1]["result"]["redecrypted"] == 0
    assert datarecords.load_records(str(tmp_path / "run" / "data"))


def _drop_recorded(src: str) -> None:
    """Rewrite the record as an agent before ``recorded_ns`` wrote it."""
    path = os.path.join(src, datarecords.RECORD)
    lines = [json.loads(x) for x in Path(path).read_text().splitlines()]
    for rec in lines:
        rec.pop("recorded_ns", None)
    with open(path, "w") as fh:
        fh.writelines(json.dumps(rec, sort_keys=True) + "\n" for rec in lines)


def test_a_record_of_an_older_agent_is_hashed_once_then_trusted(tmp_path):
    """Records written before ``recorded_ns`` still read: their copies are hashed once
    (held, nothing resent), the record is rewritten settled, and the next re-sync
    trusts (size, mtime) again."""
    src = str(tmp_path / "data")
    blobs = {f"f{i}.bin": os.urandom(200 + i) for i in range(4)}
    entries = [
        {"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest(), "mtime_ns": 1}
        for p, b in sorted(blobs.items())
    ]
    from remotemac.agent import dataops

    frames = b"".join(
        dataops.FRAME.pack(b"F", i, e["size"]) + blobs[e["path"]] + bytes.fromhex(e["sha256"])
        for i, e in enumerate(entries)
    )
    assert _session(src, entries, frames)["final"]["result"]["received"] == len(entries)
    records = datarecords.load_records(src)
    assert all(datarecords.settled(r, "mtime_ns") for r in records.values())
    _drop_recorded(src)
    again = _session(src, entries, b"")
    assert again["hello"]["todo"] == [] and again["final"]["result"]["mismatches"] == []
    records = datarecords.load_records(src)
    assert all(datarecords.settled(r, "mtime_ns") for r in records.values()), records


def test_an_older_agents_ram_record_is_hashed_not_decrypted_again(dataops, tmp_path):  # noqa: F811
    root = tmp_path / "data"
    paths = _slice(root, {f"s{i}.bin": 2000 + i for i in range(3)})
    key = os.urandom(32)
    code, lines = _run(dataops, _stream(root, paths, key))
    assert code == 0, lines[-1]
    src = str(tmp_path / "run" / "data")
    _drop_recorded(src)
    code, lines = _run(dataops, _resync(root, key, paths))
    assert code == 0, lines[-1]
    result = lines[-1]["result"]
    assert result["mismatches"] == [] and result["redecrypted"] == 0
    records = datarecords.load_records(src)
    assert all(datarecords.settled(r, "plain_mtime_ns") for r in records.values()), records
