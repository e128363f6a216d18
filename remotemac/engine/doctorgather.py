"""doctor's questions to a host: its facts, its agent runtime, the workload's Python.

Why in the engine and not in remotemac.checks: asking runs the agent's code on the
host from memory (engine/agentship.py), and the checks only judge the answers
(remotemac.checks.doctor.evaluate, remotemac.checks.pythoncheck), so the checks never
import the engine. The workload's Python is judged here too because the build to bring
and the pins' wheels are looked up on this laptop (engine/hostpython.py,
engine/pincheck.py), as a run would.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import FindPythonAnswer, Op
from remotemac.agent.shared import parse_spec
from remotemac.checks.doctor import DoctorReport, WorkloadAsk, evaluate
from remotemac.engine.hostpython import plan_python
from remotemac.engine.pincheck import check_pin, pins
from remotemac.engine.pythonsource import HostTags
from remotemac.transport.base import Transport

GATHER_TIMEOUT_S = 300.0  # the MPS probe's first `import torch` can be slow on a cold disk


async def gather_facts(
    transport: Transport,
    remote_root: str,
    venv_python: str | None = None,
    timeout: float = GATHER_TIMEOUT_S,
    workload: WorkloadAsk | None = None,
) -> dict[str, Any]:
    """Run the collector on the host from memory (engine/agentship.py), request on stdin.

    Nothing is uploaded or left behind. A host without a working ``python3``
    gives ``{"collector_error": ...}`` (judged as a failed check), not an exception;
    link problems still raise :class:`remotemac.errors.HostError`.
    """
    from remotemac.engine.agentclient import agent_python

    python = agent_python()
    request = {"remote_root": remote_root, "venv_python": venv_python}
    facts, why = await in_memory_answer(
        transport, python, "hostfacts", Op.FACTS.function, request, timeout
    )
    received = time.time()
    if facts is None:
        return {"collector_error": f"{python} on {transport.name} {why}", "received_at": received}
    facts["received_at"] = received
    facts["agent_runtime"] = await gather_runtime(transport, python, remote_root, timeout)
    if workload is not None:

        async def in_memory(module: str, fn: str, req: dict[str, Any]) -> Any:
            return await in_memory_answer(transport, python, module, fn, req, timeout)

        tags = facts["agent_runtime"].get("tags")
        facts["workload_python"] = await gather_workload_python(
            in_memory, remote_root, workload.python, workload.requirements, tags, workload.home
        )
    return facts


async def gather_runtime(
    transport: Transport, python: str, remote_root: str, timeout: float = GATHER_TIMEOUT_S
) -> dict[str, Any]:
    """The agent runtime's status on the host (agentruntime.py from memory)."""
    status, why = await in_memory_answer(
        transport,
        python,
        "agentruntime",
        Op.RUNTIME_STATUS.function,
        {"root": remote_root},
        timeout,
    )
    return status if status is not None else {"error": why}


async def in_memory_answer(
    transport: Transport,
    python: str,
    module: str,
    fn: str,
    request: dict[str, Any],
    timeout: float,
) -> tuple[dict[str, Any] | None, str]:
    """(``module.fn``'s answer, "") or (None, "exited N: why" / "printed no JSON: …")."""
    from remotemac.engine.agentship import exec_in_memory, read_answer

    result = await exec_in_memory(transport, python, module, fn, request, timeout=timeout)
    answer = read_answer(result)
    if answer is not None and answer.get("ok") and isinstance(answer.get("result"), dict):
        return answer["result"], ""
    if answer is not None:  # the host's code raised: "Type: message", as a traceback ends
        return None, f"exited {result.exit_code}: {str(answer.get('error'))[:200]}"
    printed = result.text().strip().splitlines()
    if result.ok and printed:
        return None, f"printed no JSON: {printed[-1][:200]}"
    err = result.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"]
    return None, f"exited {result.exit_code}: {err[-1][:200]}"


async def doctor(
    transport: Transport,
    host: str,
    remote_root: str = "~/remotemac",
    needs_disk_bytes: int | None = None,
    venv_python: str | None = None,
    workload: WorkloadAsk | None = None,
) -> DoctorReport:
    """Gather on an open transport and judge (remotemac.checks.doctor.evaluate)."""
    facts = await gather_facts(transport, remote_root, venv_python, workload=workload)
    return evaluate(facts, needs_disk_bytes, host=host)


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
        plan = plan_python(FindPythonAnswer.from_json(found), request, home)
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
    host = HostTags.from_json(tags)
    for name, version in pins(requirements):
        got = check_pin(home, name, version, out.get("version"), host)
        row = {"line": got.line, "ok": got.ok}
        if out.get("bring"):
            own = check_pin(home, name, version, str(tags.get("python")), host)
            if own.ok is False and got.ok:
                row["line"] = (
                    f"{got.line}; the host's own Python {tags.get('python')} has none: "
                    "it needs the Python remotemac brings"
                )
        verdicts.append(row)
    return verdicts


async def gather_workload_python(
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
