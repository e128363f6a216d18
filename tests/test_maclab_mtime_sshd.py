"""Simulation: a same-size rewrite of a synced file on the Mac-shaped lab host's
whole-second file systems (tests/harness/macfs.py: HFS+ dates) is seen by a re-sync:
a public copy in ``remote_root`` (the HFS+-rules home) and the decrypted RAM copy of a
sensitive file on the RAM disk (the volume ``hdiutil``/``diskutil`` made).

Why over the lab: the unit test (tests/test_sync_mtime.py) wraps ``os.lstat`` to
truncate times; here the FUSE volume itself gives 1-second times, and the rewrite is
a process on the host (a workload editing its input the moment it lands).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from remotemac.data.manifest import MemoryHashCache
from remotemac.engine.runtime import ensure_runtime
from remotemac.transport.options import SSHOptions
from remotemac.transport.ssh import SSHTransport
from tests.test_sync_sshd import Host

pytestmark = [pytest.mark.timeout(300), pytest.mark.e2e]

#: on the host: wait (2 ms polls) for the file to land, then flip its first 16 bytes
#: in place (same size) and exit
REWRITE = """
import os, sys, time
path, end = sys.argv[1], time.time() + 120
while time.time() < end:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        time.sleep(0.002)
        continue
    head = os.read(fd, 16)
    os.lseek(fd, 0, 0)
    os.write(fd, bytes(b ^ 0xFF for b in head))
    os.close(fd)
    print("rewrote", time.time(), flush=True)
    break
"""


def _watch(server, target: str) -> subprocess.Popen[str]:
    """REWRITE of ``target`` on the host (in its namespace, as its user), started now."""
    env = [f"{k}={v}" for k, v in {"LANG": "C.UTF-8", **server.session_env()}.items()]
    return subprocess.Popen(
        server.in_namespace(["env", "-i", *env, "python3", "-c", REWRITE, target]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _sync_rewrite_resync(server, ssh, data: Path, run_id: str, key: bytes | None, target):
    """Prepare run ``run_id``, sync ``data`` while REWRITE waits for ``target(host)`` to
    land, then sync again with an empty hash cache: (host, first, again, stats)."""
    home, cfg, alias = ssh
    host = Host(
        SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)),
        server.home / "root",
        run_id,
        "",
    )
    await host.prepare()
    if key is not None:  # the agent runtime decrypts
        host.runtime_dir = (await ensure_runtime(host.agent, home=None, method="online")).dir
    watcher = _watch(server, target(host))
    try:
        _, first, _ = await host.sync(data, key)
        out, err = watcher.communicate(timeout=60)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert "rewrote" in out, err
    _, again, stats = await host.sync(data, key, cache=MemoryHashCache())
    await host.transport.close()
    return host, first, again, stats


def _host_sha(server, path: str) -> str:
    proc = server.run_as_user(
        [
            "python3",
            "-c",
            "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())",
            path,
        ]
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_mac_host_same_size_rewrite_within_the_second_is_resent(
    mac_sshd_factory, ssh_env, tmp_path: Path
):
    """Simulation: a public slice lands in ``remote_root`` on the HFS+-rules home; a host
    process rewrites one file (same size) the moment it lands, within the second it was
    recorded in; the next sync resends that file and only it, and the host then holds
    the laptop's bytes."""
    server = mac_sshd_factory()
    data = tmp_path / "slice"
    data.mkdir()
    for i in range(3):
        (data / f"f{i}.bin").write_bytes(os.urandom(3000 + i))

    host, first, again, stats = asyncio.run(
        _sync_rewrite_resync(
            server, ssh_env(server), data, "mtime1", None, lambda h: f"{h.run_dir}/data/f1.bin"
        )
    )
    assert first["mismatches"] == [], first
    assert again["mismatches"] == [], again
    assert stats.sent_files == 1 and stats.skipped_files == 2, stats
    for i in range(3):
        expected = hashlib.sha256((data / f"f{i}.bin").read_bytes()).hexdigest()
        assert _host_sha(server, f"{host.run_dir}/data/f{i}.bin") == expected


def test_mac_host_same_size_rewrite_of_a_ram_copy_within_the_second_is_decrypted_again(
    mac_sshd_factory, ssh_env, tmp_path: Path
):
    """Simulation: a sensitive slice is decrypted onto the RAM disk (HFS+ rules, 1-second
    times); a host process rewrites one RAM copy (same size) the moment it lands, within
    the second it was recorded in; the next sync sends nothing (the stored ciphertext is
    whole) but decrypts that copy again, and only it: the job then reads the laptop's
    bytes."""
    server = mac_sshd_factory()
    data = tmp_path / "slice"
    data.mkdir()
    for i in range(3):
        (data / f"s{i}.bin").write_bytes(os.urandom(3000 + i))
    key = os.urandom(32)
    run_id = "mtime2"

    _, first, again, stats = asyncio.run(
        _sync_rewrite_resync(
            server,
            ssh_env(server),
            data,
            run_id,
            key,
            lambda _h: f"/Volumes/remotemac-{run_id}/s1.bin",
        )
    )
    ram = first["ram"]
    assert (ram["kind"], ram["path"]) == ("ramdisk", f"/Volumes/remotemac-{run_id}"), ram
    assert first["mismatches"] == [] and again["mismatches"] == [], (first, again)
    assert again["data_dir"] == ram["path"], again
    assert stats.sent_files == 0 and stats.skipped_files == 3, stats
    assert again["redecrypted"] == 1, again
    for i in range(3):
        expected = hashlib.sha256((data / f"s{i}.bin").read_bytes()).hexdigest()
        assert _host_sha(server, f"{ram['path']}/s{i}.bin") == expected
