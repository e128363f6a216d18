"""Benchmark: the fastest one large file could go on this machine, with remotemac's checks.

When laptop and host share one machine (the loopback benches), a large file is bound by
the CPU both ends spend on it together, not by either process alone. scp and rsync only
move the bytes; remotemac also does what its contract promises: SHA-256 of every byte on
the laptop (and on the host for a pull), and for a push the dataset's own AES-GCM
encryption (sealed on the laptop, opened on the host: a file received whole in one
stream is verified by that, not hashed again, docs/contract.md "Promises") plus the
plaintext copy in RAM-backed storage. This script measures,
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
work that end does (push: the laptop hashes and seals, the host opens and writes the
plaintext into RAM; pull: each end hashes once), and the larger of the
two is the least time any implementation keeping the promises could take. Beside it,
remotemac's measured CPU by end says which end holds it and by how much beyond the
floor.

    python scripts/bench_floor.py                 # 1 GiB, medians of 3
    python scripts/bench_floor.py --repeat 5 --size 512MiB
    python scripts/bench_floor.py --pin           # one core per end

``--shape A`` (issue 36) does the same for bench_sync's shape A (``--size`` bytes in
16–256 KiB files: 1,916 files at 256 MiB) pushed over loopback, against ``rsync -a``
(scp of thousands of files is no contender there). The promised work is then measured
file by file, as remotemac must do it: on the laptop SHA-256 and the dataset format's
seal of each file (streamcrypt: its own key derivation and header, then the chunks);
on the host the open of each (the same: it verifies the file, no second SHA-256 since
issue 36), and each plaintext written whole into /dev/shm as a part file renamed into
place (the job sees only
verified whole files, in RAM). The ciphertext at rest is not counted: rsync creates
a file for each on the same disk, so its CPU holds that already (remotemac packs small
files' ciphertext per group, which costs less: the "at rest" line measures both, and
the floor with packs). The floor is rsync's CPU of both ends plus that work, as a
ratio of rsync's CPU (the issue's goal is ≤ 1.5x), and each end of remotemac's own
push beside its floor says where the CPU above it goes. Each copy's destination is
removed outside its timing.

    python scripts/bench_floor.py --shape A --size 256MiB --repeat 3
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


def files_work(root: Path, paths: list[str], disk: str) -> dict[str, float]:
    """CPU seconds of the promised work of a push of ``paths``, file by file, in this
    process (each file read into memory first: rsync reads the files too).

    ``seal`` and ``open`` are the dataset format's own (remotemac/agent/streamcrypt.py:
    a key derived and a header made or checked per file, then its chunks); ``ram`` is
    each plaintext written whole into /dev/shm under a part name and renamed into place.
    Not promised, beside them: the ciphertext at rest under ``disk`` (the host's data
    disk), a file each as remotemac keeps it (``rest_files``: rsync creates as many) or
    packed per ~0.5 MiB group as the receiver now keeps it (``rest_pack``): what packing
    small files saves."""
    import hashlib
    import io

    from remotemac.agent import streamcrypt

    key = os.urandom(streamcrypt.KEY_LEN)
    blobs = [(rel, (root / rel).read_bytes()) for rel in paths]
    sealed: list[bytes] = []

    class Drop:
        def write(self, data: bytes) -> int:
            return len(data)

    def sha() -> None:
        for _, data in blobs:
            hashlib.sha256(data).digest()

    def seal() -> None:
        for rel, data in blobs:
            sealed.append(b"".join(streamcrypt.iter_encrypt(key, rel, io.BytesIO(data))))

    def open_() -> None:
        for (rel, _), data in zip(blobs, sealed, strict=True):
            streamcrypt.decrypt_stream(key, rel, io.BytesIO(data), Drop())

    ram_dir = tempfile.mkdtemp(prefix="rm-floor-", dir="/dev/shm")
    rest_dir = tempfile.mkdtemp(prefix="rm-floor-rest-", dir=disk)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL

    def rest_files() -> None:  # the ciphertext at rest as remotemac keeps it: a file each
        for i, data in enumerate(sealed):
            fd = os.open(f"{rest_dir}/.{i}.part", flags, 0o600)
            write(fd, data)
            os.close(fd)
            os.replace(f"{rest_dir}/.{i}.part", f"{rest_dir}/{i}")

    def rest_pack() -> None:  # ... or packed: one file per ~0.5 MiB group (agent/datafiles.Pack)
        fd = -1
        for i, data in enumerate(sealed):
            if fd < 0 or os.fstat(fd).st_size >= 1 << 19:
                if fd >= 0:
                    os.close(fd)
                fd = os.open(f"{rest_dir}/pack-{i}", flags, 0o600)
            write(fd, data)
        os.close(fd)

    def ram() -> None:
        for i, (_, data) in enumerate(blobs):
            part = f"{ram_dir}/.{i}.part"
            fd = os.open(part, flags, 0o600)
            write(fd, data)
            os.close(fd)
            os.replace(part, f"{ram_dir}/{i}")

    steps = (("sha256", sha), ("seal", seal), ("open", open_), ("ram", ram))
    steps += (("rest_files", rest_files), ("rest_pack", rest_pack))
    out: dict[str, float] = {}
    try:
        for name, step in steps:
            for _ in range(2):  # the lesser of two: the first pays for fresh memory
                if name == "seal":
                    sealed.clear()
                for where in (ram_dir, rest_dir):
                    shutil.rmtree(where)
                    os.mkdir(where)
                start = time.process_time()
                step()
                took = time.process_time() - start
                out[name] = min(out.get(name, took), took)
    finally:
        shutil.rmtree(ram_dir, ignore_errors=True)
        shutil.rmtree(rest_dir, ignore_errors=True)
    return out


def write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def peer(argv: list[str]) -> tuple[float, float]:
    return cpu_of(lambda: subprocess.run(argv, check=True))


#: the promised per-byte work each end does, by direction (names of extra_work's steps)
PROMISED_BY_END = {
    # (the host's check of a push received whole is its open: docs/contract.md "Promises")
    "push": {"laptop": ("sha256", "seal"), "host": ("open", "ram")},
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
    ap.add_argument(
        "--shape", choices=("one", "A"), default="one", help="one large file, or shape A"
    )
    args = ap.parse_args()
    if args.shape == "A":
        return await shape_a(args)
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
        f"promised extra work (CPU s): SHA-256 {extra['sha256']:.2f} (laptop; host too for a "
        f"pull), AES-GCM seal "
        f"{extra['seal']:.2f}, open {extra['open']:.2f}, plaintext into /dev/shm {extra['ram']:.2f}"
    )
    for way, adds in (
        ("push", extra["sha256"] + extra["seal"] + extra["open"] + extra["ram"]),
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


#: the promised work of a push of many files each end does (names of files_work's steps)
PROMISED_FILES_BY_END = {"laptop": ("sha256", "seal"), "host": ("open", "ram")}


async def shape_a(args: argparse.Namespace) -> int:
    """The floor of a loopback push of shape A against rsync (see the module doc).

    rsync and remotemac alternate which goes first each round (each frees the last
    round's files before the next creates as many, on the same ext4)."""
    cores = os.cpu_count() or 1
    rows: dict[str, list[tuple[float, float]]] = {}
    by_end: dict[str, list[dict[str, float]]] = {}
    works: list[dict[str, float]] = []
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="rm-floor-") as t:
        tmp = Path(t)
        server = SSHD(tmp / "sshd").start()
        sshd_pid = server.proc.pid if server.proc is not None else None
        if args.pin:
            pin_ends(server)
        try:
            (tmp / "s").mkdir()
            push = bench_sync.Bench(tmp / "s", server)
            data = tmp / "shape-A"
            paths = bench_sync.make_shape(data, "A", args.size)
            ssh = f"ssh -F {push.cfg} -c {CIPHER}"
            dest = server.home / "rsync-dest"

            def settled() -> None:
                os.sync()
                time.sleep(0.5)

            def timed(key: str, ends: EndsCPU, wall_cpu: tuple[float, float]) -> None:
                rows.setdefault(key, []).append(wall_cpu)
                by_end.setdefault(key, []).append(dict(ends.stop().cpu))

            async def remotemac(r: int) -> None:
                run_id = f"floor-a-{os.getpid()}-{r}"
                await push.prepare(run_id)  # the provision phase's: not timed
                settled()
                ends, cpu, start = EndsCPU(sshd_pid, None), machine_cpu_s(), time.perf_counter()
                await push.sync(data, paths, run_id, push.loopback)
                timed("remotemac", ends, (time.perf_counter() - start, machine_cpu_s() - cpu))
                push.drop_run(run_id)

            def rsync() -> None:
                push.host_dir(dest)
                settled()
                argv = ["rsync", "-a", "-e", ssh, f"{data}/", f"bench:{dest}/"]
                ends = EndsCPU(sshd_pid, None)
                timed("rsync", ends, peer(argv))
                shutil.rmtree(dest)

            for r in range(args.repeat):
                loads.append(os.getloadavg()[0])
                works.append(files_work(data, paths, str(server.home)))
                if r % 2:
                    await remotemac(r)
                    rsync()
                else:
                    rsync()
                    await remotemac(r)
                loads.append(os.getloadavg()[0])
        finally:
            server.cleanup()
    print_shape_a(args, len(paths), cores, rows, by_end, works, loads)
    return 0


def print_shape_a(
    args: argparse.Namespace,
    files: int,
    cores: int,
    rows: dict[str, list[tuple[float, float]]],
    by_end: dict[str, list[dict[str, float]]],
    works: list[dict[str, float]],
    loads: list[float],
) -> None:
    """Shape A's floor against rsync, and remotemac's ends beside their floors."""
    med = {
        k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
        for k, v in rows.items()
    }
    ends = {
        k: {e: statistics.median(row[e] for row in v) for e in ("laptop", "host", "host.sshd")}
        for k, v in by_end.items()
    }
    work = {k: statistics.median(w[k] for w in works) for k in works[0]}
    promised = {e: sum(work[s] for s in steps) for e, steps in PROMISED_FILES_BY_END.items()}
    floor_end = {e: ends["rsync"][e] + promised[e] for e in promised}
    rs_ends = ends["rsync"]["laptop"] + ends["rsync"]["host"]
    rm_ends = ends["remotemac"]["laptop"] + ends["remotemac"]["host"]
    floor = sum(floor_end.values())
    (p_wall, p_cpu), r_wall = med["rsync"], med["remotemac"][0]
    floor_wall = (p_cpu + sum(promised.values())) / cores
    print(
        f"{args.size / (1 << 20):.0f} MiB, shape A ({files} files), loopback, {cores} cores, "
        f"medians of {args.repeat}, load {min(loads):.1f}-{max(loads):.1f}"
        + (", ends pinned" if args.pin else "")
    )
    print(
        f"promised work (CPU s, this process): SHA-256 {work['sha256']:.2f} (laptop), seal "
        f"{work['seal']:.2f}, open {work['open']:.2f} (streamcrypt, file by file), "
        f"plaintext files into /dev/shm {work['ram']:.2f}: laptop {promised['laptop']:.2f}, "
        f"host {promised['host']:.2f}"
    )
    for tool in ("rsync", "remotemac"):
        wall, cpu = med[tool]
        e = ends[tool]
        print(
            f"  {tool:9s} {wall:5.2f} s {args.size / wall / 1e6:6.1f} MB/s  CPU of both ends "
            f"{e['laptop'] + e['host']:5.2f} s (laptop {e['laptop']:.2f} + host {e['host']:.2f}, "
            f"sshd {e['host.sshd']:.2f}); machine {cpu:.2f} s"
        )
    print(
        f"  floor: rsync's ends {rs_ends:.2f} s + promised {sum(promised.values()):.2f} s = "
        f"{floor:.2f} s: **{floor / rs_ends:.2f}x rsync's CPU** (goal <= 1.5x); over {cores} "
        f"cores >= {floor_wall:.2f} s: best possible {min(1.0, p_wall / floor_wall):.2f}x rsync"
    )
    if args.pin:  # one core an end: the slower end's floor is the least time
        slow = max(floor_end, key=lambda e: floor_end[e])
        floor_pinned = max(floor_end[slow], p_wall)
        print(
            f"  pinned: floor by end laptop {floor_end['laptop']:.2f} s, host "
            f"{floor_end['host']:.2f} s: the {slow} sets it, {floor_pinned:.2f} s: best "
            f"possible {p_wall / floor_pinned:.2f}x rsync; measured {p_wall / r_wall:.2f}x"
        )
    saved = work["rest_files"] - work["rest_pack"]
    print(
        f"  at rest (not promised; on the host's disk, this process): the ciphertext a file "
        f"each {work['rest_files']:.2f} s, packed per ~0.5 MiB {work['rest_pack']:.2f} s: "
        f"with packs the floor would be {floor - saved:.2f} s, "
        f"{(floor - saved) / rs_ends:.2f}x rsync's CPU"
    )
    print(
        f"  remotemac: ends {rm_ends:.2f} s = {rm_ends / rs_ends:.2f}x rsync's CPU, "
        f"{p_wall / r_wall:.2f}x its rate; above the floor: laptop "
        f"{ends['remotemac']['laptop'] - floor_end['laptop']:+.2f} s (floor "
        f"{floor_end['laptop']:.2f}), host {ends['remotemac']['host'] - floor_end['host']:+.2f} s "
        f"(floor {floor_end['host']:.2f})"
    )


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
