"""Pulling results from a hostile host over a real sshd: nothing lands outside ``--out``.

The host is the loopback sshd of tests/harness, logged in as the fresh-host lab's user. "Hostile" means its output directory
holds links, a FIFO and a symlinked directory, and its agent (which the host
controls) is replaced by one that lies in its listing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path

import pytest

from remotemac.engine import pull
from remotemac.engine.pull import pull_dir
from remotemac.errors import EXIT_INTEGRITY, IntegrityError
from tests.test_sync_sshd import files_under
from tests.test_sync_sshd import host_factory as host_factory  # the fixtures, shared
from tests.test_sync_sshd import runtime_dir as runtime_dir

pytestmark = pytest.mark.timeout(120)

CANARY = b"canary: must survive\n"


def plant(out: Path, outside: Path) -> None:
    """A real output dir with everything a hostile host can put in it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "good.txt").write_bytes(b"a real result\n")
    (out / "sub").mkdir()
    (out / "sub" / "nested.json").write_text(json.dumps({"value": 1}))
    os.symlink(outside / "canary.txt", out / "evil")  # a link to a file outside
    os.mkfifo(out / "pipe")
    (outside / "secretdir").mkdir()
    (outside / "secretdir" / "secret.txt").write_bytes(b"outside secret\n")
    os.symlink(outside / "secretdir", out / "linkdir")  # a symlinked directory


def hostile_agent(agent_dir: str, entries: list[dict]) -> None:
    """Replace the host's agent by one whose ``list_outputs`` answers ``entries``."""
    Path(agent_dir, "hostagent.py").write_text(
        "import json, sys\n"
        f"ENTRIES = json.loads({json.dumps(json.dumps(entries))})\n"
        "sys.stdin.read()\n"
        "print(json.dumps({'ok': True, 'result': {'entries': ENTRIES}}))\n"
    )


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def snapshot(root: Path, skip: Path) -> dict[str, bytes]:
    return {
        str(p): p.read_bytes()
        for p in files_under(root)
        if skip not in p.parents
        and p.is_file()
        and not p.is_symlink()
        and "host-root" not in str(p)
    }


async def host_with_model(host_factory, sshd) -> tuple:
    """A host with the agent installed and a 3 MiB ``out/cpu/model.bin`` to pull:
    (host, its output dir, the file's bytes)."""
    host = await host_factory(sshd)
    remote_out = Path(host.run_dir, "out", "cpu")
    remote_out.mkdir(parents=True)
    payload = os.urandom(3 << 20)
    (remote_out / "model.bin").write_bytes(payload)
    await host.agent.install()
    return host, remote_out, payload


async def pull_stopped_at(host, remote_out: Path, dest: Path, part: Path, at_bytes: int) -> int:
    """Start a pull of ``remote_out`` and cancel it once ``part`` holds ``at_bytes``: the
    bytes it holds then (the link is throttled by the caller so the pull can be caught)."""
    task = asyncio.ensure_future(pull_dir(host.transport, host.agent, str(remote_out), dest))
    while not (part.exists() and part.stat().st_size >= at_bytes):
        assert not task.done(), "the pull ended before it could be interrupted"
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return part.stat().st_size


@pytest.mark.asyncio
@pytest.mark.parametrize("way", ["small, over sftp", "streamed"])
async def test_real_listing_skips_links_fifo_and_linked_dirs(
    sshd, host_factory, tmp_path, monkeypatch, way
):
    """Both ways down: a small pull over SFTP (issue 36), and the sender's stream (the
    way of a bigger one: the small-pull limit set to nothing)."""
    if way == "streamed":
        monkeypatch.setattr(pull, "SMALL_PULL_BYTES", -1)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_bytes(CANARY)
    host = await host_factory(sshd)
    remote_out = Path(host.run_dir, "out", "cpu")
    plant(remote_out, outside)
    dest = tmp_path / "out" / "results" / "cpu"
    try:
        result = (await pull_dir(host.transport, host.agent, str(remote_out), dest)).to_json()
    finally:
        await host.transport.close()
    assert sorted(f["path"] for f in result["files"]) == ["good.txt", "sub/nested.json"]
    assert {s["path"] for s in result["skipped"]} == {"'evil'", "'pipe'", "'linkdir'"}
    assert sorted(str(p.relative_to(dest)) for p in files_under(dest)) == [
        "good.txt",
        "sub/nested.json",
    ]
    assert not any(p.is_symlink() for p in files_under(dest))
    assert (outside / "canary.txt").read_bytes() == CANARY


@pytest.mark.asyncio
async def test_lying_agent_cannot_write_outside_out(sshd, host_factory, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_bytes(CANARY)
    host = await host_factory(sshd)
    remote_out = Path(host.run_dir, "out", "cpu")
    plant(remote_out, outside)
    good = (remote_out / "good.txt").read_bytes()
    evil = sha(b"overwritten")
    lies = [
        {"path": "good.txt", "kind": "file", "size": len(good), "sha256": sha(good)},
        {"path": "../../escape", "kind": "file", "size": 3, "sha256": evil},
        {"path": "/" + str(outside / "abs-escape"), "kind": "file", "size": 3, "sha256": evil},
        {"path": "sub/../../../escape2", "kind": "file", "size": 3, "sha256": evil},
        {"path": "evil", "kind": "file", "size": len(CANARY), "sha256": sha(CANARY)},
        {"path": "pipe", "kind": "file", "size": 0, "sha256": sha(b"")},
        {"path": "linkdir", "kind": "dir", "size": 0},
        {
            "path": "linkdir/secret.txt",
            "kind": "file",
            "size": 15,
            "sha256": sha(b"outside secret\n"),
        },
        {"path": "a\\..\\..\\b", "kind": "file", "size": 1, "sha256": evil},
        {"path": "nul\x00name", "kind": "file", "size": 1, "sha256": evil},
        {"path": "dev", "kind": "device", "size": 0},
        {"path": ".good.txt.rmpart", "kind": "file", "size": 1, "sha256": evil},
        {"path": "noshape", "kind": "file"},
        "not even a dict",
    ]
    await host.agent.install()
    host.agent.resident = False  # the lying agent is a one-shot script
    hostile_agent(host.agent.agent_dir, lies)
    dest = tmp_path / "out" / "results" / "cpu"
    before = snapshot(tmp_path, tmp_path / "out")
    try:
        result = (await pull_dir(host.transport, host.agent, str(remote_out), dest)).to_json()
    finally:
        await host.transport.close()
    assert [f["path"] for f in result["files"]] == ["good.txt"]
    assert len(result["skipped"]) == len(lies) - 2  # all but good.txt and the linkdir "dir"
    # nothing new or changed anywhere outside --out; the canary survives
    assert snapshot(tmp_path, tmp_path / "out") == before
    assert (outside / "canary.txt").read_bytes() == CANARY
    assert not (tmp_path / "escape").exists() and not (outside / "abs-escape").exists()
    assert [str(p.relative_to(tmp_path / "out")) for p in files_under(tmp_path / "out")] == [
        "results/cpu/good.txt"
    ]


@pytest.mark.asyncio
async def test_checksum_mismatch_is_exit_5_and_leaves_no_part_file(sshd, host_factory, tmp_path):
    """Over SFTP (the fallback) the sum comes from the hashed listing; a streamed pull's
    own checksum failure is tests/test_pull_stream_sshd.py's."""
    host, remote_out, payload = await host_with_model(host_factory, sshd)
    # the listing was made, then the file changed before the transfer
    host.agent.resident = False  # the lying agent is a one-shot script
    hostile_agent(
        host.agent.agent_dir,
        [{"path": "model.bin", "kind": "file", "size": len(payload), "sha256": sha(b"before")}],
    )
    dest = tmp_path / "out" / "results" / "cpu"
    try:
        with pytest.raises(IntegrityError) as err:
            await pull_dir(host.transport, host.agent, str(remote_out), dest, sftp=True)
    finally:
        await host.transport.close()
    assert err.value.exit_code == EXIT_INTEGRITY
    assert "\n" not in err.value.line() and "model.bin" in err.value.line()
    assert files_under(tmp_path / "out") == []  # no .rmpart, no half file


@pytest.mark.asyncio
async def test_interrupted_pull_continues_from_its_part_file(
    sshd, fault_proxy, host_factory, tmp_path
):
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    remote_out = Path(host.run_dir, "out", "cpu")
    remote_out.mkdir(parents=True)
    payload = os.urandom(6 << 20)
    (remote_out / "big.bin").write_bytes(payload)
    dest = tmp_path / "out"
    part = dest / ".big.bin.rmpart"
    proxy.throttle(3_000_000)
    try:
        had = await pull_stopped_at(host, remote_out, dest, part, 2 << 20)
        assert 0 < had < len(payload) and not (dest / "big.bin").exists()
        proxy.restore()
        result = (await pull_dir(host.transport, host.agent, str(remote_out), dest)).to_json()
    finally:
        await host.transport.close()
    assert (dest / "big.bin").read_bytes() == payload and not part.exists()
    assert result["downloaded"] == len(payload) - had  # only the rest travelled
