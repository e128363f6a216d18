"""A large file pushed as pieces over several channels, against the real sshd and the
bare lab host (OS-like python3 3.9 with the agent runtime it installed).

Before the split, a dataset that is one large file went over one channel whatever the
number of streams: one sshd window per round trip (23 MB/s through an 80 ms, 100 MB/s
link, ``scripts/bench_sync.py --shapes C``).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from remotemac.agent.streamcrypt import decrypt_stream
from remotemac.engine.sync import SyncStats
from remotemac.errors import HostError
from tests.test_sync_sshd import _cut_after, _partials
from tests.test_sync_sshd import host_factory as host_factory  # the fixtures, shared
from tests.test_sync_sshd import runtime_dir as runtime_dir

pytestmark = pytest.mark.timeout(180)
MiB = 1 << 20


def _dataset(root: Path, size: int) -> Path:
    root.mkdir(parents=True)
    (root / "big").mkdir()
    (root / "big" / "train.bin").write_bytes(os.urandom(size))
    (root / "labels.json").write_text('{"classes": 10}')
    return root


def _stored_plaintext(run_dir: str, key: bytes, rel: str) -> bytes:
    out = io.BytesIO()
    with open(Path(run_dir) / "data" / f"{rel}.rmenc", "rb") as fh:
        decrypt_stream(key, rel, fh, out)
    return out.getvalue()


@pytest.mark.asyncio
async def test_one_large_file_goes_as_pieces_over_three_channels(sshd, host_factory, tmp_path):
    data = _dataset(tmp_path / "data", 40 * MiB + 4321)
    key = os.urandom(32)
    host = await host_factory(sshd)
    try:
        manifest, answer, stats = await host.sync(data, key, streams=3)
    finally:
        await host.transport.close()
    assert stats.streams == 3 and stats.split_files == 1, stats
    assert answer["mismatches"] == [] and sorted(stats.acked) == ["big/train.bin", "labels.json"]
    plain = (data / "big" / "train.bin").read_bytes()
    sha = {e.path: e.sha256 for e in manifest.entries}
    assert sha["big/train.bin"] == hashlib.sha256(plain).hexdigest()
    held = Path(answer["data_dir"]) / "big" / "train.bin"
    assert held.read_bytes() == plain  # the job's copy, in RAM
    assert _stored_plaintext(host.run_dir, key, "big/train.bin") == plain  # at rest: one stream
    assert _partials(host) == []
    assert [p.name for p in held.parent.iterdir()] == ["train.bin"]  # no part file left
    record = (Path(host.run_dir) / "data" / ".verified.jsonl").read_text().splitlines()
    assert len(record) == 2


async def _cut_at_two_thirds(sshd, fault_proxy, host_factory, tmp_path, size: int):
    """A dataset of one ``size`` file, a host behind a 20 MB/s proxy that cuts every link
    once two thirds of the file went: (data, key, proxy, host, the cutter task)."""
    data = _dataset(tmp_path / "data", size)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.throttle(20_000_000)
    cutter = asyncio.ensure_future(_cut_after(proxy, size * 2 // 3))
    return data, os.urandom(32), proxy, host, cutter


@pytest.mark.asyncio
async def test_a_cut_split_push_sends_again_only_the_pieces_not_whole(
    sshd, fault_proxy, host_factory, tmp_path
):
    """Cut once two thirds of the file went: the pieces that were whole on the host, and
    the whole chunks of those it was inside, are kept (their plaintext checked here
    first); the rest is sealed under the same header. Keeping whole pieces only, the
    second attempt sent half the file."""
    size = 48 * MiB
    data, key, proxy, host, cutter = await _cut_at_two_thirds(
        sshd, fault_proxy, host_factory, tmp_path, size
    )
    stats = SyncStats()
    try:
        manifest, answer, stats = await host.sync(data, key, streams=3, stats=stats)
    finally:
        cutter.cancel()
        await host.transport.close()
    assert cutter.done() and stats.attempts == 2, stats
    assert stats.resumed_files == 1 and stats.resumed_bytes >= size * 0.55, stats
    # what the host had stored whole when the link went (pieces, and the chunks of the
    # pieces it was inside) stays: about the third that had not gone travels again
    assert stats.per_attempt[1] < size * 0.42, stats.per_attempt
    assert answer["mismatches"] == []
    plain = (data / "big" / "train.bin").read_bytes()
    assert (Path(answer["data_dir"]) / "big" / "train.bin").read_bytes() == plain
    assert _stored_plaintext(host.run_dir, key, "big/train.bin") == plain
    assert _partials(host) == []


@pytest.mark.asyncio
async def test_a_file_changed_after_a_cut_split_starts_afresh(
    sshd, fault_proxy, host_factory, tmp_path
):
    """Same size and mtime, other bytes in a piece the host kept: never sealed again
    under the old header's nonces; the new content lands, the old pieces go."""
    size = 48 * MiB
    data, key, proxy, host, cutter = await _cut_at_two_thirds(
        sshd, fault_proxy, host_factory, tmp_path, size
    )
    path = data / "big" / "train.bin"
    try:
        with pytest.raises(HostError):
            await host.sync(data, key, streams=3, max_attempts=1)
        st = path.stat()
        with open(path, "r+b") as fh:
            fh.write(b"\xff" * 4096)  # inside the first piece, which the host kept
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        proxy.restore()
        _, answer, again = await host.sync(data, key, streams=3)
    finally:
        cutter.cancel()
        await host.transport.close()
    assert again.resumed_files == 0 and again.per_attempt[0] > size, again
    assert answer["mismatches"] == []
    plain = path.read_bytes()
    assert (Path(answer["data_dir"]) / "big" / "train.bin").read_bytes() == plain
    assert _stored_plaintext(host.run_dir, key, "big/train.bin") == plain


@pytest.mark.asyncio
async def test_a_far_link_spreads_one_large_file_over_the_streams_it_opens(
    sshd, fault_proxy, host_factory, tmp_path
):
    """40 ms round trip: the sync pings, opens five channels and sends its one large
    file as pieces on all of them (before: one channel, since there was one file)."""
    data = _dataset(tmp_path / "data", 40 * MiB)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.latency(0.02)
    try:
        _, answer, stats = await host.sync(data, os.urandom(32))
    finally:
        await host.transport.close()
    assert stats.rtt_ms is not None and stats.rtt_ms >= 35
    assert stats.streams == 5 and stats.split_files == 1, stats  # 125 MB/s x 41 ms / 1 MiB
    assert answer["mismatches"] == []
    held = Path(answer["data_dir"]) / "big" / "train.bin"
    assert held.read_bytes() == (data / "big" / "train.bin").read_bytes()


@pytest.mark.asyncio
async def test_a_host_that_hands_back_an_old_header_never_gets_a_two_time_pad(
    sshd, fault_proxy, host_factory, tmp_path
):
    """The host is not trusted: it holds ciphertext only (and plaintext in RAM). After a
    cut split, the file changes (a normal write, a new mtime); the host then lies in its
    start answer: the old split's header with the new size and mtime (the hello just
    told it them) and without the one piece whose bytes changed. Continuing under that
    header seals the new bytes under the nonces of the old ones the host holds: their
    XOR is the plaintexts' XOR (and GCM's authentication key falls out). Before: it did."""
    from remotemac.agent.streamcrypt import HEADER_LEN, TAG_LEN

    size = 48 * MiB
    cs = 256 * 1024
    data, key, proxy, host, cutter = await _cut_at_two_thirds(
        sshd, fault_proxy, host_factory, tmp_path, size
    )
    path = data / "big" / "train.bin"
    part_dir = Path(host.run_dir) / "data" / ".remotemac-partial"
    try:
        with pytest.raises(HostError):
            await host.sync(data, key, streams=3, max_attempts=1)
        (meta_path,) = [p for p in part_dir.iterdir() if p.name.endswith(".json")]
        meta = json.loads(meta_path.read_text())
        old_header = bytes.fromhex(meta["header"])
        first = max(p[0] for p in meta["pieces"])  # a chunk whose ciphertext the host holds
        at = HEADER_LEN + first * (cs + TAG_LEN)
        with open(meta_path.with_suffix(".rmenc"), "rb") as fh:
            fh.seek(at)
            old_sealed = fh.read(cs + TAG_LEN)
        old_plain = path.read_bytes()[first * cs : (first + 1) * cs]
        new_plain = os.urandom(cs)
        with open(path, "r+b") as fh:  # the user edits the file: a new mtime
            fh.seek(first * cs)
            fh.write(new_plain)
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        # the host's lie: the old header, the new version's size and mtime
        meta.update(
            mtime_ns=path.stat().st_mtime_ns,
            pieces=[p for p in meta["pieces"] if p[0] != first],
        )
        meta_path.write_text(json.dumps(meta))
        proxy.restore()
        _, answer, again = await host.sync(data, key, streams=3)
    finally:
        cutter.cancel()
        await host.transport.close()
    assert answer["mismatches"] == []
    stored = (Path(host.run_dir) / "data" / "big" / "train.bin.rmenc").read_bytes()
    new_sealed = stored[at : at + cs + TAG_LEN]
    pad = bytes(a ^ b for a, b in zip(old_sealed[:cs], new_sealed[:cs], strict=True))
    assert pad != bytes(a ^ b for a, b in zip(old_plain, new_plain, strict=True)), "two-time pad"
    assert stored[:HEADER_LEN] != old_header and again.resumed_files == 0
    assert (Path(answer["data_dir"]) / "big" / "train.bin").read_bytes() == path.read_bytes()
