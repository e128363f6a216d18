"""Benchmark the fault proxy itself, so the transfer benches measure the link, not the relay.

Three figures, each a ratio against a peer measured in the same minute:

1. raw TCP through the bare proxy (no delay, no rate) against the same bytes sent
   straight to the sink: the relay's own ceiling;
2. ``scp`` of one file through the bare proxy against ``scp`` straight to the same
   loopback sshd: what the relay costs an SSH transfer;
3. raw TCP through the emulated far link (default 80 ms RTT, 100 MB/s) against its
   nominal rate, and the measured round trip against the nominal RTT.

The proxy runs in its own process (``ProxyProcess``), as in the transfer benches.

    python scripts/bench_proxy.py                 # 1 GiB raw, 512 MiB scp, 80 ms / 100 MB/s
    python scripts/bench_proxy.py --size 256MiB --rtt 0.08 --rate 100e6
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_sync import CIPHER, parse_size  # noqa: E402
from tests.harness.faultproxy import ProxyProcess  # noqa: E402
from tests.harness.sshd import SSHD  # noqa: E402

BLOCK = b"\xa5" * (1 << 20)


class Sink:
    """A TCP server that counts what it receives and closes once the sender is done."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop:
            conn, _ = self.listener.accept()
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    @staticmethod
    def _drain(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(1 << 20):
                if data[:1] == b"p" and len(data) == 1:
                    conn.sendall(b"p")  # a ping: echo it


def blast(port: int, size: int) -> float:
    """Seconds to send ``size`` bytes and have the far side close (all of it delivered)."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        for _ in range(size // len(BLOCK)):
            sock.sendall(BLOCK)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)
    return time.perf_counter() - start


def ping(port: int, count: int = 5) -> float:
    """Median seconds for one byte there and back."""
    times = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            start = time.perf_counter()
            sock.sendall(b"p")
            sock.recv(1)
            times.append(time.perf_counter() - start)
            time.sleep(0.02)
    return sorted(times)[len(times) // 2]


def scp(cfg: Path, alias: str, src: Path, dest: str) -> float:
    start = time.perf_counter()
    argv = ["scp", "-q", "-F", str(cfg), "-c", CIPHER, str(src), f"{alias}:{dest}"]
    subprocess.run(argv, check=True)
    return time.perf_counter() - start


def mbps(size: int, seconds: float) -> str:
    return f"{size / seconds / 1e6:7.1f} MB/s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=1 << 30, help="raw TCP bytes (1GiB)")
    parser.add_argument("--scp-size", type=parse_size, default=512 << 20, help="scp file size")
    parser.add_argument("--rtt", type=float, default=0.08, help="far link round trip, seconds")
    parser.add_argument("--rate", type=float, default=100e6, help="far link bytes/s each way")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

    sink = Sink()
    direct = blast(sink.port, args.size)
    with ProxyProcess("127.0.0.1", sink.port) as proxy:
        relayed = blast(proxy.port, args.size)
    print(f"raw TCP direct        {mbps(args.size, direct)}")
    print(f"raw TCP, bare proxy   {mbps(args.size, relayed)}   {direct / relayed:.2f}x direct")

    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp_name:
        tmp = Path(tmp_name)
        server = SSHD(tmp / "sshd").start()
        try:
            src = tmp / "blob.bin"
            with open(src, "wb") as fh:
                for _ in range(args.scp_size // (8 << 20)):
                    fh.write(os.urandom(8 << 20))
            kh = server.write_known_hosts(tmp / "known_hosts")
            dest = str(server.home / "blob.bin")
            with ProxyProcess(server.host, server.port) as proxy:
                with open(kh, "a") as fh:
                    fh.write(server.known_hosts_line(f"[{server.host}]:{proxy.port}"))
                cfg = server.write_ssh_config(tmp / "ssh_config", "direct", known_hosts=kh)
                server.write_ssh_config(cfg, "relayed", known_hosts=kh, port=proxy.port)
                scp(cfg, "direct", src, dest)  # warm the page cache and the login
                straight = scp(cfg, "direct", src, dest)
                through = scp(cfg, "relayed", src, dest)
            print(f"scp direct            {mbps(args.scp_size, straight)}")
            print(
                f"scp, bare proxy       {mbps(args.scp_size, through)}   "
                f"{straight / through:.2f}x direct"
            )
        finally:
            server.cleanup()

    far = min(args.size, int(args.rate * 5))
    with ProxyProcess("127.0.0.1", sink.port, rtt=args.rtt, rate=args.rate) as proxy:
        rtt = ping(proxy.port)
        seconds = blast(proxy.port, far) - args.rtt  # first byte there, the close back
    print(
        f"far link {args.rtt * 1000:.0f} ms / {args.rate / 1e6:.0f} MB/s: measured RTT "
        f"{rtt * 1000:.1f} ms, one connection {mbps(far, seconds)} = "
        f"{far / seconds / args.rate:.2f}x nominal"
    )
    sink.stop = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
