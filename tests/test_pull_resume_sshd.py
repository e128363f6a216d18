"""A pull cut in the middle of a large result goes on from where it was (issues 16, 19).

Real parts: the loopback sshd of tests/harness, the fault proxy in front of it, the
resident agent, a 200 MiB result of random bytes. "Bytes re-sent" is what the proxy
forwarded, not remotemac's own count, so a pull that restarted a file from zero
cannot pass by miscounting.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest

from remotemac.engine.pull import PART, pull_dir
from remotemac.errors import TransientHostError
from tests.test_sync_sshd import host_factory as host_factory  # the fixtures, shared
from tests.test_sync_sshd import runtime_dir as runtime_dir

pytestmark = pytest.mark.timeout(240)

SIZE = 200 << 20


def plant(out: Path, size: int = SIZE) -> str:
    """One result of ``size`` random bytes; its sha256."""
    out.mkdir(parents=True)
    digest = hashlib.sha256()
    with open(out / "model.bin", "wb") as fh:
        for _ in range(size >> 20):
            block = os.urandom(1 << 20)
            digest.update(block)
            fh.write(block)
    return digest.hexdigest()


def sha_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


async def until_part_holds(part: Path, share: float, task: asyncio.Future) -> None:
    while not (part.exists() and part.stat().st_size >= share * SIZE):
        assert not task.done(), "the pull ended before the cut"
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_pull_cut_at_half_resends_less_than_55_percent(
    sshd, fault_proxy, host_factory, tmp_path
):
    """The link dies at 50 % and stays down past the reconnect deadline: the pull fails
    (exit 3); the next pull sends the second half only and the file verifies."""
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    remote_out = Path(host.run_dir, "out", "cpu")
    want = plant(remote_out)
    dest = tmp_path / "out"
    part = dest / f".model.bin{PART}"
    proxy.throttle(60e6)  # time to see the half-way mark
    try:
        task = asyncio.ensure_future(pull_dir(host.transport, host.agent, str(remote_out), dest))
        await until_part_holds(part, 0.5, task)
        host.transport.reconnect_deadline = 1.0
        proxy.refuse(True)
        proxy.reset()
        with pytest.raises(TransientHostError):
            await task
        had = part.stat().st_size
        assert 0.45 * SIZE < had < SIZE and not (dest / "model.bin").exists()
        proxy.restore()
        host.transport.reconnect_deadline = 30.0
        before = proxy.bytes_forwarded
        result = (await pull_dir(host.transport, host.agent, str(remote_out), dest)).to_json()
        wire = proxy.bytes_forwarded - before
    finally:
        await host.transport.close()
    assert sha_of(dest / "model.bin") == want and not part.exists()
    assert result["bytes"] == {"total": SIZE, "moved": SIZE - had, "reused": had}
    assert wire < 0.55 * SIZE, f"{wire / SIZE:.1%} of the file crossed the link again"


@pytest.mark.asyncio
async def test_pull_of_200_mib_survives_a_cut_every_2_s(sshd, fault_proxy, host_factory, tmp_path):
    """Issue 16: the link is cut every 2 s for the whole pull; the transport reconnects
    and each cut costs only what was in flight, never the file's start."""
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    remote_out = Path(host.run_dir, "out", "cpu")
    want = plant(remote_out)
    dest = tmp_path / "out"
    proxy.throttle(40e6)  # about 5 s of transfer: several cuts land mid-file
    cuts = 0

    async def cutter() -> None:
        nonlocal cuts
        while True:
            await asyncio.sleep(2.0)
            if await asyncio.to_thread(proxy.reset):
                cuts += 1

    started = time.monotonic()
    before = proxy.bytes_forwarded
    chaos = asyncio.ensure_future(cutter())
    try:
        result = (await pull_dir(host.transport, host.agent, str(remote_out), dest)).to_json()
    finally:
        chaos.cancel()
        await host.transport.close()
    wire = proxy.bytes_forwarded - before
    assert sha_of(dest / "model.bin") == want
    assert cuts >= 2 and host.transport.reconnects >= 2, (cuts, time.monotonic() - started)
    assert result["bytes"]["moved"] == SIZE and result["files"][0]["sha256"] == want
    # each cut loses at most the requests in flight (24 MiB), not the file's start
    assert wire < SIZE + cuts * (32 << 20), f"{wire / SIZE:.2f}x the file crossed the link"
