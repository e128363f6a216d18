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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import JsonObject, Op
from remotemac.engine.context import RunContext
from remotemac.engine.jsonpart import JsonPart
from remotemac.engine.phaseresults import Fingerprint
from remotemac.events import Warning
from remotemac.phases import Phase

KEYS = ("python", "os_version", "torch", "torch_origin", "lock_hash")
DRIFT_FILE = "drift.jsonl"


@dataclass
class PackageChange(JsonPart):
    """One package whose version differs (None: not installed on that side)."""

    name: str = ""
    before: str | None = None
    after: str | None = None


@dataclass
class Change(JsonPart):
    """What changed of one fingerprint key; for ``lock_hash``, the packages that did."""

    key: str = ""
    before: Any = None
    after: Any = None
    touches_torch: bool = False
    packages: list[PackageChange] | None = None

    OMIT_NONE = frozenset({"packages"})
    PARTS = {"packages": PackageChange}


@dataclass
class DriftEntry(JsonPart):
    """One check of one host, a line of ``env/drift.jsonl``."""

    when: str | None = None
    at: float | None = None
    host: str | None = None
    host_name: str | None = None
    changes: list[Change] = field(default_factory=list)

    PARTS = {"changes": Change}


@dataclass
class Drift(Change):
    """A change as the record lists it: when and on which host it was seen, described
    (always read from its JSON object: its keys keep the order they were written in)."""

    when: str | None = None
    host: str | None = None
    detail: str = ""


@dataclass
class DriftCheck(JsonPart):
    """A check the record lists: when, on which host, how many keys changed."""

    when: str | None = None
    host: str | None = None
    changes: int = 0


@dataclass
class DriftSummary:
    """For the record: the checks made, the drifts (warnings) and the torch ones (conditions)."""

    checks: list[DriftCheck] = field(default_factory=list)
    drifts: list[Drift] = field(default_factory=list)
    torch: list[Drift] = field(default_factory=list)

    def record_form(self) -> JsonObject:
        """The record's ``environment.drift``."""
        return {
            "checks": [c.to_json() for c in self.checks],
            "warnings": [d.to_json() for d in self.drifts],
        }


def touches_torch(key: str, name: str = "") -> bool:
    return key in ("torch", "torch_origin", "interpreter") or name.startswith("torch")


def compare_fingerprints(before: Fingerprint, after: Fingerprint) -> list[Change]:
    """What changed, one entry per key: {key, before, after, touches_torch[, packages]}."""
    if after.error:
        return [
            Change(
                key="interpreter", before=before.executable, after=after.error, touches_torch=True
            )
        ]
    changes = []
    for key in KEYS:
        if before.value(key) != after.value(key):
            change = Change(
                key=key,
                before=before.value(key),
                after=after.value(key),
                touches_torch=touches_torch(key),
            )
            if key == "lock_hash":
                a, b = before.packages or {}, after.packages or {}
                pkgs = [
                    PackageChange(name=n, before=a.get(n), after=b.get(n))
                    for n in sorted(set(a) | set(b))
                    if a.get(n) != b.get(n)
                ]
                change.packages = pkgs
                change.touches_torch = any(touches_torch("", p.name) for p in pkgs)
            changes.append(change)
    return changes


async def fingerprint(ctx: RunContext, key: str) -> Fingerprint:
    host = ctx.provision().hosts[key]
    return Fingerprint.from_json(
        await ctx.hosts[key].agent.call(Op.ENV_FINGERPRINT, {"python": host.venv_python})
    )


def launch_fingerprint(ctx: RunContext, key: str) -> str | None:
    """The interpreter the launch of the target on host ``key`` takes the fingerprint
    with before its runner starts (LaunchRequest.fingerprint), or None when no check
    before the target is due there (done already, or nothing to compare with)."""
    prov = ctx.result(Phase.PROVISION)
    host = prov.hosts.get(key) if prov else None
    if ctx.drift_checked is not None or host is None or not host.fingerprint:
        return None
    return host.venv_python


async def check_drift(
    ctx: RunContext, when: str, taken: dict[str, Fingerprint] | None = None
) -> list[DriftEntry]:
    """Compare every host's environment with its fingerprint at launch; record and warn.

    ``taken``: fingerprints already taken, by host (the target's host's, inside its
    launch before the job started); the others are asked for now."""
    prov = ctx.result(Phase.PROVISION)
    entries = []
    for key, host in (prov.hosts if prov else {}).items():
        before = host.fingerprint
        if not before or key not in ctx.hosts:
            continue  # provisioned by a version that took no fingerprint: nothing to compare
        after = (taken or {}).get(key) or await fingerprint(ctx, key)
        changes = compare_fingerprints(before, after)
        entry = DriftEntry(
            when=when,
            at=round(time.time(), 3),
            host=key,
            host_name=ctx.hosts[key].transport.name,
            changes=changes,
        )
        entries.append(entry)
        for change in changes:
            ctx.emit(
                Warning(
                    ctx.run_id,
                    code="environment-drift",
                    message=f"{entry.host_name}: the environment changed since "
                    f"launch ({when}): {describe(change)}",
                )
            )
    path = ctx.out_dir / "env" / DRIFT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for entry in entries:
            fh.write(json.dumps(entry.to_json()) + "\n")
    ctx.drift_checked = when
    return entries


def describe(change: Change) -> str:
    if change.packages:
        return "packages " + ", ".join(
            f"{p.name} {p.before or '-'} → {p.after or '-'}" for p in change.packages[:5]
        )
    return f"{change.key} {change.before} → {change.after}"


def load_drift(out_dir: Path) -> list[DriftEntry]:
    path = Path(out_dir) / "env" / DRIFT_FILE
    if not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            entries.append(DriftEntry.from_json(data))
    return entries


def drift_summary(entries: list[DriftEntry]) -> DriftSummary:
    """For the record: the checks made, the drifts (warnings) and the torch ones (conditions)."""
    drifts, seen = [], set()
    for entry in entries:
        for change in entry.changes or []:
            key = (entry.host, change.key, json.dumps(change.after, default=str))
            if key in seen:
                continue
            seen.add(key)
            drifts.append(
                Drift.from_json(
                    {
                        "when": entry.when,
                        "host": entry.host_name,
                        **change.to_json(),
                        "detail": describe(change),
                    }
                )
            )
    return DriftSummary(
        checks=[
            DriftCheck(when=e.when, host=e.host_name, changes=len(e.changes or [])) for e in entries
        ],
        drifts=drifts,
        torch=[d for d in drifts if d.touches_torch],
    )
