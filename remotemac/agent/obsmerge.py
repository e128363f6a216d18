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
from typing import Any, Dict, List, Optional

from .agentutil import write_json_atomic

OBS_SCHEMA = "remotemac.harness.obs/1"


def read_records(obs_dir: str) -> List[Dict[str, Any]]:
    """The process records in ``obs_dir``, oldest first; torn or foreign files skipped."""
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


def merge(records: List[Dict[str, Any]], device: str = "") -> Dict[str, Any]:
    """One job observation in the harness's shape (plus ``processes``)."""
    counts: Dict[str, int] = {}
    for rec in records:
        for item in (rec.get("operators") or {}).get("fallback_ops") or []:
            counts[item["op"]] = counts.get(item["op"], 0) + int(item.get("count") or 1)
    fallback_ops = [{"op": op, "count": n} for op, n in counts.items()]
    conditions = []
    for rec in records:
        for cond in rec.get("stopping_conditions") or []:
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
    first = next((r.get("first_on_device") for r in records if r.get("first_on_device")), None)
    peaks = [r.get("peak_rss_bytes") or 0 for r in records]
    torch_versions = _union([r.get("torch_version") for r in records if r.get("torch_version")])
    ops = [r.get("operators") or {} for r in records]
    return {
        "schema": OBS_SCHEMA,
        "device": device or (records[0].get("device") if records else None),
        "merged_at": time.time(),
        "finished": bool(records) and all(r.get("finished") for r in records),
        "tensors_on_device": _any_true([r.get("tensors_on_device") for r in records]),
        "first_on_device": first,
        "model_on_device": _any_true([r.get("model_on_device") for r in records]),
        "operators": {
            "fallback_ops": fallback_ops if records else None,
            "unsupported_ops": _union([u for o in ops for u in o.get("unsupported_ops") or []])
            if records
            else None,
            "dtype_errors": _union([d for o in ops for d in o.get("dtype_errors") or []])
            if records
            else None,
        },
        "oom": any(r.get("oom") for r in records),
        "stopping_conditions": conditions,
        "torch_version": torch_versions[0] if torch_versions else None,
        "mps": records[0].get("mps") if records else None,
        "fallback_env_before_torch": all(
            r.get("fallback_env_before_torch") is not False for r in records
        ),
        "peak_rss_bytes": max(peaks) if peaks else 0,
        "mps_peak_driver_bytes": max(
            [r.get("mps_peak_driver_bytes") or 0 for r in records], default=0
        )
        or None,
        "processes": [
            {
                "pid": r.get("pid"),
                "ppid": r.get("ppid"),
                "argv0": r.get("argv0"),
                "argv": r.get("argv"),
                "executable": r.get("executable"),
                "finished": r.get("finished"),
                "tensors_on_device": r.get("tensors_on_device"),
                "peak_rss_bytes": r.get("peak_rss_bytes"),
            }
            for r in records
        ],
    }


def mps_driver_bytes(records: List[Dict[str, Any]], pids: List[int]) -> Optional[int]:
    """Metal's driver memory summed over the live processes ``pids``; None if none has it."""
    alive = set(pids)
    values = [
        (r.get("mps_memory") or {}).get("mps_driver_allocated_bytes")
        for r in records
        if r.get("pid") in alive and not r.get("finished")
    ]
    known = [int(v) for v in values if isinstance(v, int)]
    return sum(known) if known else None


def write_merged(obs_dir: str, obs_path: str, device: str = "") -> Dict[str, Any]:
    """Merge ``obs_dir`` into ``obs_path`` atomically; returns the merged observation."""
    merged = merge(read_records(obs_dir), device)
    write_json_atomic(obs_path, merged, indent=2, sort_keys=True, newline=True, fsync=False)
    return merged
