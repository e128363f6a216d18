"""Fixed cost, two checkouts against each other: the CLI's warm trivial run of each, in
turn, on one lab sshd, with ``ssh host true`` between the runs (issue 36).

Why: on a shared machine the load moves both the run and ``ssh true`` from one minute
to the next; a change is judged by the two checkouts interleaved run by run (the
order swapped every round), each as a user runs it (``python -m remotemac run``, its
start-up included; ``PYTHONPATH`` names the checkout). The project, the playbook and
the ``ssh true`` are bench_fixed_cost.py's; ``--rtt-ms`` puts the fault proxy between.

    python scripts/bench_fixed_cost_ab.py [--rtt-ms 80] [--runs 3] [--base /work/main]
        [--no-bytecode]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import bench_fixed_cost as bench  # noqa: E402


def cli(repo: Path, book: Path, home: Path, config: Path, out: Path) -> tuple[float, int]:
    """Wall and exit code of one ``remotemac run`` of ``repo``'s code."""
    argv = [sys.executable, "-m", "remotemac", "--home", str(home), "--ssh-config", str(config)]
    argv += ["run", str(book), "--out", str(out)]
    env = bench.cli_env(repo)
    started = time.monotonic()
    done = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, cwd=str(repo)
    )
    wall = time.monotonic() - started
    if done.returncode not in (0, 1):
        sys.stderr.write(done.stderr.decode(errors="replace")[-1500:])
    return wall, done.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="/work/main", help="the checkout compared against")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rtt-ms", type=float, default=0.0)
    ap.add_argument(
        "--no-bytecode",
        action="store_true",
        help="each CLI compiles its modules from source every run (PYTHONDONTWRITEBYTECODE)",
    )
    args = ap.parse_args()
    from tests.harness import lab
    from tests.harness.faultproxy import FaultProxy
    from tests.harness.sshd import SSHD, ClientKey

    repos = {"base": Path(args.base), "this": REPO}
    base = Path(tempfile.mkdtemp(prefix="rm-ab-"))
    # bytecode cached as an installed package has it (bench_fixed_cost.cli_env): the
    # prefix mirrors each checkout's own paths, so the two never share a cache entry
    bench.BYTECODE[0] = None if args.no_bytecode else base / "pycache"
    lab.ensure_lab()
    server = SSHD(base / "sshd", client_key=ClientKey.generate(base / "client")).start()
    proxy = None
    try:
        known = base / "user_known_hosts"
        known.write_text(server.known_hosts_line())
        home = base / "home"
        home.mkdir()
        (home / "known_hosts").write_text(server.known_hosts_line())
        port = None
        if args.rtt_ms:
            proxy = FaultProxy(server.host, server.port).start()
            proxy.rtt(args.rtt_ms / 1000)
            line = server.known_hosts_line(f"[{server.host}]:{proxy.port}")
            for path in (known, home / "known_hosts"):
                with open(path, "a") as fh:
                    fh.write(line)
            port = proxy.port
        config = server.write_ssh_config(base / "ssh_config", "mac", known_hosts=known, port=port)
        book = bench.write_project(base, bench.BARE, "mac", server.host_dir("root"))
        _, kex = bench.kex_of_both(config, "mac")
        for name, repo in repos.items():  # warm-up: each checkout's agent installed
            cli(repo, book, home, config, base / f"warm-{name}")
        walls: dict[str, list[float]] = {n: [] for n in repos}
        codes: dict[str, list[int]] = {n: [] for n in repos}
        trues = []
        for i in range(args.runs):
            order = list(repos.items())
            for name, repo in order if i % 2 == 0 else order[::-1]:
                trues.append(bench.ssh_true(config, "mac", 1, kex))
                wall, code = cli(repo, book, home, config, base / f"{name}-{i}")
                walls[name].append(wall)
                codes[name].append(code)
        trues.append(bench.ssh_true(config, "mac", 1, kex))
        true_s = statistics.median(trues)
        print(
            f"rtt {args.rtt_ms:.0f} ms, load {os.getloadavg()[0]:.1f}, bytecode "
            f"{'none' if args.no_bytecode else 'cached'}, ssh host true "
            f"{true_s * 1000:.0f} ms (median of {len(trues)}, {kex})"
        )
        for name, repo in repos.items():
            wall = statistics.median(walls[name])
            print(
                f"  {name} ({repo}): {wall:.2f} s = {wall / true_s:.1f}x ssh true; runs "
                f"{' '.join(f'{w:.2f}' for w in walls[name])}; exits {codes[name]}"
            )
    finally:
        if proxy is not None:
            proxy.stop()
        server.tmux("kill-server")
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
