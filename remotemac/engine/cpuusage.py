"""CPU a run cost on each side: this laptop's process and the host's agent processes.

Why both: a fleet of simulated hosts on one machine shares its cores with the
orchestrator, so a wall-clock ratio alone cannot say which side is slow (issue 16).
The laptop figure is this process's user+system CPU (and its waited-for children)
since the run's context was built; in a fleet every run shares the process, so
it is the orchestrator's, not one run's. The host figure sums what the agent
reported for this run's calls (resident agent: its own CPU and its op
subprocesses'; one-shot calls: each process's whole CPU).
"""

from __future__ import annotations

import resource
from typing import TYPE_CHECKING

from remotemac.agent.protocol import JsonObject

if TYPE_CHECKING:  # (agentclient imports much of the engine: the type only)
    from remotemac.engine.agentclient import AgentClient


def laptop_cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_cpu(start: float | None, agents: list[AgentClient]) -> JsonObject:
    """The record's ``cpu`` section, as acceptance.json holds it; ``start``: the laptop's
    CPU seconds when the run started here; ``agents``: the run's AgentClients."""
    return {
        "laptop_s": round(laptop_cpu_s() - start, 3) if isinstance(start, float) else None,
        "host_s": round(sum(a.host_cpu_s for a in agents), 3),
        "agent_calls": sum(a.calls for a in agents),
    }
