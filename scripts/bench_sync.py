"""Benchmark: remotemac's encrypted dataset sync against scp and rsync, in one run.

Everything goes to the same loopback sshd of tests/harness (the machine plays both
laptop and host, so the two ends share its cores):

1. cold sync of a slice (many small files and a few large ones): remotemac
   (hash + encrypt + send + store + decrypt into /dev/shm + verify) against
   ``scp -c aes128-gcm@openssh.com -r`` and ``rsync -a -e 'ssh -c aes128-gcm…'``
   of the same plaintext (which neither encrypt at rest nor verify);
2. re-sync after 1% of the files changed, against rsync's re-sync;
3. a cold sync through the fault proxy throttled to 20 MB/s, against that link rate;
4. the orchestrator's peak RSS (VmHWM, reset before each measurement) for each,
   and optionally for a separate, larger slice (``--rss-size 2GiB``).

Every remotemac timing includes a fresh SSH connection, like scp's and rsync's.

    python scripts/bench_sync.py                       # 1 GiB slice, 200 MiB throttled
    python scripts/bench_sync.py --rss-size 2GiB
    python scripts/bench_sync.py --size 128MiB --throttle-size 32MiB   # quick look
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from remotemac.data.manifest import MemoryHashCache  # noqa: E402
from remotemac.engine.agentclient import AgentClient  # noqa: E402
from remotemac.engine.runtime import ensure_runtime  # noqa: E402
from remotemac.engine.sync import sync_slice  # noqa: E402
from remotemac.transport.options import SSHOptions  # noqa: E402
from remotemac.transport.ssh import SSHTransport  # noqa: E402
from tests.harness.faultproxy import FaultProxy  # noqa: E402
from tests.harness.sshd import SSHD  # noqa: E402

CIPHER = "aes128-gcm@openssh.com"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)\s*([kmg]?)(i?b)?", text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 1GiB, 64MiB)")
    return int(match[1]) * _UNITS[match[2]]


def make_slice(root: Path, size: int, small_share: float = 0.3, big_files: int = 3) -> list[str]:
    """Incompressible files: ``small_share`` of the bytes in 16–256 KiB files, the rest large."""
    rng = random.Random(0)
    block = os.urandom(8 << 20)
    paths = []

    def write(rel: str, n: int) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            left = n
            while left > 0:
                start = rng.randrange(0, len(block) - min(left, len(block)) + 1)
                piece = block[start : start + min(left, len(block))]
                fh.write(piece)
                left -= len(piece)
        paths.append(rel)

    small_left = int(size * small_share)
    i = 0
    while small_left > 0:
        n = min(small_left, rng.randrange(16 << 10, 256 << 10))
        write(f"shards/{i // 500:03d}/s{i:05d}.bin", n)
        small_left -= n
        i += 1
    big_left = size - int(size * small_share)
    for j in range(big_files):
        write(f"big/b{j}.bin", big_left // big_files + (big_left % big_files if j == 0 else 0))
    return sorted(paths)


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM, so each step gets its own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def peak_rss_mib() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Bench:
    def __init__(self, tmp: Path, server: SSHD) -> None:
        self.tmp, self.server = tmp, server
        self.home = tmp / "home"
        self.home.mkdir()
        server.write_known_hosts(self.home / "known_hosts")
        self.user_kh = server.write_known_hosts(tmp / "user_known_hosts")
        self.cfg = server.write_ssh_config(tmp / "ssh_config", "bench", known_hosts=self.user_kh)
        self.host_root = server.home / "host-root"  # the lab host's user writes here
        self.runtime_dir = ""
        self.caches: dict[str, MemoryHashCache] = {}
        self.keys: dict[str, bytes] = {}
        self.run_dirs: dict[str, str] = {}

    def proxied(self, proxy: FaultProxy) -> tuple[Path, str]:
        for kh in (self.home / "known_hosts", self.user_kh):
            with open(kh, "a") as fh:
                fh.write(self.server.known_hosts_line(f"[{self.server.host}]:{proxy.port}"))
        cfg = self.server.write_ssh_config(
            self.tmp / "ssh_config_proxy", "benchproxy", known_hosts=self.user_kh, port=proxy.port
        )
        return cfg, "benchproxy"

    async def sync(
        self,
        data: Path,
        paths: list[str],
        run_id: str,
        cfg: Path | None = None,
        alias: str = "bench",
    ) -> tuple[float, float, dict]:
        """(seconds including a fresh connection, peak RSS MiB, stats) of one remotemac sync."""
        cache = self.caches.setdefault(run_id, MemoryHashCache())
        key = self.keys.setdefault(run_id, os.urandom(32))
        if run_id not in self.run_dirs:  # the provision phase's job, not timed
            async with SSHTransport(
                "bench", home_dir=self.home, options=SSHOptions(ssh_config=self.cfg)
            ) as t:
                agent = AgentClient(t, str(self.host_root))
                run = await agent.call(
                    "prepare_run", {"root": str(self.host_root), "run_id": run_id}
                )
                self.run_dirs[run_id] = run["run_dir"]
                if not self.runtime_dir:  # the host's python3 decrypts with its runtime
                    self.runtime_dir = (await ensure_runtime(agent, home=None, method="online"))[
                        "dir"
                    ]
        transport = SSHTransport(
            alias, home_dir=self.home, options=SSHOptions(ssh_config=cfg or self.cfg)
        )
        reset_peak_rss()
        start = time.perf_counter()
        async with transport:
            agent = AgentClient(transport, str(self.host_root))
            run = {"run_dir": self.run_dirs[run_id]}
            _, answer, stats = await sync_slice(
                transport,
                agent,
                root=data,
                paths=paths,
                run_dir=run["run_dir"],
                run_id=run_id,
                key=key,
                runtime_dir=self.runtime_dir,
                cache=cache,
            )
        seconds = time.perf_counter() - start
        if answer["mismatches"]:
            raise SystemExit(f"sync verification failed: {answer['mismatches'][:1]}")
        return seconds, peak_rss_mib(), stats.to_dict()

    def drop_run(self, run_id: str) -> None:
        shutil.rmtree(f"/dev/shm/remotemac-{run_id}", ignore_errors=True)
        shutil.rmtree(self.host_root / "runs" / run_id, ignore_errors=True)
        self.run_dirs.pop(run_id, None)

    def host_dir(self, dest: Path) -> None:
        """A destination dir the host's (lab) user owns, as scp/rsync write as that user."""
        dest.mkdir(parents=True, exist_ok=True)
        owner = self.server.home.stat()
        os.chown(dest, owner.st_uid, owner.st_gid)

    def scp(self, data: Path, dest: Path) -> float:
        self.host_dir(dest)
        start = time.perf_counter()
        subprocess.run(
            ["scp", "-q", "-r", "-F", str(self.cfg), "-c", CIPHER, str(data), f"bench:{dest}/"],
            check=True,
        )
        return time.perf_counter() - start

    def rsync(self, data: Path, dest: Path) -> float:
        self.host_dir(dest)
        start = time.perf_counter()
        subprocess.run(
            ["rsync", "-a", "-e", f"ssh -F {self.cfg} -c {CIPHER}", f"{data}/", f"bench:{dest}/"],
            check=True,
        )
        return time.perf_counter() - start


def change_files(data: Path, paths: list[str], share: float) -> list[str]:
    """Rewrite ``share`` of the files (same size, new bytes, new mtime)."""
    rng = random.Random(1)
    chosen = rng.sample(paths, max(1, int(len(paths) * share)))
    for rel in chosen:
        path = data / rel
        size = path.stat().st_size
        with open(path, "r+b") as fh:
            fh.write(os.urandom(min(size, 4096)))
    return chosen


def fmt(seconds: float, size: int) -> str:
    return f"{seconds:7.2f} s {size / seconds / 1e6:8.1f} MB/s"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=1 << 30, help="slice size (1GiB)")
    parser.add_argument(
        "--throttle-size",
        type=parse_size,
        default=200 << 20,
        help="slice size for the throttled sync (200MiB)",
    )
    parser.add_argument("--rate", type=float, default=20e6, help="throttle, bytes/s (20e6)")
    parser.add_argument(
        "--rss-size",
        type=parse_size,
        default=0,
        help="also sync a slice this big just to measure peak RSS (e.g. 2GiB)",
    )
    parser.add_argument("--changed", type=float, default=0.01, help="share changed (0.01)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rm-bench-sync-", dir=os.environ.get("TMPDIR")) as t:
        tmp = Path(t)
        server = SSHD(tmp / "sshd").start()
        bench = Bench(tmp, server)
        data = tmp / "slice"
        paths = make_slice(data, args.size)
        size = args.size
        print(
            f"slice: {len(paths)} files, {size / 2**20:.0f} MiB "
            f"({sum(p.startswith('shards/') for p in paths)} small, 3 large); "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        try:
            # 1. cold
            t_rm, rss_cold, st_cold = await bench.sync(data, paths, "bench-cold")
            dests = server.home
            t_scp = bench.scp(data, dests / "scp-dest")
            shutil.rmtree(dests / "scp-dest")
            t_rsync = bench.rsync(data, dests / "rsync-dest")
            print(f"cold  remotemac      {fmt(t_rm, size)}  peak RSS {rss_cold:6.1f} MiB")
            print(f"cold  scp -r         {fmt(t_scp, size)}")
            print(f"cold  rsync          {fmt(t_rsync, size)}")
            print(f"      ratio remotemac/scp throughput  : {t_scp / t_rm:.2f}  (goal >= 0.90)")
            print(f"      ratio remotemac/rsync throughput: {t_rsync / t_rm:.2f}", flush=True)
            # 2. re-sync with 1% changed
            changed = change_files(data, paths, args.changed)
            t_rm2, rss2, st2 = await bench.sync(data, paths, "bench-cold")
            t_rsync2 = bench.rsync(data, dests / "rsync-dest")
            print(
                f"resync ({len(changed)} files changed) remotemac {t_rm2:6.2f} s "
                f"(sent {st2['sent_files']} files, {st2['sent_bytes'] / 1e6:.1f} MB), "
                f"rsync {t_rsync2:6.2f} s; speed-up vs rsync {t_rsync2 / t_rm2:.2f}x "
                f"(goal > 1)  peak RSS {rss2:.1f} MiB",
                flush=True,
            )
            # unchanged re-sync, for the record
            t_rm3, _, st3 = await bench.sync(data, paths, "bench-cold")
            t_rsync3 = bench.rsync(data, dests / "rsync-dest")
            print(
                f"resync (unchanged) remotemac {t_rm3:6.2f} s (sent {st3['sent_bytes']} B), "
                f"rsync {t_rsync3:6.2f} s",
                flush=True,
            )
            bench.drop_run("bench-cold")
            shutil.rmtree(dests / "rsync-dest")
            # 3. throttled
            sub, acc = [], 0
            for rel in paths:
                if acc >= args.throttle_size:
                    break
                n = (data / rel).stat().st_size
                if acc + n <= args.throttle_size * 1.1:
                    sub.append(rel)
                    acc += n
            proxy = FaultProxy(server.host, server.port).start()
            try:
                cfg, alias = bench.proxied(proxy)
                proxy.throttle(args.rate)
                t_th, rss_th, st_th = await bench.sync(data, sub, "bench-throttled", cfg, alias)
                # what the throttled link really carries: scp of one 40 MB file through it
                probe = tmp / "probe.bin"
                probe.write_bytes(os.urandom(40_000_000))
                start = time.perf_counter()
                subprocess.run(
                    [
                        "scp",
                        "-q",
                        "-F",
                        str(cfg),
                        "-c",
                        CIPHER,
                        str(probe),
                        f"{alias}:{dests / 'probe-copy.bin'}",
                    ],
                    check=True,
                )
                link = probe.stat().st_size / (time.perf_counter() - start)
            finally:
                proxy.stop()
            bench.drop_run("bench-throttled")
            rate = acc / t_th
            print(
                f"throttled {args.rate / 1e6:.0f} MB/s: {len(sub)} files {acc / 2**20:.0f} MiB "
                f"in {t_th:.2f} s = {rate / 1e6:.1f} MB/s of plaintext; "
                f"ratio to link {rate / args.rate:.2f} (goal >= 0.90); "
                f"wire bytes {st_th['sent_bytes'] / 1e6:.1f} MB; peak RSS {rss_th:.1f} MiB",
                flush=True,
            )
            print(
                f"      scp through the same throttled proxy: {link / 1e6:.1f} MB/s; "
                f"remotemac/scp there {rate / link:.2f}",
                flush=True,
            )
            shutil.rmtree(data)
            # 4. a bigger slice for the memory figure
            if args.rss_size:
                big = tmp / "rss-slice"
                big_paths = make_slice(big, args.rss_size)
                t_big, rss_big, _ = await bench.sync(big, big_paths, "bench-rss")
                bench.drop_run("bench-rss")
                print(
                    f"rss   {args.rss_size / 2**30:.1f} GiB slice ({len(big_paths)} files) "
                    f"synced in {t_big:.2f} s; orchestrator peak RSS {rss_big:.1f} MiB "
                    f"(goal < 200 MiB)",
                    flush=True,
                )
        finally:
            for run_id in ("bench-cold", "bench-throttled", "bench-rss"):
                bench.drop_run(run_id)
            server.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
