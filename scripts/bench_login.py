"""Benchmark: the round trips of remotemac's SSH connection and login, through the proxy.

One loopback sshd of tests/harness; ``--repeat`` fresh ``SSHTransport`` connections
(key exchange, strict host-key check, public-key login), straight and through the
fault proxy with a long round trip (``--rtt``, 200 ms by default, so that a round
trip dwarfs the machine's own work). The proxied time over the round trip is the
number of round trips the connection waits for (the proxy's own TCP handshake is
local: a real link adds one for TCP). ``RM_BENCH_CODE=<checkout>`` measures that
checkout's remotemac (an A/B against main).

    python scripts/bench_login.py
    RM_BENCH_CODE=/work/main python scripts/bench_login.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# bench_pull puts RM_BENCH_CODE first on the path: the remotemac measured is that one
from scripts.bench_pull import make_proxy, remotemac  # noqa: E402
from scripts.bench_sync import BenchHost, Link  # noqa: E402
from tests.harness.sshd import SSHD  # noqa: E402


async def connect_s(bench: BenchHost, link: Link) -> float:
    """Seconds for one fresh connection, login included, to be ready."""
    from remotemac.transport.options import SSHOptions
    from remotemac.transport.ssh import SSHTransport

    options = SSHOptions(ssh_config=link.cfg)
    start = time.perf_counter()
    async with SSHTransport(link.alias, home_dir=bench.home, options=options) as t:
        await t.connect()
        return time.perf_counter() - start


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt", type=float, default=0.2, help="proxy round trip, s (0.2)")
    parser.add_argument("--repeat", type=int, default=5, help="connections per link (5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rm-bench-login-") as t:
        tmp = Path(t)
        server = SSHD(tmp / "sshd").start()
        proxy = make_proxy(server, args.rtt, 100e6)
        try:
            bench = BenchHost(tmp, server)
            far = bench.proxied(proxy.port, "proxy")
            print(
                f"remotemac of {Path(remotemac.__file__).parent.parent}; "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            for link in (bench.loopback, far):
                times = [await connect_s(bench, link) for _ in range(args.repeat)]
                best, med = min(times), statistics.median(times)
                trips = f" = {med / args.rtt:.2f} round trips of {args.rtt * 1000:.0f} ms"
                print(
                    f"{link.name:8} connection and login: median {med:.3f} s, best {best:.3f} s"
                    + (trips if link is far else ""),
                    flush=True,
                )
        finally:
            proxy.stop()
            server.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
