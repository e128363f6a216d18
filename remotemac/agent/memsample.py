"""Memory sampling for the in-agent harness and for the runner.

Runs on the host (Python 3.9, standard library only; torch is only touched when the
workload already imported it). Two users:

* the harness samples its own process tree (the Python workload runs in-process; its
  forked DataLoader workers are its children) and, on MPS, the Metal allocator's
  figures, one JSON line per tick in ``metrics.jsonl``;
* the runner samples the job's process tree (runner.JobMemory), in the same row shape
  (:func:`tree_row`).

A row holds the RSS summed over the tree and, where the OS gives it, the tree's own
memory (ownmem.py: Linux PSS from ``/proc/<pid>/smaps_rollup``, macOS
``ri_phys_footprint`` from ``proc_pid_rusage``), which counts the pages forked workers
share with their parent once: summed RSS counts them again in every worker, so two
workers starting read as "memory keeps growing" (issue 34). The record judges the trend
on ``own_bytes`` when every row has it. RSS here is always the *current* resident size:
``ru_maxrss`` is a high-water mark and cannot show a leak's trend, so it is only used
for the peak.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

if __package__:  # part of the agent package (the runner, tests, the laptop)
    from . import ownmem, proctree
else:  # loaded by path inside the workload (harness.py run as a script): so are they,
    # under private names, so a user module called ``ownmem`` is neither shadowed nor used
    import runpy
    import types

    _HERE = os.path.dirname(os.path.abspath(__file__))
    ownmem = types.SimpleNamespace(
        **runpy.run_path(os.path.join(_HERE, "ownmem.py"), run_name="_remotemac_ownmem")
    )
    proctree = types.SimpleNamespace(
        **runpy.run_path(os.path.join(_HERE, "proctree.py"), run_name="_remotemac_proctree")
    )

# /bin/ps with close_fds=False lets CPython use posix_spawn on macOS instead of fork():
# forking a process that holds gigabytes of tensors once per second is not free.
PS = "/bin/ps"


def rss_from_statm(pid: int) -> int | None:
    """Linux: resident pages from /proc/<pid>/statm times the page size."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            fields = f.read().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None


def rss_from_ps(pid: int, ps: str = PS) -> int | None:
    """macOS (and any BSD): ``ps -o rss= -p PID`` prints kilobytes; None if the pid is gone."""
    try:
        proc = subprocess.run(
            [ps, "-o", "rss=", "-p", str(pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=False,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = proc.stdout.decode("ascii", "replace").strip()
    if proc.returncode != 0 or not text.isdigit():
        return None
    return int(text) * 1024


def sample_rss(pid: int) -> int | None:
    """Current resident set size of ``pid`` in bytes, or None when it cannot be read."""
    if os.path.exists("/proc/self/statm"):
        return rss_from_statm(pid)
    return rss_from_ps(pid)


def tree_row(pids: list[int], rss_bytes: int) -> dict[str, object]:
    """One memory row of a process tree: its summed RSS, how many processes, and the
    tree's own memory (``own_bytes``, ``own_kind``) when every process's can be read."""
    row: dict[str, object] = {"rss_bytes": rss_bytes, "processes": len(pids)}
    row["source"] = "process-tree"
    own = ownmem.own_bytes(pids)
    if own is not None:
        # what the job itself uses: shared pages (forked workers) counted once
        row["own_bytes"], row["own_kind"] = own
    return row


def peak_rss_self() -> int:
    """High-water RSS of this process: ru_maxrss is KiB on Linux, bytes on macOS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def mps_memory() -> dict[str, int]:
    """The Metal allocator's figures, if the workload has torch with MPS available.

    Never imports torch: importing from this thread while the workload's main thread
    is importing it could deadlock on the import lock.
    """
    torch = sys.modules.get("torch")
    mps = getattr(torch, "mps", None) if torch is not None else None
    if mps is None:
        return {}
    try:
        if not torch.backends.mps.is_available():
            return {}
        return {
            "mps_current_allocated_bytes": int(mps.current_allocated_memory()),
            "mps_driver_allocated_bytes": int(mps.driver_allocated_memory()),
            "mps_recommended_max_bytes": int(mps.recommended_max_memory()),
        }
    except Exception:  # noqa: BLE001 - a sampler must never kill the workload
        return {}


class Sampler(threading.Thread):
    """Appends one JSON line per interval to ``metrics.jsonl`` and keeps the peak.

    ``extra`` is called each tick (e.g. to refresh the harness's provisional record);
    its failures are swallowed so that sampling never disturbs the workload.
    """

    def __init__(
        self,
        path: str,
        interval: float,
        mps: bool,
        extra: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(name="remotemac-sampler", daemon=True)
        self.interval = max(0.01, float(interval))
        self.mps = mps
        self.extra = extra
        #: this process's own RSS high-water mark (not the tree's sum: that counts pages
        #: a forked worker shares once per worker)
        self.peak_rss = 0
        #: the tree's own memory at its highest (PSS / phys_footprint), 0 when unread
        self.peak_own = 0
        self.count = 0
        self.started = time.monotonic()
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._out: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in stop()

    def sample(self) -> dict[str, object]:
        """Take one sample and append it; safe from any thread."""
        t = round(time.monotonic() - self.started, 3)
        pid = os.getpid()
        table = proctree.process_table()
        pids = proctree.tree(table, pid)
        record: dict[str, object] = {"t": t}
        if pid in table:
            record.update(tree_row(pids, sum(table[p][2] for p in pids if p in table)))
            own_rss: int | None = table[pid][2]
        else:  # no process table (no /proc, no ps): this process alone
            own_rss = sample_rss(pid)
            record["rss_bytes"] = own_rss
        if self.mps:
            record.update(mps_memory())
        with self._lock:
            if isinstance(own_rss, int):
                self.peak_rss = max(self.peak_rss, own_rss)
            own = record.get("own_bytes")
            if isinstance(own, int):
                self.peak_own = max(self.peak_own, own)
            if not self._out.closed:
                self._out.write(json.dumps(record, sort_keys=True) + "\n")
                self._out.flush()
                self.count += 1
        return record

    def run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # see class docstring
                self.sample()
                if self.extra is not None:
                    self.extra(time.monotonic() - self.started)
            if self._stop_event.wait(self.interval):
                return

    def stop(self) -> None:
        """Stop the thread, take a last sample and close the file."""
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)
        with contextlib.suppress(Exception):
            self.sample()
        with self._lock:
            self._out.close()
