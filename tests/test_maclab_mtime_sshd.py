"""Simulation: a same-size rewrite of a synced file on the Mac-shaped lab host's
whole-second file system (tests/harness/macfs.py: HFS+ dates) is seen by a re-sync.

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
    home, cfg, alias = ssh_env(server)
    data = tmp_path / "slice"
    data.mkdir()
    for i in range(3):
        (data / f"f{i}.bin").write_bytes(os.urandom(3000 + i))

    async def go() -> tuple:
        host = Host(
            SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)),
            server.home / "root",
            "mtime1",
            "",
        )
        await host.prepare()
        target = f"{host.run_dir}/data/f1.bin"
        env = [f"{k}={v}" for k, v in {"LANG": "C.UTF-8", **server.session_env()}.items()]
        watcher = subprocess.Popen(
            server.in_namespace(["env", "-i", *env, "python3", "-c", REWRITE, target]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _, first, _ = await host.sync(data, None)
            out, err = watcher.communicate(timeout=60)
        finally:
            if watcher.poll() is None:
                watcher.kill()
        assert "rewrote" in out, err
        _, again, stats = await host.sync(data, None, cache=MemoryHashCache())
        await host.transport.close()
        return host, first, again, stats

    host, first, again, stats = asyncio.run(go())
    assert first["mismatches"] == [], first
    assert again["mismatches"] == [], again
    assert stats.sent_files == 1 and stats.skipped_files == 2, stats
    for i in range(3):
        expected = hashlib.sha256((data / f"f{i}.bin").read_bytes()).hexdigest()
        assert _host_sha(server, f"{host.run_dir}/data/f{i}.bin") == expected
