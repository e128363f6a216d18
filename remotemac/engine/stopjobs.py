"""Stop a run's jobs on their hosts: the TUI's "stop the job and quit".

Why its own module: stopping is not a phase of the pipeline and runs outside one (the
run is left, failed, for ``wipe``); it only reuses the pipeline's way to bring the
provisioned hosts back and connect to them.
"""

from __future__ import annotations

from remotemac.agent.protocol import Op
from remotemac.engine.agentanswers import StopAnswer
from remotemac.engine.context import RunContext
from remotemac.engine.pipeline import close_hosts, connect_hosts, restore_phase
from remotemac.errors import EXIT_INTERRUPTED
from remotemac.phases import Phase, PhaseKey


async def stop_jobs(ctx: RunContext, why: str) -> list[str]:
    """Stop a run's jobs on their hosts (the TUI's "stop the job and quit"), returns
    what the hosts left alone (a pid reused by another process is never signalled).

    Why not a wipe: stopping ends the work, it does not take the data; the run is
    ``failed`` in the journal with ``why`` (so no TUI re-attaches it and no relaunch
    starts it again), and ``remotemac wipe`` or the dead-man wipe takes the data later.
    A run stopped before its provision has nothing on a host to stop.
    """
    run_id, journal = ctx.run_id, ctx.journal
    ctx.restore_results(journal.phases(run_id))
    left: list[str] = []
    if Phase.PROVISION in ctx.results:
        restore_phase(ctx, PhaseKey(Phase.PROVISION))
        prov = ctx.provision().hosts
        try:
            await connect_hosts(ctx)
            for side in ctx.sides:  # the reference first: its runner may start the target
                answer = await ctx.host_for(side).agent.ask(
                    Op.STOP,
                    {
                        "run_dir": prov[side.host_key].run_dir,
                        "device": side.label,
                        "session": side.session(run_id),
                    },
                    StopAnswer,
                )
                left += [f"{side.label}: {what}" for what in answer.left_alone or []]
        finally:
            await close_hosts(ctx)
    journal.set_run_state(run_id, "failed", exit_code=EXIT_INTERRUPTED, phase="stop", error=why)
    return left
