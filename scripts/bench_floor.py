"""Benchmark: the fastest one large file could go on this machine, with remotemac's checks.

When laptop and host share one machine (the loopback benches), a large file is bound by
the CPU both ends spend on it together, not by either process alone. scp and rsync only
move the bytes; remotemac also does what its contract promises: SHA-256 of every byte on
both ends, and for a push the dataset's own AES-GCM encryption (sealed on the laptop,
opened on the host) plus the plaintext copy in RAM-backed storage. This script measures,
in the same minute, over the same loopback sshd, for one file of ``--size`` (1 GiB):

1. scp and rsync of the file both ways: wall time and the CPU of the whole machine;
2. the extra per-byte work the contract asks for, each in this process over as many
   bytes: one SHA-256 pass, one AES-GCM seal and one open (256 KiB chunks, as the
   dataset format), one more write (the plaintext copy into /dev/shm);
3. remotemac's own push (a one-file dataset slice) and pull of the same file.

Before each copy the machine writes back what the last one left dirty (``sync``), so no
copy pays for another's disk writes.

From 1 and 2 it prints the floor: the faster peer's CPU plus the promised extra work,
spread perfectly over all cores, and so the best ratio any implementation that keeps
the promises could reach here, beside the measured one.

``--pin`` models two machines (issue 36): the laptop side (this process and what it
starts) on core 0, sshd and every session it runs on core 1, as bench_sync's
``--pin``. Each end then has one core, so the floor is the slower END: for each end
the peer's own CPU there (sampled from /proc by bench_sync.EndsCPU) plus the promised
work that end does (push: the laptop hashes and seals, the host hashes, opens and
writes the plaintext into RAM; pull: each end hashes once), and the larger of the
two is the least time any implementation keeping the promises could take. Beside it,
remotemac's measured CPU by end says which end holds it and by how much beyond the
floor.

    python scripts/bench_floor.py                 # 1 GiB, medians of 3
    python scripts/bench_floor.py --repeat 5 --size 512MiB
    python scripts/bench_floor.py --pin           # one core per end
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts import bench_pull, bench_sync  # noqa: E402
from scripts.bench_sync import CIPHER, EndsCPU, machine_cpu_s, parse_size, pin_ends  # noqa: E402
from tests.harness.sshd import SSHD  # noqa: E402

CHUNK = 256 * 1024  # remotemac-enc/v1's default chunk (remotemac/agent/streamcrypt.py)


def cpu_of(step: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, machine CPU seconds) of one step."""
    cpu, start = machine_cpu_s(), time.perf_counter()
    step()
    return time.perf_counter() - start, machine_cpu_s() - cpu


def extra_work(size: int) -> dict[str, float]:
    """CPU seconds of each promised per-byte step over ``size`` bytes, in this process.

    On one 1 MiB buffer used over and over: the file's own reading is not counted
    (scp and rsync read it too), only what remotemac does beyond them."""
    import hashlib

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead, nonce = AESGCM(os.urandom(32)), os.urandom(12)
    block = memoryview(os.urandom(1 << 20))
    blocks = range(size >> 20)
    sealed = aead.encrypt(nonce, block[:CHUNK], None)

    def sha() -> None:
        digest = hashlib.sha256()
        for _ in blocks:
            digest.update(block)

    def seal() -> None:
        for _ in blocks:
            for i in range(0, len(block), CHUNK):
                aead.encrypt(nonce, block[i : i + CHUNK], None)

    def open_() -> None:
        for _ in range(len(blocks) * ((1 << 20) // CHUNK)):
            aead.decrypt(nonce, sealed, None)

    def ram_copy() -> None:  # the host keeps the ciphertext on disk and the plaintext in RAM
        with open("/dev/shm/rm-floor.bin", "wb") as out:
            for _ in blocks:
                out.write(block)
        os.unlink("/dev/shm/rm-floor.bin")

    out: dict[str, float] = {}
    for name, step in (("sha256", sha), ("seal", seal), ("open", open_), ("ram", ram_copy)):
        start = time.process_time()
        step()
        out[name] = time.process_time() - start
    return out


def peer(argv: list[str]) -> tuple[float, float]:
    return cpu_of(lambda: subprocess.run(argv, check=True))


#: the promised per-byte work each end does, by direction (names of extra_work's steps)
PROMISED_BY_END = {
    "push": {"laptop": ("sha256", "seal"), "host": ("sha256", "open", "ram")},
    "pull": {"laptop": ("sha256",), "host": ("sha256",)},
}


def pinned_floor(
    way: str, peer_ends: dict[str, float], extra: dict[str, float]
) -> tuple[float, str, dict[str, float]]:
    """(floor seconds, the end that sets it, each end's floor CPU) with one core an end:
    the peer's CPU on that end plus the promised work there; the slower end is the floor."""
    per_end = {
        end: peer_ends[end] + sum(extra[step] for step in steps)
        for end, steps in PROMISED_BY_END[way].items()
    }
    slow = max(per_end, key=lambda end: per_end[end])
    return per_end[slow], slow, per_end


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=parse_size("1GiB"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--pin", action="store_true", help="laptop side on core 0, sshd and its sessions on 1"
    )
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    rows: dict[str, list[tuple[float, float]]] = {}
    by_end: dict[str, list[dict[str, float]]] = {}
    extras: list[dict[str, float]] = []
    sshd_pid: int | None = None

    def note(key: str, wall_cpu: tuple[float, float], ends: EndsCPU | None = None) -> None:
        rows.setdefault(key, []).append(wall_cpu)
        if ends is not None:
            by_end.setdefault(key, []).append(dict(ends.cpu))

    def copy(key: str, argv: list[str]) -> None:
        ends = EndsCPU(sshd_pid, None)
        wall_cpu = peer(argv)
        note(key, wall_cpu, ends.stop())

    with tempfile.TemporaryDirectory(prefix="rm-floor-") as t:
        tmp = Path(t)
        server = SSHD(tmp / "sshd").start()
        sshd_pid = server.proc.pid if server.proc is not None else None
        if args.pin:
            pin_ends(server)
        try:
            (tmp / "s").mkdir()
            (tmp / "p").mkdir()
            push, pull = bench_sync.Bench(tmp / "s", server), bench_pull.Bench(tmp / "p", server)
            data = tmp / "data"
            bench_pull.write_random(data / "train.bin", args.size)
            remote = server.home / "results" / "one"
            bench_pull.write_random(remote / "model.bin", args.size)
            push.host_dir(server.home / "results")
            push.host_dir(remote)
            owner = server.home.stat()
            os.chown(remote / "model.bin", owner.st_uid, owner.st_gid)
            await pull.install_agent()
            await push.prepare("floor")
            push.drop_run("floor")
            cfg, alias = push.cfg, "bench"
            ssh = f"ssh -F {cfg} -c {CIPHER}"
            local = tmp / "local"
            tools = (
                ("scp", ["scp", "-q", "-F", str(cfg), "-c", CIPHER]),
                ("rsync", ["rsync", "-a", "-e", ssh]),
            )

            def settled() -> None:
                """Nothing left to write back: one copy's dirty pages must not slow the next."""
                os.sync()
                time.sleep(0.5)

            for r in range(args.repeat):
                extras.append(extra_work(args.size))
                for tool, argv in tools:
                    shutil.rmtree(local, ignore_errors=True)
                    local.mkdir()
                    settled()
                    copy(f"pull {tool}", [*argv, f"{alias}:{remote}/model.bin", f"{local}/"])
                shutil.rmtree(local, ignore_errors=True)
                local.mkdir()
                settled()
                ends, cpu, start = EndsCPU(sshd_pid, None), machine_cpu_s(), time.perf_counter()
                await pull.pull("loopback", remote, local)
                wall_cpu = (time.perf_counter() - start, machine_cpu_s() - cpu)
                note("pull remotemac", wall_cpu, ends.stop())
                shutil.rmtree(local, ignore_errors=True)
                run_id = f"floor-{r}"
                await push.prepare(run_id)  # a run dir: the provision phase's, not timed
                settled()
                ends, cpu, start = EndsCPU(sshd_pid, None), machine_cpu_s(), time.perf_counter()
                await push.sync(data, ["train.bin"], run_id, push.loopback)
                wall_cpu = (time.perf_counter() - start, machine_cpu_s() - cpu)
                note("push remotemac", wall_cpu, ends.stop())
                push.drop_run(run_id)
                for tool, argv in tools:
                    dest = server.home / f"{tool}-dest"
                    push.host_dir(dest)
                    settled()
                    copy(f"push {tool}", [*argv, str(data / "train.bin"), f"{alias}:{dest}/"])
                    shutil.rmtree(dest)
        finally:
            server.cleanup()

    med = {
        k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
        for k, v in rows.items()
    }
    extra = {k: statistics.median(e[k] for e in extras) for k in extras[0]}
    gib = args.size / (1 << 30)
    print(
        f"{args.size / (1 << 20):.0f} MiB, one file, loopback, {cores} cores, medians of {args.repeat}\n"
        f"promised extra work per end (CPU s): SHA-256 {extra['sha256']:.2f}, AES-GCM seal "
        f"{extra['seal']:.2f}, open {extra['open']:.2f}, plaintext into /dev/shm {extra['ram']:.2f}"
    )
    for way, adds in (
        ("push", 2 * extra["sha256"] + extra["seal"] + extra["open"] + extra["ram"]),
        ("pull", 2 * extra["sha256"]),
    ):
        best_peer = min(("scp", "rsync"), key=lambda tool: med[f"{way} {tool}"][0])
        p_wall, p_cpu = med[f"{way} {best_peer}"]
        r_wall, r_cpu = med[f"{way} remotemac"]
        floor_wall = (p_cpu + adds) / cores
        for tool in ("scp", "rsync", "remotemac"):
            wall, cpu = med[f"{way} {tool}"]
            print(
                f"  {way} {tool:9s} {wall:5.2f} s {args.size / wall / 1e6:6.1f} MB/s  CPU of both ends {cpu:5.2f} s"
            )
        print(
            f"  {way}: floor = {best_peer} CPU {p_cpu:.2f} s + promised {adds:.2f} s = "
            f"{p_cpu + adds:.2f} s over {cores} cores >= {floor_wall:.2f} s: best possible "
            f"{p_wall / floor_wall:.2f}x {best_peer}; measured {p_wall / r_wall:.2f}x "
            f"(remotemac CPU {r_cpu / gib:.2f} s per GiB)"
        )
        if args.pin:
            print_pinned(way, med, by_end, extra, args.size)
    return 0


def print_pinned(
    way: str,
    med: dict[str, tuple[float, float]],
    by_end: dict[str, list[dict[str, float]]],
    extra: dict[str, float],
    size: int,
) -> None:
    """The one-core-an-end floor of ``way`` against the faster pinned peer, and which
    end of remotemac's own copy stands above its floor."""
    ends = {
        key: {e: statistics.median(row[e] for row in rows) for e in ("laptop", "host")}
        for key, rows in by_end.items()
    }
    best_peer = min(("scp", "rsync"), key=lambda tool: med[f"{way} {tool}"][0])
    p_wall = med[f"{way} {best_peer}"][0]
    r_wall = med[f"{way} remotemac"][0]
    floor, slow, per_end = pinned_floor(way, ends[f"{way} {best_peer}"], extra)
    floor_wall = max(floor, p_wall)  # never faster than the peer itself
    mine = ends[f"{way} remotemac"]
    print(
        f"  {way}, pinned: {best_peer} {p_wall:.2f} s (laptop {ends[f'{way} {best_peer}']['laptop']:.2f}"
        f" + host {ends[f'{way} {best_peer}']['host']:.2f} s CPU); floor by end: laptop "
        f"{per_end['laptop']:.2f} s, host {per_end['host']:.2f} s: the {slow} sets it, "
        f"{floor_wall:.2f} s: best possible {p_wall / floor_wall:.2f}x {best_peer}; measured "
        f"{p_wall / r_wall:.2f}x ({size / r_wall / 1e6:.1f} MB/s), remotemac CPU laptop "
        f"{mine['laptop']:.2f} s (floor {per_end['laptop']:.2f}), host {mine['host']:.2f} s "
        f"(floor {per_end['host']:.2f})"
    )


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
