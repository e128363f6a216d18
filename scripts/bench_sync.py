"""Benchmark: remotemac's encrypted dataset push against scp and rsync, near and far.

Everything goes to the loopback sshd of tests/harness (the machine plays both laptop
and host, so the two ends share its cores), straight ("loopback") and through the
fault proxy emulating a far link ("far": by default 80 ms RTT, 100 MB/s, the proxy in
its own process so it shares no GIL with the orchestrator):

1. cold sync of shape A (``--size`` bytes in 16–256 KiB files) and shape B (three
   large files): remotemac (hash + encrypt + send + store + decrypt into /dev/shm +
   verify, over as many channels as the measured round trip calls for) against
   ``scp -c aes128-gcm@openssh.com -r`` and ``rsync -a -e 'ssh -c aes128-gcm…'`` of
   the same plaintext (which neither encrypt at rest nor verify). scp is stopped at
   ``--scp-cap`` times the best time (thousands of files over a far link wait a round
   trip each): its figure is then a bound. ``--repeat N`` rounds, medians printed;
2. a re-sync of shape A after 1 % of the files changed, against rsync's (loopback;
   ``--repeat`` rounds, each tool in turn, medians printed);
3. push resume: one file of ``--resume-size`` through the far link, cut once half of
   it has been forwarded; the bytes the second attempt sent, as a share of the file;
4. the orchestrator's peak RSS (VmHWM, reset before each sync) over all of them.

``--pin`` models two machines on the two cores: the laptop side (this process, its
threads, and the ssh/scp/rsync it starts) runs on core 0, sshd and everything it
starts (remotemac's receivers, scp's and rsync's host ends) on core 1 (sched
affinity, as ``taskset`` sets it; the proxy, being the network, is left on both).
Each line also gives the CPU by end (sampled from /proc, so other tenants of a
shared machine do not count) and how long each end waited for a core.

Every remotemac timing includes a fresh SSH connection, like scp's and rsync's; the
agent is already on the host (provision installs it before the sync phase of a run).

    python scripts/bench_sync.py --repeat 5                   # 1 GiB shapes, 80 ms, 100 MB/s
    python scripts/bench_sync.py --size 64MiB --links loopback  # quick look
    python scripts/bench_sync.py --size 256MiB --links loopback --parts cold --pin
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
#: the checkout whose remotemac is measured (an A/B runs this bench on main's code)
sys.path.insert(0, os.environ.get("RM_BENCH_CODE") or str(ROOT))

from remotemac.data.manifest import MemoryHashCache  # noqa: E402
from remotemac.engine.agentclient import AgentClient  # noqa: E402
from remotemac.engine.runtime import ensure_runtime  # noqa: E402
from remotemac.engine.sync import SyncStats, sync_slice  # noqa: E402
from remotemac.transport.options import SSHOptions  # noqa: E402
from remotemac.transport.ssh import SSHTransport  # noqa: E402
from tests.harness.faultproxy import ProxyProcess  # noqa: E402
from tests.harness.sshd import SSHD  # noqa: E402

CIPHER = "aes128-gcm@openssh.com"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
SHAPES = {
    "A": "many 16–256 KiB files",
    "B": "three large files",
    "C": "one large file",
}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)\s*([kmg]?)(i?b)?", text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 1GiB, 64MiB)")
    return int(match[1]) * _UNITS[match[2]]


def _writer(root: Path, rng: random.Random) -> tuple[list[str], Any]:
    """Incompressible bytes cut from one random block (writing 1 GiB of urandom is slow)."""
    block = os.urandom(8 << 20)
    paths: list[str] = []

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

    return paths, write


def make_shape(root: Path, shape: str, size: int) -> list[str]:
    """Shape A: ``size`` bytes in 16–256 KiB files; B: three files of size/3; C: one file."""
    rng = random.Random(0)
    paths, write = _writer(root, rng)
    if shape == "A":
        left, i = size, 0
        while left > 0:
            n = min(left, rng.randrange(16 << 10, 256 << 10))
            write(f"shards/{i // 500:03d}/s{i:05d}.bin", n)
            left -= n
            i += 1
    elif shape == "C":
        write("big/train.bin", size)
    else:
        for j in range(3):
            write(f"big/b{j}.bin", size // 3 + (size % 3 if j == 0 else 0))
    return sorted(paths)


def machine_cpu_s() -> float:
    """CPU seconds all processes of this machine have used so far (Linux /proc/stat).

    Both ends run here, so the difference over one copy is what it cost laptop and host
    together: remotemac hashes (on the laptop; on the host too
    for resumed and split files) and encrypts, scp and rsync do neither, and
    on 2 shared cores that sum, not one process, sets the time of a large file."""
    with open("/proc/stat") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _tree(pid: int, skip: tuple[int | None, ...] = ()) -> list[int]:
    """``pid`` and its live descendants but ``skip`` and theirs."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in skip:
            continue
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except OSError:
            continue
    return out


def _sample(pid: int) -> tuple[float, float]:
    """(utime + stime, run-queue wait of every thread) of one live process; 0s if gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        wait = 0.0
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                wait += int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0
    return sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK"), wait


class EndsCPU:
    """CPU seconds of one copy by end, sampled every 50 ms from /proc: the laptop (this
    process and the ssh/rsync/scp it runs), the host (sshd and every session it runs:
    receivers, sftp, rsync) and the fault proxy; with each end's wait for a core
    (run-queue delay of its threads). sshd's finished sessions do not reach its
    cutime, hence the sampling (a process's last 50 ms may be missed). Unlike
    machine_cpu_s, the other tenants of a shared machine do not count: on a loaded
    machine this says which end a copy's CPU went to, and how long the ends waited
    for a core while others used it."""

    def __init__(self, sshd_pid: int | None, proxy_pid: int | None) -> None:
        self.roots = {"host": sshd_pid, "proxy": proxy_pid}
        self.last: dict[int, tuple[str, float, float]] = {}
        self.before = self._walk()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _walk(self) -> dict[int, tuple[str, float, float]]:
        skip = tuple(self.roots.values())
        groups = [("laptop", _tree(os.getpid(), skip))]
        groups += [(g, _tree(p)) for g, p in self.roots.items() if p is not None]
        return {pid: (self._name(g, pid), *_sample(pid)) for g, pids in groups for pid in pids}

    @staticmethod
    def _name(group: str, pid: int) -> str:
        """``host`` splits into sshd and what it runs (``host.sshd``, ``host.other``)."""
        if group != "host":
            return group
        try:
            with open(f"/proc/{pid}/comm") as fh:
                return "host.sshd" if fh.read().startswith("sshd") else "host.other"
        except OSError:
            return "host.other"

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for pid, row in self._walk().items():
                if row[1] or row[2] or pid not in self.last:
                    self.last[pid] = row

    def stop(self) -> EndsCPU:
        self._stop.set()
        self._thread.join()
        for pid, row in self._walk().items():
            if row[1] or row[2] or pid not in self.last:
                self.last[pid] = row
        self.cpu = {"laptop": 0.0, "host": 0.0, "proxy": 0.0, "host.sshd": 0.0}
        self.wait = dict(self.cpu)
        for pid, (group, cpu, wait) in self.last.items():
            _, cpu0, wait0 = self.before.get(pid, (group, 0.0, 0.0))
            for g in {group.partition(".")[0], group} & set(self.cpu):
                self.cpu[g] += cpu - cpu0
                self.wait[g] += wait - wait0
        return self

    @property
    def ends(self) -> float:
        return self.cpu["laptop"] + self.cpu["host"]

    def __str__(self) -> str:
        c, w = self.cpu, self.wait
        return (
            f"laptop {c['laptop']:.2f} + host {c['host']:.2f} s (sshd {c['host.sshd']:.2f}; "
            f"proxy {c['proxy']:.2f}), "
            f"waiting for a core {w['laptop']:.2f} + {w['host']:.2f} s ({w['proxy']:.2f})"
        )


def pin_ends(server: SSHD) -> None:
    """This process (the laptop: its threads and every process it starts from now on)
    on core 0, sshd (the host: every session it forks inherits it) on core 1."""
    if server.proc is None or (os.cpu_count() or 1) < 2:
        raise SystemExit("--pin needs two cores and a running sshd")
    os.sched_setaffinity(server.proc.pid, {1})
    for task in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(task), {0})


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


@dataclass
class Link:
    """How the laptop reaches the host: straight (loopback) or through the far-link proxy."""

    name: str
    cfg: Path
    alias: str


class BenchHost:
    """The laptop side of a bench against one sshd: its own known_hosts and ssh_config,
    the loopback link, and a link through a proxy on demand (bench_sync, bench_pull)."""

    def __init__(self, tmp: Path, server: SSHD) -> None:
        self.tmp, self.server = tmp, server
        self.home = tmp / "home"
        self.home.mkdir()
        server.write_known_hosts(self.home / "known_hosts")
        self.user_kh = server.write_known_hosts(tmp / "user_known_hosts")
        self.cfg = server.write_ssh_config(tmp / "ssh_config", "bench", known_hosts=self.user_kh)
        self.loopback = Link("loopback", self.cfg, "bench")

    def proxied(self, port: int, name: str) -> Link:
        for kh in (self.home / "known_hosts", self.user_kh):
            with open(kh, "a") as fh:
                fh.write(self.server.known_hosts_line(f"[{self.server.host}]:{port}"))
        alias = f"bench{port}"
        cfg = self.server.write_ssh_config(
            self.tmp / f"ssh_config_{port}", alias, known_hosts=self.user_kh, port=port
        )
        return Link(name, cfg, alias)


class Bench(BenchHost):
    def __init__(self, tmp: Path, server: SSHD) -> None:
        super().__init__(tmp, server)
        self.host_root = server.home / "host-root"  # the lab host's user writes here
        self.runtime_dir = ""
        self.agent_dir = ""  # installed by provision in a run: the sync phase finds it there
        self.caches: dict[str, MemoryHashCache] = {}
        self.keys: dict[str, bytes] = {}
        self.run_dirs: dict[str, str] = {}
        self.peak_rss = 0.0
        self.streams: int | None = None  # --streams: forced, else sized by the round trip
        self.connect_s = 0.0  # the last sync's SSH connection set-up
        self.close_s = 0.0  # and its close, after the sync's answer
        self.proxy_pid: int | None = None

    def ends(self) -> EndsCPU:
        """Start sampling the CPU of each end (EndsCPU.stop: the figures)."""
        sshd = self.server.proc.pid if self.server.proc is not None else None
        return EndsCPU(sshd, self.proxy_pid)

    async def prepare(self, run_id: str) -> None:
        """The provision phase's job (a run dir, the agent runtime): not timed."""
        if run_id in self.run_dirs:
            return
        options = SSHOptions(ssh_config=self.cfg)
        async with SSHTransport("bench", home_dir=self.home, options=options) as t:
            agent = AgentClient(t, str(self.host_root))
            run = await agent.call("prepare_run", {"root": str(self.host_root), "run_id": run_id})
            self.run_dirs[run_id] = run["run_dir"]
            if not self.runtime_dir:  # the host's python3 decrypts with its runtime
                self.runtime_dir = (await ensure_runtime(agent, home=None, method="online")).dir
            self.agent_dir = agent.agent_dir or await agent.install()

    async def sync(
        self, data: Path, paths: list[str], run_id: str, link: Link, max_attempts: int = 4
    ) -> tuple[float, SyncStats]:
        """(seconds including a fresh connection, stats) of one remotemac sync."""
        await self.prepare(run_id)
        cache = self.caches.setdefault(run_id, MemoryHashCache())
        key = self.keys.setdefault(run_id, os.urandom(32))
        options = SSHOptions(ssh_config=link.cfg, reconnect_deadline=60)
        transport = SSHTransport(link.alias, home_dir=self.home, options=options)
        stats = SyncStats()
        reset_peak_rss()
        start = time.perf_counter()
        async with transport:
            self.connect_s = time.perf_counter() - start
            agent = AgentClient(transport, str(self.host_root))
            agent.agent_dir = self.agent_dir
            _, answer, stats = await sync_slice(
                transport,
                agent,
                root=data,
                paths=paths,
                run_dir=self.run_dirs[run_id],
                run_id=run_id,
                key=key,
                runtime_dir=self.runtime_dir,
                cache=cache,
                stats=stats,
                max_attempts=max_attempts,
                streams=self.streams,
            )
            synced = time.perf_counter()
        seconds = time.perf_counter() - start
        self.close_s = seconds - (synced - start)
        self.peak_rss = max(self.peak_rss, peak_rss_mib())
        if answer["mismatches"]:
            raise SystemExit(f"sync verification failed: {answer['mismatches'][:1]}")
        return seconds, stats

    def drop_run(self, run_id: str) -> None:
        shutil.rmtree(f"/dev/shm/remotemac-{run_id}", ignore_errors=True)
        shutil.rmtree(self.host_root / "runs" / run_id, ignore_errors=True)
        self.run_dirs.pop(run_id, None)
        self.caches.pop(run_id, None)

    def host_dir(self, dest: Path) -> None:
        """A destination dir the host's (lab) user owns, as scp/rsync write as that user."""
        dest.mkdir(parents=True, exist_ok=True)
        owner = self.server.home.stat()
        os.chown(dest, owner.st_uid, owner.st_gid)

    def drop_copy(self, tool: str) -> None:
        """Remove what :meth:`copy` wrote (after its timing: remotemac's run is dropped
        after its own, and deleting 1,916 files is no part of a copy)."""
        shutil.rmtree(self.server.home / f"{tool}-dest", ignore_errors=True)

    def copy(self, tool: str, data: Path, link: Link, cap: float | None) -> float | None:
        """Seconds for ``scp -r`` or ``rsync -a`` of ``data``; None when stopped at ``cap``
        (the destination stays for :meth:`drop_copy`)."""
        dest = self.server.home / f"{tool}-dest"
        self.drop_copy(tool)
        self.host_dir(dest)
        if tool == "scp":
            argv = ["scp", "-q", "-r", "-F", str(link.cfg), "-c", CIPHER]
            argv += [str(data), f"{link.alias}:{dest}/"]
        else:
            argv = ["rsync", "-a", "-e", f"ssh -F {link.cfg} -c {CIPHER}"]
            argv += [f"{data}/", f"{link.alias}:{dest}/"]
        start = time.perf_counter()
        proc = subprocess.Popen(argv, start_new_session=True)
        try:
            proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            return None
        if proc.returncode:
            raise SystemExit(f"{tool} failed ({proc.returncode})")
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


def rate(size: int, seconds: float | None) -> str:
    return "stopped" if seconds is None else f"{size / seconds / 1e6:6.1f} MB/s"


async def cold_round(
    bench: Bench,
    link: Link,
    shape: str,
    data: Path,
    paths: list[str],
    size: int,
    args: Any,
    tag: str,
) -> dict[str, Any]:
    """One cold sync of a shape over a link, then scp and rsync of the same bytes."""
    run_id = f"bench-{os.getpid()}-{tag}"  # (/dev/shm is shared with other benches)
    versus = None
    if args.versus_streams and int(tag[1:]) % 2:  # odd rounds: the fixed count first
        versus = await fixed_sync(bench, data, paths, link, f"{tag}f", args.versus_streams)
    await bench.prepare(run_id)  # the provision phase's login and run dir: not counted
    cpu, ends = machine_cpu_s(), bench.ends()
    t_rm, stats = await bench.sync(data, paths, run_id, link)
    cpu_rm, ends_rm = machine_cpu_s() - cpu, ends.stop()
    bench.drop_run(run_id)
    if args.versus_streams and versus is None:
        versus = await fixed_sync(bench, data, paths, link, f"{tag}f", args.versus_streams)
    cpu, ends = machine_cpu_s(), bench.ends()
    t_rsync = None if args.no_peers else bench.copy("rsync", data, link, None)
    cpu_rsync, ends_rsync = machine_cpu_s() - cpu, ends.stop()
    bench.drop_copy("rsync")
    # scp of thousands of files over a far link waits a round trip per file: stop it
    # once it is clearly the slower tool (its time is then only a lower bound)
    cap = max(args.scp_cap * min(t_rm, t_rsync or t_rm), 20.0)
    t_scp = None if args.no_scp or args.no_peers else bench.copy("scp", data, link, cap)
    bench.drop_copy("scp")
    if args.no_scp or args.no_peers:
        cap = 0.0
    # (no peer run: the far link's own time for the bytes stands in for the faster)
    faster = min((t for t in (t_scp, t_rsync) if t is not None), default=size / args.rate)
    row = {"rm": t_rm, "scp": t_scp, "rsync": t_rsync, "ratio": faster / t_rm}
    row["fixed"] = versus[0] if versus else None
    row.update(cpu_rm=cpu_rm, cpu_rsync=cpu_rsync)
    row.update(ends_rm=ends_rm.ends, ends_rsync=ends_rsync.ends)
    of_link = ""
    if link.name == "far":
        row["link"] = size / t_rm / args.rate
        after = size / (t_rm - bench.connect_s) / args.rate
        of_link = f"{row['link']:.2f}x the link ({after:.2f}x after the connection set-up), "
    print(
        f"  {link.name:8s} {shape}  remotemac {rate(size, t_rm)} ({of_link}{stats.streams_text()}"
        + (f", {stats.spare_streams} on a second connection" if stats.spare_streams else "")
        + f", rtt {stats.rtt_ms} ms, streams ran {stats.stream_s:.2f} s"
        + f", load {os.getloadavg()[0]:.1f}"
        + f", connect {bench.connect_s:.2f} s, then {stats.steps_text()}, link closed +{bench.close_s:.2f}"
        + (f", {stats.split_files} split into pieces" if stats.split_files else "")
        + (f")  scp {rate(size, t_scp)}" if cap else ")  scp not run")
        + (f" (> {cap:.0f} s)" if t_scp is None and cap else "")
        + f"  rsync {rate(size, t_rsync)}  ratio to the faster {row['ratio']:.2f}; "
        f"CPU of the machine: remotemac {cpu_rm:.2f} s, rsync {cpu_rsync:.2f} s; "
        f"by end: remotemac {ends_rm}, rsync {ends_rsync}",
        flush=True,
    )
    if versus is not None:
        t_fixed, ends_fixed, stream_s = versus
        print(
            f"           fixed {args.versus_streams} streams {rate(size, t_fixed)} "
            f"({size / t_fixed / args.rate:.2f}x the link, streams ran {stream_s:.2f} s); "
            f"adaptive/fixed "
            f"{t_fixed / t_rm:.2f}; by end: {ends_fixed}",
            flush=True,
        )
    return row


async def fixed_sync(
    bench: Bench, data: Path, paths: list[str], link: Link, tag: str, streams: int
) -> tuple[float, EndsCPU, float]:
    """The same cold push with the stream count fixed (``--versus-streams``): seconds and
    each end's CPU, in the same minute as the adaptive one."""
    run_id = f"bench-{os.getpid()}-{tag}"  # (/dev/shm is shared with other benches)
    await bench.prepare(run_id)  # not counted, as in cold_round
    ends = bench.ends()
    bench.streams = streams
    try:
        t_fixed, stats = await bench.sync(data, paths, run_id, link)
    finally:
        bench.streams = None
    fixed_ends = ends.stop()
    bench.drop_run(run_id)
    return t_fixed, fixed_ends, stats.stream_s


async def resync_figure(bench: Bench, data: Path, paths: list[str], args: Any) -> None:
    """``--repeat`` rounds of: change 1 % of the files, re-sync them with remotemac, change
    them again, re-sync them with rsync (alternating, so both meet the same load)."""
    link = bench.loopback
    dest = bench.server.home / "rsync-dest"
    bench.host_dir(dest)
    rs = ["rsync", "-a", "-e", f"ssh -F {link.cfg} -c {CIPHER}", f"{data}/"]
    rs.append(f"{link.alias}:{dest}/")
    await bench.sync(data, paths, "bench-resync", link)
    subprocess.run(rs, check=True)
    rows = []
    for r in range(args.repeat):
        changed = change_files(data, paths, args.changed)
        t_rm, st = await bench.sync(data, paths, "bench-resync", link)
        change_files(data, paths, args.changed)
        start = time.perf_counter()
        subprocess.run(rs, check=True)
        t_rs = time.perf_counter() - start
        rows.append((t_rm, t_rs))
        print(
            f"resync  loopback A, {len(changed)} files changed: remotemac {t_rm:.2f} s "
            f"({st.sent_files} files sent), rsync {t_rs:.2f} s  (round {r + 1}, "
            f"load {os.getloadavg()[0]:.1f})",
            flush=True,
        )
    bench.drop_run("bench-resync")
    shutil.rmtree(dest, ignore_errors=True)
    if len(rows) > 1:
        rm, rsync = (statistics.median(x[i] for x in rows) for i in (0, 1))
        print(
            f"resync  medians of {len(rows)}: remotemac {rm:.2f} s, rsync {rsync:.2f} s, "
            f"rsync/remotemac {rsync / rm:.2f} (goal > 1)",
            flush=True,
        )


async def resume_figure(bench: Bench, tmp: Path, size: int, args: Any) -> None:
    """One ``size`` file through the far link, cut when half of it has been forwarded."""
    data = tmp / "resume"
    paths, write = _writer(data, random.Random(2))
    write("train.bin", size)
    one = size
    proxy = ProxyProcess(
        bench.server.host, bench.server.port, rtt=args.rtt, rate=args.rate, cut_after=one // 2
    ).start()
    try:
        link = bench.proxied(proxy.port, "far")
        seconds, stats = await bench.sync(data, paths, "bench-resume", link)
    finally:
        proxy.stop()
        bench.drop_run("bench-resume")
        shutil.rmtree(data, ignore_errors=True)
    again = stats.per_attempt[1] if len(stats.per_attempt) > 1 else None
    print(
        f"resume  {one / 2**20:.0f} MiB file cut at 50 % of it forwarded: "
        + (
            f"attempt 2 sent {again / 1e6:.1f} MB = {100 * again / one:.1f} % of the file "
            f"(goal < 55 %); {stats.resumed_bytes / 2**20:.0f} MiB kept; {seconds:.1f} s in all"
            if again is not None
            else f"the cut did not land (attempts {stats.attempts})"
        ),
        flush=True,
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=1 << 30, help="per shape (1GiB)")
    parser.add_argument("--rtt", type=float, default=0.08, help="far link round trip (0.08 s)")
    parser.add_argument("--rate", type=float, default=100e6, help="far link bytes/s (100e6)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; medians printed (1)")
    parser.add_argument("--shapes", default="AB", help="A, B, C or any mix (AB)")
    parser.add_argument("--links", default="loopback,far", help="loopback, far or both")
    parser.add_argument(
        "--resume-size", type=parse_size, default=None, help="file cut at 50 %% (--size)"
    )
    parser.add_argument(
        "--scp-cap", type=float, default=2.0, help="stop scp at this many times the best (2)"
    )
    parser.add_argument(
        "--streams", type=int, default=None, help="force remotemac's channels (by the RTT)"
    )
    parser.add_argument(
        "--versus-streams",
        type=int,
        default=None,
        help="also push with this many streams fixed, alternating first and second",
    )
    parser.add_argument("--no-scp", action="store_true", help="leave scp out (rsync only)")
    parser.add_argument(
        "--no-peers",
        action="store_true",
        help="far link only: run neither scp nor rsync (the ratio is to the link's rate)",
    )
    parser.add_argument(
        "--pin", action="store_true", help="laptop side on core 0, sshd and its children on 1"
    )
    parser.add_argument("--changed", type=float, default=0.01, help="re-sync: share changed")
    parser.add_argument(
        "--parts",
        default="cold,resync,resume",
        help="which figures: cold, resync, resume (comma-separated; all by default)",
    )
    args = parser.parse_args()
    if args.no_peers and args.links != "far":
        parser.error("--no-peers is for --links far (its ratio is to the link's rate)")
    links = args.links.split(",")
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory(prefix="rm-bench-sync-", dir=os.environ.get("TMPDIR")) as t:
        tmp = Path(t)
        server = SSHD(tmp / "sshd").start()
        if args.pin:
            pin_ends(server)
        bench = Bench(tmp, server)
        bench.streams = args.streams
        proxy = None
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        try:
            shapes = {s: make_shape(tmp / f"shape-{s}", s, args.size) for s in args.shapes}
            print(
                f"{args.size / 2**20:.0f} MiB per shape: "
                + ", ".join(f"{s} = {len(p)} files ({SHAPES[s]})" for s, p in shapes.items())
                + f"; far link {args.rtt * 1000:.0f} ms RTT, {args.rate / 1e6:.0f} MB/s "
                f"(fault proxy in its own process); {os.cpu_count()} cores "
                + ("pinned: laptop on 0, host on 1" if args.pin else "shared by both ends")
                + f", load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            targets = []
            if "loopback" in links:
                targets.append(bench.loopback)
            if "far" in links:
                proxy = ProxyProcess(server.host, server.port, rtt=args.rtt, rate=args.rate)
                targets.append(bench.proxied(proxy.start().port, "far"))
                bench.proxy_pid = proxy._proc.pid if proxy._proc is not None else None
                if args.pin and bench.proxy_pid is not None:  # the network: both cores
                    os.sched_setaffinity(bench.proxy_pid, {0, 1})
            for r in range(args.repeat if "cold" in parts else 0):
                print(f"round {r + 1}/{args.repeat} (load {os.getloadavg()[0]:.1f})", flush=True)
                for link in targets:
                    for s, paths in shapes.items():
                        row = await cold_round(
                            bench, link, s, tmp / f"shape-{s}", paths, args.size, args, f"{s}{r}"
                        )
                        results.setdefault((link.name, s), []).append(row)
            if results:
                print(f"medians of {args.repeat} (throughput of the same bytes):")
            for (name, s), rows in results.items():

                def med(key: str, rows: list[dict[str, Any]] = rows) -> float | None:
                    got = [x[key] for x in rows if x[key] is not None]
                    return statistics.median(got) if len(got) == len(rows) else None

                print(
                    f"  {name:8s} {s}  remotemac {rate(args.size, med('rm'))}  "
                    + (
                        f"fixed {args.versus_streams} streams {rate(args.size, med('fixed'))} "
                        f"(adaptive/fixed each: "
                        + ", ".join(f"{x['fixed'] / x['rm']:.2f}" for x in rows)
                        + ")  "
                        if args.versus_streams
                        else ""
                    )
                    + ("" if args.no_scp else f"scp {rate(args.size, med('scp'))}  ")
                    + f"rsync {rate(args.size, med('rsync'))}  "
                    + (
                        f"{statistics.median(x['link'] for x in rows):.2f}x the link; "
                        if name == "far"
                        else ""
                    )
                    + f"ratio to the faster {statistics.median(x['ratio'] for x in rows):.2f} "
                    f"(goal >= 0.90; each: " + ", ".join(f"{x['ratio']:.2f}" for x in rows) + "); "
                    f"CPU of the machine: remotemac {med('cpu_rm'):.2f} s, "
                    f"rsync {med('cpu_rsync'):.2f} s; of laptop + host: remotemac "
                    f"{med('ends_rm'):.2f} s, rsync {med('ends_rsync'):.2f} s",
                    flush=True,
                )
            if "A" in shapes and "loopback" in links and "resync" in parts:
                await resync_figure(bench, tmp / "shape-A", shapes["A"], args)
            if proxy is not None:
                proxy.stop()
                proxy = None
            for s in list(shapes):
                shutil.rmtree(tmp / f"shape-{s}", ignore_errors=True)
            if "resume" in parts:
                await resume_figure(bench, tmp, args.resume_size or args.size, args)
            print(
                f"peak RSS of the orchestrator over every sync: {bench.peak_rss:.1f} MiB "
                "(goal < 200 MiB)",
                flush=True,
            )
        finally:
            if proxy is not None:
                proxy.stop()
            for run_id in list(bench.run_dirs):
                bench.drop_run(run_id)
            server.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
