"""Benchmark: the laptop's CPU per small file in a loopback push of shape A (issue 36).

Two figures, each on the laptop's side only (the host's is bench_receiver.py's):

1. the whole push (default): a cold loopback push of shape A through bench_sync's
   ``Bench`` (fresh connection each round), this process's CPU (every thread: the
   event loop, the frames' threads) and the event loop thread's alone, per round and
   per 1,000 files, with each end's CPU as bench_sync samples it. ``--profile FILE``
   keeps a cProfile of the event loop thread (clock: its CPU time, so a busy
   machine's waits do not count) of the last round;
2. ``--frames``: the frames alone (engine/syncpieces: read, SHA-256, seal, frame) of
   the same files into nothing, one thread's CPU, beside a plain read + SHA-256 +
   AES-GCM of each file: what the frames do per file beyond the promised per-byte work.

An A/B against another checkout runs this script with ``RM_BENCH_CODE=/that/checkout``
(its own venv), alternating with this one; ``--data DIR`` keeps the shape between runs.

    python scripts/bench_laptop_files.py --size 1GiB --rounds 2 --data /tmp/shapeA
    python scripts/bench_laptop_files.py --frames --size 1GiB --rounds 3 --data /tmp/shapeA
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import hashlib
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = os.environ.get("RM_BENCH_CODE") or str(ROOT)
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, CODE)

import bench_sync  # noqa: E402

from remotemac.engine import syncpieces, syncsplit  # noqa: E402
from remotemac.engine.syncplan import Job, stat_all  # noqa: E402
from tests.harness.sshd import SSHD  # noqa: E402


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def shape_a(data: Path | None, size: int, tmp: Path) -> tuple[Path, list[str]]:
    """Shape A under ``data`` (made there once) or in ``tmp``."""
    root = data or tmp / "shape-A"
    if root.exists():
        return root, sorted(str(p.relative_to(root)) for p in root.rglob("*.bin"))
    return root, bench_sync.make_shape(root, "A", size)


async def push(args: argparse.Namespace, tmp: Path) -> None:
    root, paths = shape_a(args.data, args.size, tmp)
    server = SSHD(tmp / "sshd").start()
    try:
        bench = bench_sync.Bench(tmp, server)
        print(f"{len(paths)} files, code {CODE}", flush=True)
        for r in range(args.rounds):
            run_id = f"lapfiles-{os.getpid()}-{r}"
            await bench.prepare(run_id)
            prof = cProfile.Profile(time.thread_time) if args.profile else None
            ends = bench.ends()
            cpu, loop = _cpu(), time.thread_time()
            if prof is not None:
                prof.enable()
            seconds, stats = await bench.sync(root, paths, run_id, bench.loopback)
            if prof is not None:
                prof.disable()
            cpu, loop = _cpu() - cpu, time.thread_time() - loop
            by_end = ends.stop()
            bench.drop_run(run_id)
            print(
                f"round {r + 1}: {seconds:.2f} s, laptop process {cpu:.2f} s of CPU "
                f"({cpu / len(paths) * 1000:.3f} s per 1,000 files), event loop thread "
                f"{loop:.2f} s; by end: {by_end}; {stats.streams_text()}, "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            if prof is not None and r == args.rounds - 1:
                prof.dump_stats(args.profile)
    finally:
        server.stop()


def frames(args: argparse.Namespace, tmp: Path) -> None:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    root, paths = shape_a(args.data, args.size, tmp)
    files = stat_all(root, paths, None)
    key = os.urandom(32)

    def ours() -> None:
        work = collections.deque(Job(i, None, None) for i in range(len(files)))
        pieces = syncpieces.read_pieces(
            root, list(files), work, key, lambda: False, {}, syncsplit.SealLog()
        )
        while (batch := syncpieces.next_batch(pieces)).data or batch.done:
            pass

    def floor() -> None:
        aead = AESGCM(key)
        for rel in paths:
            with open(root / rel, "rb", buffering=0) as fh:
                data = fh.read()
            hashlib.sha256(data).digest()
            aead.encrypt(bytes(12), data, None)

    print(f"{len(paths)} files, code {CODE}", flush=True)
    for r in range(args.rounds):
        took = {}
        for name, fn in (("frames", ours), ("floor", floor)):
            cpu = time.thread_time()
            fn()
            took[name] = time.thread_time() - cpu
        above = (took["frames"] - took["floor"]) / len(paths) * 1e6
        print(
            f"round {r + 1}: frames {took['frames']:.3f} s, read + SHA-256 + seal "
            f"{took['floor']:.3f} s: {above:.0f} us a file above it, "
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=bench_sync.parse_size, default=256 << 20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data", type=Path, help="shape A's folder (made there once)")
    parser.add_argument("--frames", action="store_true", help="the frames alone")
    parser.add_argument("--profile", help="cProfile of the event loop (last round)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rm-bench-lapfiles-") as t:
        if args.frames:
            frames(args, Path(t))
        else:
            asyncio.run(push(args, Path(t)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
