"""Cold build of a torch environment with uv and with pip, and a second one with the same torch.

Runs the agent on the host ``local`` under the lab's bare CPython 3.9 (the model of
a rented Mac's /usr/bin/python3), building venvs from the lab's relocatable 3.11
(what remotemac brings to a 3.9-only host), each cold case in a fresh remote_root
(empty caches):

* uv: uv brought the way a run brings it (its wheel from PyPI, unzipped under the
  root), ``uv venv`` + ``uv pip install -r`` (uv's cache under the root);
* pip: ``python -m venv`` + ``pip install -r`` (pip's cache under the root);
* second: in the uv root, another environment whose requirements differ but pin
  the same torch (a different venv key): its own disk figure, counted by ``du``
  after the first (hard links / APFS clones from uv's cache cost nothing).

torch comes from this machine's disk (``PIP_FIND_LINKS``, passed to uv as
``--find-links``), its dependencies from the package index; wall time and disk
(``du``, environment and cache apart) are printed, with the ratio pip / uv.

    python scripts/bench_env.py [--requirements "torch==2.13.0 numpy"]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from remotemac.engine.agentclient import AgentClient  # noqa: E402
from remotemac.engine.hostpython import ensure_uv  # noqa: E402
from remotemac.engine.ledger import Ledger  # noqa: E402
from remotemac.engine.provision import env_key  # noqa: E402
from remotemac.transport.local import LocalTransport  # noqa: E402

LAB = Path("/opt/remotemac-lab/usr/bin")
AGENT_PY = str(LAB / "python3.9")
VENV_PY = str(LAB / "python3.11")


def du(*paths: Path) -> list[int]:
    """Bytes on disk of each path, a hard link counted once, at its first path."""
    out = subprocess.run(
        ["du", "-s", "-B1", *map(str, paths)], capture_output=True, text=True, check=True
    ).stdout
    return [int(line.split()[0]) for line in out.splitlines()]


async def build(
    root: Path, home: Path, reqs: Path, installer: str, name: str = "a"
) -> tuple[float, dict]:
    ledger = Ledger(root.parent / "ledger.jsonl")
    agent = AgentClient(LocalTransport(), str(root), ledger, python=AGENT_PY)
    await agent.install()
    await agent.claim("bench")
    uv = None
    if installer == "uv":
        uv = await ensure_uv(agent, home=home, method="auto", emit=lambda _e: None, run_id="")
        if uv is None:
            raise SystemExit("uv could not be brought")
    started = time.monotonic()
    answer = await agent.call(
        "ensure_venv",
        {
            "root": str(root),
            "key": env_key(False, reqs.read_bytes()),
            "python": VENV_PY,
            "system_site_packages": False,
            "requirements": str(reqs),
            "uv": uv.exe if uv else None,
        },
        timeout=3600,
    )
    assert answer["installer"] == installer, answer
    return time.monotonic() - started, answer


def mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requirements", default="torch==2.13.0 numpy")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-env-") as tmp:
        base = Path(tmp)
        home = base / "home"
        reqs = base / "requirements.txt"
        reqs.write_text("\n".join(args.requirements.split()) + "\n")
        second = base / "requirements-2.txt"
        second.write_text(reqs.read_text() + "six\n")
        print(f"load average {os.getloadavg()[0]:.1f} (2 cores, shared with other work)")
        rows = {}
        for installer in ("uv", "pip"):
            root = base / installer / "root"
            root.parent.mkdir()
            seconds, answer = await build(root, home, reqs, installer)
            env_bytes, cache_bytes = du(
                Path(answer["env_dir"]), root / "runtime" / f"{installer}-cache"
            )
            rows[installer] = (seconds, env_bytes, cache_bytes)
            print(
                f"cold {installer:3}: {seconds:6.1f} s, environment {mib(env_bytes)}, "
                f"its cache {mib(cache_bytes)} more (a file hard-linked into the environment "
                "is counted there)"
            )
        root = base / "uv" / "root"
        seconds, answer = await build(root, home, second, "uv")
        first_env = next(
            p for p in (root / "envs").iterdir() if p.name != Path(answer["env_dir"]).name
        )
        _, _, again = du(root / "runtime" / "uv-cache", first_env, Path(answer["env_dir"]))
        print(
            f"second uv environment, same torch (+six): {seconds:.1f} s, "
            f"{mib(again)} more on disk (first: {mib(rows['uv'][1])})"
        )
        uv_s, pip_s = rows["uv"][0], rows["pip"][0]
        print(f"cold build, pip / uv: {pip_s / uv_s:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
