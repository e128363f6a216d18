"""A claim's process taken as the link's resident agent (engine/resident.py ``adopt``),
raced against another lease of the same pooled link starting the agent.

Real agent processes over the local transport; only the moment of the race is held
open (the start waits on an event), so the two orders are exercised deterministically.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from remotemac.agent.protocol import Op
from remotemac.agent.shared import agent_argv
from remotemac.engine.resident import ResidentAgent
from remotemac.transport.local import LocalTransport

AGENT = Path(__file__).resolve().parents[1] / "remotemac" / "agent"


class HeldStart(LocalTransport):
    """A local transport whose next process start waits until ``go`` is set: the
    window in which a pooled link's other lease starts the agent."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.entered = asyncio.Event()

    async def open_process(self, argv, **kw):
        self.entered.set()
        await self.go.wait()
        return await super().open_process(argv, **kw)


def _argv() -> list[str]:
    return agent_argv(sys.executable, str(AGENT), "resident")


def test_a_claim_adopted_while_another_lease_starts_the_agent_is_closed_not_raced():
    """The other lease's start holds the start lock when the claim's process arrives:
    ``adopt`` waits for it, says False (the caller closes its process, its claim
    stands), and every call goes to the one agent that start made. Before the fix the
    adopted process was taken during the start's await, then overwritten by it: two
    agents on one link, one of them answering nobody."""

    async def go() -> tuple[bool, int, bool, int]:
        transport = HeldStart()
        session = ResidentAgent(transport, _argv(), reconnect_deadline=30)
        try:
            call = asyncio.ensure_future(session.call(Op.PING, {}, store=None, timeout=30))
            await transport.entered.wait()
            claims = await LocalTransport().open_process(_argv())
            adopting = asyncio.ensure_future(session.adopt(claims))
            await asyncio.sleep(0.2)
            waited = not adopting.done()  # the start lock holds it
            transport.go.set()
            adopted = await adopting
            frame = await asyncio.wait_for(call, 60)
            if not adopted:
                await claims.close()
            served = await session.call(Op.PING, {}, store=None, timeout=30)
            assert frame["answer"]["ok"] and served["answer"]["ok"]
            return adopted, session.starts, waited, len(session.cpu_by_pid)
        finally:
            await session.close()

    adopted, starts, waited, agents = asyncio.run(go())
    assert waited, "adopt did not wait for the start in progress"
    assert adopted is False
    assert starts == 1
    assert agents <= 1  # every answer came from one agent process


def test_a_claim_adopted_on_a_link_without_an_agent_serves_the_calls():
    """Nothing running: the claim's process is the agent; the next call starts no other."""

    async def go() -> tuple[bool, int]:
        transport = HeldStart()
        transport.go.set()
        session = ResidentAgent(transport, _argv(), reconnect_deadline=30)
        try:
            adopted = await session.adopt(await LocalTransport().open_process(_argv()))
            frame = await session.call(Op.PING, {}, store=None, timeout=30)
            assert frame["answer"]["ok"]
            return adopted, session.starts
        finally:
            await session.close()

    adopted, starts = asyncio.run(go())
    assert adopted is True
    assert starts == 1
