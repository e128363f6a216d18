"""A push that adds and retires streams while it runs, against the real sshd through the
fault proxy at 80 ms (engine/streamtuner.py decides, engine/synctalk.py opens and
retires channels).

The tuner's decisions are tested on synthetic rate series in tests/test_streamtuner.py.
Here the question is the data path: streams opened mid-push (past one connection's
six, on a second SSH connection) and retired mid-push (each ends after its last file,
its receiver verifying it) lose no file and verify none twice, a cut after the count
changed resumes, and the ledger and the result say how many streams ran over time.
To make the changes happen on this shared 2-core machine, whatever rate it measures,
two tests use a *scripted* tuner (a simulation of its decisions: the samples and the
timing are real, the targets come from a list); the last uses the real one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path

import pytest

from remotemac.engine import synctalk
from remotemac.engine.ledger import Ledger
from remotemac.engine.streamtuner import StreamTuner
from remotemac.engine.sync import SyncStats
from remotemac.events import PhaseProgress
from tests.test_sync_sshd import host_factory as host_factory  # the fixtures, shared
from tests.test_sync_sshd import runtime_dir as runtime_dir

pytestmark = pytest.mark.timeout(240)
MiB = 1 << 20


def _files(root: Path, count: int, size: int) -> Path:
    for i in range(count):
        path = root / f"d{i % 4}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size - i * 1000))
    return root


def scripted(targets: list[int]) -> type[StreamTuner]:
    """A tuner whose every judgement (after a real settle and measuring window) moves to
    the next of ``targets``; then it holds."""

    class Scripted(StreamTuner):
        script: list[int]

        def __post_init__(self) -> None:
            super().__post_init__()
            self.script = list(targets)

        def _judge(self, now: float, rate: float, left: int) -> None:
            self.base_rate = rate
            if self.script:
                self._set(self.script.pop(0), now)
            else:
                self._done = True

    return Scripted


def _check_all_held(host, manifest, answer, stats: SyncStats) -> None:
    """Every file verified once, in the ack list and in the host's record, and held."""
    names = [e.path for e in manifest.entries]
    assert answer["mismatches"] == []
    assert sorted(stats.acked) == sorted(names), "a file not verified, or verified twice"
    record = (Path(host.run_dir) / "data" / ".verified.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["path"] for line in record) == sorted(names)
    for entry in manifest.entries:
        held = (Path(answer["data_dir"]) / entry.path).read_bytes()
        assert hashlib.sha256(held).hexdigest() == entry.sha256


def _ledger_note(ledger_path: Path) -> list[str]:
    return [
        json.loads(line)["command"].rpartition(" ×")[2]
        for line in ledger_path.read_text().splitlines()
        if json.loads(line)["op"] == "sync-data"
    ]


@pytest.mark.asyncio
async def test_streams_added_past_one_connection_then_retired_lose_no_file(
    sshd, fault_proxy, host_factory, tmp_path, monkeypatch
):
    """80 ms, 16 MB/s, 48 files of ~3 MiB: the push starts at six (one connection), the
    (scripted) tuner asks for nine (three on a second SSH connection), then for four:
    five streams are retired mid-push, each after its last file. Every file is verified
    once; the result, an event and the ledger say ``streams 6→9→4``."""
    monkeypatch.setattr(synctalk, "StreamTuner", scripted([9, 4]))
    data = _files(tmp_path / "data", 48, 3 * MiB)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    ledger_path = tmp_path / "ledger.jsonl"
    host.agent.ledger = Ledger(ledger_path)
    proxy.latency(0.04)
    proxy.throttle(16_000_000)
    logins = proxy.accepted
    events: list = []
    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32), events=events)
    finally:
        await host.transport.close()
    assert stats.rtt_ms is not None and stats.rtt_ms >= 70
    assert [n for _, n in stats.stream_steps] == [6, 9, 4], stats.stream_steps
    assert stats.streams == 9 and stats.spare_streams == 3 and proxy.accepted - logins == 1
    assert stats.streams_text() == "streams 6→9→4"
    assert _ledger_note(ledger_path) == ["streams 6→9→4"]
    said = [e.detail for e in events if isinstance(e, PhaseProgress) and e.detail]
    assert any(d.startswith("streams 6→9") for d in said)
    assert any(d.startswith("streams 9→4") for d in said)
    _check_all_held(host, manifest, answer, stats)


@pytest.mark.asyncio
async def test_a_cut_after_the_count_changed_resumes_every_file_once(
    sshd, fault_proxy, host_factory, tmp_path, monkeypatch
):
    """The link is cut once the (scripted) tuner has gone 6 → 8 → 3 and retired five
    streams: the next attempt starts again from the host's answer and its own tuner, and
    every file ends verified once."""
    monkeypatch.setattr(synctalk, "StreamTuner", scripted([8, 3]))
    data = _files(tmp_path / "data", 40, 3 * MiB)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.latency(0.04)
    proxy.throttle(12_000_000)
    events: list = []

    async def cut_after_the_drop() -> None:
        while not any(
            isinstance(e, PhaseProgress) and (e.detail or "").startswith("streams 8→3")
            for e in events
        ):
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        proxy.cut()

    cutter = asyncio.ensure_future(cut_after_the_drop())
    stats = SyncStats()
    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32), events=events, stats=stats)
    finally:
        cutter.cancel()
        await host.transport.close()
    assert stats.attempts >= 2, "the cut did not land inside the push"
    assert len(stats.per_attempt) == stats.attempts
    _check_all_held(host, manifest, answer, stats)


@pytest.mark.asyncio
async def test_the_real_tuner_measures_and_records_its_streams(
    sshd, fault_proxy, host_factory, tmp_path
):
    """The real tuner at 80 ms, 16 MB/s for 120 MiB: six streams carry the throttled
    link (6 x 1 MiB per round trip would carry 75 MB/s), so its probe to eight gains
    nothing and is undone: 6→8→6, and the result records it."""
    data = _files(tmp_path / "data", 30, 4 * MiB)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.latency(0.04)
    proxy.throttle(16_000_000)
    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32))
    finally:
        await host.transport.close()
    steps = [n for _, n in stats.stream_steps]
    assert steps == [6, 8, 6], stats.stream_steps
    _check_all_held(host, manifest, answer, stats)


@pytest.mark.asyncio
async def test_large_files_split_across_streams_retired_and_opened_again(
    sshd, fault_proxy, host_factory, tmp_path, monkeypatch
):
    """Five 40 MiB files go as 8 MiB pieces; the (scripted) tuner goes 6 → 8 → 6 → 8:
    the pieces of one file land through streams retired and streams opened after them,
    on both connections, and each file is put together and verified once."""
    monkeypatch.setattr(synctalk, "StreamTuner", scripted([8, 6, 8]))
    data = tmp_path / "data"
    (data / "big").mkdir(parents=True)
    for i in range(5):
        (data / "big" / f"b{i}.bin").write_bytes(os.urandom(40 * MiB + i))
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.latency(0.04)
    proxy.throttle(24_000_000)
    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32))
    finally:
        await host.transport.close()
    assert [n for _, n in stats.stream_steps] == [6, 8, 6, 8], stats.stream_steps
    assert stats.split_files == 5
    _check_all_held(host, manifest, answer, stats)


class _Channel:
    """A channel a probe opened (a unit test's stand-in: only its close is watched)."""

    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


@pytest.mark.asyncio
async def test_channels_a_probe_opened_as_the_push_ended_are_closed():
    """A probe on the run's own link opened two channels and waits for their start
    answers when the push ends: the push cancels it, and the two are closed, not left
    with a receiver waiting on its stdin, one of the host's MaxSessions each, on a link
    that outlives the sync (a pooled run's link does). A unit test of synctalk's
    Session._grow: the channels are stand-ins."""
    opened: list[_Channel] = []

    class Probe:
        async def _open_workers(self, argv, hello, count, procs):
            for _ in range(count):
                channel = _Channel()
                opened.append(channel)
                procs.append(channel)
            await asyncio.sleep(300)  # the start answers, slow

        async def _open_spare(self, argv, hello, count):
            return []

    probe = asyncio.ensure_future(synctalk.Session._grow(Probe(), [], None, [], 2))
    while len(opened) < 2:
        await asyncio.sleep(0.01)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert [c.closed for c in opened] == [True, True]
