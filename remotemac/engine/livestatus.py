"""``remotemac status RUN``: what the host says about a run's jobs right now.

Read-only: it asks the agent for each device's status (state, exit code, heartbeat
age, log size) and never changes the run. A host that does not answer is reported
as such, in one line, instead of failing the command.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import JobStatus, Op
from remotemac.engine.context import RunOptions
from remotemac.engine.jsonpart import JsonPart
from remotemac.engine.statusview import LiveSide, LiveView
from remotemac.events import EventBus
from remotemac.journal import Journal
from remotemac.playbook import Playbook


async def live_status(
    *,
    run_id: str,
    playbook: Playbook,
    journal: Journal,
    home: Path,
    out_dir: Path,
    ssh: Any,
    timeout: float = 20.0,
) -> LiveView:
    from remotemac.engine.pipeline import build_context, restore_phase
    from remotemac.phases import Phase, PhaseKey

    ctx = build_context(
        run_id=run_id,
        playbook=playbook,
        journal=journal,
        bus=EventBus(),
        home=home,
        out_dir=out_dir,
        options=RunOptions(),
        ssh=ssh,
    )
    ctx.restore_results(journal.phases(run_id))
    if Phase.PROVISION not in ctx.results:
        return LiveView.with_keys(answered=False, detail="not provisioned yet")
    restore_phase(ctx, PhaseKey(Phase.PROVISION))
    sides: dict[str, LiveSide] = {}
    try:
        async with asyncio.timeout(timeout):
            for binding in ctx.hosts.values():
                await binding.transport.connect()
                await binding.agent.install()
            for side in ctx.sides:
                binding = ctx.host_for(side)
                answer = await binding.agent.call(
                    Op.STATUS,
                    {
                        "run_dir": binding.run_dir,
                        "device": side.label,
                        "session": side.session(run_id),
                    },
                )
                job = JobStatus.from_json(answer)
                file = RunnerFile.from_json(job.file)
                beat = file.heartbeat_at
                sides[side.label] = LiveSide(
                    state=job.state,
                    exit_code=file.exit_code,
                    heartbeat_age_s=round(float(job.now or 0) - beat, 1) if beat else None,
                    log_bytes=job.log_size,
                    tmux=job.tmux_alive,
                )
    except Exception as exc:  # status must answer even when the host does not
        return LiveView.with_keys(
            answered=False,
            detail=f"host did not answer: {exc}",
            sides=sides,
            asked_at=time.time(),
        )
    finally:
        for binding in ctx.hosts.values():
            await binding.agent.close()
            await binding.transport.close()
    return LiveView.with_keys(answered=True, sides=sides, asked_at=time.time())


@dataclass
class RunnerFile(JsonPart):
    """The parts of the runner's status file (``status/<label>.json``) status shows."""

    heartbeat_at: float | None = None
    exit_code: int | None = None
