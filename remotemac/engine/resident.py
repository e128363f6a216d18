"""The laptop's side of the resident agent (agent/resident.py): one process per link.

Why: a one-shot ``hostagent.py OP`` pays an SSH exec channel and an interpreter
start per call (issue 16: 17-20 of them per run). The resident agent is started
once per host connection and answers length-prefixed JSON frames; several calls
may be in flight at once.

Nothing depends on the process surviving. When the link drops, every call in
flight fails over to a new process on the new link and is sent again *with the
same id*; the host recorded each completed call's answer before replying, so a
retried call is answered from that record and never runs twice. Retries are
bounded by the reconnect deadline (time since the call first lost the link),
not by a count.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import struct
import time
from dataclasses import dataclass
from typing import Any

from remotemac.agent.protocol import Hello, JsonObject, Message, check_protocol
from remotemac.errors import HostError, TransientHostError
from remotemac.transport.base import RemoteProcess, Transport

HEADER = struct.Struct(">I")
MAX_FRAME = 64 << 20
HELLO_TIMEOUT_S = 120.0
#: pause between a lost attempt and the next (the transport's reconnect backs off itself)
RETRY_PAUSE_S = 0.05


@dataclass
class Frame(Message):
    """A frame of the resident agent (agent/resident.py): its hello, or the answer to
    the call ``id`` with the agent's CPU seconds so far (``pid``: which process)."""

    id: Any = None
    hello: Any = None
    pid: Any = None
    cpu_s: Any = None
    answer: Any = None

    @property
    def cpu(self) -> tuple[int, float] | None:
        """(pid, CPU seconds) when the frame carries both."""
        if not isinstance(self.pid, int) or not isinstance(self.cpu_s, (int, float)):
            return None
        return self.pid, float(self.cpu_s)


class AgentGone(Exception):
    """The resident process ended (or its link dropped) with calls in flight."""


class ProtocolMismatch(HostError):
    """The resident agent's hello carries another protocol version than this laptop's
    (agent/protocol.py PROTOCOL_VERSION): its answers would be misread. Not retried."""


def encode_frame(obj: JsonObject) -> bytes:
    body = json.dumps(obj).encode("utf-8")
    return HEADER.pack(len(body)) + body


async def read_frame(proc: RemoteProcess) -> JsonObject | None:
    """One frame, or None at the end of the agent's output."""
    head = await proc.readexactly(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise HostError(f"the resident agent sent a {size} byte frame (limit {MAX_FRAME})")
    body = await proc.readexactly(size)
    if len(body) < size:
        return None
    return json.loads(body.decode("utf-8"))


class ResidentAgent:
    """One resident agent on one host link, shared by every run leasing that link."""

    def __init__(self, transport: Transport, argv: list[str], *, reconnect_deadline: float) -> None:
        self.transport = transport
        self.argv = argv
        self.reconnect_deadline = reconnect_deadline
        self._proc: RemoteProcess | None = None
        self._reader: asyncio.Task | None = None
        self._pending: dict[str, tuple[RemoteProcess, asyncio.Future]] = {}
        self._start_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._prefix = f"{int(time.time())}-{secrets.token_hex(6)}"
        #: agent pid -> the last CPU seconds it reported (itself plus its children)
        self.cpu_by_pid: dict[int, float] = {}
        self.starts = 0
        self.closed = False

    def new_id(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    @property
    def host_cpu_s(self) -> float:
        """CPU of every resident agent process this link has started, summed."""
        return sum(self.cpu_by_pid.values())

    def note_cpu(self, frame: JsonObject) -> float:
        """Record a frame's CPU figure; returns the increase since that pid's last one."""
        figure = Frame.from_json(frame).cpu
        if figure is None:
            return 0.0
        pid, cpu = figure
        before = self.cpu_by_pid.get(pid, 0.0)
        if cpu > before:
            self.cpu_by_pid[pid] = cpu
            return cpu - before
        return 0.0

    async def _ensure(self, within: float) -> RemoteProcess:
        """The running agent, or a new one. Its hello is not waited for: the first
        request is sent at once and queues in the channel while Python starts (on a
        link that stays up two seconds at a time, every round trip counts)."""
        async with self._start_lock:
            if self._proc is not None:
                return self._proc
            if self.closed:
                raise HostError(f"the agent on {self.transport.name} was closed")
            proc = await self.transport.open_process(self.argv, reconnect_within=within)
            self._proc = proc
            self.starts += 1
            self._reader = asyncio.ensure_future(self._read_loop(proc))
            return proc

    async def adopt(self, proc: RemoteProcess) -> bool:
        """Take ``proc`` as this link's agent: a process started another way that is
        the resident agent now (the claim's, agentclient._claim_then_resident), its
        hello still to come. False when the link has its agent already, or one is
        being started: another lease of a pooled link may have started it since the
        claim looked; the caller closes ``proc``, its claim stands. It takes the start
        lock, so it never overwrites an agent :meth:`_ensure` is starting."""
        async with self._start_lock:
            if self.closed:
                raise HostError(f"the agent on {self.transport.name} was closed")
            if self._proc is not None:
                return False
            self._proc = proc
            self.starts += 1
            self._reader = asyncio.ensure_future(self._read_loop(proc))
            return True

    async def _read_loop(self, proc: RemoteProcess) -> None:
        why: BaseException = AgentGone("the resident agent ended")
        hello = False
        try:
            while True:
                frame = await (
                    read_frame(proc)
                    if hello
                    else asyncio.wait_for(read_frame(proc), HELLO_TIMEOUT_S)
                )
                if frame is None:
                    if not hello:
                        why = await self._start_failed(proc)
                    break
                head = Frame.from_json(frame)
                if head.hello:  # its CPU goes with the first answer, to that run
                    mismatch = check_protocol(Hello.from_json(frame).protocol)
                    if mismatch:
                        why = ProtocolMismatch(
                            f"{self.transport.name}: {mismatch}; its answers would be misread",
                            hint="the agent directory on the host is not this remotemac's "
                            "upload: remove it (remotemac cleanup) and run again",
                        )
                        break
                    hello = True
                    continue
                entry = self._pending.pop("" if head.id is None else str(head.id), None)
                if entry is not None and not entry[1].done():
                    entry[1].set_result(frame)
        except asyncio.CancelledError:
            why = AgentGone("closed")
        except asyncio.TimeoutError:
            why = HostError(
                f"{self.transport.name}: the resident agent did not start within"
                f" {HELLO_TIMEOUT_S:.0f} s",
                hint="check the host's python3",
            )
        except Exception as exc:  # the link dropped under the stream
            why = exc
        finally:
            self._drop(proc, why)

    async def _start_failed(self, proc: RemoteProcess) -> BaseException:
        """The agent ended before its hello. With an exit status it cannot start (no
        python3, a Python older than 3.9): not retried. Without one the link went."""
        code = None
        with contextlib.suppress(Exception):
            code = await proc.wait(5)
        if code is None or code < 0:
            return AgentGone("the link dropped while the agent started")
        return HostError(
            f"{self.transport.name}: the resident agent exited at start"
            f" (exit {code}): {proc.stderr_tail() or 'no output'}",
            hint="check the host's python3 (3.9 or newer)",
        )

    def _drop(self, proc: RemoteProcess, why: BaseException) -> None:
        """Forget ``proc``; every call in flight on it fails over to a new process."""
        if self._proc is proc:
            self._proc = None
        for call_id, (owner, fut) in list(self._pending.items()):
            if owner is proc:
                self._pending.pop(call_id, None)
                if not fut.done():
                    fut.set_exception(
                        why if isinstance(why, (AgentGone, HostError)) else AgentGone(str(why))
                    )
        asyncio.ensure_future(_quiet_close(proc))

    async def call(
        self,
        op: str,
        request: JsonObject,
        *,
        store: str | None,
        timeout: float | None,
        call_id: str | None = None,
    ) -> JsonObject:
        """Send one call (retried with the same id until the deadline) and return its frame."""
        call_id = call_id or self.new_id()
        frame = encode_frame({"id": call_id, "op": op, "req": request, "store": store})
        first_loss: float | None = None
        last: BaseException | None = None
        while True:
            spent = 0.0 if first_loss is None else time.monotonic() - first_loss
            left = self.reconnect_deadline - spent
            if left <= 0:
                raise TransientHostError(
                    f"agent {op} on {self.transport.name}: the link kept dropping for"
                    f" {self.reconnect_deadline:.0f} s (the reconnect deadline)"
                    + (f"; last: {_short(last)}" if last else ""),
                    hint="check the network, then re-attach",
                )
            fut: asyncio.Future = asyncio.get_running_loop().create_future()
            proc: RemoteProcess | None = None
            try:
                proc = await self._ensure(left)
                self._pending[call_id] = (proc, fut)
                async with self._write_lock:
                    await proc.write(frame)
                return await asyncio.wait_for(fut, timeout)
            except (TransientHostError, AgentGone, BrokenPipeError, ConnectionError) as exc:
                self._pending.pop(call_id, None)
                last = exc
                if first_loss is None:
                    first_loss = time.monotonic()
                if (
                    proc is not None
                    and proc is self._proc
                    and isinstance(exc, (TransientHostError, BrokenPipeError))
                ):
                    self._drop(proc, exc)  # (never a newer agent another call started)
                await asyncio.sleep(RETRY_PAUSE_S)
            except asyncio.CancelledError:
                self._pending.pop(call_id, None)
                raise
            except asyncio.TimeoutError:
                self._pending.pop(call_id, None)
                raise HostError(
                    f"agent {op} on {self.transport.name} did not answer within {timeout:g} s",
                    hint="raise the timeout or check the host",
                ) from None

    async def close(self) -> None:
        """Close the channel: the agent sees end of input, finishes what is in flight, exits."""
        self.closed = True
        proc, self._proc = self._proc, None
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        if proc is not None:
            await _quiet_close(proc)


async def _quiet_close(proc: RemoteProcess) -> None:
    with contextlib.suppress(Exception):
        await proc.write_eof()
    with contextlib.suppress(Exception):
        await proc.close()


def _short(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__
