"""``remotemac logs RUN --follow`` of a run no remotemac follows: a live, read-only tail.

A detached (or interrupted) run's jobs keep appending to their logs on the host, but
only a following remotemac copies them to the laptop, so the laptop's copy stands
still. This connects to the host the way ``status`` does and reads each device's log
from the byte offset the laptop's copy ends at, with the follow phase's own reader
(:class:`~remotemac.engine.jobs.LogFollower`): every line once and in order, a
dropped link ridden out as follow rides it out, the end seen when the job's state is
final and its log fully read. It is a viewer: it writes neither the laptop's copy of
the log nor the journal, and never relaunches, pulls or wipes; ``remotemac attach
RUN`` finishes the run.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from remotemac.agent.protocol import JobState, JobStatus, LaunchRequest, Op
from remotemac.engine.context import RunContext, RunOptions, Side
from remotemac.engine.jobs import FOLLOW_RECONNECT_MAX_WAIT_S, LogFollower
from remotemac.errors import JobLost
from remotemac.events import EventBus, LogLine
from remotemac.journal import Journal
from remotemac.playbook import Playbook


@dataclass(frozen=True)
class JobEnd:
    """How a tailed job ended: its final state (``lost``/``absent`` when the host says
    so) and the exit code its status file gives (None: none written)."""

    state: str | None
    exit_code: int | None


class _LogViewer(LogFollower):
    """The follow phase's reader, started at a given offset, keeping nothing."""

    def __init__(
        self, ctx: RunContext, side: Side, request: LaunchRequest, start: tuple[int, int]
    ) -> None:
        self.start = start
        super().__init__(ctx, side, request)

    def _start(self) -> tuple[int, int]:
        return self.start  # the laptop's copy is left as it is

    def _sink(self) -> BinaryIO:
        return open(os.devnull, "ab")  # lines are only announced (LogLine events)

    def _save_offset(self) -> None:
        """The journal's offset belongs to the remotemac that follows the run."""

    async def _job_lost(self, job: JobStatus) -> None:
        """A viewer relaunches nothing: attach relaunches or reports a lost job."""
        raise JobLost(
            f"{self.transport.name}: the {self.side.label} job was lost "
            f"({job.lost_reason or 'runner gone'}); "
            f"remotemac attach {self.ctx.run_id} reports it"
        )


async def tail_logs(
    *,
    run_id: str,
    playbook: Playbook,
    journal: Journal,
    home: Path,
    out_dir: Path,
    ssh: Any,
    starts: dict[str, tuple[int, int]],
    on_line: Any,
    devices: set[str] | None = None,
) -> dict[str, JobEnd]:
    """Stream each launched, unfollowed device's log lines to ``on_line(LogLine)``
    from ``starts[label]`` ((bytes, lines) the laptop already has; 0 otherwise) until
    every job is final; each device's final state and exit code."""
    from remotemac.engine.pipeline import build_context, restore_phase
    from remotemac.phases import Phase, PhaseKey, follow_key, launch_key

    bus = EventBus()
    bus.subscribe(lambda event: on_line(event) if isinstance(event, LogLine) else None)
    ctx = build_context(
        run_id=run_id,
        playbook=playbook,
        journal=journal,
        bus=bus,
        home=home,
        out_dir=out_dir,
        options=RunOptions(),
        ssh=ssh,
    )
    done = set(ctx.restore_results(journal.phases(run_id)))
    launched = [s for s in ctx.sides if str(launch_key(s.role)) in done]
    reference, target = ctx.side("reference"), ctx.side("target")
    # a target on the reference's host is started by the host itself once the
    # reference finished (the launch's ``next``): it is tailed after the reference
    chained = (
        target
        if target not in launched
        and reference in launched
        and target is not None
        and reference is not None
        and target.host_key == reference.host_key
        else None
    )
    sides = [
        side
        for side in [*launched, *([chained] if chained else [])]
        if str(follow_key(side.role)) not in done  # a followed log is whole on the laptop
        and (devices is None or side.label in devices)
    ]
    if Phase.PROVISION not in ctx.results or not sides:
        return {}
    restore_phase(ctx, PhaseKey(Phase.PROVISION))
    ended: dict[str, JobEnd] = {}
    try:
        for binding in ctx.hosts.values():
            await binding.transport.connect()
            await binding.agent.install()
        now = [side for side in sides if side is not chained]
        results = await asyncio.gather(*(_tail(ctx, side, starts) for side in now))
        ended.update({side.label: r for side, r in zip(now, results, strict=True)})
        if chained in sides and reference is not None:
            first = ended.get(reference.label) or await _state(ctx, reference)
            if first.state == JobState.FINISHED:  # else the host does not start the target
                ended[chained.label] = await _tail(ctx, chained, starts)
    finally:
        for binding in ctx.hosts.values():
            await binding.agent.close()
            await binding.transport.close()
    return ended


async def _state(ctx: RunContext, side: Side) -> JobEnd:
    """A job's final state without tailing it (the reference of a target tailed alone)."""
    binding = ctx.host_for(side)
    while True:
        job = await binding.agent.ask(
            Op.STATUS,
            {"run_dir": binding.run_dir, "device": side.label, "session": side.session(ctx.run_id)},
            JobStatus,
        )
        if job.final or job.state in (JobState.LOST, JobState.ABSENT):
            break
        await asyncio.sleep(1.0)
    return JobEnd(job.state, job.file.get("exit_code"))


async def _tail(ctx: RunContext, side: Side, starts: dict[str, tuple[int, int]]) -> JobEnd:
    binding = ctx.host_for(side)
    request = LaunchRequest(run_dir=binding.run_dir, session=side.session(ctx.run_id))
    viewer = _LogViewer(ctx, side, request, starts.get(side.label, (0, 0)))
    with binding.transport.reconnect_wait_capped(FOLLOW_RECONNECT_MAX_WAIT_S):
        result = await viewer.run()
    return JobEnd(result.state, result.exit_code)
