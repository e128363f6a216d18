"""Ship the agent to a host once per content hash, and call its operations.

The engine talks to the host through the agent's operations with JSON in and out
instead of shell pipelines, so macOS's BSD tools and Linux's GNU tools never
matter, and nothing secret appears in argv.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import weakref
from typing import Any, TypeVar

from remotemac.agent.protocol import ErrorCode, JsonObject, Message, Op
from remotemac.engine.agentanswers import ANSWERS, AgentAnswer, ClaimAnswer, Steps
from remotemac.engine.agentship import (
    agent_argv,
    agent_bundle,
    exec_in_memory,
    open_in_memory_then,
)
from remotemac.engine.ledger import Ledger
from remotemac.engine.resident import ResidentAgent
from remotemac.errors import HostEnvironmentError, HostError, RemotemacError, TransientHostError
from remotemac.transport.base import ExecResult, Transport

#: the host's interpreter the agent runs under (never the workload's venv)
DEFAULT_AGENT_PYTHON = "python3"
ENV_AGENT_PYTHON = "REMOTEMAC_AGENT_PYTHON"
#: ``1``: one ``hostagent OP`` process per call instead of the resident agent
ENV_ONESHOT = "REMOTEMAC_AGENT_ONESHOT"
# protocol.HOST_ENV_CODES: the agent's error codes that mean "the host's environment lacks
# something" (exit 6), disk space too ("no-space": the link is fine, retrying will not
# help; was exit 3); Answer.host_env asks it


def agent_python(setting: str | None = None) -> str:
    """The playbook's ``agent.python``, else $REMOTEMAC_AGENT_PYTHON, else ``python3``."""
    return setting or os.environ.get(ENV_AGENT_PYTHON) or DEFAULT_AGENT_PYTHON


OWNED_MARKER = ".remotemac-owned"  # agent/safefs.py MARKER

M = TypeVar("M", bound=Message)


def parse_answer(host: str, what: str, result: ExecResult, hint: str | None = None) -> JsonObject:
    """The agent's one JSON answer on stdout, or HostError with its last stderr line."""
    try:
        answer = json.loads(result.stdout.decode("utf-8", "replace") or "{}")
    except ValueError:
        answer = {}
    if not answer:
        err = result.stderr.decode("utf-8", "replace").strip().splitlines()
        raise HostError(
            f"{host}: {what} gave no answer (exit {result.exit_code}): "
            f"{err[-1] if err else 'no output'}",
            hint=hint,
        )
    return answer


def missing_python(host: str, python: str, result: ExecResult) -> None:
    """The shell could not run the agent's interpreter (exit 127: not found, 126: not
    executable): the host lacks it, exit 6, not a link problem (exit 3)."""
    if result.exit_code not in (126, 127):
        return
    err = result.stderr.decode("utf-8", "replace").strip().splitlines()
    raise HostEnvironmentError(
        f"{host}: the agent's interpreter {python!r} cannot run on the host "
        f"({err[-1] if err else f'exit {result.exit_code}'})",
        hint="install it there, or set agent.python in the playbook (or "
        "$REMOTEMAC_AGENT_PYTHON) to one the host has, e.g. python3",
    )


async def call_in_memory(
    transport: Transport,
    ledger: Ledger,
    op: Op,
    req: JsonObject,
    python: str | None = None,
    timeout: float = 900,
    idempotent: bool = False,
    module: str = "cleanupops",
) -> JsonObject:
    """Run ``module.op_<op>(req)`` (cleanupops, or rootclaim for the claim: a few
    modules to ship and compile, not sixteen) on the host from memory: nothing lands
    on its disk.

    For cleanup (it must not recreate the root it removes) and for claiming the root
    (the agent is installed below it). ``python`` defaults to the agent's interpreter
    ($REMOTEMAC_AGENT_PYTHON or python3). ``idempotent``: the call may run again after
    the link dropped under it (claiming the root does: a second run adopts what the
    first made).
    """
    python = agent_python(python)
    fn = op.function
    started = time.monotonic()
    result = await exec_in_memory(
        transport, python, module, fn, req, timeout=timeout, idempotent=idempotent
    )
    ledger.append(
        transport.name,
        f"{python} -c <remotemac agent from stdin: {module}.{fn}"
        f"{' (dry run)' if req.get('dry_run') else ''}>",
        result.exit_code,
        op=f"cleanup:{fn}",
        seconds=time.monotonic() - started,
    )
    missing_python(transport.name, python, result)
    envelope = AgentAnswer.from_json(
        parse_answer(
            transport.name, f"agent ({fn})", result, hint=f"is {python} installed on the host?"
        )
    )
    if not envelope.ok:
        raise RemotemacError(f"{transport.name}: cleanup failed on the host: {envelope.error}")
    answer: JsonObject = envelope.result
    ledger.append_steps(transport.name, f"cleanup:{fn}", Steps.from_json(answer).steps)
    return answer


class AgentError(RemotemacError):
    """The agent answered with an error."""

    exit_code = 3

    def __init__(self, op: str, message: str, code: str, tail: list[str] | None = None) -> None:
        super().__init__(
            f"host agent {op}: {message}" + (f" (last lines: {' | '.join(tail)})" if tail else "")
        )
        self.code = code
        self.tail = tail or []


class AgentEnvironmentError(HostEnvironmentError, AgentError):
    """The agent ran but the host's environment failed it (exit 6, not 3)."""


#: read-only ops whose answers the resident agent does not record in its call store:
#: one asked again after a drop is simply answered again. ``status`` carries the job's
#: log bytes (every follow poll): recorded, they would pile up under ``agent/calls``
#: outside the run dir, past its wipe, with whatever the job printed. ``list_outputs``
#: carries every result's name (and, hashed, its sha256): the same, and writing the
#: answer (250 KB for 2,000 results) held the pull's first byte back (issue 36).
UNRECORDED = frozenset({Op.STATUS, Op.LIST_OUTPUTS})


class AgentClient:
    """A run's handle on the host's agent.

    Calls go to the link's resident agent (engine/resident.py) unless
    ``$REMOTEMAC_AGENT_ONESHOT=1`` (or a per-call ``python``) asks for one
    ``hostagent OP`` process per call (agentship.agent_argv). ``host_cpu_s`` sums the host-side CPU
    the agent reported for this run's calls.
    """

    def __init__(
        self,
        transport: Transport,
        root: str,
        ledger: Ledger | None = None,
        python: str | None = None,
    ) -> None:
        self.transport = transport
        self.root = root
        #: remote_root as the host resolved it once at claim (None until then)
        self.real_root: str | None = None
        self.ledger = ledger or Ledger(None)
        self.python = agent_python(python)
        self.agent_dir = ""
        self.resident = os.environ.get(ENV_ONESHOT, "") in ("", "0")
        self.host_cpu_s = 0.0
        self.calls = 0
        #: the remote_root's id from its ownership marker (provision claims the root)
        self.root_id: str | None = None
        #: the claim found this agent version installed below the root (no stat needed)
        self.agent_ready = False

    @property
    def store(self) -> str | None:
        """Where the host records completed calls' answers (exactly-once retries)."""
        return f"{self.root}/agent/calls" if self.root else None

    def session(self) -> ResidentAgent:
        """The resident agent of this link (one per connection, shared by every lease)."""
        owner = self.transport.link_owner()
        # -S: no site-packages (stdlib only; a heavy site costs 0.2-0.4 s per start)
        argv = tuple(agent_argv(self.python, self.agent_dir, "resident"))
        sessions = _SESSIONS.setdefault(owner, {})
        found = sessions.get(argv)
        if found is None or found.closed:
            found = ResidentAgent(
                owner, list(argv), reconnect_deadline=self.transport.reconnect_deadline
            )
            sessions[argv] = found
        return found

    async def close(self) -> None:
        """Stop this transport's resident agent unless the link is shared (a pool lease)."""
        if self.transport.link_owner() is self.transport:
            await close_link_agents(self.transport)

    async def claim(self, run_id: str | None = None, *, then_resident: bool = False) -> str | None:
        """Make or adopt the root on the host and mark it as remotemac's, before anything
        is written below it; BadInput (exit 2, nothing written) for a root that is, holds
        or sits above the host's home, or that holds files remotemac did not write.
        Runs the agent from memory (it is installed below the root). ``then_resident``:
        the claim's process goes on as this link's resident agent when the agent is
        installed already (see :meth:`_claim_then_resident`)."""
        from remotemac.errors import BadInput, HostDiskFull

        # the claim also says whether this agent version is installed there already
        request = {"root": self.root, "run_id": run_id, "agent_version": agent_bundle()[0]}
        raw = await self._claim_then_resident(request) if then_resident else None
        if raw is None:
            raw = await call_in_memory(
                self.transport,
                self.ledger,
                Op.CLAIM_ROOT,
                request,
                python=self.python,
                timeout=120,
                # a cut link retries it: a second claim adopts the root the first one made
                idempotent=True,
                module="rootclaim",
            )
        answer = ClaimAnswer.from_json(raw)
        if answer.refused and answer.code == ErrorCode.NO_SPACE.value:
            raise HostDiskFull(
                f"{self.transport.name}: remote_root {self.root}: {answer.refused}",
                hint="the host's disk is full; nothing was written on the host",
            )
        if answer.refused:
            raise BadInput(
                f"{self.transport.name}: remote_root {self.root}: {answer.refused}",
                hint="nothing was written on the host",
            )
        self.root_id = answer.root_id
        self.real_root = answer.real_root or None
        self.agent_ready = bool(answer.agent_ready)
        return self.root_id

    async def _claim_then_resident(self, request: JsonObject) -> JsonObject | None:
        """The claim on a channel that goes on as the resident agent (issue 36): when the
        root is claimed as given and this agent version is installed below it, the
        claim's process execs the resident agent exactly as :meth:`session` would start
        it, and the session adopts the channel: one exec channel for the claim and the
        agent, not two (two round trips, and one wait for a Python start, fewer).

        None when it cannot be done this way (one-shot calls, a transport without
        streamed processes, a resident agent running already, the link dropped, no
        answer line): the caller claims the ordinary way, which retries (the claim is
        idempotent: a second one adopts what the first made)."""
        if not self.resident or not self.root:
            return None
        agent_dir = f"{self.root}/agent/{agent_bundle()[0]}"
        argv = agent_argv(self.python, agent_dir, "resident")
        owner = self.transport.link_owner()
        found = _SESSIONS.get(owner, {}).get(tuple(argv))
        if found is not None and not found.closed:
            return None  # a pool lease whose link has its agent already
        started = time.monotonic()
        try:
            proc = await open_in_memory_then(
                self.transport, self.python, "rootclaim", Op.CLAIM_ROOT.function, request, argv
            )
        except (NotImplementedError, TransientHostError, BrokenPipeError, ConnectionResetError):
            # (BrokenPipeError: the command ended before it took the agent: no such
            # python on the host; the ordinary claim says so, exit 6)
            return None
        try:
            line = await asyncio.wait_for(proc.readline(), 120)
            envelope = AgentAnswer.from_json(json.loads(line)) if line.strip() else None
        except (TransientHostError, ValueError, asyncio.TimeoutError):  # (ProtocolError too)
            envelope = None
        if envelope is None or not envelope.ok or not isinstance(envelope.result, dict):
            await proc.close()
            return None  # the ordinary claim says what went wrong, in its own words
        answer: JsonObject = envelope.result
        self.ledger.append(
            self.transport.name,
            f"{self.python} -S -c <remotemac agent from stdin: rootclaim.op_claim_root,"
            " then the resident agent>",
            0,
            op="cleanup:op_claim_root",
            seconds=time.monotonic() - started,
        )
        ledger_steps = Steps.from_json(answer).steps
        self.ledger.append_steps(self.transport.name, "cleanup:op_claim_root", ledger_steps)
        claimed = ClaimAnswer.from_json(answer)
        adopted = False
        try:
            if claimed.agent_ready and not claimed.refused and claimed.real_root == self.root:
                self.agent_dir = agent_dir  # the process is the resident agent now
                # False: another lease of this link started its agent meanwhile: that one
                adopted = await self.session().adopt(proc)
        finally:
            if not adopted:  # it ended after its answer, or is an agent too many
                await proc.close()
        return answer

    async def install(self) -> str:
        """Upload the agent unless this exact version is already there (the root is
        claimed first when this client has not done it yet)."""
        if self.root_id is None:
            await self.claim()
        version, files = agent_bundle()
        agent_dir = f"{self.root}/agent/{version}"
        marker = f"{agent_dir}/.complete"
        if not self.agent_ready and await self.transport.stat(marker) is None:
            await self.transport.makedirs(agent_dir)
            # ownership first: cleanup removes only directories that carry it
            await self.transport.write_bytes(
                f"{agent_dir}/{OWNED_MARKER}",
                json.dumps(
                    {
                        "kind": "agent",
                        "version": version,
                        "root_id": self.root_id,
                        "created_at": time.time(),
                    }
                ).encode(),
            )
            for name, data in files.items():
                await self.transport.write_bytes(f"{agent_dir}/{name}", data, mode=0o600)
            await self.transport.write_bytes(marker, version.encode())
            self.ledger.append(
                self.transport.name, f"upload agent {version} to {agent_dir}", 0, op="install-agent"
            )
        self.agent_dir = agent_dir
        return agent_dir

    async def call(
        self,
        op: Op,
        request: JsonObject | None = None,
        *,
        timeout: float | None = 600,
        idempotent: bool = True,
        python: str | None = None,
    ) -> JsonObject:
        """Run one agent operation under the host's own interpreter (``self.python``).

        ``python`` overrides it for this call only (tests); operations that need the
        workload's interpreter take it in ``request`` and run it as a subprocess.
        ``op`` is a ``protocol.Op``: the names the agent's handler table serves.
        Returns the answer's ``result`` as it arrived (JSON); :meth:`ask` reads it as
        the op's answer type.
        """
        if not self.agent_dir:
            await self.install()
        self.calls += 1
        if self.resident and python is None:
            return await self._call_resident(op, request or {}, timeout)
        argv = agent_argv(
            python or self.python, self.agent_dir, "hostagent", str(op.value), site=True
        )
        started = time.monotonic()
        kwargs: dict[str, Any] = {"stdin": json.dumps(request or {}).encode(), "timeout": timeout}
        if idempotent:  # (only the SSH transport retries: Transport.exec has no such flag)
            kwargs["idempotent"] = True
        result = await self.transport.exec(argv, **kwargs)
        self.ledger.append(
            self.transport.name,
            " ".join(argv),
            result.exit_code,
            op=op,
            seconds=time.monotonic() - started,
        )
        answer = parse_answer(self.transport.name, f"agent {op}", result)
        envelope = AgentAnswer.from_json(answer)
        if isinstance(envelope.cpu_s, (int, float)):
            self.host_cpu_s += float(envelope.cpu_s)
        return _result(op, answer, envelope)

    async def ask(
        self,
        op: Op,
        request: JsonObject | Message | None,
        answer: type[M],
        **kwargs: Any,
    ) -> M:
        """:meth:`call`, its result read once as ``answer``: the op's type in
        agentanswers.ANSWERS (TypeError for another: one op's answer is never read as
        another's). ``request`` may be a message (written as its JSON)."""
        declared = ANSWERS.get(op)
        if declared is None or not issubclass(answer, declared):
            raise TypeError(f"{op} answers with {declared and declared.__name__}, not {answer}")
        body = request.to_json() if isinstance(request, Message) else request
        return answer.from_json(await self.call(op, body, **kwargs))

    async def _call_resident(
        self, op: Op, request: JsonObject, timeout: float | None
    ) -> JsonObject:
        session = self.session()
        started = time.monotonic()
        store = None if op in UNRECORDED else self.store
        frame = await session.call(op, request, store=store, timeout=timeout)
        self.host_cpu_s += session.note_cpu(frame)
        answer: JsonObject = frame.get("answer") or {}
        envelope = AgentAnswer.from_json(answer)
        self.ledger.append(
            self.transport.name,
            f"{' '.join(session.argv)} ← {op}"
            + (" (answer recorded before the link dropped)" if envelope.replayed else ""),
            0 if envelope.ok else 1,
            op=op,
            seconds=time.monotonic() - started,
            via="resident",
        )
        return _result(op, answer, envelope)


async def close_link_agents(owner: Transport) -> None:
    """Stop the resident agents on ``owner``'s link (before the link itself closes)."""
    for found in _SESSIONS.pop(owner, {}).values():
        await found.close()


def _result(op: str, answer: JsonObject, envelope: AgentAnswer) -> JsonObject:
    """The agent's ``result``, or its error as an exception (exit 6 for the environment)."""
    if not envelope.ok:
        cls = AgentEnvironmentError if envelope.host_env else AgentError
        error = envelope.error if "error" in answer else "unknown error"
        raise cls(op, str(error), envelope.code or "", envelope.tail)
    return answer["result"]


#: resident agents by link owner, then by argv (python, the boot, resident.py path)
_SESSIONS: weakref.WeakKeyDictionary[Transport, dict[tuple[str, ...], ResidentAgent]] = (
    weakref.WeakKeyDictionary()
)
