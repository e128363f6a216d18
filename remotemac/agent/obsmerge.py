"""Merge the per-process observer records of a job into the job's one observation.

Each Python process of the job that imported torch left ``<obs dir>/<pid>.json``
(observer.py). The job's observation, ``status/<label>.obs.json``, is what the
acceptance record reads: tensors were on the device if they were in any process,
fallback counts add up, failures and stopping conditions are the union, and
``processes`` says which processes were observed (pid, argv[0]).

Standard library only, Python 3.9.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .agentutil import write_json_atomic
from .protocol import JsonObject

OBS_SCHEMA = "remotemac.harness.obs/1"


def read_records(obs_dir: str) -> List[JsonObject]:
    """The process records in ``obs_dir`` as their files hold them, oldest first; torn or
    foreign files skipped (the runner's sampler reads them too; :func:`merge` parses them)."""
    records = []
    try:
        names = sorted(os.listdir(obs_dir))
    except OSError:
        return []
    for name in names:
        if not (name.endswith(".json") and name[:-5].isdigit()):
            continue
        try:
            with open(os.path.join(obs_dir, name), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict):
            records.append(rec)
    records.sort(key=lambda r: (r.get("started_at") or 0, r.get("pid") or 0))
    return records


@dataclass(frozen=True)
class ProcessRecord:
    """What the merge reads of one process's record (observer.py writes it); the
    parts it passes on unread (``first_on_device``, ``mps``, conditions) stay JSON."""

    pid: Optional[int] = None
    ppid: Optional[int] = None
    argv0: Optional[str] = None
    argv: Any = None
    executable: Optional[str] = None
    device: Optional[str] = None
    finished: Any = None
    tensors_on_device: Optional[bool] = None
    model_on_device: Optional[bool] = None
    first_on_device: Any = None
    #: (op, count) of each operator that fell back to the CPU
    fallback_counts: List[Tuple[str, int]] = field(default_factory=list)
    unsupported_ops: List[Any] = field(default_factory=list)
    dtype_errors: List[Any] = field(default_factory=list)
    stopping_conditions: List[JsonObject] = field(default_factory=list)
    oom: Any = None
    torch_version: Optional[str] = None
    mps: Any = None
    fallback_env_before_torch: Optional[bool] = None
    peak_rss_bytes: Optional[int] = None
    mps_peak_driver_bytes: Optional[int] = None
    mps_driver_allocated_bytes: Any = None

    @classmethod
    def from_json(cls, rec: JsonObject) -> "ProcessRecord":
        ops = rec.get("operators") or {}
        fallbacks = ops.get("fallback_ops") or []
        return cls(
            fallback_counts=[(item["op"], int(item.get("count") or 1)) for item in fallbacks],
            unsupported_ops=list(ops.get("unsupported_ops") or []),
            dtype_errors=list(ops.get("dtype_errors") or []),
            stopping_conditions=list(rec.get("stopping_conditions") or []),
            mps_driver_allocated_bytes=(rec.get("mps_memory") or {}).get(
                "mps_driver_allocated_bytes"
            ),
            **{key: rec.get(key) for key in _AS_WRITTEN},
        )

    def process_json(self) -> JsonObject:
        """The process's line in the merged observation's ``processes``."""
        return {key: getattr(self, key) for key in _PROCESS_LINE}


#: the record's keys read as they are (a missing one is None)
_AS_WRITTEN = (
    "pid",
    "ppid",
    "argv0",
    "argv",
    "executable",
    "device",
    "finished",
    "tensors_on_device",
    "model_on_device",
    "first_on_device",
    "oom",
    "torch_version",
    "mps",
    "fallback_env_before_torch",
    "peak_rss_bytes",
    "mps_peak_driver_bytes",
)
#: what ``processes`` says of each process, in this order
_PROCESS_LINE = (
    "pid",
    "ppid",
    "argv0",
    "argv",
    "executable",
    "finished",
    "tensors_on_device",
    "peak_rss_bytes",
)


def _any_true(values: List[Optional[bool]]) -> Optional[bool]:
    """True if any process said True, False if one said False and none True, else None."""
    if any(v is True for v in values):
        return True
    if any(v is False for v in values):
        return False
    return None


def _union(items: List[Any]) -> List[Any]:
    out: List[Any] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def merge(records: List[JsonObject], device: str = "") -> JsonObject:
    """One job observation in the harness's shape (plus ``processes``), from the
    records :func:`read_records` read."""
    procs = [ProcessRecord.from_json(rec) for rec in records]
    counts: Dict[str, int] = {}
    for proc in procs:
        for op, n in proc.fallback_counts:
            counts[op] = counts.get(op, 0) + n
    fallback_ops = [{"op": op, "count": n} for op, n in counts.items()]
    conditions: List[JsonObject] = []
    for proc in procs:
        for cond in proc.stopping_conditions:
            if cond.get("code") == "fallback-op":
                continue  # re-derived below from the summed counts
            if cond not in conditions:
                conditions.append(cond)
    conditions += [
        {
            "code": "fallback-op",
            "op": f["op"],
            "detail": "%s fell back to the CPU %d time(s)" % (f["op"], f["count"]),
        }
        for f in fallback_ops
    ]
    first = next((p.first_on_device for p in procs if p.first_on_device), None)
    peaks = [p.peak_rss_bytes or 0 for p in procs]
    torch_versions = _union([p.torch_version for p in procs if p.torch_version])
    return {
        "schema": OBS_SCHEMA,
        "device": device or (procs[0].device if procs else None),
        "merged_at": time.time(),
        "finished": bool(procs) and all(p.finished for p in procs),
        "tensors_on_device": _any_true([p.tensors_on_device for p in procs]),
        "first_on_device": first,
        "model_on_device": _any_true([p.model_on_device for p in procs]),
        "operators": {
            "fallback_ops": fallback_ops if procs else None,
            "unsupported_ops": _union([u for p in procs for u in p.unsupported_ops])
            if procs
            else None,
            "dtype_errors": _union([d for p in procs for d in p.dtype_errors]) if procs else None,
        },
        "oom": any(p.oom for p in procs),
        "stopping_conditions": conditions,
        "torch_version": torch_versions[0] if torch_versions else None,
        "mps": procs[0].mps if procs else None,
        "fallback_env_before_torch": all(p.fallback_env_before_torch is not False for p in procs),
        "peak_rss_bytes": max(peaks) if peaks else 0,
        "mps_peak_driver_bytes": max([p.mps_peak_driver_bytes or 0 for p in procs], default=0)
        or None,
        "processes": [p.process_json() for p in procs],
    }


def mps_driver_bytes(records: List[JsonObject], pids: List[int]) -> Optional[int]:
    """Metal's driver memory summed over the live processes ``pids``; None if none has it."""
    alive = set(pids)
    procs = [ProcessRecord.from_json(rec) for rec in records]
    values = [p.mps_driver_allocated_bytes for p in procs if p.pid in alive and not p.finished]
    known = [int(v) for v in values if isinstance(v, int)]
    return sum(known) if known else None


def write_merged(obs_dir: str, obs_path: str, device: str = "") -> JsonObject:
    """Merge ``obs_dir`` into ``obs_path`` atomically; returns the merged observation."""
    merged = merge(read_records(obs_dir), device)
    write_json_atomic(obs_path, merged, indent=2, sort_keys=True, newline=True, fsync=False)
    return merged
