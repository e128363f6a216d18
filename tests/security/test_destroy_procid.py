"""Who a process is (procid): start times from the recorded macOS ``ps`` output and
from Linux's /proc, and path matches on component boundaries (items 4 and 6)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from remotemac.agent import procid

AGENT = str(Path(__file__).resolve().parents[2] / "remotemac" / "agent")

PS = (
    Path(__file__).resolve().parents[1]
    / "fixtures"
    / "macos"
    / "ps_ax_-o_pid,ppid,pgid,pcpu,time,vsz,rss,etime,command__apple_silicon.txt"
)


def test_item06_etime_from_recorded_macos_ps():
    """Simulation: the etime column as a real Mac printed it (``43:49``), and the
    longer forms ``ps`` uses after an hour and after a day."""
    rows = [line.split() for line in PS.read_text().splitlines()]
    assert [procid.parse_etime(r[7]) for r in rows] == [43 * 60 + 49, 43 * 60 + 48]
    assert procid.parse_etime("01:02:03") == 3723
    assert procid.parse_etime("2-01:02:03") == 2 * 86400 + 3723
    assert procid.parse_etime("") is None and procid.parse_etime("junk") is None


def test_item06_start_identity_tells_a_reused_pid_apart():
    first = subprocess.Popen(["sleep", "30"])
    recorded = procid.identity(first.pid)
    assert procid.same_start(first.pid, recorded)
    first.kill()
    first.wait()
    time.sleep(0.05)
    second = subprocess.Popen(["sleep", "30"])
    try:
        assert not procid.same_start(second.pid, recorded)  # whatever pid it got
        assert not procid.same_start(second.pid, None)
        assert not procid.same_start(second.pid, {"start_s": time.time() - 3600})
    finally:
        second.kill()
        second.wait()


def test_item04_paths_match_on_component_boundaries():
    line = "python3 /x/rr2/agent/v/deadman.py sleep /x/rr2/deadman/r.json"
    assert not procid.names_path(line, "/x/rr")
    assert procid.names_path(line, "/x/rr2")
    assert procid.names_path(line, "/x/rr2/deadman")
    assert procid.names_path("sh -c 'cd /x/rr && run'", "/x/rr")
    assert procid.names_path("--root=/x/rr", "/x/rr")
    assert not procid.names_path("/x/rr.bak/f", "/x/rr")
    assert procid.is_below("/x/rr/a", "/x/rr") and not procid.is_below("/x/rr2", "/x/rr")
