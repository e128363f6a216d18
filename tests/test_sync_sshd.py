"""Dataset sync over a real OpenSSH sshd: round trip, secrecy, resume, incremental, integrity.

The "host" is the loopback sshd of tests/harness, logged in as the fresh-host lab's
user (tests/harness/lab.py: a bare python3 3.9, no third-party module), so its
RAM-backed storage is /dev/shm and its disk is ``remote_root`` under the session's HOME.
The agent runs on that python3 and decrypts with the agent runtime it installed.
"""

from __future__ import annotations

import asyncio
import collections
import glob
import hashlib
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from remotemac.agent import datarecords
from remotemac.data.manifest import MemoryHashCache
from remotemac.engine.agentclient import AgentClient
from remotemac.engine.pull import pull_dir
from remotemac.engine.runtime import ensure_runtime
from remotemac.engine.sync import SyncStats, sync_slice
from remotemac.errors import EXIT_INTEGRITY, HostError, HostKeyError, IntegrityError
from remotemac.events import PhaseProgress
from remotemac.transport.options import SSHOptions
from remotemac.transport.ssh import SSHTransport
from tests.harness.sshd import SSHD

pytestmark = pytest.mark.timeout(120)

SENTINEL = b"PLAINTEXT-SENTINEL-7f3a9c"


class Host:
    """One connected sshd host with the agent installed and a prepared run directory."""

    def __init__(self, transport: SSHTransport, root: Path, run_id: str, runtime_dir: str) -> None:
        self.transport, self.root, self.run_id = transport, root, run_id
        self.agent = AgentClient(transport, str(root))
        self.run_dir = ""
        self.runtime_dir = runtime_dir

    async def prepare(self) -> Host:
        await self.transport.connect()
        answer = await self.agent.call(
            "prepare_run", {"root": str(self.root), "run_id": self.run_id}
        )
        self.run_dir = answer["run_dir"]
        return self

    async def sync(self, data: Path, key: bytes | None, cache=None, events=None, **kw):
        paths = sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file())
        emit = kw.pop("emit", events.append if events is not None else None)
        return await sync_slice(
            self.transport,
            self.agent,
            root=data,
            paths=paths,
            run_dir=self.run_dir,
            run_id=self.run_id,
            key=key,
            runtime_dir=self.runtime_dir,
            cache=cache,
            emit=emit,
            **kw,
        )


@pytest.fixture(scope="module")
def runtime_dir(tmp_path_factory, client_key, fresh_host_lab) -> Iterator[str]:
    """The agent runtime (cryptography), installed once on the lab host by the agent's
    own python3: these tests are about the stream, test_agent_runtime.py about the runtime.
    Every lab sshd logs in as the same user, so each test's host can read it."""
    work = tmp_path_factory.mktemp("rt-sshd")
    server = SSHD(work / "sshd", client_key=client_key).start()
    try:
        home = work / "rmhome"
        home.mkdir()
        (home / "known_hosts").write_text(server.known_hosts_line())
        cfg = server.write_ssh_config(work / "ssh_config", "rt", known_hosts=work / "kh")

        async def install() -> str:
            async with SSHTransport(
                "rt", home_dir=home, options=SSHOptions(ssh_config=cfg)
            ) as transport:
                agent = AgentClient(transport, str(server.host_dir("runtime") / "root"))
                return str((await ensure_runtime(agent, home=None, method="online")).dir)

        yield asyncio.run(install())
    finally:
        server.cleanup()


@pytest.fixture
def host_factory(ssh_env, tmp_path, request, runtime_dir):
    """``await host_factory(sshd, proxy=None)``; removes the run's /dev/shm store afterwards."""
    made: list[Host] = []

    async def make(server, proxy=None, run_id: str | None = None) -> Host:
        home, cfg, alias = ssh_env(server, proxy)
        rid = run_id or f"t{os.getpid()}-{len(made)}-{abs(hash(request.node.name)) % 10**8}"
        host = Host(
            SSHTransport(
                alias, home_dir=home, options=SSHOptions(ssh_config=cfg, reconnect_deadline=30)
            ),
            server.home / f"host-root-{len(made)}",
            rid,
            runtime_dir,
        )
        made.append(host)
        return await host.prepare()

    yield make
    for host in made:
        shutil.rmtree(f"/dev/shm/remotemac-{host.run_id}", ignore_errors=True)


def make_slice(
    root: Path,
    small: int = 30,
    small_size: int = 20_000,
    big: int = 1,
    big_size: int = 3 << 20,
    sentinel: bool = True,
) -> Path:
    """Many small files and a few large ones, each with the sentinel somewhere inside."""
    for i in range(small):
        path = root / f"d{i % 3}" / f"s{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(
            os.urandom(small_size // 2)
            + (SENTINEL if sentinel else b"")
            + os.urandom(small_size // 2)
        )
    for i in range(big):
        (root / f"big{i}.bin").write_bytes(
            os.urandom(big_size // 2) + SENTINEL + os.urandom(big_size // 2)
        )
    (root / "empty.txt").write_bytes(b"")
    return root


def files_under(root: Path) -> list[Path]:
    return [Path(d) / n for d, _, names in os.walk(root) for n in names]


def grep_tree(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in files_under(root) if p.is_file() and needle in p.read_bytes()]


class Watcher(threading.Thread):
    """Polls ``ps -ww -eo args`` (full width) and every readable /proc/*/environ while a sync runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.ps: list[str] = []
        self.environ: list[bytes] = []
        self.saw_agent = False

    def run(self) -> None:
        while not self.stop.is_set():
            out = subprocess.run(
                ["ps", "-ww", "-eo", "args"], capture_output=True, text=True
            ).stdout
            self.ps.extend(out.splitlines())
            self.saw_agent |= "dataops.py sync" in out
            for path in glob.glob("/proc/[0-9]*/environ"):
                try:
                    with open(path, "rb") as fh:
                        self.environ.append(fh.read())
                except OSError:
                    continue
            self.ready.set()
            self.stop.wait(0.02)


@pytest.mark.asyncio
async def test_round_trip_plaintext_only_in_ram_key_nowhere(
    sshd, fault_proxy, host_factory, tmp_path
):
    data = make_slice(tmp_path / "data", big_size=6 << 20)
    key = os.urandom(32)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.throttle(4_000_000)  # about two seconds: the watcher sees the agent at work
    watcher = Watcher()
    watcher.start()
    watcher.ready.wait(10)
    try:
        manifest, answer, stats = await host.sync(data, key)
    finally:
        watcher.stop.set()
        watcher.join()
    try:
        assert answer["ram"]["kind"] == "shm" and answer["data_dir"].startswith("/dev/shm/")
        assert stats.sent_files == stats.files == len(manifest.entries) == 32
        # what the workload reads is exactly the plaintext, from RAM
        for entry in manifest.entries:
            ram_copy = Path(answer["data_dir"], entry.path).read_bytes()
            assert ram_copy == (data / entry.path).read_bytes()
        # the host's disk has ciphertext only; neither the plaintext nor the key is there
        src = Path(host.run_dir, "data")
        records = datarecords.load_records(str(src))
        assert sorted(records) == sorted(e.path for e in manifest.entries)
        # small files rest packed (each sealed on its own), large ones as <path>.rmenc
        packs = list((src / datarecords.PACKS).iterdir())
        own = [p for p in files_under(host.root / "runs") if p.name.endswith(".rmenc")]
        assert len(own) == len([r for r in records.values() if not r.get("pack")])
        assert 1 <= len(packs) < len(records) - len(own)
        assert grep_tree(src / datarecords.PACKS, SENTINEL) == []
        assert grep_tree(host.root, SENTINEL) == []
        assert grep_tree(host.root, key.hex().encode()) == [] and grep_tree(host.root, key) == []
        # nor in any process's argv or environment, nor tmux's global environment
        assert watcher.saw_agent, "the watcher never saw the agent running"
        assert not [line for line in watcher.ps if key.hex() in line]
        assert not [env for env in watcher.environ if key.hex().encode() in env]
        tmux = await host.transport.exec(["sh", "-c", "tmux show-environment -g 2>&1; true"])
        assert key.hex() not in tmux.text()
        # ... and back: the host copies what it decrypted into an output dir, we pull it
        out_dir = f"{host.run_dir}/out/cpu"
        await host.transport.exec(["cp", "-r", answer["data_dir"] + "/.", out_dir], check=True)
        pulled = (
            await pull_dir(host.transport, host.agent, out_dir, tmp_path / "results")
        ).to_json()
        assert len(pulled["files"]) == 32 and pulled["skipped"] == []
        for entry in manifest.entries:
            assert (tmp_path / "results" / entry.path).read_bytes() == (
                data / entry.path
            ).read_bytes()
    finally:
        await host.transport.close()


@pytest.mark.asyncio
async def test_cut_link_resumes_without_resending_verified_files(
    sshd, fault_proxy, host_factory, tmp_path
):
    data = make_slice(tmp_path / "data", small=40, small_size=200_000, big=0)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.throttle(6_000_000)
    events: list = []
    cut = []

    def on_event(event) -> None:
        events.append(event)
        acked = sum(1 for e in events if isinstance(e, PhaseProgress) and e.unit == "verified")
        if acked >= 12 and not cut:
            cut.append(acked)
            proxy.cut()

    stats = SyncStats()
    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32), emit=on_event, stats=stats)
    finally:
        await host.transport.close()
    assert cut, "the link was never cut"
    assert stats.attempts == 2 and host.transport.link_stats().reconnects >= 1
    # every file verified exactly once: nothing verified before the cut was sent again
    counts = collections.Counter(stats.acked)
    assert set(counts) == {e.path for e in manifest.entries} and max(counts.values()) == 1
    # the second attempt sent only what the first had not got verified
    verified_first = {e.path: e.size for e in manifest.entries if e.path in stats.acked[: cut[0]]}
    assert stats.skipped_files >= len(verified_first) >= 12
    ciphertext_all = sum(e.size + 200 for e in manifest.entries)  # + header, tag, frame
    assert stats.per_attempt[1] <= ciphertext_all - sum(verified_first.values())
    assert answer["mismatches"] == []


@pytest.mark.asyncio
async def test_cancelled_sync_then_rerun_skips_verified_files(
    sshd, fault_proxy, host_factory, tmp_path
):
    data = make_slice(tmp_path / "data", small=30, small_size=200_000, big=0)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.throttle(5_000_000)
    key = os.urandom(32)
    first = SyncStats()
    task = asyncio.ensure_future(host.sync(data, key, stats=first))
    while len(first.acked) < 8:
        await asyncio.sleep(0.02)
        assert not task.done(), "sync finished before it could be interrupted"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    verified_before = set(first.acked)
    proxy.restore()
    try:
        _, answer, second = await host.sync(data, key)
    finally:
        await host.transport.close()
    assert second.skipped_files >= len(verified_before) and not verified_before & set(second.acked)
    assert second.sent_files == second.files - second.skipped_files
    assert answer["mismatches"] == [] and answer["pruned"] == 0


@pytest.mark.asyncio
async def test_resync_unchanged_sends_under_one_percent(sshd, host_factory, tmp_path):
    data = make_slice(tmp_path / "data", small=100, small_size=30_000, big=1)
    key = os.urandom(32)
    cache = MemoryHashCache()
    host = await host_factory(sshd)
    try:
        _, _, cold = await host.sync(data, key, cache=cache)
        _, answer, again = await host.sync(data, key, cache=cache)
        assert again.sent_bytes < cold.sent_bytes / 100 and again.sent_files == 0
        assert cache.hits >= again.files  # nothing was hashed again either
        # one file changes, one leaves the slice: only the change travels; the leaver is pruned
        (data / "d0" / "s000.bin").write_bytes(b"new content")
        (data / "d1" / "s001.bin").unlink()
        manifest, answer, third = await host.sync(data, key, cache=cache)
        assert third.sent_files == 1 and third.acked == ["d0/s000.bin"]
        assert answer["pruned"] == 1  # its RAM copy (its ciphertext: a span of a pack in use)
        assert sorted(p.name for p in Path(answer["data_dir"]).rglob("*") if p.is_file()) == sorted(
            Path(e.path).name for e in manifest.entries
        )
        # a new local journal (no hash cache) still sends nothing: it hashes, the host agrees
        _, _, fresh = await host.sync(data, key, cache=MemoryHashCache())
        assert fresh.sent_files == 0 and fresh.skipped_files == fresh.files
    finally:
        await host.transport.close()


@pytest.mark.asyncio
async def test_packed_small_files_resync_prune_and_decrypt_again(sshd, host_factory, tmp_path):
    """Small files' ciphertext rests in packs (one per write-behind group, each file sealed on
    its own, the record naming pack, offset and length). A re-sync that rewrites every
    file records them in new packs and removes the packs no record names any more; a
    file that leaves the slice leaves its pack to the files still in it; after a
    "reboot" (RAM emptied) every file is decrypted again from its span of a pack, and
    the full check (prepare_data) reads the same spans."""
    data = make_slice(tmp_path / "data", small=60, small_size=30_000, big=0, sentinel=False)
    key = os.urandom(32)
    host = await host_factory(sshd)
    src = Path(host.run_dir, "data")
    try:
        manifest, answer, cold = await host.sync(data, key)
        records = datarecords.load_records(str(src))
        first = {r["pack"] for r in records.values()}
        assert all(records.values()) and 2 <= len(first) <= 6 and len(records) == 61
        assert not [p for p in files_under(src) if p.name.endswith(".rmenc")]
        # every file rewritten: new packs, the old ones gone (no record names them)
        for path in data.rglob("*.bin"):
            path.write_bytes(os.urandom(30_000))
        manifest, answer, again = await host.sync(data, key)
        assert again.sent_files == 60 and answer["mismatches"] == []
        now = {p.name for p in (src / datarecords.PACKS).iterdir()}
        records = datarecords.load_records(str(src))
        assert now & first == {"".join(sorted(first & now))} - {""}  # at most empty.txt's
        assert {r["pack"] for r in records.values()} == now
        # one file leaves: its RAM copy goes, its pack stays for the others in it
        leaver = records["d1/s001.bin"]["pack"]
        (data / "d1" / "s001.bin").unlink()
        manifest, answer, _ = await host.sync(data, key)
        assert answer["pruned"] == 1 and (src / datarecords.PACKS / leaver).exists()
        # the host "rebooted": every file is decrypted again from its span of a pack
        shutil.rmtree(answer["data_dir"])
        manifest, answer, after = await host.sync(data, key)
        assert after.sent_files == 0 and answer["redecrypted"] == len(manifest.entries) == 60
        for entry in manifest.entries:
            assert (
                Path(answer["data_dir"], entry.path).read_bytes()
                == (data / entry.path).read_bytes()
            )
        full = await host.agent.call(
            "prepare_data",
            {
                "run_dir": host.run_dir,
                "run_id": host.run_id,
                "src": str(src),
                "encrypted": True,
                "key_hex": key.hex(),
                "runtime_dir": host.runtime_dir,
                "manifest": [e.__dict__ for e in manifest.entries],
            },
        )
        assert full["mismatches"] == []
    finally:
        await host.transport.close()


@pytest.mark.asyncio
async def test_tampered_ciphertext_on_host_is_exit_5(sshd, host_factory, tmp_path):
    data = make_slice(tmp_path / "data", small=5, big=0)
    key = os.urandom(32)
    host = await host_factory(sshd)
    try:
        manifest, answer, _ = await host.sync(data, key)
        src = Path(host.run_dir, "data")
        rec = datarecords.load_records(str(src))["d1/s001.bin"]
        victim, off, _ = datarecords.stored_span(str(src), rec, True)
        blob = bytearray(Path(victim).read_bytes())
        blob[off + 200] ^= 0x01  # one byte inside its span of the pack
        Path(victim).write_bytes(bytes(blob))
        # the full check (prepare_data) decrypts the stored ciphertext again
        full = await host.agent.call(
            "prepare_data",
            {
                "run_dir": host.run_dir,
                "run_id": host.run_id,
                "src": f"{host.run_dir}/data",
                "encrypted": True,
                "key_hex": key.hex(),
                "runtime_dir": host.runtime_dir,
                "manifest": [e.__dict__ for e in manifest.entries],
            },
        )
        assert [m["path"] for m in full["mismatches"]] == ["d1/s001.bin"]
        # the host "rebooted": RAM is empty, so the sync must decrypt what is stored, and fails
        shutil.rmtree(answer["data_dir"])
        with pytest.raises(IntegrityError) as err:
            await host.sync(data, key)
    finally:
        await host.transport.close()
    assert err.value.exit_code == EXIT_INTEGRITY == 5
    line = err.value.line()
    assert "\n" not in line and "d1/s001.bin" in line and "tampered or damaged" in line


@pytest.mark.asyncio
async def test_no_ram_store_is_one_clear_line(sshd, host_factory, tmp_path):
    data = make_slice(tmp_path / "data", small=2, big=0)
    host = await host_factory(sshd)
    squatter = Path(f"/dev/shm/remotemac-{host.run_id}")
    squatter.write_text("someone else's file")
    try:
        with pytest.raises(HostError) as err:
            await host.sync(data, os.urandom(32))
    finally:
        await host.transport.close()
        squatter.unlink()
    line = err.value.line()
    assert "\n" not in line and "RAM" in line and "not our own directory" in line
    assert "Traceback" not in line


def test_sealed_stream_hashes_what_it_sends(tmp_path):
    """The sha256 sent after each frame is the plaintext's, read once with the encryption."""
    from remotemac.agent.streamcrypt import decrypt_stream
    from remotemac.engine.syncpieces import next_batch, read_pieces
    from remotemac.engine.syncplan import Job, LocalFile

    data = make_slice(tmp_path / "data", small=3, big=0)
    key = os.urandom(32)
    files = [
        LocalFile(str(p.relative_to(data)), p.stat().st_size, 0, 0, None)
        for p in sorted(data.rglob("*"))
        if p.is_file()
    ]
    work = collections.deque(Job(i, None, None) for i in range(len(files)))
    pieces = read_pieces(data, files, work, key)
    stream = b""
    while (batch := next_batch(pieces)).data:
        stream += batch.data
    import io

    src = io.BytesIO(stream)
    for f in files:
        header = src.read(13)
        length = int.from_bytes(header[5:], "big")
        out = io.BytesIO()
        decrypt_stream(key, f.path, src, out, limit=length)
        plain = (data / f.path).read_bytes()
        assert out.getvalue() == plain and src.read(32) == hashlib.sha256(plain).digest()
    assert src.read() == b""


async def _cut_after(proxy, nbytes: int) -> None:
    """Cut every link once the proxy has forwarded ``nbytes`` more (the host got them)."""
    start = proxy.bytes_forwarded
    while proxy.bytes_forwarded - start < nbytes:
        await asyncio.sleep(0.005)
    proxy.cut()


def _partials(host: Host) -> list[str]:
    return sorted(os.listdir(Path(host.run_dir) / "data" / ".remotemac-partial"))


@pytest.mark.asyncio
async def test_big_file_cut_halfway_resumes_inside_the_file(
    sshd, fault_proxy, host_factory, tmp_path
):
    """Before in-file resume the second attempt resent the whole file (~100 %)."""
    size = 96 << 20
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.bin").write_bytes(os.urandom(size))
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.throttle(30_000_000)
    stats = SyncStats()
    cutter = asyncio.ensure_future(_cut_after(proxy, size // 2))
    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32), stats=stats)
    finally:
        cutter.cancel()
        await host.transport.close()
    assert cutter.done() and stats.attempts == 2 and host.transport.reconnects >= 1
    assert stats.resumed_files == 1 and stats.resumed_bytes >= size * 0.4
    assert stats.per_attempt[1] < size * 0.55, stats.per_attempt
    assert answer["mismatches"] == [] and stats.acked == ["train.bin"]
    held = Path(answer["data_dir"]) / "train.bin"
    assert hashlib.sha256(held.read_bytes()).hexdigest() == manifest.entries[0].sha256
    assert _partials(host) == []  # the kept part became the stored ciphertext


@pytest.mark.asyncio
async def test_cut_partial_is_invisible_and_a_changed_file_starts_afresh(
    sshd, fault_proxy, host_factory, tmp_path
):
    """The kept part is ciphertext outside the data dir; a file changed since it was cut
    (same size, new bytes and mtime) is not resumed: sent whole, the stale part dropped."""
    size = 32 << 20
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.bin").write_bytes(
        os.urandom(size // 4) + SENTINEL + os.urandom(size - size // 4 - len(SENTINEL))
    )
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.throttle(20_000_000)
    key = os.urandom(32)
    cutter = asyncio.ensure_future(_cut_after(proxy, size // 2))
    try:
        with pytest.raises(HostError):
            await host.sync(data, key, max_attempts=1)
        for _ in range(200):  # the host's receiver sees the cut and exits
            if (
                "dataops.py sync"
                not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
            ):
                break
            await asyncio.sleep(0.05)
        kept = _partials(host)
        assert len(kept) == 2 and {Path(k).suffix for k in kept} == {".rmenc", ".json"}
        part_dir = Path(host.run_dir) / "data" / ".remotemac-partial"
        assert grep_tree(part_dir, SENTINEL) == []  # kept as ciphertext (the sentinel was sent)
        assert os.path.getsize(next(part_dir.glob("*.rmenc"))) > size // 3
        ram = Path(f"/dev/shm/remotemac-{host.run_id}")
        assert [p for p in files_under(ram) if "train" in p.name] == []  # no plaintext part
        (data / "train.bin").write_bytes(os.urandom(size))
        proxy.restore()
        manifest, answer, again = await host.sync(data, key)
    finally:
        cutter.cancel()
        await host.transport.close()
    assert again.resumed_files == 0 and again.per_attempt[0] > size
    assert answer["mismatches"] == [] and _partials(host) == []
    held = Path(answer["data_dir"]) / "train.bin"
    assert held.read_bytes() == (data / "train.bin").read_bytes()


@pytest.mark.asyncio
async def test_several_streams_keep_one_consistent_record(sshd, host_factory, tmp_path):
    """Three receivers at once: every file verified once, the record whole (a re-sync
    sends nothing), the plaintext right."""
    data = make_slice(tmp_path / "data", small=60, small_size=100_000, big=3, big_size=4 << 20)
    key = os.urandom(32)
    host = await host_factory(sshd)
    try:
        manifest, answer, stats = await host.sync(data, key, streams=3)
        _, _, again = await host.sync(data, key, cache=MemoryHashCache())
    finally:
        await host.transport.close()
    assert stats.streams == 3 and answer["mismatches"] == []
    counts = collections.Counter(stats.acked)
    assert set(counts) == {e.path for e in manifest.entries} and max(counts.values()) == 1
    assert again.sent_files == 0 and again.skipped_files == again.files
    record = (Path(host.run_dir) / "data" / ".verified.jsonl").read_text().splitlines()
    assert len(record) == len(manifest.entries)
    for entry in manifest.entries:
        held = (Path(answer["data_dir"]) / entry.path).read_bytes()
        assert hashlib.sha256(held).hexdigest() == entry.sha256


@pytest.mark.asyncio
async def test_a_push_right_after_a_login_sizes_its_streams_by_the_links_round_trip(
    sshd, host_factory, tmp_path, monkeypatch
):
    """A fresh login then at once a push of one 48 MiB file on loopback: one stream,
    sized by a sub-millisecond round trip. Right after a login sshd's last packets sit
    behind Nagle (it sets TCP_NODELAY only for interactive sessions) until the laptop
    acknowledges, and a laptop that delays its ACK made every probe sent then read
    43 ms: six streams and the file split in pieces on loopback. Both guards are
    checked: the ACK sent at once (transport/coalesce.py), and, with that switched off,
    the one more probe sent behind the first ones (engine/synctalk.py)."""
    from remotemac.transport import coalesce

    (tmp_path / "data").mkdir()
    data = make_slice(tmp_path / "data", small=0, big=1, big_size=48 << 20)
    for quickack in (coalesce.TCP_QUICKACK, None):
        monkeypatch.setattr(coalesce, "TCP_QUICKACK", quickack)
        host = await host_factory(sshd)
        agent_dir = host.agent.agent_dir or await host.agent.install()
        await host.transport.close()
        t = host.transport
        fresh = SSHTransport(t.spec, home_dir=t.home_dir, options=t.options)
        host.transport, host.agent = fresh, AgentClient(fresh, str(host.root))
        host.agent.agent_dir = agent_dir
        try:
            await fresh.connect()  # and the sync at once, as a run's first push does
            _, answer, stats = await host.sync(data, os.urandom(32))
        finally:
            await fresh.close()
        assert answer["mismatches"] == []
        assert stats.rtt_ms is not None and stats.rtt_ms < 20, (quickack, stats.rtt_ms)
        assert stats.streams == 1, (quickack, stats.streams)


@pytest.mark.asyncio
async def test_a_round_trip_right_after_a_login_is_the_links_own(sshd, ssh_env):
    """The first keepalive round trip after a login on loopback takes milliseconds,
    not the 40 ms of a delayed ACK (see the test above; transport/coalesce.py)."""
    home, cfg, alias = ssh_env(sshd)
    async with SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)) as t:
        first = await t.round_trip()
    assert first is not None and first < 0.03, first


@pytest.mark.asyncio
async def test_long_round_trip_opens_more_streams(sshd, fault_proxy, host_factory, tmp_path):
    """At ~80 ms RTT one channel's 2 MiB window caps it near 13-25 MB/s: auto opens more
    (as many as 40 MiB of files pays for: 8 MiB a stream; too short a push for the
    tuner to probe past them)."""
    data = make_slice(tmp_path / "data", small=8, small_size=3 << 20, big=2, big_size=8 << 20)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.latency(0.04)
    try:
        _, answer, stats = await host.sync(data, os.urandom(32))
    finally:
        await host.transport.close()
    assert stats.rtt_ms is not None and stats.rtt_ms >= 70
    assert stats.streams == 5 and answer["mismatches"] == []


@pytest.mark.asyncio
async def test_a_changed_key_on_the_second_connection_stops_the_sync(
    sshd, fault_proxy, host_factory, tmp_path, monkeypatch
):
    """The second connection checks the host key as strictly as the first: a changed key
    there is the run's HostKeyError, not "fewer streams". (The changed key is a stand-in:
    the spare link's connect raises what hostkeys.py raises for a mismatch; the first
    connection, the streams and the receiver are real.)"""
    data = make_slice(tmp_path / "data", small=1, big=9, big_size=8 << 20)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.latency(0.04)
    proxy.throttle(12_000_000)  # (the second login lands while files are still queued)

    class ChangedKey(SSHTransport):
        async def connect(self) -> None:
            raise HostKeyError(f"{self.name}: the host key changed")

    real = SSHTransport.spare_link
    monkeypatch.setattr(
        SSHTransport,
        "spare_link",
        lambda self: ChangedKey(self.spec, home_dir=self.home_dir, options=real(self).options),
    )
    try:
        with pytest.raises(HostKeyError, match="host key changed"):
            await host.sync(data, os.urandom(32), streams=9)
    finally:
        await host.transport.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("second_login", ["allowed", "refused"])
async def test_a_long_fat_link_opens_streams_on_a_second_connection(
    sshd, fault_proxy, host_factory, tmp_path, second_login
):
    """80 ms RTT, 72 MiB in nine 8 MiB files (and a small one), nine streams asked for (the
    count a tuner's probe reaches, or ``--streams 9``): one connection gives six, the
    other three come on a second SSH connection through the same link (the proxy counts
    it). A host that refuses the second login gets the sync done on the first
    connection's six."""
    data = make_slice(tmp_path / "data", small=1, big=9, big_size=8 << 20)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.latency(0.04)
    proxy.throttle(12_000_000)  # (the second login lands while files are still queued)
    logins = proxy.accepted
    proxy.refuse(second_login == "refused")
    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32), streams=9)
    finally:
        proxy.refuse(False)
        await host.transport.close()
    assert answer["mismatches"] == [] and len(stats.acked) == len(manifest.entries)
    if second_login == "allowed":
        assert (stats.streams, stats.spare_streams, proxy.accepted - logins) == (9, 3, 1)
    else:
        assert (stats.streams, stats.spare_streams, proxy.accepted - logins) == (6, 0, 1)
    for entry in manifest.entries:
        held = (Path(answer["data_dir"]) / entry.path).read_bytes()
        assert hashlib.sha256(held).hexdigest() == entry.sha256
    record = (Path(host.run_dir) / "data" / ".verified.jsonl").read_text().splitlines()
    assert len(record) == len(manifest.entries)


@pytest.mark.asyncio
async def test_cut_during_several_streams_resumes_each_big_file(
    sshd, fault_proxy, host_factory, tmp_path
):
    """Three streams, three big files cut mid-way: the next attempt continues each one
    (on whichever channel takes it), and everything verifies."""
    data = make_slice(tmp_path / "data", small=6, small_size=50_000, big=3, big_size=12 << 20)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.latency(0.02)  # 40 ms RTT: three streams
    proxy.throttle(20_000_000)
    proxy.cut_after(20 << 20)
    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32))
    finally:
        await host.transport.close()
    assert stats.attempts == 2 and stats.streams == 3, stats  # (the last attempt's: 17 MiB)
    assert stats.resumed_files >= 2 and stats.resumed_bytes >= 10 << 20
    assert answer["mismatches"] == [] and _partials(host) == []
    for entry in manifest.entries:
        held = (Path(answer["data_dir"]) / entry.path).read_bytes()
        assert hashlib.sha256(held).hexdigest() == entry.sha256


def _receivers_under(root: Path) -> list[int]:
    """Pids of the sync receivers (``dataops … sync``) whose agent lives under ``root``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        script = [a for a in argv if a.endswith(b"/dataops.py")]
        if script and b"sync" in argv and str(root).encode() in script[0]:
            pids.append(int(entry))
    return pids


@pytest.mark.asyncio
async def test_a_receiver_killed_mid_group_loses_no_file_and_resends_none_acked(
    sshd, fault_proxy, host_factory, tmp_path
):
    """The receiver keeps small files read whole and their record lines for a group (up
    to ~1 MiB, and until the next acks line); SIGKILL there loses them unrecorded and
    unacknowledged. The sync resumes on its own: every file is verified exactly once
    (none the laptop saw acknowledged is sent again), the record holds each file once,
    no part file is left, and every RAM copy hashes as on the laptop."""
    data = make_slice(tmp_path / "data", small=90, small_size=60_000, big=0)
    proxy = fault_proxy(sshd)
    host = await host_factory(sshd, proxy)
    proxy.throttle(4_000_000)  # ~1.4 s for the slice: the kill lands while files arrive
    killed: list[int] = []
    acked_at_kill: list[str] = []
    stats = SyncStats()

    def on_event(event) -> None:
        verified = isinstance(event, PhaseProgress) and event.unit == "verified"
        if verified and not killed and len(stats.acked) >= 20:
            acked_at_kill.extend(stats.acked)
            for pid in _receivers_under(host.root):
                os.kill(pid, 9)
                killed.append(pid)

    try:
        manifest, answer, stats = await host.sync(data, os.urandom(32), emit=on_event, stats=stats)
    finally:
        await host.transport.close()
    assert killed, "no receiver was killed"
    assert stats.attempts >= 2 and answer["mismatches"] == []
    counts = collections.Counter(stats.acked)
    assert set(counts) == {e.path for e in manifest.entries} and max(counts.values()) == 1
    assert stats.skipped_files >= len(acked_at_kill) >= 20  # none acked before was resent
    record = (Path(host.run_dir) / "data" / ".verified.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["path"] for line in record) == sorted(
        e.path for e in manifest.entries
    )
    leftovers = [
        str(p)
        for d in (Path(host.run_dir) / "data", Path(answer["data_dir"]))
        for p in d.rglob("*")
        if ".part-" in p.name
    ]
    assert leftovers == []
    for entry in manifest.entries:
        held = (Path(answer["data_dir"]) / entry.path).read_bytes()
        assert hashlib.sha256(held).hexdigest() == entry.sha256
