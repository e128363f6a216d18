"""How fast does a followed log resume after the link comes back?

Runs the whole pipeline against a throwaway sshd (the fresh-host lab of
tests/harness/lab.py on this machine, real tmux) behind the fault proxy: a workload printing LINES numbered lines over SECONDS while the
link is cut CUTS times and blackholed once (keepalive 1 s x 3). Prints whether
every line arrived exactly once, the job's exit code, and the time from link
restored to the first new log line (median, p90, max).

    python scripts/bench_reattach.py [--lines 5000] [--seconds 30] [--cuts 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness.faultproxy import FaultProxy  # noqa: E402
from tests.harness.fixtures import trust_line  # noqa: E402
from tests.harness.sshd import SSHD, ClientKey  # noqa: E402
from tests.test_detached_faults import fault_run  # noqa: E402
from tests.test_detached_ssh import (  # noqa: E402
    SSHHost,
    cleanup_host,
    expected_lines,
    local_lines,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--cuts", type=int, default=20)
    ap.add_argument("--no-blackhole", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rm-bench-reattach-"))
    server = SSHD(work / "sshd", client_key=ClientKey.generate(work / "key")).start()
    proxy = FaultProxy(server.host, server.port).start()
    host = None
    try:
        home = work / "home"
        home.mkdir()
        (home / "known_hosts").write_text(trust_line(server, proxy.port))
        empty = work / "user_known_hosts"
        empty.touch()
        cfg = server.write_ssh_config(
            work / "ssh_config",
            "benchhost",
            known_hosts=empty,
            port=proxy.port,
            extra={"ServerAliveInterval": "1", "ServerAliveCountMax": "3", "ConnectTimeout": "5"},
        )
        host = SSHHost(
            home, cfg, "benchhost", server.home / "host-root", str(server.tmux_dir), server, proxy
        )
        result = fault_run(
            host,
            proxy,
            work,
            lines=args.lines,
            seconds=args.seconds,
            cuts=args.cuts,
            blackhole=not args.no_blackhole,
        )
        got = local_lines(result["out"])
        want = expected_lines(args.lines)
        waits = sorted(result["resume_s"])
        figures = {
            "lines_expected": len(want),
            "lines_local": len(got),
            "exactly_once_in_order": got == want,
            "job_state": result["follow"].get("state"),
            "job_exit_code": result["follow"].get("exit_code"),
            "faults": [f["kind"] for f in result["faults"]].count("cut"),
            "blackholes": [f["kind"] for f in result["faults"]].count("blackhole"),
            "disconnects": result["continuity"].get("disconnects"),
            "reconnects": result["continuity"].get("reconnects"),
            "resume_median_s": round(result["median_s"], 3) if waits else None,
            "resume_p90_s": round(result["p90_s"], 3) if waits else None,
            "resume_max_s": round(waits[-1], 3) if waits else None,
            "blackhole_resume_s": round(result["resume_s"][-1], 3)
            if waits and not args.no_blackhole
            else None,
            "wall_s": round(result["seconds"], 1),
        }
        if args.json:
            print(json.dumps(figures))
        else:
            for key, value in figures.items():
                print(f"{key:24} {value}")
        return 0 if figures["exactly_once_in_order"] else 1
    finally:
        proxy.stop()
        if host is not None:
            cleanup_host(host)
        server.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
