"""What a failed run's last line says about the way on: the outputs kept on the host
after a failed pull, and the command that goes on once a full disk is freed
(docs/contract.md, "What survives a failure"). Kept apart from the pipeline, which only
calls them on its way out."""

from __future__ import annotations

from remotemac.agent.protocol import ErrorCode
from remotemac.engine.context import RunContext
from remotemac.errors import HostDiskFull, RemotemacError
from remotemac.phases import Phase


def say_what_is_kept(ctx: RunContext, exc: Exception, failed: str) -> None:
    """The failure's hint says that the outputs not verified here are kept on the host,
    and the command that gets them (docs/contract.md, "What survives a failure")."""
    if failed != Phase.PULL.value or not isinstance(exc, RemotemacError):
        return
    if "kept on the host" in (exc.hint or ""):
        return
    more = " --max-bytes SIZE" if isinstance(exc, outputs_too_large()) else ""
    kept = (
        f"the outputs not verified here are kept on the host: get them with "
        f"remotemac attach {ctx.run_id}{more}"
    )
    exc.hint = f"{exc.hint}; {kept}" if exc.hint else kept


def say_how_to_go_on_after_a_full_disk(ctx: RunContext, exc: Exception) -> None:
    """A host disk that filled up stops a phase, not the run: once the user frees space,
    ``attach`` goes on from the phase that stopped (provision and sync included), so the
    hint names that command unless it already names one."""
    full = isinstance(exc, HostDiskFull) or getattr(exc, "code", None) in DISK_FULL_CODES
    if not full or not isinstance(exc, RemotemacError) or "remotemac attach" in (exc.hint or ""):
        return
    go_on = f"free some space on the host, then go on with: remotemac attach {ctx.run_id}"
    exc.hint = f"{exc.hint}; {go_on}" if exc.hint else go_on


def outputs_too_large() -> type[RemotemacError]:
    from remotemac.engine.pull import OutputsTooLarge

    return OutputsTooLarge


#: agent error codes of a host disk that is full: the launch's write check, an ENOSPC
DISK_FULL_CODES = frozenset({ErrorCode.DISK_FULL.value, ErrorCode.NO_SPACE.value})


def launch_on_a_full_disk(ctx: RunContext, exc: Exception, failed: str) -> bool:
    """Whether ``failed`` is a launch the host's full disk refused, after the data was
    synced: no side can start on that run any more, so its data has no use there."""
    return (
        failed.partition(":")[0] == Phase.LAUNCH.value
        and getattr(exc, "code", None) in DISK_FULL_CODES
        and Phase.SYNC.value in ctx.results
    )
