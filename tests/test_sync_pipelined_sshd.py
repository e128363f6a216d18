"""The push's time outside its streams, against the real sshd through the fault proxy
(issue 36): workers opened while the first channel opens, sized by sshd's own round
trip, started without waiting for their start answers; split files hashed on the host
as their pieces land.

What must hold with that pipelining: a receiver's start answer still comes before any
file of its lane counts (an error there ends the attempt), and a cut while workers'
starts are in flight (their hellos and first pieces sent, no answer back) loses no file
and leaves nothing: no file verified twice, no part file, no split, no writing marker,
no receiver left running, and nothing in the RAM store that is not verified.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from remotemac.engine import syncsplitfiles, synctalk
from remotemac.engine.sync import SyncStats
from remotemac.errors import HostError
from remotemac.transport import ssh as ssh_transport
from tests.test_sync_sshd import _partials, _receivers_under, files_under
from tests.test_sync_sshd import host_factory as host_factory  # the fixtures, shared
from tests.test_sync_sshd import runtime_dir as runtime_dir

pytestmark = pytest.mark.timeout(240)
MiB = 1 << 20


def _dataset(root: Path, small: int, big: list[int]) -> Path:
    for i in range(small):
        path = root / f"d{i % 3}" / f"s{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(200_000 + i))
    for i, size in enumerate(big):
        path = root / "big" / f"b{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return root


def _check_all_held(host, manifest, answer, stats: SyncStats) -> None:
    """Every file verified once, recorded once, held with its hash; nothing else left."""
    names = sorted(e.path for e in manifest.entries)
    assert answer["mismatches"] == []
    counts = collections.Counter(stats.acked)
    assert sorted(counts) == names and max(counts.values()) == 1, counts
    src = Path(host.run_dir) / "data"
    record = (src / ".verified.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["path"] for line in record) == names
    for entry in manifest.entries:
        held = (Path(answer["data_dir"]) / entry.path).read_bytes()
        assert hashlib.sha256(held).hexdigest() == entry.sha256
    assert _partials(host) == []
    ram = Path(answer["data_dir"])
    left = [p.name for d in (src, ram) for p in files_under(d) if _debris(p.name)]
    assert left == []


def _debris(name: str) -> bool:
    """A part file, a split's RAM part or a session's writing marker."""
    return ".part-" in name or ".split-" in name or name.startswith(".remotemac-writing-")


async def _receivers_gone(host) -> None:
    """The cut session's receivers see the cut and exit (sshd closes their stdin)."""
    for _ in range(400):
        if not _receivers_under(host.root):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"receivers still running: {_receivers_under(host.root)}")


@pytest.mark.asyncio
async def test_workers_open_with_the_first_channel_by_the_links_own_round_trip(
    sshd, fault_proxy, host_factory, tmp_path, monkeypatch
):
    """80 ms: the round trip comes from sshd's answers to keepalive requests (a ping
    through the channel would fail this test), and the workers' channels are opened
    before the first channel's start answer is in; every file, a split one among
    them, is verified once."""

    async def no_ping(self, proc, probes=2):
        raise AssertionError("the round trip was pinged through the channel")

    monkeypatch.setattr(synctalk.Session, "_rtt", no_ping)
    answered: list[float] = []
    start = synctalk.Session._start

    async def start_spy(self, main):
        out = await start(self, main)
        answered.append(time.monotonic())
        return out

    monkeypatch.setattr(synctalk.Session, "_start", start_spy)
    data = _dataset(tmp_path / "data", small=6, big=[40 * MiB])
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    opened: list[float] = []
    open_process = host.transport.open_process

    async def open_spy(argv, **kw):
        opened.append(time.monotonic())
        return await open_process(argv, **kw)

    host.transport.open_process = open_spy  # type: ignore[method-assign]
    proxy.latency(0.04)
    proxy.throttle(24_000_000)
    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32))
    finally:
        await host.transport.close()
    assert stats.rtt_ms is not None and stats.rtt_ms >= 70
    assert stats.streams >= 4 and stats.split_files == 1
    assert len(answered) == 1
    assert sum(t < answered[0] for t in opened) >= stats.streams, (opened, answered)
    assert [step for step, _ in stats.steps][:3] == ["stat", "open", "hello"]
    _check_all_held(host, manifest, answer, stats)


@pytest.mark.asyncio
async def test_split_files_are_hinted_to_the_host_while_the_streams_run(
    sshd, fault_proxy, host_factory, tmp_path, monkeypatch
):
    """Two 40 MiB files as 8 MiB pieces over three streams: as pieces are stored, the
    first channel tells the host (``H`` frames between its files) to hash what tiles so
    far; the joins then check each whole file against the laptop's SHA-256 as before."""
    monkeypatch.setattr(syncsplitfiles, "HINT_BYTES", 8 * MiB)
    hints: list[bytes] = []
    read_pieces = synctalk.read_pieces

    def spy(*args, **kw):
        for item in read_pieces(*args, **kw):
            if isinstance(item, tuple) and item[0][:1] == b"H" and b'"header"' in item[0]:
                hints.append(item[0])
            yield item

    monkeypatch.setattr(synctalk, "read_pieces", spy)
    data = _dataset(tmp_path / "data", small=0, big=[40 * MiB, 40 * MiB + 5])
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.latency(0.02)
    proxy.throttle(40_000_000)
    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32), streams=3)
    finally:
        await host.transport.close()
    assert stats.split_files == 2 and stats.streams == 3
    assert hints, "no hint went to the host"
    _check_all_held(host, manifest, answer, stats)


@pytest.mark.asyncio
@pytest.mark.parametrize("then", ["resumes", "fails, run again"])
async def test_a_cut_while_workers_starts_are_in_flight_loses_nothing_and_leaves_nothing(
    sshd, fault_proxy, host_factory, tmp_path, monkeypatch, then
):
    """200 ms: the link is cut while a worker has its hello and more than 256 KiB of
    its first files sent and its start answer has not come back. The push resumes (or,
    allowed one attempt, fails and is run again): every file is verified exactly once,
    the cut session's receivers exit, and nothing is left but verified files: while
    the push stood failed, nothing visible in the RAM store that the record does not
    vouch for; after it, no part, split or marker anywhere."""
    sessions: list[synctalk.Session] = []
    hello_worker = synctalk.Session._hello_worker

    async def spy(self, proc, line):
        sessions.append(self)
        await hello_worker(self, proc, line)

    monkeypatch.setattr(synctalk.Session, "_hello_worker", spy)
    data = _dataset(tmp_path / "data", small=24, big=[40 * MiB])
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.latency(0.1)
    proxy.throttle(16_000_000)
    in_flight: list[int] = []

    async def cut_during_a_start() -> None:
        while True:
            for session in sessions:
                sent = [getattr(proc, "_written", 0) for proc in session._starting]
                if any(n > 256 << 10 for n in sent):
                    in_flight.append(max(sent))
                    proxy.cut()
                    return
            await asyncio.sleep(0.003)

    cutter = asyncio.ensure_future(cut_during_a_start())
    key = os.urandom(32)
    stats = SyncStats()
    try:
        if then == "resumes":
            manifest, answer, stats = await host.sync(data, key, stats=stats)
        else:
            with pytest.raises(HostError):
                await host.sync(data, key, stats=stats, max_attempts=1)
            await _receivers_gone(host)
            _only_verified_visible(host)
            manifest, answer, stats = await host.sync(data, key, stats=stats)
    finally:
        cutter.cancel()
        await host.transport.close()
    assert in_flight, "the cut did not land while a worker's start was in flight"
    assert stats.attempts >= 2
    await _receivers_gone(host)
    _check_all_held(host, manifest, answer, stats)


def _only_verified_visible(host) -> None:
    """After a failed push: every file the job could see in the RAM store (no dot
    name on its path) is in the host's record with the hash it holds."""
    src = Path(host.run_dir) / "data"
    record = src / ".verified.jsonl"
    held = {}
    if record.exists():
        for line in record.read_text().splitlines():
            rec = json.loads(line)
            held[rec["path"]] = rec["sha256"]
    ram = Path(f"/dev/shm/remotemac-{host.run_id}")
    for path in files_under(ram):
        rel = path.relative_to(ram)
        if any(part.startswith(".") for part in rel.parts):
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert (
            held.get(str(rel.relative_to(rel.parts[0]))) == digest or held.get(str(rel)) == digest
        ), f"{rel} is visible in RAM and not verified"


@pytest.mark.asyncio
async def test_early_workers_of_a_push_that_fails_are_ended_once_open_and_keep_no_slot(
    sshd, fault_proxy, host_factory, tmp_path, monkeypatch
):
    """The first channel's start answer is a refusal (made so here: ``_start`` raises
    as it does for a host's error line) while the workers opened early are still
    opening (each held 1 s inside its channel open, on the real transport). They are
    ended once open, not cancelled half-way: every one of the link's channel slots is
    free after the push, and no receiver is left on the host. (Cancelled mid-open, as
    before the review of issue 36, each kept a slot for good: a pooled link then
    waited forever for a channel.)"""
    data = _dataset(tmp_path / "data", small=12, big=[24 * MiB])
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    transport = host.transport
    opens = [0]
    real = ssh_transport.refused_session_retried

    async def slow_workers(conn, start, *args, **kw):
        opens[0] += 1
        if opens[0] > 1:  # the first channel opens at once; the workers are slow
            await asyncio.sleep(1.0)
        return await real(conn, start, *args, **kw)

    async def refused(self, main):
        raise HostError("the host refused the push (simulated start answer)")

    try:
        await transport.connect()
        full = transport._channels._value  # every slot free before the push
        monkeypatch.setattr(ssh_transport, "refused_session_retried", slow_workers)
        monkeypatch.setattr(synctalk.Session, "_start", refused)
        proxy.latency(0.04)
        with pytest.raises(HostError, match="refused the push"):
            await host.sync(data, os.urandom(32), max_attempts=1)
        assert opens[0] > 1, "no worker was opened early: the case is not exercised"
        await asyncio.sleep(0.5)  # the ended workers' channels close
        assert transport._channels._value == full, (transport._channels._value, full)
        await _receivers_gone(host)
    finally:
        await transport.close()


@pytest.mark.asyncio
async def test_without_the_links_own_round_trip_the_push_pings_through_its_channel(
    sshd, fault_proxy, host_factory, tmp_path, monkeypatch
):
    """The fallback of ``Transport.round_trip`` (it uses asyncssh's private global
    request): should it give None, the round trip is pinged through the first channel,
    the streams are still sized by it at 80 ms, and every file is verified once."""
    pinged: list[float] = []
    rtt = synctalk.Session._rtt

    async def spy(self, proc, probes=2):
        pinged.append(await rtt(self, proc, probes))
        return pinged[-1]

    async def no_round_trip(self):
        return None

    monkeypatch.setattr(synctalk.Session, "_rtt", spy)
    monkeypatch.setattr(ssh_transport.SSHTransport, "round_trip", no_round_trip)
    data = _dataset(tmp_path / "data", small=8, big=[24 * MiB])
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.latency(0.04)
    proxy.throttle(24_000_000)
    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32))
    finally:
        await host.transport.close()
    assert pinged and min(pinged) >= 0.07, pinged
    assert stats.rtt_ms is not None and stats.rtt_ms >= 70
    assert stats.streams >= 2
    _check_all_held(host, manifest, answer, stats)
