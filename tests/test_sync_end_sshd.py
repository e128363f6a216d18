"""The end of a push over several streams, against the real sshd through the fault
proxy (issue 36): the first channel's end frame goes as soon as every stream has sent
its last file, with the workers' end frames, not after their answers; the host's first
receiver then waits for the files the laptop names as not yet acknowledged until the
other streams have recorded them, and checks the slice.

What must hold: every file verified once and held with its hash (a check that did
not wait would find the workers' last files missing); a cut while the first receiver
waits ends it at once (it exits; the workers it waited for are killed) and loses nothing: the push
resumes, or fails and is run again, with every file verified exactly once and no part
file, split or writing marker left.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from remotemac.engine import synctalk
from remotemac.engine.sync import SyncStats
from remotemac.errors import HostError
from tests.test_sync_pipelined_sshd import (
    _dataset,
    _debris,
    _only_verified_visible,
    _receivers_gone,
)
from tests.test_sync_sshd import _receivers_under, files_under
from tests.test_sync_sshd import host_factory as host_factory  # the fixtures, shared
from tests.test_sync_sshd import runtime_dir as runtime_dir

pytestmark = pytest.mark.timeout(240)


def _all_held(host, manifest, answer, stats: SyncStats, held: frozenset = frozenset()) -> None:
    """Every file verified once, recorded once, held with its hash; nothing else left
    (tests/test_sync_pipelined_sshd's check; a push of small files only never makes
    the host's dir of kept cut transfers, so it is looked in only if it is there).
    ``held``: what the host's record held when the push was run again (a receiver
    cut after it stored its last files stores them before it exits: verified, never
    acknowledged; the next push finds them held and sends them no more)."""
    names = sorted(e.path for e in manifest.entries)
    assert answer["mismatches"] == []
    counts = collections.Counter(stats.acked)
    assert set(names) - set(counts) <= held and max(counts.values()) == 1, (
        sorted(set(names) - set(counts) - held),
        [n for n, c in counts.items() if c > 1],
    )
    assert set(counts) <= set(names)
    src = Path(host.run_dir) / "data"
    record = (src / ".verified.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["path"] for line in record) == names
    for entry in manifest.entries:
        copy = (Path(answer["data_dir"]) / entry.path).read_bytes()
        assert hashlib.sha256(copy).hexdigest() == entry.sha256
    kept = src / ".remotemac-partial"
    assert not kept.exists() or os.listdir(kept) == []
    ram = Path(answer["data_dir"])
    left = [p.name for d in (src, ram) for p in files_under(d) if _debris(p.name)]
    assert left == []


def _recorded(host) -> list[str]:
    """The paths the host's record lists now."""
    record = Path(host.run_dir) / "data" / ".verified.jsonl"
    if not record.exists():
        return []
    return [json.loads(line)["path"] for line in record.read_text().splitlines()]


def _spy_end_frame(monkeypatch) -> list[tuple[float, list[int]]]:
    """(when, the files the laptop named pending) for each end frame it wrote."""
    sent: list[tuple[float, list[int]]] = []
    finish = synctalk.Session._finish

    async def spy(self, main, hello):
        pending = sorted(self._unacked)
        await finish(self, main, hello)
        sent.append((time.monotonic(), pending))

    monkeypatch.setattr(synctalk.Session, "_finish", spy)
    return sent


def _started(pid: int) -> int:
    """A process's start time (clock ticks since boot), 0 once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


@pytest.mark.asyncio
async def test_the_end_frame_goes_with_the_workers_and_the_host_waits_for_their_files(
    sshd, fault_proxy, host_factory, tmp_path, monkeypatch
):
    """80 ms, 4 streams, 48 files of ~200 KB: the end frame is written before the
    workers have answered ("end sent" comes before "workers done" in the push's steps),
    naming files not yet acknowledged; the host's check, which waited for them, finds
    every file held."""
    sent = _spy_end_frame(monkeypatch)
    data = _dataset(tmp_path / "data", small=48, big=[])
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.latency(0.04)
    proxy.throttle(20_000_000)
    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32), streams=4)
    finally:
        await host.transport.close()
    assert stats.streams == 4
    steps = [step for step, _ in stats.steps]
    assert steps.index("end sent") < steps.index("workers done"), steps
    assert len(sent) == 1 and sent[0][1], "no file was pending when the end frame went"
    _all_held(host, manifest, answer, stats)
    await _receivers_gone(host)


@pytest.mark.asyncio
@pytest.mark.parametrize("then", ["resumes", "fails, run again"])
async def test_a_cut_while_the_host_waits_for_the_workers_loses_nothing_and_leaves_nothing(
    sshd, fault_proxy, host_factory, tmp_path, monkeypatch, then
):
    """100 ms, 3 streams: each worker's end frame is held back (here, on the laptop: it
    keeps its last group of files unstored), and as the first channel's end frame goes
    the workers' receivers are stopped on the host (SIGSTOP: a host too busy to run
    them), their last files still on the way. The first receiver has the end frame and
    waits for those files (the record lacks some the end frame named); the link is cut.
    The stopped workers are killed (SIGKILL) at the cut; the first receiver ends at
    once (it does not sit out its wait for files that cannot come), and the push resumes (or, allowed one
    attempt, fails and is run again): every file verified exactly once, nothing left
    but verified files."""
    data = _dataset(tmp_path / "data", small=36, big=[])
    names = sorted(p.relative_to(data).as_posix() for p in files_under(data))
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    stopped: list[int] = []
    sent: list[list[int]] = []
    finish, end_lane = synctalk.Session._finish, synctalk.Session._end_lane

    async def held_end(self, lane):
        await asyncio.sleep(1.5)  # the worker keeps its last group of files unstored
        await end_lane(self, lane)

    async def stop_workers_then_finish(self, main, hello):
        if not stopped:
            receivers = sorted(_receivers_under(host.root), key=_started)
            for pid in receivers[1:]:  # the first started is the first channel's
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        sent.append(sorted(self._unacked))
        await finish(self, main, hello)

    monkeypatch.setattr(synctalk.Session, "_end_lane", held_end)
    monkeypatch.setattr(synctalk.Session, "_finish", stop_workers_then_finish)
    proxy.latency(0.05)
    proxy.throttle(16_000_000)
    waited_for: list[str] = []
    first_left: list[float] = []

    async def cut_while_the_host_waits() -> None:
        while not sent:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.4)  # the end frame is on the host (one way: 50 ms)
        recorded = set(_recorded(host))
        waited_for.extend(names[i] for i in sent[0] if names[i] not in recorded)
        running = set(_receivers_under(host.root)) - set(stopped)  # the first receiver
        proxy.cut()
        proxy.restore()
        cut = time.monotonic()
        for pid in stopped:  # (run again, they would store files resent meanwhile too)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while any(_started(pid) for pid in running):
            if time.monotonic() - cut > 5:
                break
            await asyncio.sleep(0.02)
        else:
            first_left.append(time.monotonic() - cut)

    cutter = asyncio.ensure_future(cut_while_the_host_waits())
    key = os.urandom(32)
    stats = SyncStats()
    held: frozenset = frozenset()
    try:
        if then == "resumes":
            manifest, answer, stats = await host.sync(data, key, stats=stats, streams=3)
        else:
            with pytest.raises(HostError):
                await host.sync(data, key, stats=stats, streams=3, max_attempts=1)
            await asyncio.wait_for(cutter, 30)
            await _receivers_gone(host)
            _only_verified_visible(host)
            held = frozenset(_recorded(host))
            manifest, answer, stats = await host.sync(data, key, stats=stats, streams=3)
        await asyncio.wait_for(cutter, 30)
    finally:
        cutter.cancel()
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await host.transport.close()
    assert stopped, "no worker was running when the end frame went"
    assert waited_for, "every file the end frame named was recorded before the cut"
    assert first_left, "the first receiver did not end within 5 s of the cut"
    assert stats.attempts >= 2
    await _receivers_gone(host)
    _all_held(host, manifest, answer, stats, held)
