"""The streamed pull (agent/pullops.py → engine/pullstream.py) over the real sshd fixture.

The host's sender is the host's to replace: here it is swapped for scripts that
break the protocol (a frame for a file not asked for, bytes past the listed size,
a damaged byte, an absurd frame length). Each must end in one IntegrityError
(exit 5) with nothing written outside ``--out`` and no half file renamed into place.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from remotemac.engine.pull import PART, pull_dir
from remotemac.errors import EXIT_INTEGRITY, IntegrityError
from tests.test_pull_sshd import host_with_model, pull_stopped_at
from tests.test_sync_sshd import files_under
from tests.test_sync_sshd import host_factory as host_factory  # the fixtures, shared
from tests.test_sync_sshd import runtime_dir as runtime_dir

pytestmark = pytest.mark.timeout(120)

#: a sender that answers pings like the real one, then runs MODE on the one file asked
HOSTILE_SENDER = """
import hashlib, json, struct, sys
F = struct.Struct(">cIQ")
out = sys.stdout.buffer
while True:
    req = json.loads(sys.stdin.readline())
    if not req.get("ping"):
        break
    out.write(F.pack(b"P", 0, 0)); out.flush()
(index, name_hex, offset, limit), = req["files"][:1]
data = open(req["dir"] + "/" + bytes.fromhex(name_hex).decode(), "rb").read()
good = hashlib.sha256(data[:limit]).digest()
{mode}
out.flush()
"""

MODES = {
    "a frame for a file it was not asked for": (
        "out.write(F.pack(b'D', index + 7, 4) + b'evil')\n"
        "out.write(F.pack(b'H', index + 7, 32) + hashlib.sha256(b'evil').digest())"
    ),
    "more bytes than the listed size": (
        "out.write(F.pack(b'D', index, limit + 1) + data[:limit] + b'X')\n"
        "out.write(F.pack(b'H', index, 32) + hashlib.sha256(data[:limit] + b'X').digest())"
    ),
    "a damaged byte under the right digest": (
        "bad = bytes([data[0] ^ 1]) + data[1:limit]\n"
        "out.write(F.pack(b'D', index, len(bad)) + bad + F.pack(b'H', index, 32) + good)"
    ),
    "a frame of a terabyte": "out.write(F.pack(b'D', index, 1 << 40) + data[:1000])",
    "an unknown frame": "out.write(F.pack(b'Q', index, 0))",
}


def hostile_sender(agent_dir: str, mode: str) -> None:
    """Replace the host's pull sender by one that runs ``mode`` on the first file asked."""
    Path(agent_dir, "pullops.py").write_text(HOSTILE_SENDER.replace("{mode}", mode))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", sorted(MODES))
async def test_a_sender_breaking_the_protocol_is_refused_and_writes_nothing_in_place(
    sshd, host_factory, tmp_path, mode
):
    host, remote_out, payload = await host_with_model(host_factory, sshd)
    hostile_sender(host.agent.agent_dir, MODES[mode])
    dest = tmp_path / "out" / "results" / "cpu"
    try:
        with pytest.raises(IntegrityError) as err:
            await pull_dir(host.transport, host.agent, str(remote_out), dest)
    finally:
        await host.transport.close()
    assert err.value.exit_code == EXIT_INTEGRITY
    assert "\n" not in err.value.line() and "Traceback" not in err.value.line()
    assert not (dest / "model.bin").exists()
    # nothing else anywhere under --out; a cut-short .rmpart never past the listed size
    for path in files_under(tmp_path / "out"):
        assert path == dest / f".model.bin{PART}", path
        assert path.stat().st_size <= len(payload)
        assert mode != "a damaged byte under the right digest", "the bad file was kept"


@pytest.mark.asyncio
async def test_the_stream_pulls_with_one_listing_and_no_sftp(
    sshd, host_factory, tmp_path, monkeypatch
):
    """The host hashes as it sends: one agent call (no second, hashed listing), and not
    a byte over SFTP; 300 small files and a large one, all verified."""
    host = await host_factory(sshd)
    remote_out = Path(host.run_dir, "out", "cpu")
    want = {}
    for i in range(300):
        data = os.urandom(100 + i * 37)
        (remote_out / f"d{i % 7}").mkdir(parents=True, exist_ok=True)
        (remote_out / f"d{i % 7}" / f"s{i:03d}.npy").write_bytes(data)
        want[f"d{i % 7}/s{i:03d}.npy"] = sha(data)
    big = os.urandom(20 << 20)
    (remote_out / "model.bin").write_bytes(big)
    want["model.bin"] = sha(big)
    (remote_out / "empty.txt").write_bytes(b"")
    want["empty.txt"] = sha(b"")
    await host.agent.install()

    async def no_sftp(*_a: object, **_k: object) -> int:
        raise AssertionError("a streamed pull read over SFTP")

    monkeypatch.setattr(host.transport, "download_to", no_sftp)
    calls = host.agent.calls
    dest = tmp_path / "out"
    try:
        result = (await pull_dir(host.transport, host.agent, str(remote_out), dest)).to_json()
    finally:
        await host.transport.close()
    assert host.agent.calls - calls == 1
    # the listing (every result's name) is not kept in the agent's call store, outside
    # the run dir and past its wipe
    store = Path(str(host.agent.store))
    assert store.is_dir() and not any(b"s000.npy" in p.read_bytes() for p in store.iterdir())
    assert {f["path"]: f["sha256"] for f in result["files"]} == want
    assert {str(p.relative_to(dest)): sha(p.read_bytes()) for p in files_under(dest)} == want
    assert result["bytes"]["moved"] == sum(len(b) for b in [big]) + sum(
        100 + i * 37 for i in range(300)
    )


@pytest.mark.asyncio
async def test_a_stale_part_file_is_fetched_again_and_a_complete_file_is_not(
    sshd, host_factory, tmp_path
):
    """Resume inside a file: a ``.rmpart`` whose prefix came from another version of the
    file fails the host's digest and the file comes again whole; a result already in
    place with the host's digest moves no byte."""
    host = await host_factory(sshd)
    remote_out = Path(host.run_dir, "out", "cpu")
    remote_out.mkdir(parents=True)
    new, done = os.urandom(6 << 20), os.urandom(1 << 20)
    (remote_out / "model.bin").write_bytes(new)
    (remote_out / "done.bin").write_bytes(done)
    (remote_out / "empty.txt").write_bytes(b"")
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "empty.txt").write_bytes(b"")
    (dest / f".model.bin{PART}").write_bytes(os.urandom(3 << 20))  # another version's half
    (dest / "done.bin").write_bytes(done)
    try:
        result = (await pull_dir(host.transport, host.agent, str(remote_out), dest)).to_json()
    finally:
        await host.transport.close()
    assert (dest / "model.bin").read_bytes() == new and (dest / "done.bin").read_bytes() == done
    assert not (dest / f".model.bin{PART}").exists() and (dest / "empty.txt").read_bytes() == b""
    assert len(result["files"]) == 3
    # the stale half was refused at its prefix check: it cost no byte on the wire
    assert result["bytes"] == {
        "total": len(new) + len(done),
        "moved": len(new),
        "reused": len(done),
    }


@pytest.mark.asyncio
async def test_a_cut_mid_file_resumes_over_the_stream_from_the_bytes_held(
    sshd, fault_proxy, host_factory, tmp_path, monkeypatch
):
    """Stopped half-way, the next pull asks the sender for the rest only (never SFTP)."""
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    remote_out = Path(host.run_dir, "out", "cpu")
    remote_out.mkdir(parents=True)
    payload = os.urandom(8 << 20)
    (remote_out / "big.bin").write_bytes(payload)

    async def no_sftp(*_a: object, **_k: object) -> int:
        raise AssertionError("a streamed pull read over SFTP")

    monkeypatch.setattr(host.transport, "download_to", no_sftp)
    dest = tmp_path / "out"
    part = dest / f".big.bin{PART}"
    proxy.throttle(3_000_000)
    try:
        had = await pull_stopped_at(host, remote_out, dest, part, 3 << 20)
        assert payload.startswith(part.read_bytes()) and 0 < had < len(payload)
        proxy.restore()
        await asyncio.sleep(0.5)  # what the cancelled channel had in flight drains first
        before = proxy.bytes_forwarded
        result = (await pull_dir(host.transport, host.agent, str(remote_out), dest)).to_json()
        wire = proxy.bytes_forwarded - before
    finally:
        await host.transport.close()
    assert (dest / "big.bin").read_bytes() == payload and not part.exists()
    assert result["bytes"] == {"total": len(payload), "moved": len(payload) - had, "reused": had}
    assert wire < len(payload) - had + (1 << 20)  # the held prefix did not travel again


@pytest.mark.asyncio
async def test_a_far_pull_grows_its_one_channel_window_in_place_and_a_cut_loses_nothing(
    sshd, fault_proxy, host_factory, tmp_path
):
    """Issue 36: over a 100 ms round trip the sender's channel opens once, its window is
    raised in place to what the round trip needs (no second channel, no second Python
    start on the host), and a cut mid-file after that resumes from the bytes held: every
    byte lands once, verified."""
    from remotemac.engine.pullstream import BASE_WINDOW, choose_window

    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    remote_out = Path(host.run_dir, "out", "cpu")
    remote_out.mkdir(parents=True)
    payload = os.urandom(48 << 20)
    (remote_out / "model.bin").write_bytes(payload)
    await host.agent.install()
    opened: list[int | None] = []
    grown: list[int] = []
    real_open = host.transport.open_process

    async def counting_open(argv: list[str], **kwargs: object):  # type: ignore[no-untyped-def]
        proc = await real_open(argv, **kwargs)  # type: ignore[arg-type]
        if "pullops.py" in " ".join(argv):
            opened.append(kwargs.get("window"))  # type: ignore[arg-type]
            real_grow = proc.grow_window

            def grow(size: int) -> bool:
                grown.append(size)
                return real_grow(size)

            proc.grow_window = grow  # type: ignore[method-assign]
        return proc

    host.transport.open_process = counting_open  # type: ignore[method-assign]
    dest = tmp_path / "out"
    part = dest / f".model.bin{PART}"
    proxy.rtt(0.1)
    proxy.throttle(30e6)
    try:
        task = asyncio.ensure_future(pull_dir(host.transport, host.agent, str(remote_out), dest))
        while not (part.exists() and part.stat().st_size >= 16 << 20):
            assert not task.done(), "the pull ended before the cut"
            await asyncio.sleep(0.01)
        assert await asyncio.to_thread(proxy.reset)
        result = (await asyncio.wait_for(task, 90)).to_json()
    finally:
        await host.transport.close()
    assert (dest / "model.bin").read_bytes() == payload and not part.exists()
    assert result["files"] == [{"path": "model.bin", "size": len(payload), "sha256": sha(payload)}]
    # each byte landed once: the held prefix was kept across the cut
    assert result["bytes"] == {"total": len(payload), "moved": len(payload), "reused": 0}
    assert host.transport.reconnects >= 1
    # first channel: the small window, raised in place once; after the cut: opened with it
    assert len(grown) == 1 and grown[0] >= choose_window(0.1) > BASE_WINDOW, grown
    assert opened == [BASE_WINDOW, grown[0]], opened


@pytest.mark.asyncio
async def test_a_pull_over_max_bytes_closes_the_sender_channel_it_opened_early(
    sshd, host_factory, tmp_path
):
    """The sender's channel opens while the listing is checked (issue 36): here while
    the side waits for the run's other side to list (``outputs.max_bytes`` is shared),
    which then leaves it too little; the pull is refused before a byte moves, the
    channel it opened is closed, and nothing is written."""
    from remotemac.engine.pull import OutputsTooLarge, SharedBudget

    host = await host_factory(sshd)
    remote_out = Path(host.run_dir, "out", "cpu")
    remote_out.mkdir(parents=True)
    (remote_out / "model.bin").write_bytes(os.urandom(2 << 20))
    await host.agent.install()
    opened, closed = [], []
    real_open = host.transport.open_process

    async def counting_open(argv: list[str], **kwargs: object):  # type: ignore[no-untyped-def]
        proc = await real_open(argv, **kwargs)  # type: ignore[arg-type]
        if "pullops.py" in " ".join(argv):
            opened.append(proc)
            real_close = proc.close

            async def close() -> None:
                closed.append(proc)
                await real_close()

            proc.close = close  # type: ignore[method-assign]
        return proc

    host.transport.open_process = counting_open  # type: ignore[method-assign]
    dest = tmp_path / "out"
    budget = SharedBudget(3 << 20, ["mps", "cpu"])
    try:
        task = asyncio.ensure_future(
            pull_dir(host.transport, host.agent, str(remote_out), dest, label="cpu", budget=budget)
        )
        for _ in range(500):  # the sender's channel opens while the side waits
            if opened or task.done():
                break
            await asyncio.sleep(0.01)
        assert len(opened) == 1 and not closed and not task.done()
        budget.note("mps", 2 << 20)  # the other side listed: 1 MiB is left for this one
        with pytest.raises(OutputsTooLarge) as caught:
            await task
        assert caught.value.exit_code == EXIT_INTEGRITY
        assert closed == opened  # opened early, closed unused
        assert not [p for p in dest.rglob("*") if p.is_file()]
        # refused at once (no shared budget to wait for): the channel, still opening
        # then, is closed once it is open, never cut off half-way
        with pytest.raises(OutputsTooLarge):
            await pull_dir(host.transport, host.agent, str(remote_out), dest, max_bytes=1 << 20)
        for _ in range(500):
            if len(closed) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(opened) == 2 and closed == opened
        # the link is fine afterwards: the same pull within the limit goes through
        result = (await pull_dir(host.transport, host.agent, str(remote_out), dest)).to_json()
    finally:
        await host.transport.close()
    assert [f["path"] for f in result["files"]] == ["model.bin"] and len(opened) == 3


@pytest.mark.asyncio
async def test_a_channel_whose_window_cannot_grow_in_place_is_asked_again_on_a_wider_one(
    sshd, fault_proxy, host_factory, tmp_path
):
    """The fallback of the in-place window (it reads asyncssh's private channel
    counters): should ``grow_window`` say it cannot, the pull asks again on a second
    channel opened with the window the round trip needs, and every byte lands once."""
    from remotemac.engine.pullstream import BASE_WINDOW, choose_window

    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    remote_out = Path(host.run_dir, "out", "cpu")
    remote_out.mkdir(parents=True)
    payload = os.urandom(8 << 20)
    (remote_out / "model.bin").write_bytes(payload)
    await host.agent.install()
    opened: list[int | None] = []
    real_open = host.transport.open_process

    async def no_growing_open(argv: list[str], **kwargs: object):  # type: ignore[no-untyped-def]
        proc = await real_open(argv, **kwargs)  # type: ignore[arg-type]
        if "pullops.py" in " ".join(argv):
            opened.append(kwargs.get("window"))  # type: ignore[arg-type]
            proc.grow_window = lambda size: False  # type: ignore[method-assign]
        return proc

    host.transport.open_process = no_growing_open  # type: ignore[method-assign]
    dest = tmp_path / "out"
    proxy.rtt(0.1)
    try:
        result = (
            await asyncio.wait_for(pull_dir(host.transport, host.agent, str(remote_out), dest), 90)
        ).to_json()
    finally:
        await host.transport.close()
    assert (dest / "model.bin").read_bytes() == payload
    assert result["bytes"] == {"total": len(payload), "moved": len(payload), "reused": 0}
    assert len(opened) == 2 and opened[0] == BASE_WINDOW, opened
    assert opened[1] is not None and opened[1] >= choose_window(0.1) > BASE_WINDOW, opened
