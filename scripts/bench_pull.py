"""Benchmark: ``remotemac pull`` of results against scp and rsync of the same files.

Everything comes from the same loopback sshd of tests/harness (the machine plays both
laptop and host, so the two ends share its cores), once straight and once through
the fault proxy with a long link (``--rtt 0.08 --rate 100e6``: 80 ms round trip,
100 MB/s shared by every connection):

1. one large result (``--size``, 1 GiB), then ``--files`` small ones (2,000 files of
   the same total size): remotemac (listing with SHA-256 on the host, transfer,
   verification of every byte, rename into place) against ``scp -r`` and ``rsync -a``
   (which verify nothing end to end); ``--repeat N`` prints medians and ratios;
2. resume: a pull of the large file stopped when half of it has arrived, then pulled
   again; the share of the file that travels again (goal < 55 %);
3. the orchestrator's peak RSS (VmHWM, reset before each remotemac pull).

Every timing includes a fresh SSH connection, like scp's and rsync's.

    python scripts/bench_pull.py                          # 1 GiB, 2,000 files, both links
    python scripts/bench_pull.py --repeat 5
    python scripts/bench_pull.py --size 64MiB --files 200 --links loopback   # quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: the checkout whose remotemac is measured (an A/B runs this bench on main's code)
sys.path.insert(0, os.environ.get("RM_BENCH_CODE") or str(ROOT))

import remotemac  # noqa: E402
from remotemac.engine.agentclient import AgentClient  # noqa: E402
from remotemac.engine.pull import PART, pull_dir  # noqa: E402
from remotemac.transport.options import SSHOptions  # noqa: E402
from remotemac.transport.ssh import SSHTransport  # noqa: E402
from scripts.bench_sync import (  # noqa: E402
    CIPHER,
    BenchHost,
    Link,
    machine_cpu_s,
    parse_size,
    peak_rss_mib,
    reset_peak_rss,
)
from tests.harness.faultproxy import ProxyProcess  # noqa: E402
from tests.harness.sshd import SSHD  # noqa: E402


def write_random(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        left = size
        while left:
            block = min(left, 1 << 20)
            fh.write(os.urandom(block))
            left -= block


def make_results(src: Path, size: int, files: int) -> dict[str, Path]:
    """``one/model.bin`` of ``size`` bytes and ``many/`` with ``files`` files of the same total."""
    write_random(src / "one" / "model.bin", size)
    rng = random.Random(7)
    weights = [rng.uniform(0.5, 1.5) for _ in range(files)]
    scale = size / sum(weights)
    sizes = [int(w * scale) for w in weights]
    sizes[0] += size - sum(sizes)
    for i, n in enumerate(sizes):
        write_random(src / "many" / f"step{i // 100:02d}" / f"shard-{i:05d}.npy", n)
    return {"one file": src / "one", f"{files} files": src / "many"}


def make_proxy(server: SSHD, rtt: float, rate: float) -> ProxyProcess:
    """The fault proxy in its own process: it shares no GIL with the pull it carries."""
    return ProxyProcess(server.host, server.port, rtt=rtt, rate=rate).start()


class Bench(BenchHost):
    def __init__(self, tmp: Path, server: SSHD, agent_start: str = "claim") -> None:
        super().__init__(tmp, server)
        self.links: dict[str, Link] = {"loopback": self.loopback}
        self.host_root = str(server.home / "host-root")
        self.agent_start = agent_start

    def add_proxy(self, name: str, port: int) -> None:
        self.links[name] = self.proxied(port, name)

    def transport(self, link: str) -> SSHTransport:
        via = self.links[link]
        return SSHTransport(via.alias, home_dir=self.home, options=SSHOptions(ssh_config=via.cfg))

    async def install_agent(self) -> None:
        async with self.transport("loopback") as t:
            await AgentClient(t, self.host_root).call("ping", {})

    async def pull(
        self, link: str, src: Path, dest: Path, *, stop_at: float | None = None
    ) -> tuple[float, float, float, Any]:
        """(seconds with a fresh connection, of them the set-up's, peak RSS MiB, pull
        result) of one pull: the side pulled (a PulledSide), or ``{"part": bytes}`` when
        stopped half-way.

        The set-up is the connection and, with ``agent_start`` "claim", the agent
        started as ``remotemac pull RUN`` and a run start it (the root's claim, whose
        process goes on as the resident agent); with "call" the pull's first call
        starts it (a claim, then the resident agent on a second channel), inside the
        pull's own time.

        ``stop_at``: cancel the pull once that share of the (single) file is in its
        ``.rmpart``, as a laptop that loses power would leave it."""
        reset_peak_rss()
        start = time.perf_counter()
        async with self.transport(link) as t:
            agent = AgentClient(t, self.host_root)
            if self.agent_start == "claim":
                await agent.claim(then_resident=True)
            setup = time.perf_counter() - start
            job = pull_dir(t, agent, str(src), dest)
            if stop_at is None:
                result = await job
            else:
                result = await stop_when_half(job, dest, src, stop_at)
        return time.perf_counter() - start, setup, peak_rss_mib(), result

    def scp(self, link: str, src: Path, dest: Path, *extra: str) -> float:
        """OpenSSH's scp: the SFTP protocol (its default since 9.0; one file at a time)."""
        cfg, alias = self.links[link].cfg, self.links[link].alias
        start = time.perf_counter()
        subprocess.run(
            ["scp", *extra, "-q", "-r", "-F", str(cfg), "-c", CIPHER, f"{alias}:{src}", str(dest)],
            check=True,
        )
        return time.perf_counter() - start

    def scp_legacy(self, link: str, src: Path, dest: Path) -> float:
        """``scp -O``: the old scp protocol, one stream for the whole tree (no round trip
        per file: far faster than SFTP-mode scp for many files on a long link)."""
        return self.scp(link, src, dest, "-O")

    def rsync(self, link: str, src: Path, dest: Path) -> float:
        cfg, alias = self.links[link].cfg, self.links[link].alias
        start = time.perf_counter()
        subprocess.run(
            ["rsync", "-a", "-e", f"ssh -F {cfg} -c {CIPHER}", f"{alias}:{src}/", f"{dest}/"],
            check=True,
        )
        return time.perf_counter() - start


async def stop_when_half(job: Any, dest: Path, src: Path, share: float) -> dict[str, Any]:
    (name,) = [p.name for p in src.iterdir()]
    size = (src / name).stat().st_size
    part = dest / f".{name}{PART}"
    task = asyncio.ensure_future(job)
    while not (part.exists() and part.stat().st_size >= share * size):
        if task.done():
            raise SystemExit("the pull ended before it could be stopped half-way")
        await asyncio.sleep(0.005)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return {"part": part.stat().st_size}


def median_of(
    repeat: int, tool: Callable[[str, Path, Path], float], link: str, src: Path, local: Path
) -> tuple[float, float]:
    """The median time of ``repeat`` copies by ``tool`` into a fresh ``local``, and the
    median CPU seconds the machine (both ends) spent on one."""
    times, cpu = [], []
    for _ in range(repeat):
        shutil.rmtree(local, ignore_errors=True)
        local.mkdir()
        before = machine_cpu_s()
        times.append(tool(link, src, local))
        cpu.append(machine_cpu_s() - before)
    return statistics.median(times), statistics.median(cpu)


def fmt(seconds: float, size: int) -> str:
    return f"{seconds:7.2f} s {size / seconds / 1e6:7.1f} MB/s"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=1 << 30, help="bytes per shape (1GiB)")
    parser.add_argument("--files", type=int, default=2000, help="small files (2000)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure; medians (1)")
    parser.add_argument("--rtt", type=float, default=0.08, help="proxy round trip, s (0.08)")
    parser.add_argument("--rate", type=float, default=100e6, help="proxy bytes/s (100e6)")
    parser.add_argument("--links", default="loopback,proxy", help="loopback,proxy")
    parser.add_argument(
        "--agent-start",
        choices=("claim", "call"),
        default="claim",
        help="claim: the agent started as `remotemac pull RUN` starts it (default); "
        "call: by the pull's first call, on a second channel (the bench before issue 36)",
    )
    parser.add_argument(
        "--compare",
        default="scp,scp-O,rsync",
        help="tools to compare with, of scp (SFTP mode), scp-O (legacy), rsync; or none",
    )
    args = parser.parse_args()
    links = args.links.split(",")

    with tempfile.TemporaryDirectory(prefix="rm-bench-pull-", dir=os.environ.get("TMPDIR")) as t:
        tmp = Path(t)
        server = SSHD(tmp / "sshd").start()
        proxy = None
        try:
            bench = Bench(tmp, server, args.agent_start)
            shapes = make_results(server.home / "results", args.size, args.files)
            owner = server.home.stat()
            for path in [server.home / "results", *(server.home / "results").rglob("*")]:
                os.chown(path, owner.st_uid, owner.st_gid)
            await bench.install_agent()
            if "proxy" in links:
                proxy = make_proxy(server, args.rtt, args.rate)
                bench.add_proxy("proxy", proxy.port)
            print(
                f"results: {args.size / 2**20:.0f} MiB as one file and as {args.files} files; "
                f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; proxy: "
                f"{args.rtt * 1000:.0f} ms RTT, {args.rate / 1e6:.0f} MB/s "
                f"(its own process); medians of {args.repeat}; agent start: {args.agent_start}; "
                f"remotemac of {Path(remotemac.__file__).parent.parent}",
                flush=True,
            )
            local = tmp / "local"
            for link in links:
                for shape, src in shapes.items():
                    rm_times, setups, rss, rm_cpu = [], [], [], []
                    for _ in range(args.repeat):
                        shutil.rmtree(local, ignore_errors=True)
                        before = machine_cpu_s()
                        seconds, setup, peak, _ = await bench.pull(link, src, local)
                        rm_cpu.append(machine_cpu_s() - before)
                        rm_times.append(seconds)
                        setups.append(setup)
                        rss.append(peak)
                    t_rm = statistics.median(rm_times)
                    t_set = statistics.median(setups)
                    t_own = statistics.median(a - b for a, b in zip(rm_times, setups, strict=True))
                    limit = (
                        f" = {args.size / t_rm / args.rate:.2f}x the link"
                        if link != "loopback"
                        else ""
                    )
                    own = f" = {args.size / t_own / args.rate:.2f}x" if link != "loopback" else ""
                    print(
                        f"{link:8} {shape:11} remotemac {fmt(t_rm, args.size)}{limit}  "
                        f"(set-up {t_set:.2f} s, the pull itself {fmt(t_own, args.size).strip()}"
                        f"{own}); peak RSS {max(rss):.0f} MiB; CPU of both ends "
                        f"{statistics.median(rm_cpu):.2f} s",
                        flush=True,
                    )
                    tools = {"scp": bench.scp, "scp-O": bench.scp_legacy, "rsync": bench.rsync}
                    for tool in args.compare.split(","):
                        if tool in tools:
                            other, cpu = median_of(args.repeat, tools[tool], link, src, local)
                            print(
                                f"{link:8} {shape:11} {tool:9} {fmt(other, args.size)}  "
                                f"remotemac/{tool} {other / t_rm:.2f}; CPU of both ends "
                                f"{cpu:.2f} s",
                                flush=True,
                            )
            # resume: stopped half-way, pulled again
            for link in links:
                src = shapes["one file"]
                shutil.rmtree(local, ignore_errors=True)
                _, _, _, half = await bench.pull(link, src, local, stop_at=0.5)
                seconds, _, peak, result = await bench.pull(link, src, local)
                moved = result.bytes.moved or 0  # a PulledSide (engine.phaseresults)
                print(
                    f"{link:8} resume: stopped with {half['part'] / args.size:.0%} in .rmpart; "
                    f"the next pull sent {moved / args.size:.1%} of the file again "
                    f"(goal < 55%), reused {(result.bytes.reused or 0) / args.size:.1%}, "
                    f"{seconds:.2f} s, verified; peak RSS {peak:.0f} MiB",
                    flush=True,
                )
        finally:
            if proxy is not None:
                proxy.stop()
            server.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
