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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from remotemac.agent.protocol import Answer, FindPythonAnswer, JsonObject, Op, RuntimeStatus
from remotemac.agent.shared import parse_spec
from remotemac.checks.doctor import DoctorReport, WorkloadAsk, evaluate
from remotemac.engine.hostpython import plan_python
from remotemac.engine.jsonpart import JsonPart
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
) -> JsonObject:
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
    runtime = await gather_runtime(transport, python, remote_root, timeout)
    facts["agent_runtime"] = runtime
    if workload is not None:

        async def in_memory(module: str, fn: str, req: JsonObject) -> Asked:
            return await in_memory_answer(transport, python, module, fn, req, timeout)

        # an answer without tags (the runtime's status failed): no pin is checked
        tags = RuntimeStatus.from_json(runtime).tags or None
        facts["workload_python"] = await gather_workload_python(
            in_memory, remote_root, workload.python, workload.requirements, tags, workload.home
        )
    return facts


async def gather_runtime(
    transport: Transport, python: str, remote_root: str, timeout: float = GATHER_TIMEOUT_S
) -> JsonObject:
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
    request: JsonObject,
    timeout: float,
) -> Asked:
    """(``module.fn``'s answer, "") or (None, "exited N: why" / "printed no JSON: …")."""
    from remotemac.engine.agentship import exec_in_memory, read_answer

    result = await exec_in_memory(transport, python, module, fn, request, timeout=timeout)
    last = read_answer(result)
    answer = Answer.from_json(last) if last is not None else None
    if answer is not None and answer.ok and isinstance(answer.result, dict):
        return answer.result, ""
    if answer is not None:  # the host's code raised: "Type: message", as a traceback ends
        return None, f"exited {result.exit_code}: {str(answer.error)[:200]}"
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
            length = resp.headers["Content-Length"]  # None when it sent none
        return int(length) if length else None
    except (OSError, ValueError):
        return None


@dataclass
class PythonFound(JsonPart):
    """One interpreter the host has (an item of the agent's ``find_python`` list)."""

    path: str = ""
    version: str | None = None


@dataclass
class PinVerdict(JsonPart):
    """Whether a pinned package has a wheel for the workload's Python, in one line."""

    line: str = ""
    ok: bool | None = None


@dataclass
class WorkloadPython(JsonPart):
    """doctor's ``workload_python``: the Python the workload would get on the host (the
    host's own, or the build remotemac would bring, and its size), or the problem, and
    the verdict on each pin for it (remotemac.checks.pythoncheck judges it)."""

    request: str | None = None
    pythons: list[PythonFound] | None = None
    #: what earlier runs brought under remote_root (passed on as the agent listed it)
    brought_dirs: list[JsonObject] | None = None
    python: str | None = None
    version: str | None = None
    problem: str | None = None
    describe: str | None = None
    bring: str | None = None
    bring_bytes: int | None = None
    pins: list[PinVerdict] | None = None

    PARTS = {"pythons": PythonFound, "pins": PinVerdict}


def judge_found(found: JsonObject, request: str | None, home: Path | None) -> WorkloadPython:
    """The workload's Python from the agent's ``find_python`` answer (no network for a
    name; the downloads list for a version request nothing matches)."""
    answer = FindPythonAnswer.from_json(found)
    out = WorkloadPython.with_keys(
        request=request, pythons=answer.pythons, brought_dirs=answer.brought_dirs
    )
    if request and parse_spec(request):
        plan = plan_python(answer, request, home)
        out = out.but(
            python=plan.python, version=plan.version, problem=plan.problem, describe=plan.describe()
        )
        if plan.bring:
            out = out.but(bring=plan.bring.label, bring_bytes=archive_size(plan.bring.url))
    elif request:
        hit = next(
            (p for p in out.pythons or [] if request in (p.path, os.path.basename(p.path))),
            None,
        )
        out = out.but(
            python=hit and hit.path,
            version=hit and hit.version,
            describe=f"{hit.version} ({hit.path})" if hit else f"{request} is not on the host",
        )
        if not hit:
            out = out.but(problem=f"{request} is not on the host")
    return out


def judge_pins(
    version: str | None,
    brought: bool,
    requirements: bytes | None,
    tags: JsonObject | None,
    home: Path | None,
) -> list[PinVerdict]:
    """One verdict per checked pin, for the Python the workload gets (``version``; and,
    when it is ``brought``, whether the host's own would have done)."""
    if not requirements or not tags:
        return []
    host_python = tags.get("python")  # the wheel tags the host's own Python accepts
    verdicts = []
    host = HostTags.from_json(tags)
    for name, pin in pins(requirements):
        got = check_pin(home, name, pin, version, host)
        row = PinVerdict(line=got.line, ok=got.ok)
        if brought:
            own = check_pin(home, name, pin, str(host_python), host)
            if own.ok is False and got.ok:
                row.line = (
                    f"{got.line}; the host's own Python {host_python} has none: "
                    "it needs the Python remotemac brings"
                )
        verdicts.append(row)
    return verdicts


#: an in-memory call's (answer, "") or (None, why)
Asked = tuple[JsonObject | None, str]


async def gather_workload_python(
    in_memory: Callable[[str, str, JsonObject], Awaitable[Asked]],
    remote_root: str,
    request: str | None,
    requirements: bytes | None,
    tags: JsonObject | None,
    home: Path | None,
) -> JsonObject:
    """``in_memory(module, fn, request)`` → (answer, why), as doctor runs host code."""
    spec = request if request and parse_spec(request) else None
    found, why = await in_memory(
        "pythons", Op.FIND_PYTHON.function, {"root": remote_root, "spec": spec}
    )
    if found is None:
        return {"error": why}
    out = await asyncio.to_thread(judge_found, found, request, home)
    pins_seen = await asyncio.to_thread(
        judge_pins, out.version, bool(out.bring), requirements, tags, home
    )
    return out.but(pins=pins_seen).to_json()
