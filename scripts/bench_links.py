"""Benchmark: issue 36's far links in one table, push and pull, as x the link's own rate.

For each far link (80 ms / 100 MB/s, 40 ms / 125 MB/s, 150 ms / 50 MB/s: the fault
proxy in its own process in front of the loopback sshd of tests/harness, the two ends
sharing this machine's cores), ``--repeat`` rounds of:

- push shape A (``--size`` bytes in 16–256 KiB files) and shape B (three large
  files): ``bench_sync.Bench.sync``, a cold encrypted push with a fresh connection;
- pull of one file and of ``--files`` files of the same total: ``bench_pull.Bench.pull``,
  a fresh connection and the agent's claim, then ``pull_dir``.

Each cell is the median of the rounds as x the link's rate (``size / seconds /
rate``), with a fresh connection, and in brackets after it: the push without its
connection's set-up, the pull from the listing on (as a run's pull phase, its
connection and agent up). The load (1-minute average) is printed per round and
as a range per link.

    python scripts/bench_links.py                  # 1 GiB, medians of 3 (long)
    python scripts/bench_links.py --quick          # 256 MiB, one round
    RM_BENCH_CODE=/work/main python scripts/bench_links.py --quick   # main's code
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# bench_pull puts RM_BENCH_CODE first on the path: the remotemac measured is that one
from scripts import bench_pull, bench_sync  # noqa: E402
from tests.harness.faultproxy import ProxyProcess  # noqa: E402
from tests.harness.sshd import SSHD  # noqa: E402


@dataclass(frozen=True)
class FarLink:
    rtt: float  # s
    rate: float  # bytes/s

    @property
    def name(self) -> str:
        return f"{self.rtt * 1000:.0f} ms / {self.rate / 1e6:.0f} MB/s"


#: the far links issue 36 names
LINKS = (FarLink(0.08, 100e6), FarLink(0.04, 125e6), FarLink(0.15, 50e6))
CASES = ("push A", "push B", "pull one file", "pull files")


@dataclass
class Cell:
    """The rounds of one case over one link: (fresh, after the set-up) as x the link."""

    fresh: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)

    def add(self, link: FarLink, size: int, seconds: float, setup: float) -> None:
        self.fresh.append(size / seconds / link.rate)
        self.after.append(size / (seconds - setup) / link.rate)

    def text(self) -> str:
        if not self.fresh:
            return "-"
        return f"{statistics.median(self.fresh):.2f}x ({statistics.median(self.after):.2f}x)"


class Links:
    """One sshd, the push's and the pull's benches on it, a proxy per far link."""

    def __init__(self, tmp: Path, size: int, files: int) -> None:
        self.tmp, self.size = tmp, size
        self.server = SSHD(tmp / "sshd").start()
        (tmp / "push").mkdir()
        (tmp / "pull").mkdir()
        self.push = bench_sync.Bench(tmp / "push", self.server)
        self.pulls = bench_pull.Bench(tmp / "pull", self.server)
        self.shapes = {s: bench_sync.make_shape(tmp / f"shape-{s}", s, size) for s in "AB"}
        results = self.server.home / "results"
        self.results = bench_pull.make_results(results, size, files)
        owner = self.server.home.stat()
        for path in [results, *results.rglob("*")]:
            os.chown(path, owner.st_uid, owner.st_gid)
        self.proxies: dict[FarLink, ProxyProcess] = {}
        self.push_links: dict[FarLink, bench_sync.Link] = {}

    async def start(self, links: tuple[FarLink, ...]) -> None:
        await self.pulls.install_agent()
        for link in links:
            proxy = bench_pull.make_proxy(self.server, link.rtt, link.rate)
            self.proxies[link] = proxy
            self.push_links[link] = self.push.proxied(proxy.port, link.name)
            self.pulls.add_proxy(link.name, proxy.port)

    def stop(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()
        for run_id in list(self.push.run_dirs):
            self.push.drop_run(run_id)
        self.server.cleanup()

    async def run(self, link: FarLink, case: str, round_no: int) -> tuple[float, float]:
        """One case over one link: (seconds with a fresh connection, of them the set-up)."""
        if case.startswith("push "):
            shape = case[-1]
            return await self.push_once(link, shape, f"{shape}{round_no}")
        one, many = self.results  # "one file", "N files"
        return await self.pull_once(link, one if case == "pull one file" else many)

    async def push_once(self, link: FarLink, shape: str, tag: str) -> tuple[float, float]:
        """(seconds with a fresh connection, of them the connection's set-up)."""
        run_id = f"links-{os.getpid()}-{tag}"  # (/dev/shm is shared with other benches)
        data = self.tmp / f"shape-{shape}"
        try:
            seconds, _ = await self.push.sync(
                data, self.shapes[shape], run_id, self.push_links[link]
            )
        finally:
            self.push.drop_run(run_id)
        return seconds, self.push.connect_s

    async def pull_once(self, link: FarLink, shape: str) -> tuple[float, float]:
        """(seconds with a fresh connection, of them the connection and the agent's claim)."""
        local = self.tmp / "local"
        shutil.rmtree(local, ignore_errors=True)
        try:
            seconds, setup, _, _ = await self.pulls.pull(link.name, self.results[shape], local)
        finally:
            shutil.rmtree(local, ignore_errors=True)
        return seconds, setup


async def measure(args: argparse.Namespace, links: tuple[FarLink, ...]) -> None:
    with tempfile.TemporaryDirectory(prefix="rm-bench-links-", dir=os.environ.get("TMPDIR")) as t:
        bench = Links(Path(t), args.size, args.files)
        many = list(bench.results)[1]  # "N files"
        try:
            await bench.start(links)
            print(
                f"{args.size / 2**20:.0f} MiB per case: push A = {len(bench.shapes['A'])} files, "
                f"push B = 3 files, pull one file and {args.files} files; "
                f"{os.cpu_count()} cores shared by both ends; medians of {args.repeat}; "
                f"remotemac of {Path(bench_pull.remotemac.__file__).parent.parent}",
                flush=True,
            )
            cells = {(link, case): Cell() for link in links for case in CASES}
            loads: dict[FarLink, list[float]] = {link: [] for link in links}
            for r in range(args.repeat):
                for link in links:
                    for case in CASES:
                        loads[link].append(os.getloadavg()[0])
                        seconds, setup = await bench.run(link, case, r)
                        cells[link, case].add(link, args.size, seconds, setup)
                        print(
                            f"  round {r + 1} {link.name:17} {case:13} {seconds:6.2f} s "
                            f"(set-up {setup:.2f} s) = {args.size / seconds / link.rate:.2f}x "
                            f"the link, load {loads[link][-1]:.1f}",
                            flush=True,
                        )
            print_table(cells, loads, links, args, many)
        finally:
            bench.stop()


def print_table(
    cells: dict[tuple[FarLink, str], Cell],
    loads: dict[FarLink, list[float]],
    links: tuple[FarLink, ...],
    args: argparse.Namespace,
    many: str,
) -> None:
    heads = [c if c != "pull files" else f"pull {many}" for c in CASES]
    print(
        f"\nmedians of {args.repeat}, {args.size / 2**20:.0f} MiB, x the link's rate with a "
        "fresh connection (in brackets: the push after its connection's set-up, the pull "
        "from the listing on); goal >= 0.90x"
    )
    print(f"| link | {' | '.join(heads)} | load |")
    print("|" + "---|" * (len(heads) + 2))
    for link in links:
        row = " | ".join(cells[link, case].text() for case in CASES)
        print(f"| {link.name} | {row} | {min(loads[link]):.1f}–{max(loads[link]):.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=bench_sync.parse_size, default=1 << 30, help="(1GiB)")
    parser.add_argument("--files", type=int, default=2000, help="files of the pull (2000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians printed (3)")
    parser.add_argument("--quick", action="store_true", help="256MiB, one round")
    parser.add_argument(
        "--links", default="80,40,150", help="the far links by round trip in ms (80,40,150)"
    )
    args = parser.parse_args()
    if args.quick:
        args.size, args.repeat = 256 << 20, 1
    wanted = {int(ms) for ms in args.links.split(",")}
    links = tuple(link for link in LINKS if round(link.rtt * 1000) in wanted)
    asyncio.run(measure(args, links))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
