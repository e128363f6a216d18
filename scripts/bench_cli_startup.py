"""How fast does ``remotemac --help`` start, against ``python -c pass``, same minute.

Prints the median wall times of N runs of each and their ratio, and which heavy
modules (torch, textual, asyncssh) the command imported (should be none).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

HEAVY = ("torch", "textual", "asyncssh", "numpy", "pydantic", "yaml", "rich")


def timed(argv: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def imported_heavy(args: list[str]) -> list[str]:
    code = (
        "import sys\n"
        "from remotemac.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    line = [x for x in out.stdout.splitlines() if x.startswith("HEAVY=")][-1]
    return [m for m in line[len("HEAVY=") :].split(",") if m]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    base = timed([sys.executable, "-c", "pass"], args.runs)
    cli = timed([sys.executable, "-m", "remotemac", "--help"], args.runs)
    print(f"python -c pass      : {base * 1000:7.1f} ms (median of {args.runs})")
    print(f"remotemac --help    : {cli * 1000:7.1f} ms (median of {args.runs})")
    print(f"ratio               : {cli / base:7.2f}x")
    print(f"heavy modules loaded by --help: {imported_heavy(['--help']) or 'none'}")


if __name__ == "__main__":
    main()
