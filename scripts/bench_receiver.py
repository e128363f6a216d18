"""Benchmark: the host's sync receiver alone, per file (no SSH, no sshd, no laptop).

Why: on loopback, shape A (thousands of 16–256 KiB files) costs remotemac's host 2–5x
rsync's CPU, and the sshd bench mixes that with sshd, ssh, the laptop and the other
tenants of a shared machine. Here the laptop's side (engine/syncpieces.py: read, hash,
seal, frame) writes one stream of shape A and one of shape B (the same bytes in three
files) into files first; then the receiver (``dataops.serve``, as ``dataops.main``
runs it) reads each through a pipe from ``cat`` in the host's interpreter (Python 3.9,
as on a rental Mac and in tests/harness/lab.py), stores, decrypts into /dev/shm,
verifies, records and acknowledges every file, and answers the end frame. Its CPU
(both threads), user and system time and context switches per shape, and shape A
minus shape B per 1,000 files, are the receiver's per-file cost.

    python scripts/bench_receiver.py --repeat 5
    python scripts/bench_receiver.py --ab /work/main --repeat 5   # main's agent, interleaved
    python scripts/bench_receiver.py --profile                    # cProfile of both threads
    python scripts/bench_receiver.py --wrap 'strace -c -f'         # syscalls of shape A

``--no-host-hash`` (bench only: never a product switch) stands a hasher that does
nothing in for the host's SHA-256 of each small file's plaintext and takes the laptop's
claim: the difference is what the host's second hash costs (docs/figures.md). Shape A
only (its files all take the small-file path). Since the receiver no longer hashes a
file received whole in one encrypted stream (docs/contract.md, "Promises"), it changes
nothing on this code; it is kept for A/B runs against older checkouts.

cryptography for the host's interpreter comes from ``--runtime-path`` (a ``pip
install --target`` dir), or is installed into a temp dir first.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: the host's interpreter in the sshd bench (tests/harness/lab.py copies pyenv's 3.9)
HOST_PYTHON = "/root/.pyenv/versions/3.9.18/bin/python3.9"


def local_files(root: Path, paths: list) -> list:
    from remotemac.engine.syncplan import LocalFile

    out = []
    for rel in paths:
        st = os.stat(root / rel)
        out.append(LocalFile(rel, st.st_size, st.st_mtime_ns, st.st_ino, None, st.st_ctime_ns))
    return out


def write_stream(root: Path, files: list, key: bytes, out: Path) -> float:
    """The laptop's frames of every file into ``out``; the CPU seconds that took."""
    import collections

    from remotemac.engine.syncpieces import next_batch, pack_frame, read_pieces
    from remotemac.engine.syncplan import Job

    work = collections.deque(Job(i, None, None) for i in range(len(files)))
    pieces = read_pieces(root, files, work, key)
    start = time.process_time()
    with open(out, "wb") as fh:
        while True:
            batch = next_batch(pieces)
            for done in batch.done:
                files[done.index] = done.local
            if not batch.data:
                break
            fh.write(batch.data)
        final = json.dumps({"changed": []}).encode()
        fh.write(pack_frame("E", 0, len(final)) + final)
    return time.process_time() - start


def hello(files: list, run_dir: str, run_id: str, key: bytes) -> bytes:
    req = {
        "run_dir": run_dir,
        "run_id": run_id,
        "src": run_dir + "/data",
        "encrypted": True,
        "key_hex": key.hex(),
        "runtime_dir": "unused",
        "ram_bytes": 2 * sum(f.size for f in files) + (64 << 20),
        "columns": {
            "path": [f.path for f in files],
            "size": [f.size for f in files],
            "sha256": [f.sha256 for f in files],
            "mtime_ns": [f.mtime_ns for f in files],
        },
    }
    return json.dumps(req).encode() + b"\n"


class ThreadProfiles:
    """cProfile of the reading thread and of the write-behind thread."""

    def __init__(self) -> None:
        from remotemac.agent import writebehind

        self.main = cProfile.Profile()
        self.behind: list = []
        loop = writebehind.WriteBehind._loop
        owner = self

        def profiled(wb: object) -> None:
            prof = cProfile.Profile()
            owner.behind.append(prof)
            prof.enable()
            try:
                loop(wb)  # type: ignore[arg-type]
            finally:
                prof.disable()

        writebehind.WriteBehind._loop = profiled  # type: ignore[method-assign,assignment]

    def show(self, limit: int) -> None:
        for name, profs in (("reading thread", [self.main]), ("write-behind", self.behind)):
            if not profs:
                continue
            stats = pstats.Stats(profs[0])
            for p in profs[1:]:
                stats.add(p)
            print(f"--- {name}: by own time")
            stats.sort_stats("tottime").print_stats(limit)


class _NoHash:
    """--no-host-hash: a sha256 that hashes nothing (bench only)."""

    def update(self, data: bytes) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


def serve_child(args: argparse.Namespace) -> None:
    """In the host's interpreter: one receiver session on stdin; its costs as JSON."""
    import resource

    sys.path.insert(0, args.runtime_path)  # cryptography, as the agent runtime gives it
    sys.path.insert(0, args.agent_root)
    from remotemac.agent import dataops, receiver

    receiver.use_runtime = lambda path: None  # type: ignore[assignment]
    if args.no_host_hash:
        receiver.hashlib = type("H", (), {"sha256": _NoHash})  # type: ignore[assignment]
        receiver.Receiver._check_digest = staticmethod(lambda *a: None)  # type: ignore[method-assign]
    prof = ThreadProfiles() if args.profile else None
    stdout = io.BytesIO()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.process_time()
    if prof is not None:
        prof.main.enable()
    code = dataops.serve(sys.stdin.buffer, stdout, None)  # as dataops.main reads it
    if prof is not None:
        prof.main.disable()
    cpu = time.process_time() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    last = stdout.getvalue().splitlines()[-1]
    answer = json.loads(last)
    if code != 0 or not answer.get("ok") or answer["result"].get("mismatches"):
        raise SystemExit(f"receiver failed ({code}): {last[:300]!r}")
    if prof is not None:
        prof.show(args.top)
    print(
        json.dumps(
            {
                "cpu": cpu,
                "user": after.ru_utime - before.ru_utime,
                "sys": after.ru_stime - before.ru_stime,
                "switches": after.ru_nvcsw - before.ru_nvcsw + after.ru_nivcsw - before.ru_nivcsw,
                "acks": stdout.getvalue().count(b'"acks"'),
            }
        )
    )


def run_child(
    args: argparse.Namespace,
    root: str,
    head: bytes,
    stream: Path,
    tmp: Path,
    tag: str,
    profile: bool,
) -> dict:
    run_id = f"benchrecv{os.getpid()}{tag}"
    run_dir = str(tmp / "runs" / run_id)
    os.makedirs(run_dir)
    head_file = tmp / "head"
    head_file.write_bytes(
        head.replace(b"@RUN_DIR@", run_dir.encode()).replace(b"@RUN_ID@", run_id.encode())
    )
    argv = args.wrap.split() + [args.python, "-S", __file__, "--serve"]
    argv += ["--runtime-path", args.runtime_path, "--agent-root", root, "--top", str(args.top)]
    argv += ["--profile"] if profile else []
    argv += ["--no-host-hash"] if args.no_host_hash else []
    feed = subprocess.Popen(["cat", str(head_file), str(stream)], stdout=subprocess.PIPE)
    try:
        done = subprocess.run(argv, stdin=feed.stdout, capture_output=True, text=True)
    finally:
        assert feed.stdout is not None
        feed.stdout.close()
        feed.wait()
        shutil.rmtree(f"/dev/shm/remotemac-{run_id}", ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    if done.returncode:
        raise SystemExit(f"receiver child failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    if args.wrap:
        print(done.stderr[-6000:])
    lines = done.stdout.splitlines()
    if len(lines) > 1:
        print("\n".join(lines[:-1]))
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shapes", default="AB", help="A, B or AB (per 1,000 files needs both)")
    ap.add_argument("--ab", default="", help="another checkout (e.g. /work/main): interleaved")
    ap.add_argument("--profile", action="store_true", help="cProfile of shape A (both threads)")
    ap.add_argument("--no-host-hash", action="store_true", help="bench only: see the doc")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--python", default=HOST_PYTHON, help="the host's interpreter (3.9)")
    ap.add_argument("--runtime-path", default="", help="cryptography for it (pip --target)")
    ap.add_argument("--wrap", default="", help="prefix the child's argv (e.g. 'strace -c -f')")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--agent-root", default=str(ROOT), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve_child(args)
        return
    sys.path.insert(0, str(ROOT))
    from scripts.bench_sync import make_shape, parse_size

    size = parse_size(args.size)
    key = os.urandom(32)
    tmp = Path(tempfile.mkdtemp(prefix="bench-recv-"))
    try:
        if not args.runtime_path:
            args.runtime_path = str(tmp / "runtime")
            subprocess.run(
                [args.python, "-m", "pip", "install", "-q", "--target", args.runtime_path]
                + ["--only-binary=:all:", "cryptography"],
                check=True,
            )
        shapes = "A" if args.no_host_hash else args.shapes
        laptop, count, streams, heads = {}, {}, {}, {}
        for shape in shapes:
            data = tmp / f"data{shape}"
            paths = make_shape(data, shape, size)
            files = local_files(data, paths)
            stream = tmp / f"stream{shape}"
            laptop[shape] = write_stream(data, files, key, stream)
            streams[shape], count[shape] = stream, len(files)
            heads[shape] = hello(files, "@RUN_DIR@", "@RUN_ID@", key)
            shutil.rmtree(data)
        roots = {"this": str(ROOT)}
        if args.ab:
            roots["other"] = str(Path(args.ab).resolve())
        rows: dict = {(name, s): [] for name in roots for s in shapes}
        loads = []
        for r in range(args.repeat):
            loads.append(os.getloadavg()[0])
            for name, root in roots.items() if r % 2 == 0 else reversed(roots.items()):
                for shape in shapes:
                    profile = args.profile and shape == "A" and r == 0 and name == "this"
                    got = run_child(
                        args, root, heads[shape], streams[shape], tmp, f"{name}{shape}{r}", profile
                    )
                    rows[(name, shape)].append(got)
        print(
            f"{size >> 20} MiB: A {count['A']} files"
            + (f", B {count['B']}" if "B" in count else "")
            + f"; receiver under {args.python}; load {min(loads):.1f}-{max(loads):.1f}; "
            + ("host hash OFF (bench only)" if args.no_host_hash else "host hash on")
        )
        for name, root in roots.items():
            med = {}
            for shape in shapes:
                got = rows[(name, shape)]
                med[shape] = statistics.median(g["cpu"] for g in got)
                each = " ".join(format(g["cpu"], ".2f") for g in got)
                print(
                    f"  {name} ({root}) {shape}: CPU {each} s"
                    f" (median {med[shape]:.2f}; user "
                    f"{statistics.median(g['user'] for g in got):.2f}, sys "
                    f"{statistics.median(g['sys'] for g in got):.2f}), context switches "
                    f"{statistics.median(g['switches'] for g in got):.0f}, ack lines "
                    f"{statistics.median(g['acks'] for g in got):.0f}"
                )
            if "B" in med:
                extra = max(1, count["A"] - count["B"])
                per = (med["A"] - med["B"]) / extra * 1000
                print(f"  {name}: receiver CPU per 1,000 files (A - B): {per:.3f} s")
        if "B" in count:
            extra = max(1, count["A"] - count["B"])
            lap = (laptop["A"] - laptop["B"]) / extra * 1000
            print(f"laptop's frames (read, hash, seal) per 1,000 files: {lap:.3f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
