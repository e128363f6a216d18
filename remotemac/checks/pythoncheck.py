"""doctor: which Python the workload will get on this host, and whether its pinned torch exists.

Why before the run: a rented Mac has only ``/usr/bin/python3`` 3.9, and torch has no
cp39 wheel past 2.8.0. Said here, the user learns before renting time is spent that
``python: "3.11"`` will make remotemac bring a CPython (what, how big), or that
the ``requirements`` pin cannot install on the Python named (one line). The host's
interpreters are found by agent/pythons.py (from memory, nothing installed); the
build to bring and the pins' wheels are looked up on this laptop
(engine/pythonsource.py, engine/pincheck.py).
"""

from __future__ import annotations

import asyncio
import os
import urllib.request
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import Op
from remotemac.agent.pythons import parse_spec
from remotemac.engine.hostpython import plan_python
from remotemac.engine.pincheck import check_pin, pins

OK, WARN, FAIL, NOT_APPLICABLE = "ok", "warn", "fail", "n/a"


def _mib(n: int | None) -> str:
    return "size unknown" if n is None else f"{n / (1 << 20):.0f} MiB"


def archive_size(url: str) -> int | None:
    """The archive's size without downloading it (a HEAD request, a file's size)."""
    try:
        if url.startswith("file://"):
            return os.path.getsize(urllib.request.url2pathname(url[len("file://") :]))
        req = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
            length = resp.headers.get("Content-Length")
        return int(length) if length else None
    except (OSError, ValueError):
        return None


def judge_found(found: dict[str, Any], request: str | None, home: Path | None) -> dict[str, Any]:
    """The workload's Python from the agent's ``find_python`` answer (no network for a
    name; the downloads list for a version request nothing matches)."""
    out: dict[str, Any] = {
        "request": request,
        "pythons": found.get("pythons", []),
        "brought_dirs": found.get("brought_dirs", []),
    }
    if request and parse_spec(request):
        plan = plan_python(found, request, home)
        out.update(python=plan.python, version=plan.version, problem=plan.problem)
        out["describe"] = plan.describe()
        if plan.bring:
            out["bring"] = plan.bring.label
            out["bring_bytes"] = archive_size(plan.bring.url)
    elif request:
        hit = next(
            (
                p
                for p in out["pythons"]
                if p["path"] == request or os.path.basename(p["path"]) == request
            ),
            None,
        )
        out.update(python=hit and hit["path"], version=hit and hit["version"])
        out["describe"] = (
            f"{hit['version']} ({hit['path']})" if hit else f"{request} is not on the host"
        )
        if not hit:
            out["problem"] = f"{request} is not on the host"
    return out


def judge_pins(
    out: dict[str, Any], requirements: bytes | None, tags: dict[str, Any] | None, home: Path | None
) -> list[dict[str, Any]]:
    """One verdict per checked pin, for the Python the workload gets (and, when it is
    brought, whether the host's own would have done)."""
    if not requirements or not tags:
        return []
    verdicts = []
    for name, version in pins(requirements):
        got = check_pin(home, name, version, out.get("version"), tags)
        row = {"line": got.line, "ok": got.ok}
        if out.get("bring"):
            own = check_pin(home, name, version, str(tags.get("python")), tags)
            if own.ok is False and got.ok:
                row["line"] = (
                    f"{got.line}; the host's own Python {tags.get('python')} has none: "
                    "it needs the Python remotemac brings"
                )
        verdicts.append(row)
    return verdicts


async def gather(
    in_memory: Any,
    remote_root: str,
    request: str | None,
    requirements: bytes | None,
    tags: dict[str, Any] | None,
    home: Path | None,
) -> dict[str, Any]:
    """``in_memory(module, fn, request)`` → (answer, why), as doctor runs host code."""
    spec = request if request and parse_spec(request) else None
    found, why = await in_memory(
        "pythons", Op.FIND_PYTHON.function, {"root": remote_root, "spec": spec}
    )
    if found is None:
        return {"error": why}
    out = await asyncio.to_thread(judge_found, found, request, home)
    out["pins"] = await asyncio.to_thread(judge_pins, out, requirements, tags, home)
    return out


def check_workload_python(facts: dict[str, Any]) -> Any:
    from remotemac.checks.doctor import Check

    wp = facts.get("workload_python")
    if not wp:
        return Check("workload python", NOT_APPLICABLE, "not asked")
    if wp.get("error"):
        return Check("workload python", WARN, "unknown", f"the search failed: {wp['error']}")
    have = ", ".join(f"{p['version']} ({p['path']})" for p in wp["pythons"]) or "none"
    brought = wp.get("brought_dirs") or []
    there = f"the host has {have}" + (
        "; brought by remotemac: "
        + ", ".join(f"{os.path.basename(b['path'])} ({_mib(b['bytes'])})" for b in brought)
        if brought
        else ""
    )
    if not wp.get("request"):
        return Check("workload python", OK, there, "doctor --playbook says which one the run gets")
    if wp.get("bring"):
        return Check(
            "workload python",
            WARN,
            f"{wp['describe']} ({_mib(wp.get('bring_bytes'))} download, into "
            "remote_root/runtime, removed by cleanup); " + there,
            "a rented Mac has only the CLT's python3 3.9",
        )
    if wp.get("problem"):
        return Check(
            "workload python",
            FAIL,
            f"{wp['describe']}; {there}",
            "the workload's venv is made from this interpreter",
            'set environment.python to a version ("3.11") remotemac can bring, or one the host has',
        )
    return Check("workload python", OK, wp["describe"])


def check_pins(facts: dict[str, Any]) -> Any:
    from remotemac.checks.doctor import Check

    wp = facts.get("workload_python") or {}
    rows = wp.get("pins") or []
    if not rows:
        return Check("pins", NOT_APPLICABLE, "no torch pin in the requirements")
    value = "; ".join(r["line"] for r in rows)
    if any(r["ok"] is False for r in rows):
        return Check(
            "pins",
            FAIL,
            value,
            "pip would stop with ResolutionImpossible after the upload",
            'set environment.python to a version the pin has wheels for (e.g. "3.11")',
        )
    if any(r["ok"] is None for r in rows):
        return Check("pins", WARN, value, "checked against PyPI's JSON API")
    return Check("pins", OK, value)
