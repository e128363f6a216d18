"""The job's own memory: what its processes use, each shared page counted once.

Why not RSS: a forked DataLoader worker starts with its parent's pages mapped, and RSS
counts every shared page again in every process that maps it. Summed over a job with
two workers, RSS went ~700 MB -> 1,400 -> 2,000 as the workers started and faulted the
parent's pages in, and the trend called that "memory keeps growing" (issue 34) while
the job used no more memory at all.

* Linux: the proportional set size, ``Pss:`` of ``/proc/<pid>/smaps_rollup`` (kernel
  4.14+; ``smaps`` summed otherwise): a page shared by N processes counts 1/N in each,
  so the sum over the job counts it once.
* macOS: ``ri_phys_footprint`` of ``proc_pid_rusage(pid, RUSAGE_INFO_V0)`` (libproc,
  what Activity Monitor shows as a process's memory): the dirty memory the process
  owns, compressed and swapped pages included, shared clean pages not. On a Mac,
  DataLoader workers are spawned, not forked, so they share little anyway.

Either figure missing for a process (it exited, or the platform has neither) makes
:func:`own_bytes` return None, and the caller keeps the RSS sum instead: a sum of
mixed measures would be a trend of nothing. Standard library only, Python 3.9.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from typing import Any, List, Optional, Tuple

#: ``struct rusage_info_v0`` (<sys/resource.h>): uuid[16] then ten uint64 fields, the
#: eighth of which is ri_phys_footprint
RUSAGE_INFO_V0 = 0
RUSAGE_INFO_V0_SIZE = 16 + 10 * 8
PHYS_FOOTPRINT_OFFSET = 16 + 7 * 8
LIBPROC_PATHS = ("/usr/lib/libproc.dylib", "/usr/lib/libSystem.B.dylib")

_libproc: Any = None


def pss_bytes(pid: int, proc: str = "/proc") -> Optional[int]:
    """``Pss`` of ``pid`` in bytes from smaps_rollup (or smaps), None when unreadable."""
    for name in ("smaps_rollup", "smaps"):
        try:
            with open(os.path.join(proc, str(pid), name), "rb") as f:
                raw = f.read()
        except OSError:
            continue
        total, seen = 0, False
        for line in raw.splitlines():
            if line.startswith(b"Pss:"):
                parts = line.split()
                try:
                    total += int(parts[1]) * 1024  # kB
                except (IndexError, ValueError):
                    return None
                seen = True
        # a zombie (exited, not yet reaped) has an empty smaps: it holds no memory
        return total if seen or not raw else None
    return None


def _load_libproc() -> Any:
    global _libproc
    if _libproc is None:
        for path in LIBPROC_PATHS:
            try:
                lib = ctypes.CDLL(path, use_errno=True)
                lib.proc_pid_rusage  # noqa: B018 - raises AttributeError when absent
            except (OSError, AttributeError):
                continue
            _libproc = lib
            break
        else:
            _libproc = False
    return _libproc or None


def phys_footprint_bytes(pid: int, lib: Any = None) -> Optional[int]:
    """``ri_phys_footprint`` of ``pid`` (macOS), None when libproc or the pid is not there.

    ``lib`` stands in for libproc in tests (a simulation: there is no Mac here).
    """
    lib = lib if lib is not None else _load_libproc()
    if lib is None:
        return None
    buf = ctypes.create_string_buffer(RUSAGE_INFO_V0_SIZE)
    try:
        rc = lib.proc_pid_rusage(ctypes.c_int(pid), ctypes.c_int(RUSAGE_INFO_V0), buf)
    except (OSError, ctypes.ArgumentError):
        return None
    if rc != 0:
        return None
    (value,) = struct.unpack_from("<Q", buf.raw, PHYS_FOOTPRINT_OFFSET)
    return int(value)


def own_kind(platform: Optional[str] = None) -> str:
    """What :func:`own_bytes` measures here: ``pss`` (Linux) or ``phys-footprint`` (macOS)."""
    platform = platform or sys.platform
    return "phys-footprint" if platform == "darwin" else "pss"


def own_bytes(
    pids: List[int], platform: Optional[str] = None, lib: Any = None
) -> Optional[Tuple[int, str]]:
    """(the job's own memory over ``pids``, what it measures), or None when any pid's
    figure cannot be read (see the module docstring)."""
    kind = own_kind(platform)
    total = 0
    for pid in pids:
        got = phys_footprint_bytes(pid, lib) if kind == "phys-footprint" else pss_bytes(pid)
        if got is None:
            if not _alive(pid):
                continue  # exited since the process table was read: it holds nothing
            return None
        total += got
    return (total, kind) if pids else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists
        return True
    return True
