"""Issue 34: the job's own memory counts a page that forked processes share once.

Linux: real processes, a real fork, the kernel's own PSS. macOS: a simulation (no Mac
here) of libproc's ``proc_pid_rusage`` filling ``struct rusage_info_v0`` as
<sys/resource.h> lays it out; the values are made up for the test, not recorded.
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remotemac.agent import ownmem, proctree

MiB = 1 << 20

HOLD_AND_FORK = """
import os, sys, time
block = bytearray(os.urandom(1 << 20)) * 150  # 150 MiB, touched
pid = os.fork()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.slow  # a process fills 150 MiB and forks
@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="Linux smaps_rollup")
def test_pages_a_forked_child_shares_count_once(tmp_path):
    """A process holding 150 MiB forks: RSS summed over both is ~300 MiB, the job's own
    memory (PSS) ~150 MiB, as the two share every page until one writes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_FORK], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        proc.stdout.readline()  # both processes are up
        time.sleep(0.3)
        got = proctree.tree_rss(proc.pid, session_leader=True)
        assert len(got.pids) == 2
        own = ownmem.own_bytes(got.pids)
        assert own is not None and own[1] == "pss"
        assert got.rss_bytes > 290 * MiB
        assert 140 * MiB < own[0] < 200 * MiB, (own, got.rss_bytes)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_a_process_that_exited_counts_nothing_and_does_not_void_the_sample():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    own = ownmem.own_bytes([os.getpid(), child.pid], platform="linux")
    assert own is not None and own[0] > 0


class _Libproc:
    """Simulation of libproc: ``proc_pid_rusage(pid, RUSAGE_INFO_V0, buf)`` fills
    ``struct rusage_info_v0``: uuid[16], then user_time, system_time, pkg_idle_wkups,
    interrupt_wkups, pageins, wired_size, resident_size, phys_footprint,
    proc_start_abstime, proc_exit_abstime (uint64 each); -1 for a pid that is gone."""

    def __init__(self, table: dict[int, tuple[int, int]]) -> None:
        self.table = table  # pid -> (resident_size, phys_footprint)

    def proc_pid_rusage(self, pid, flavor, buf) -> int:
        assert flavor.value == ownmem.RUSAGE_INFO_V0
        if pid.value not in self.table:
            return -1
        resident, footprint = self.table[pid.value]
        fields = [11, 22, 0, 0, 7, 0, resident, footprint, 5, 0]
        ctypes.memmove(buf, b"\x01" * 16 + struct.pack("<10Q", *fields), 96)
        return 0


def test_macos_phys_footprint_is_read_from_rusage_info():
    """Simulation (see _Libproc): the footprint, not the resident size, is the job's."""
    me = os.getpid()
    lib = _Libproc({me: (900 * MiB, 310 * MiB), me + 1: (850 * MiB, 40 * MiB)})
    assert ownmem.phys_footprint_bytes(me, lib) == 310 * MiB
    assert ownmem.own_bytes([me, me + 1], platform="darwin", lib=lib) == (
        350 * MiB,
        "phys-footprint",
    )
    # a pid libproc does not know, still alive (here: ourselves missing from the table)
    assert ownmem.own_bytes([me], platform="darwin", lib=_Libproc({})) is None
