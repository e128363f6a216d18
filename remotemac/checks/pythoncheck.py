"""doctor: which Python the workload will get on this host, and whether its pinned torch exists.

Why before the run: a rented Mac has only ``/usr/bin/python3`` 3.9, and torch has no
cp39 wheel past 2.8.0. Said here, the user learns before renting time is spent that
``python: "3.11"`` will make remotemac bring a CPython (what, how big), or that
the ``requirements`` pin cannot install on the Python named (one line). The host's
interpreters are found by agent/pythons.py (from memory, nothing installed); the
build to bring and the pins' wheels are looked up on this laptop by
engine/doctorgather.py; this module judges what it found.
"""

from __future__ import annotations

import os
from typing import Any

OK, WARN, FAIL, NOT_APPLICABLE = "ok", "warn", "fail", "n/a"


def _mib(n: int | None) -> str:
    return "size unknown" if n is None else f"{n / (1 << 20):.0f} MiB"


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
