#!/usr/bin/env python3
"""Run mypy (config: ``[tool.mypy]`` in pyproject.toml) against a baseline of known errors.

The engine, transport, data and acceptance packages had no type checker until issue 21;
the errors found then are listed in scripts/mypy-baseline.txt, one per line, without line
numbers (``path: [code] message``) so unrelated edits do not churn it. A new error fails;
a fixed one is reported so the baseline can shrink (``--update`` rewrites it).

Exit 0 when mypy finds nothing outside the baseline, 1 otherwise.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "scripts" / "mypy-baseline.txt"
ERROR = re.compile(r"^(?P<path>[^:]+):\d+(?::\d+)?: error: (?P<msg>.*?)\s+\[(?P<code>[\w-]+)\]$")


def current() -> list[str]:
    """mypy's errors as baseline lines (sorted, duplicates kept)."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--hide-error-context", "--no-pretty"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode not in (0, 1) or "error: " in proc.stderr:
        sys.exit(f"mypy did not run: {proc.stderr.strip() or proc.stdout.strip()}")
    lines = []
    for line in proc.stdout.splitlines():
        match = ERROR.match(line)
        if match:
            lines.append(f"{match['path']}: [{match['code']}] {match['msg']}")
    return sorted(lines)


def main() -> int:
    found = current()
    if "--update" in sys.argv[1:]:
        BASELINE.write_text("".join(line + "\n" for line in found))
        print(f"mypy baseline: {len(found)} known error(s) written to {BASELINE.name}")
        return 0
    known = collections.Counter(BASELINE.read_text().splitlines() if BASELINE.exists() else [])
    now = collections.Counter(found)
    new = now - known
    fixed = known - now
    for line in sorted(fixed.elements()):
        print(f"fixed (remove from the baseline): {line}")
    for line in sorted(new.elements()):
        print(f"new type error: {line}")
    print(
        f"mypy: {sum(now.values())} error(s), {sum(new.values())} new, "
        f"{sum(fixed.values())} fixed against the baseline of {sum(known.values())}"
    )
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
