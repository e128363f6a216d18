"""The host side of a re-sync, in process: what the start answer carries, when finish
walks the data dir for debris, and the stdin pipe. Over the real sshd:
tests/test_sync_sshd.py (a file that left the slice is pruned there too).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from remotemac.agent import dataops, datarecords, receiver
from remotemac.engine.synctalk import RECEIVER_BOOT, receiver_argv
from tests.test_sync_resume import _session
from tests.test_sync_sshd import host_factory, make_slice, runtime_dir  # noqa: F401 (fixtures)


def _slice(n: int = 12) -> tuple[dict[str, bytes], list[dict]]:
    blobs = {f"d{i % 3}/f{i:03d}.bin": os.urandom(100 + i) for i in range(n)}
    entries = [
        {"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest(), "mtime_ns": 1}
        for p, b in sorted(blobs.items())
    ]
    return blobs, entries


def _frames(blobs: dict[str, bytes], entries: list[dict], only=None) -> bytes:
    return b"".join(
        dataops.FRAME.pack(b"F", i, e["size"]) + blobs[e["path"]] + bytes.fromhex(e["sha256"])
        for i, e in enumerate(entries)
        if only is None or i in only
    )


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_start_answer_lists_only_what_the_host_does_not_hold_as_said(tmp_path):
    """A re-sync of thousands of files answers a few lines: only the entries whose
    hash the hello does not match (or does not know), with the host's hash."""
    src = str(tmp_path / "data")
    blobs, entries = _slice()
    _session(src, entries, _frames(blobs, entries))
    changed = [dict(e) for e in entries]
    changed[3]["sha256"] = "0" * 64  # the laptop's file changed
    changed[5]["sha256"] = None  # the laptop does not know (mtime moved): it will hash
    changed[7]["size"] += 1  # another size: the host's copy does not count
    again = _session(src, changed, b"")
    assert again["hello"]["todo"] == [
        [3, entries[3]["sha256"]],
        [5, entries[5]["sha256"]],
        [7, None],
    ]


def test_clean_resync_prunes_by_the_record_without_walking(tmp_path, monkeypatch):
    """No session was cut: finish removes what left the slice by its record, and
    never walks the data dir (thousands of entries on a real slice)."""
    src = str(tmp_path / "data")
    blobs, entries = _slice()
    _session(src, entries, _frames(blobs, entries))
    assert not [n for n in os.listdir(src) if n.startswith(datarecords.WRITING)]

    def no_walk(*_a, **_k):
        raise AssertionError("finish walked the data dir after clean sessions")

    monkeypatch.setattr(dataops.os, "walk", no_walk)
    left = entries[4]["path"]
    result = _session(src, entries[:4] + entries[5:], b"")["final"]["result"]
    assert result["mismatches"] == [] and result["pruned"] == 1
    assert not os.path.exists(os.path.join(src, left))
    assert sorted(datarecords.load_records(src)) == sorted(
        e["path"] for e in entries if e["path"] != left
    )


def test_a_cut_session_leaves_a_marker_and_the_next_finish_walks(tmp_path):
    """A session cut mid-file keeps its marker: the next finish walks both trees and
    removes its part file and anything else the manifest does not list, then the
    marker; a marker of a session still running stays (its files are in flight)."""
    src = str(tmp_path / "data")
    blobs, entries = _slice()
    # a session cut inside file 2: files 0 and 1 verified, file 2's part file left
    cut = (
        json.dumps(
            {"run_dir": src, "run_id": "t", "src": src, "encrypted": False, "entries": entries}
        ).encode()
        + b"\n"
        + _frames(blobs, entries, only={0, 1})
        + dataops.FRAME.pack(b"F", 2, entries[2]["size"])
        + blobs[entries[2]["path"]][:10]
    )
    assert dataops.serve(io.BytesIO(cut), io.BytesIO()) == 3
    mine = os.path.join(src, datarecords.WRITING + str(os.getpid()))
    assert os.path.exists(mine)  # the cut session did not end cleanly
    # as if that process died hard (its own except clause removes its part file)
    dead = _dead_pid()
    os.rename(mine, os.path.join(src, datarecords.WRITING + str(dead)))
    debris = Path(src, entries[2]["path"] + f".part-{dead}")
    debris.write_bytes(b"half")
    stray = Path(src, "d0", "stray.bin")
    stray.write_bytes(b"not in the slice")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live_mark = Path(src, datarecords.WRITING + str(live.pid))
        live_mark.touch()
        result = _session(src, entries, _frames(blobs, entries, only=set(range(2, 12))))
        assert result["final"]["result"]["mismatches"] == []
        assert not debris.exists() and not stray.exists()
        assert not Path(src, datarecords.WRITING + str(dead)).exists()
        assert live_mark.exists()  # still writing: the next finish walks again
        assert not os.path.exists(mine)  # this session ended cleanly
    finally:
        live.kill()
        live.wait()


def test_a_wanted_file_named_like_a_part_file_survives_the_walk(tmp_path):
    """The walk after a cut session removed every name holding ``.part-<digits>`` whose
    pid was dead, so slice files named ``weights.part-<n>`` and ``.cache.part-<n>`` went
    after the final check had passed them. Now a name is debris only if the slice does
    not want it and it has the exact in-flight form (``<name>.part-<pid>`` here)."""
    src = str(tmp_path / "data")
    dead = _dead_pid()
    blobs, entries = _slice()
    blobs[f"d0/weights.part-{dead}"] = b"wanted weights"
    blobs[f".cache.part-{dead}"] = b"wanted cache"
    entries = [
        {"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest(), "mtime_ns": 1}
        for p, b in sorted(blobs.items())
    ]
    _session(src, entries, _frames(blobs, entries))
    Path(src, datarecords.WRITING + str(dead)).touch()  # a session cut, since dead
    debris = Path(src, "d1", f"f001.bin.part-{dead}")
    debris.write_bytes(b"half")
    result = _session(src, entries, b"")["final"]["result"]
    assert result["mismatches"] == []
    assert Path(src, "d0", f"weights.part-{dead}").read_bytes() == b"wanted weights"
    assert Path(src, f".cache.part-{dead}").read_bytes() == b"wanted cache"
    assert not debris.exists()  # real debris of the dead session still goes
    assert not Path(src, datarecords.WRITING + str(dead)).exists()


def test_receiver_imports_the_runtime_named_in_argv_before_the_hello(monkeypatch):
    """The cipher's import (tens of ms) overlaps the laptop's stat of the slice."""
    order: list[str] = []
    monkeypatch.setattr(dataops, "use_runtime", lambda path: order.append(f"runtime {path}"))

    class Stdin(io.BytesIO):
        def readline(self, *_a) -> bytes:
            order.append("hello")
            return b""

    assert dataops.serve(Stdin(), io.BytesIO(), "/rt") == 3
    assert order == ["runtime /rt", "hello"]
    argv = receiver_argv("python3", "/agent", "/rt")
    assert argv == ["python3", "-S", "-c", RECEIVER_BOOT, "/agent/dataops.py", "sync"] + [
        "--runtime",
        "/rt",
    ]
    assert receiver_argv("python3", "/agent")[-2:] == ["/agent/dataops.py", "sync"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="F_SETPIPE_SZ is Linux's")
def test_stdin_pipe_is_widened_on_linux():
    """64 KiB pipes cost a wake-up round per 64 KiB between sshd and the receiver."""
    read_fd, write_fd = os.pipe()
    try:
        with open(read_fd, "rb", closefd=False) as stdin:
            dataops._widen_pipe(stdin)
        assert __import__("fcntl").fcntl(read_fd, 1032) == dataops.PIPE_BYTES  # F_GETPIPE_SZ
    finally:
        os.close(read_fd)
        os.close(write_fd)


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_resync_redecrypts_ram_copies_lost_or_changed_before_it(
    sshd,
    host_factory,  # noqa: F811
    tmp_path,
):
    """The RAM copies are looked at once per session (right after the start answer,
    not in finish): one deleted and one edited on the host are decrypted again from
    the stored ciphertext, and the job then reads exactly the laptop's bytes."""
    data = make_slice(tmp_path / "data", small=12, small_size=20_000, big=0)
    key = os.urandom(32)
    host = await host_factory(sshd)
    try:
        _, first, _ = await host.sync(data, key)
        ram = Path(first["data_dir"])
        (ram / "d0" / "s000.bin").unlink()
        edited = ram / "d1" / "s001.bin"
        edited.write_bytes(edited.read_bytes() + b"edited on the host")
        manifest, answer, stats = await host.sync(data, key)
        assert stats.sent_files == 0 and answer["mismatches"] == []
        assert answer["redecrypted"] == 2
        for entry in manifest.entries:
            assert (ram / entry.path).read_bytes() == (data / entry.path).read_bytes()
    finally:
        await host.transport.close()


def test_manifest_of_checked_paths_still_refuses_duplicates_and_stat_checks_paths(tmp_path):
    """The sync's manifest skips the path check its stat pass made; nothing else."""
    from remotemac.data.manifest import Manifest, ManifestEntry
    from remotemac.engine.syncplan import stat_all
    from remotemac.errors import IntegrityError

    entry = ManifestEntry("a.bin", 1, "0" * 64)
    with pytest.raises(IntegrityError):
        Manifest.from_entries([entry, entry], checked=True)
    (tmp_path / "a.bin").write_bytes(b"x")
    with pytest.raises(IntegrityError):  # check_relpath's, before any stat
        stat_all(tmp_path, ["a.bin", "../a.bin"], None)
    assert [f.path for f in stat_all(tmp_path, ["a.bin", "a.bin"], None)] == ["a.bin"]


def test_hello_columns_read_as_entries():
    """The laptop sends its entries as one list per field (json encodes thousands of
    dicts ten times slower); the host reads them as the entries they describe."""
    req = {"columns": {"path": ["a", "b"], "size": [1, 2], "sha256": ["x", None]}}
    req["columns"]["mtime_ns"] = [5, 6]
    assert receiver.hello_entries(req) == [
        {"path": "a", "size": 1, "sha256": "x", "mtime_ns": 5},
        {"path": "b", "size": 2, "sha256": None, "mtime_ns": 6},
    ]
    req["columns"]["size"].append(3)
    with pytest.raises(datarecords.DataError):
        receiver.hello_entries(req)
    assert receiver.hello_entries({"entries": [{"path": "a"}]}) == [{"path": "a"}]


def test_host_path_check_refuses_what_it_did():
    """One regex now: every unsafe form is still refused, names with dots are not."""
    for bad in ["", "/a", "a//b", "a/./b", "a/../b", "a/.", "a/..", "a/", ".", "..", "../a"]:
        with pytest.raises(datarecords.DataError):
            datarecords.check_rel(bad)
    for bad in ["a\x00b", "a\nb", "a\x1fb", "a\\b"]:
        with pytest.raises(datarecords.DataError):
            datarecords.check_rel(bad)
    for good in ["a", ".hidden", "a/...", "a/..b/c", "d/.x.bin", "a b/ü.bin", "a\x7fb"]:
        assert datarecords.check_rel(good) == good


def test_receiver_process_exits_with_the_sessions_code():
    """It leaves by os._exit (no teardown of the session's dicts): the code still tells
    a laptop that went away (3) from bad usage (2), and every line is out first."""
    argv = receiver_argv(sys.executable, str(Path(dataops.__file__).parent))
    gone = subprocess.run(argv, input=b"", capture_output=True)
    assert gone.returncode == 3
    bad = subprocess.run(argv + ["--x"], capture_output=True)
    assert bad.returncode == 2 and b"usage" in bad.stdout
    hello = json.dumps({"src": "/nonexistent/\x00", "encrypted": False}).encode() + b"\n"
    failed = subprocess.run(argv, input=hello, capture_output=True)
    assert failed.returncode == 1 and json.loads(failed.stdout)["ok"] is False


def test_receiver_starts_from_cached_bytecode(tmp_path):
    """The host runs dataops imported (``receiver_argv``), so its second start loads
    the bytecode the first one cached instead of compiling the file again (~7 ms of
    the host's start, before it can read the hello); it still exits with the
    session's code."""
    agent = tmp_path / "agent"
    agent.mkdir()
    #: the receiver and every agent module it imports at its start (it runs as the agent
    #: package; agentutil and procid only after a cut: tests/test_receiver_start_imports.py)
    names = ("datafiles", "datafinish", "dataops", "datapartial", "datarecords")
    names += ("datasplit", "protocol", "receiver", "writebehind")
    for name in (n + ".py" for n in names):
        (agent / name).write_bytes((Path(dataops.__file__).parent / name).read_bytes())
    argv = receiver_argv(sys.executable, str(agent))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for _ in range(2):
        gone = subprocess.run(argv, input=b"", capture_output=True, env=env)
        assert gone.returncode == 3, gone.stderr
    assert [p.name.split(".")[0] for p in sorted((agent / "__pycache__").iterdir())] == list(names)
    bad = subprocess.run(argv + ["--x"], capture_output=True, env=env)
    assert bad.returncode == 2 and b"usage" in bad.stdout


class _Watched:
    """A channel whose first line back (the start answer) is handed over only once a
    file's frame was written, or after 5 s: what the laptop wrote before it, in order."""

    def __init__(self, proc, log: list) -> None:
        self._proc, self._log = proc, log
        self._framed = asyncio.Event()
        self._lines = 0

    def __getattr__(self, name):
        return getattr(self._proc, name)

    async def write(self, data: bytes) -> None:
        if data[:1] == b"F" and self._lines == 0:
            self._log.append("frame before the start answer")
            self._framed.set()
        await self._proc.write(data)

    async def readline(self) -> bytes:
        if self._lines == 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._framed.wait(), 5)
        self._lines += 1
        return await self._proc.readline()


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_changed_files_go_right_after_the_hello_when_the_cache_knows_the_slice(
    sshd,
    host_factory,  # noqa: F811
    tmp_path,
):
    """A re-sync sends the files its hash cache says changed without waiting for the
    host's start answer (the host reads them once it has checked what it holds); with
    no cache (every file unknown) it still waits, hashes and sends nothing the host holds."""
    from remotemac.data.manifest import MemoryHashCache

    data = make_slice(tmp_path / "data", small=30, small_size=20_000, big=1)
    key = os.urandom(32)
    cache = MemoryHashCache()
    host = await host_factory(sshd)
    log: list[str] = []
    opened = host.transport.open_process

    async def watched(argv, **kw):
        return _Watched(await opened(argv, **kw), log)

    try:
        await host.sync(data, key, cache=cache)
        changed = ["d0/s000.bin", "d1/s004.bin"]
        for rel in changed:
            (data / rel).write_bytes(os.urandom(15_000))
        host.transport.open_process = watched  # type: ignore[method-assign]
        manifest, answer, stats = await host.sync(data, key, cache=cache)
        assert log == ["frame before the start answer"]
        assert stats.sent_files == 2 and sorted(stats.acked) == changed
        assert answer["mismatches"] == [] and stats.skipped_files == len(manifest.entries) - 2
        ram = Path(answer["data_dir"])
        for rel in changed:
            assert (ram / rel).read_bytes() == (data / rel).read_bytes()
        log.clear()
        _, _, fresh = await host.sync(data, key, cache=MemoryHashCache())
        assert log == [] and fresh.sent_files == 0
    finally:
        await host.transport.close()
