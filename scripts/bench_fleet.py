"""Fleet scaling: wall time and the orchestrator's peak RSS for 1, 4 and 16 hosts.

Each size runs in a fresh child process (so peak RSS is that size's alone) that
starts N real sshd instances on loopback, then runs one playbook over all of
them with ``run_fleet`` in-process (``--forks`` = N). The job is the same small
stdlib workload on every host (``lines`` emitter, 2 x ~1 s).

Caveat printed with the figures: the "hosts" are sshds on this machine, so
their agents and jobs share its cores with the orchestrator; on real Macs only
the orchestrator's own CPU (reported separately) is spent here. "host cpu s" sums
what every run's agent reported (its processes and their op subprocesses, not the
jobs), so the figure separates the orchestrator from the simulated hosts.

    python scripts/bench_fleet.py [--sizes 1,4,16] [--seconds 1.0] [--torch]
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def vm_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child(size: int, seconds: float, torch: bool) -> dict:
    from remotemac.engine.context import RunOptions
    from remotemac.engine.fleet import FLEET_FOLLOW_POLL_S, plan_runs, run_fleet
    from remotemac.engine.hosts import SSHOptions
    from remotemac.engine.inventoryfile import load_inventory
    from remotemac.journal import Journal
    from remotemac.playbook import load_playbook
    from tests import fleetkit as fk
    from tests.harness import lab
    from tests.harness.sshd import SSHD, ClientKey

    base = Path(tempfile.mkdtemp(prefix="rm-bench-fleet-"))
    servers: list[SSHD] = []
    key = ClientKey.generate(base / "client")

    def start(**kw) -> SSHD:
        # the login is this user (not the lab user): fleetkit puts each root under base
        server = SSHD(
            base / f"sshd{len(servers)}", client_key=key, user=getpass.getuser(), **kw
        ).start()
        servers.append(server)
        return server

    try:
        macs, config = fk.start_macs(size, base, start)
        home = base / "home"
        fk.trust(home, macs)
        inv_path = fk.write_inventory(base / "inventory.yaml", macs)
        command = (
            f"python3 emit.py --device {{device}} --out {{output_dir}} --lines 10 "
            f"--seconds {seconds}" + (" --torch" if torch else "")
        )
        # the lab host's own bare python3 (no venv to build per host: this measures the
        # orchestrator), or with --torch the lab's torch interpreter
        python = lab.ensure_host_torch_python() if torch else None
        overrides = {} if torch else {"environment": {"python": "python3", "venv": False}}
        pb_path = fk.write_playbook(
            base / "bench.yaml", workload={"command": command}, python=python, **overrides
        )
        pb = load_playbook(pb_path)
        inventory = load_inventory(inv_path)
        runs = plan_runs(pb, inventory.hosts(), inventory, base / "out")
        rss_before = vm_kib("VmHWM")
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        started = time.monotonic()
        result = asyncio.run(
            run_fleet(
                pb,
                runs,
                journal=Journal(home / "journal.sqlite3"),
                home=home,
                out_root=base / "out",
                options=RunOptions(follow_poll_s=FLEET_FOLLOW_POLL_S),
                ssh=SSHOptions(ssh_config=config),
                forks=size,
            )
        )
        wall = time.monotonic() - started
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        counts: dict[str, int] = {}
        host_cpu = 0.0
        for r in result.runs:
            counts[r.verdict] = counts.get(r.verdict, 0) + 1
            record = r.out_dir / "acceptance.json"
            if record.exists():  # the agent's own CPU, reported per run (issue 16)
                host_cpu += (json.loads(record.read_text()).get("cpu") or {}).get("host_s") or 0
        return {
            "hosts": size,
            "wall_s": round(wall, 2),
            "verdicts": counts,
            "connections": result.connections,
            "host_agent_cpu_s": round(host_cpu, 2),
            "orchestrator_cpu_s": round(
                cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 2
            ),
            "rss_before_kib": rss_before,
            "peak_rss_kib": vm_kib("VmHWM"),
        }
    finally:
        for server in servers:
            server.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--seconds", type=float, default=1.0, help="each job's duration")
    ap.add_argument("--torch", action="store_true", help="jobs import torch (costs host CPU)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.seconds, args.torch)))
        return 0
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        argv = [sys.executable, __file__, "--child", str(size), "--seconds", str(args.seconds)]
        if args.torch:
            argv.append("--torch")
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=1800)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    one = rows[0]
    print(
        f"\nmachine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
        "(shared with other work; hosts are local sshds on the same cores)"
    )
    print(
        f"{'hosts':>5} {'wall s':>8} {'x one':>6} {'orch cpu s':>10} {'peak RSS MiB':>12} "
        f"{'Δ/host KiB':>10} {'host cpu s':>10}  verdicts"
    )
    for row in rows:
        per_host = (
            (row["peak_rss_kib"] - one["peak_rss_kib"]) / (row["hosts"] - one["hosts"])
            if row["hosts"] != one["hosts"]
            else 0
        )
        print(
            f"{row['hosts']:>5} {row['wall_s']:>8.1f} {row['wall_s'] / one['wall_s']:>6.2f} "
            f"{row['orchestrator_cpu_s']:>10.2f} {row['peak_rss_kib'] / 1024:>12.1f} "
            f"{per_host:>10.0f} {row.get('host_agent_cpu_s', 0):>10.2f}  {row['verdicts']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
