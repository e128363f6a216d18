"""The workload's interpreter: the host's own when one matches the playbook, else one remotemac brings.

``environment.python`` is either an interpreter (``python3``, a path: used as named)
or a version request (``"3.11"``, ``">=3.10"``): the agent looks for a matching
interpreter on the host (agent/pythons.py); when there is none, this laptop picks
the newest matching CPython build for the host's platform (engine/pythonsource.py)
and brings it under ``<root>/runtime`` (engine/bring.py). uv, which builds the
venv, comes the same way; when it cannot come, pip builds it (with a warning).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import (
    BringAnswer,
    FindPythonAnswer,
    FindPythonRequest,
    JsonObject,
    Op,
    RuntimeStatus,
)
from remotemac.agent.shared import looks_like_spec, parse_spec
from remotemac.engine import pythonsource
from remotemac.engine.agentclient import AgentClient
from remotemac.engine.bring import Artifact, Emit, bring
from remotemac.engine.pythonsource import HostPlatform, HostTags
from remotemac.errors import BadInput, HostEnvironmentError, RemotemacError
from remotemac.events import Warning


def version_request(python: str) -> list[Any] | None:
    """The clauses of a version request, None for an interpreter name; a malformed
    version (``">=three"``) is bad input."""
    spec = parse_spec(python)
    if spec is None and looks_like_spec(python) and "/" not in python:
        raise BadInput(
            f'environment.python {python!r}: a version is written like "3.11" or '
            '">=3.10"; an interpreter by its name or path (python3, /usr/bin/python3)'
        )
    return spec


@dataclass
class PythonPlan:
    """What the workload's Python will be on this host, before anything is installed."""

    request: str
    found: FindPythonAnswer  # the agent's find_python answer
    bring: Artifact | None = None
    bring_version: str | None = None
    problem: str | None = None

    @property
    def python(self) -> str | None:
        return self.found.python

    @property
    def version(self) -> str | None:
        return self.found.version or self.bring_version

    def describe(self) -> str:
        if self.python:
            how = "brought earlier by remotemac" if self.found.brought else "the host's"
            return f"{self.found.version} ({self.python}, {how})"
        if self.bring:
            return f"none on the host matches {self.request!r}: remotemac will bring {self.bring.label}"
        return f"none on the host matches {self.request!r}: {self.problem}"


@dataclass(frozen=True)
class HostPython:
    """The workload's interpreter on the host (:func:`ensure_python`); ``dir``, ``reused``
    and ``label`` only when remotemac brought it."""

    python: str | None
    version: str | None
    brought: bool
    dir: str | None = None
    reused: bool | None = None
    label: str | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"python": self.python, "version": self.version, "brought": self.brought}
        if self.dir is not None:
            out.update(dir=self.dir, reused=self.reused, label=self.label)
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> HostPython:
        return cls(**data)

    def as_brought(self) -> JsonObject:
        """What provision keeps of a brought interpreter (its ``interpreter.brought``)."""
        return {
            "dir": self.dir,
            "version": self.version,
            "label": self.label,
            "reused": self.reused,
        }


def brought_dir_of(python: str) -> str:
    """The directory remotemac brought an interpreter into, from its executable:
    ``<root>/runtime/python-<key>/python/bin/python3.X`` (agent/bring.py's layout)."""
    return posixpath.dirname(posixpath.dirname(posixpath.dirname(python)))


def plan_python(found: FindPythonAnswer, request: str, home: Path | None) -> PythonPlan:
    """Judge the agent's ``find_python`` answer; pick what to bring when nothing matches."""
    plan = PythonPlan(request, found)
    if plan.python:
        return plan
    spec = parse_spec(request) or []
    try:
        plat = HostPlatform.from_json(found.platform or {})
        dl = pythonsource.choose(pythonsource.python_downloads(home), spec, plat)
        if dl is None:
            plan.problem = (
                f"no CPython build matching {request!r} for {plat.os} {plat.arch} "
                f"({plat.libc}) in the source"
            )
            return plan
        plan.bring = pythonsource.python_artifact(home, dl)
        plan.bring_version = dl.version_text
    except (OSError, ValueError, RemotemacError) as exc:
        plan.problem = f"could not look up a build to bring: {getattr(exc, 'message', exc)}"
    return plan


async def ensure_python(
    agent: AgentClient,
    request: str,
    *,
    home: Path | None,
    method: str,
    emit: Emit,
    run_id: str,
) -> HostPython:
    """The interpreter for ``request`` on the host, found there or brought."""
    asked = FindPythonRequest(root=agent.root, spec=request)
    found = FindPythonAnswer.from_json(await agent.call(Op.FIND_PYTHON, asked.to_json()))
    plan = plan_python(found, request, home)
    if plan.python:
        if found.brought:  # an interpreter an earlier run brought: the record names it too
            return HostPython(
                plan.python,
                plan.version,
                True,
                dir=brought_dir_of(plan.python),
                reused=True,
                label=f"CPython {plan.version} (brought earlier)",
            )
        return HostPython(plan.python, plan.version, False)
    if plan.bring is None:
        listed = found.pythons
        seen = ", ".join(f"{p['version']} ({p['path']})" for p in listed)
        raise HostEnvironmentError(
            f"{agent.transport.name}: no Python matching environment.python {request!r} "
            f"(the host has {seen or 'none'}), and {plan.problem}",
            hint="name an interpreter the host has, or let this laptop reach the Python builds",
        )
    got = await bring(
        agent, plan.bring, home=home, method=method, emit=emit, run_id=run_id, phase="provision"
    )
    return HostPython(
        python=got.exe,
        version=got.version or plan.bring_version,
        brought=True,
        dir=got.dir,
        reused=got.reused,
        label=plan.bring.label,
    )


async def host_tags(agent: AgentClient) -> HostTags:
    """The wheel tags of the agent's interpreter on the host (``runtime_status``)."""
    status = RuntimeStatus.from_json(await agent.call(Op.RUNTIME_STATUS, {"root": agent.root}))
    return HostTags.from_json(status.tags)


async def ensure_uv(
    agent: AgentClient, *, home: Path | None, method: str, emit: Emit, run_id: str
) -> BringAnswer | None:
    """uv on the host (its wheel, unzipped under the root), or None: pip builds the venv."""
    try:
        art = pythonsource.uv_artifact(home, await host_tags(agent))
        if art is None:
            raise HostEnvironmentError(
                f"PyPI has no uv {pythonsource.UV_VERSION} wheel for the host"
            )
        return await bring(agent, art, home=home, method=method, emit=emit, run_id=run_id)
    except (OSError, ValueError, RemotemacError) as exc:
        emit(
            Warning(
                run_id,
                code="uv-unavailable",
                message=f"uv cannot come to {agent.transport.name} "
                f"({getattr(exc, 'message', exc)}); pip builds the environment",
            )
        )
        return None
