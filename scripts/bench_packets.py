"""The SSH packet path alone: the laptop's CPU to send (or receive) N bytes on one channel.

What: N random bytes written through one exec channel of a loopback sshd into
``cat > /dev/null`` (``--way push``), or read from ``cat FILE`` on the host (``--way
pull``), by remotemac's SSH transport with its short data path (transport/fastdata.py)
and without it (asyncssh's own ``send_packet``), alternating in the same minutes; the
peer is OpenSSH's client moving the same bytes with the same cipher. The figure is the
laptop process's CPU (this process has no other work: the event loop, asyncssh, the
cipher) against the ``ssh`` client's, and the wall time of each.

Run: ``python scripts/bench_packets.py --size 256MiB --repeat 5 [--way pull] [--pin]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from remotemac.transport import sshconnect  # noqa: E402
from remotemac.transport.options import SSHOptions  # noqa: E402
from remotemac.transport.ssh import SSHTransport  # noqa: E402
from scripts.bench_sync import CIPHER, BenchHost, parse_size, pin_ends  # noqa: E402
from tests.harness.sshd import SSHD  # noqa: E402

CHUNK = 1 << 20


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


async def remotemac_copy(host: BenchHost, way: str, size: int, path: str, fast: bool) -> tuple:
    """(wall s, laptop CPU s) of one copy through remotemac's transport."""
    wanted = sshconnect.send_data_directly, sshconnect.receive_data_directly
    if not fast:
        sshconnect.send_data_directly = lambda conn: False  # type: ignore[assignment]
        sshconnect.receive_data_directly = lambda conn: False  # type: ignore[assignment]
    try:
        options = SSHOptions(ssh_config=host.loopback.cfg)
        async with SSHTransport(host.loopback.alias, home_dir=host.home, options=options) as t:
            argv = ["sh", "-c", "cat > /dev/null"] if way == "push" else ["cat", path]
            window = None if way == "push" else 16 << 20
            proc = await t.open_process(argv, window=window)
            block = os.urandom(CHUNK)
            cpu0, start = cpu_self(), time.perf_counter()
            if way == "push":
                for _ in range(size // CHUNK):
                    await proc.write(block)
                await proc.write_eof()
                await proc.wait()
            else:
                for _ in range(size // CHUNK):
                    await proc.readexactly(CHUNK)
                await proc.wait()
            return time.perf_counter() - start, cpu_self() - cpu0
    finally:
        sshconnect.send_data_directly, sshconnect.receive_data_directly = wanted


def ssh_copy(host: BenchHost, way: str, size: int, src: Path, path: str) -> tuple:
    """(wall s, ssh client CPU s) of the same bytes through OpenSSH's client."""
    ssh = ["ssh", "-F", str(host.loopback.cfg), "-c", CIPHER, host.loopback.alias]
    cpu0, start = cpu_children(), time.perf_counter()
    if way == "push":
        with open(src, "rb") as fh:
            subprocess.run([*ssh, "cat > /dev/null"], stdin=fh, check=True)
    else:
        subprocess.run([*ssh, f"cat {path}"], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start, cpu_children() - cpu0


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=parse_size("256MiB"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--way", choices=("push", "pull"), default="push")
    ap.add_argument("--pin", action="store_true", help="this process on core 0, sshd on 1")
    args = ap.parse_args()
    rows: dict[str, list[tuple[float, float]]] = {"fast": [], "asyncssh": [], "ssh": []}
    with tempfile.TemporaryDirectory(prefix="rm-packets-") as t:
        tmp = Path(t)
        server = SSHD(tmp / "sshd").start()
        try:
            if args.pin:
                pin_ends(server)
            host = BenchHost(tmp, server)
            src = tmp / "src.bin"
            src.write_bytes(os.urandom(args.size))
            remote = server.home / "packets.bin"
            subprocess.run(["cp", str(src), str(remote)], check=True)
            os.chmod(remote, 0o644)
            for _ in range(args.repeat):
                for fast in (True, False):
                    key = "fast" if fast else "asyncssh"
                    rows[key].append(
                        await remotemac_copy(host, args.way, args.size, str(remote), fast)
                    )
                rows["ssh"].append(ssh_copy(host, args.way, args.size, src, str(remote)))
        finally:
            server.cleanup()
    mib = args.size / (1 << 20)
    print(
        f"{args.way} of {mib:.0f} MiB on one channel, medians of {args.repeat}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    ssh_cpu = statistics.median(c for _, c in rows["ssh"])
    for key, vals in rows.items():
        wall = statistics.median(w for w, _ in vals)
        cpu = statistics.median(c for _, c in vals)
        print(
            f"  {key:9s} wall {wall:6.2f} s ({mib / wall:6.1f} MiB/s)  laptop CPU {cpu:5.2f} s"
            f"  = {cpu / ssh_cpu:4.2f}x ssh's   rounds: " + " ".join(f"{c:.2f}" for _, c in vals)
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
