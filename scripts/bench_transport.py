"""Benchmark: SFTP put through SSHTransport versus ``scp -c aes128-gcm@openssh.com``.

Both copy the same file to the same local test sshd (tests/harness), in one run,
and the script prints MB/s for each and the ratio. Why: asyncssh's SFTP speed
depends on block size and requests in flight; this is the evidence for the
values chosen in remotemac/transport/ssh.py.

    python scripts/bench_transport.py                # 1 GiB
    python scripts/bench_transport.py --size 64MiB --block-size 65536 --requests 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from remotemac.transport import ssh as ssh_mod  # noqa: E402
from remotemac.transport.options import SSHOptions  # noqa: E402
from remotemac.transport.ssh import SSHTransport  # noqa: E402
from tests.harness.sshd import SSHD  # noqa: E402

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)\s*([kmg]?)(i?b)?", text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 1GiB, 64MiB)")
    return int(match[1]) * _UNITS[match[2]]


def make_file(path: Path, size: int) -> None:
    """Incompressible data, so neither side can cheat with compression."""
    block = os.urandom(8 << 20)
    with open(path, "wb") as fh:
        left = size
        while left > 0:
            fh.write(block[: min(left, len(block))])
            left -= len(block)


async def sftp_put(transport: SSHTransport, src: Path, dst: str) -> float:
    start = time.perf_counter()
    await transport.put(str(src), dst)
    return time.perf_counter() - start


def scp_put(cfg: Path, alias: str, src: Path, dst: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        ["scp", "-q", "-F", str(cfg), "-c", "aes128-gcm@openssh.com", str(src), f"{alias}:{dst}"],
        check=True,
    )
    return time.perf_counter() - start


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=1 << 30, help="file size (1GiB)")
    parser.add_argument("--block-size", type=int, default=ssh_mod.SFTP_BLOCK_SIZE)
    parser.add_argument("--requests", type=int, default=ssh_mod.SFTP_MAX_REQUESTS)
    args = parser.parse_args()
    ssh_mod.SFTP_BLOCK_SIZE = args.block_size
    ssh_mod.SFTP_MAX_REQUESTS = args.requests

    with tempfile.TemporaryDirectory(prefix="rm-bench-") as tmp_name:
        tmp = Path(tmp_name)
        server = SSHD(tmp / "sshd").start()
        try:
            home = tmp / "home"
            home.mkdir()
            server.write_known_hosts(home / "known_hosts")
            user_kh = server.write_known_hosts(tmp / "user_known_hosts")
            cfg = server.write_ssh_config(tmp / "ssh_config", "bench", known_hosts=user_kh)
            src = tmp / "payload.bin"
            make_file(src, args.size)
            remote_dir = server.host_dir("remote")  # the lab host's user writes here
            async with SSHTransport(
                "bench", home_dir=home, options=SSHOptions(ssh_config=cfg)
            ) as transport:
                t_sftp = await sftp_put(transport, src, str(remote_dir / "sftp.bin"))
            if (remote_dir / "sftp.bin").stat().st_size != args.size:
                raise SystemExit("sftp copy has the wrong size")
            (remote_dir / "sftp.bin").unlink()
            t_scp = scp_put(cfg, "bench", src, str(remote_dir / "scp.bin"))
            if (remote_dir / "scp.bin").stat().st_size != args.size:
                raise SystemExit("scp copy has the wrong size")
        finally:
            server.cleanup()
    mib = args.size / (1 << 20)
    print(f"size {mib:.0f} MiB, block {args.block_size} B, {args.requests} requests in flight")
    print(f"remotemac sftp put : {t_sftp:7.2f} s  {mib / t_sftp:8.1f} MiB/s")
    print(f"scp aes128-gcm     : {t_scp:7.2f} s  {mib / t_scp:8.1f} MiB/s")
    print(f"ratio sftp/scp throughput: {t_scp / t_sftp:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
