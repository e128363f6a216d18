"""Environment drift: is the host's environment still the one the run was launched in?

A package update, an OS update or a replaced interpreter between launch and a
re-attach (or between the reference and the target) means the target did not run
in the environment the record describes. The fingerprint taken at provision is
compared with a fresh one at re-attach and before the target run (the agent's
``env_fingerprint``: Python, OS version, the venv's package set and its hash,
torch; torch is never imported, so a check costs a fraction of a second). A drift
that touches torch is the stopping condition ``environment-drift``; any other is a
warning in the record. Every check is appended to ``env/drift.jsonl`` in the run's
output dir, so later processes (attach, record) see what earlier ones found.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import Op
from remotemac.engine.context import RunContext
from remotemac.events import Warning
from remotemac.phases import Phase

KEYS = ("python", "os_version", "torch", "torch_origin", "lock_hash")
DRIFT_FILE = "drift.jsonl"


def touches_torch(key: str, name: str = "") -> bool:
    return key in ("torch", "torch_origin", "interpreter") or name.startswith("torch")


def compare_fingerprints(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """What changed, one entry per key: {key, before, after, touches_torch[, packages]}."""
    if after.get("error"):
        return [
            {
                "key": "interpreter",
                "before": before.get("executable"),
                "after": after["error"],
                "touches_torch": True,
            }
        ]
    changes = []
    for key in KEYS:
        if before.get(key) != after.get(key):
            change: dict[str, Any] = {
                "key": key,
                "before": before.get(key),
                "after": after.get(key),
                "touches_torch": touches_torch(key),
            }
            if key == "lock_hash":
                a, b = before.get("packages") or {}, after.get("packages") or {}
                pkgs = [
                    {"name": n, "before": a.get(n), "after": b.get(n)}
                    for n in sorted(set(a) | set(b))
                    if a.get(n) != b.get(n)
                ]
                change["packages"] = pkgs
                change["touches_torch"] = any(touches_torch("", p["name"]) for p in pkgs)
            changes.append(change)
    return changes


async def fingerprint(ctx: RunContext, key: str) -> dict[str, Any]:
    host = ctx.provision().hosts[key]
    return await ctx.hosts[key].agent.call(Op.ENV_FINGERPRINT, {"python": host.venv_python})


async def check_drift(ctx: RunContext, when: str) -> list[dict[str, Any]]:
    """Compare every host's environment with its fingerprint at launch; record and warn."""
    prov = ctx.result(Phase.PROVISION)
    entries = []
    for key, host in (prov.hosts if prov else {}).items():
        before = host.fingerprint
        if not before or key not in ctx.hosts:
            continue  # provisioned by a version that took no fingerprint: nothing to compare
        changes = compare_fingerprints(before, await fingerprint(ctx, key))
        entry = {
            "when": when,
            "at": round(time.time(), 3),
            "host": key,
            "host_name": ctx.hosts[key].transport.name,
            "changes": changes,
        }
        entries.append(entry)
        for change in changes:
            ctx.emit(
                Warning(
                    ctx.run_id,
                    code="environment-drift",
                    message=f"{entry['host_name']}: the environment changed since "
                    f"launch ({when}): {describe(change)}",
                )
            )
    path = ctx.out_dir / "env" / DRIFT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for entry in entries:
            fh.write(json.dumps(entry) + "\n")
    ctx.drift_checked = when
    return entries


def describe(change: dict[str, Any]) -> str:
    if change.get("packages"):
        return "packages " + ", ".join(
            f"{p['name']} {p['before'] or '-'} → {p['after'] or '-'}"
            for p in change["packages"][:5]
        )
    return f"{change['key']} {change.get('before')} → {change.get('after')}"


def load_drift(out_dir: Path) -> list[dict[str, Any]]:
    path = Path(out_dir) / "env" / DRIFT_FILE
    if not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


def drift_summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """For the record: the checks made, the drifts (warnings) and the torch ones (conditions)."""
    drifts, seen = [], set()
    for entry in entries:
        for change in entry.get("changes") or []:
            key = (entry.get("host"), change["key"], json.dumps(change.get("after"), default=str))
            if key in seen:
                continue
            seen.add(key)
            drifts.append(
                {
                    "when": entry.get("when"),
                    "host": entry.get("host_name"),
                    **change,
                    "detail": describe(change),
                }
            )
    return {
        "checks": [
            {
                "when": e.get("when"),
                "host": e.get("host_name"),
                "changes": len(e.get("changes") or []),
            }
            for e in entries
        ],
        "drifts": drifts,
        "torch": [d for d in drifts if d.get("touches_torch")],
    }
