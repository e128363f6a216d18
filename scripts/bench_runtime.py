"""Cold and warm install of the agent runtime (cryptography for host-side decryption).

Runs the agent on the host ``local`` under the given interpreter (default: the bare
CPython 3.9 the fresh-host lab finds: pyenv's, uv's or the OS's; the model of a rented Mac's /usr/bin/python3), into a fresh
remote_root for each cold case:

* online: the host's pip installs the pinned set (pip cache inside remote_root);
* offline, laptop cache cold: the laptop downloads the host's wheels, uploads them,
  the agent unzips them;
* offline, laptop cache warm: the same with the wheels already in ``<home>/wheels``;
* reuse: a second ensure on a root that has the runtime (0 installs).

``--pypi`` ignores this machine's pip configuration (local mirrors, find-links)
and goes to https://pypi.org, as a rented Mac would.

    python scripts/bench_runtime.py [--python PATH] [--pypi]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from remotemac.agent.protocol import RuntimeEnsureAnswer  # noqa: E402
from remotemac.engine.agentclient import AgentClient  # noqa: E402
from remotemac.engine.ledger import Ledger  # noqa: E402
from remotemac.engine.runtime import ensure_runtime  # noqa: E402
from remotemac.transport.local import LocalTransport  # noqa: E402
from tests.harness import lab  # noqa: E402

BARE = lab.bare_python("3.9")  # pyenv's, uv's or the OS's, as the fresh-host lab finds it


async def once(
    python: str, root: Path, home: Path, method: str
) -> tuple[float, RuntimeEnsureAnswer, int]:
    ledger = root.parent / f"{root.name}.ledger.jsonl"
    agent = AgentClient(LocalTransport(), str(root), Ledger(ledger), python=python)
    await agent.install()
    before = _installs(ledger)
    started = time.monotonic()
    answer = await ensure_runtime(agent, home=home, method=method)
    seconds = time.monotonic() - started
    return seconds, answer, _installs(ledger) - before


def _installs(ledger: Path) -> int:
    """``install-runtime`` lines in the ledger (one per runtime installed)."""
    if not ledger.exists():
        return 0
    return sum(1 for line in ledger.read_text().splitlines() if "install-runtime" in line)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=BARE)
    parser.add_argument("--pypi", action="store_true")
    args = parser.parse_args()
    if not args.python:
        parser.error("no bare Python 3.9 found (pyenv, uv or /usr/bin): give --python")
    if args.pypi:
        os.environ.update(
            PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS="", PIP_INDEX_URL="https://pypi.org/simple"
        )
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        home = base / "home"
        rows = []
        s, a, n = await once(args.python, base / "online", home, "online")
        rows.append(("online, cold", s, a, n))
        s, a, n = await once(args.python, base / "online", home, "online")
        rows.append(("online, second run", s, a, n))
        s, a, n = await once(args.python, base / "offline1", home, "offline")
        rows.append(("offline, laptop wheel cache cold", s, a, n))
        s, a, n = await once(args.python, base / "offline2", home, "offline")
        rows.append(("offline, laptop wheel cache warm", s, a, n))
        s, a, n = await once(args.python, base / "offline2", home, "offline")
        rows.append(("offline, second run", s, a, n))
        print(f"agent python: {args.python}; index: {'pypi.org' if args.pypi else 'pip config'}")
        for name, seconds, answer, installs in rows:
            print(
                f"{name:34s} {seconds:6.2f} s  reused={answer.reused!s:5s} "
                f"host-side {answer.seconds} s  installs={installs}"
            )


if __name__ == "__main__":
    asyncio.run(main())
