"""One run, driven from a front end: the only way the CLI, the TUI and fleets run phases.

Why one class: each front end used to build its own event bus, call
``build_context``/``run_pipeline`` and turn the way a run ended (a failure, a dropped
link past its deadline, Ctrl-C) into a ``RunFinished`` of its own. Three copies drift
(the TUI's re-attach never carried ``--show-secrets``: kept as it was, named here as
``resume(show_secrets=False)``). A :class:`RunSession`
holds what a run needs (its id, playbook, journal, where its outputs go, how hosts
are reached), opens the run's context on its own bus, runs the whole pipeline or one
phase of it, and says how a run that raised ended, as the event a front end shows.

Starting a run (a new journal row), resuming one (``attach``: the row's playbook and
options) and the phase a user runs by hand (``pull``, ``wipe``) are here too, so the
rules for them (an out dir already used, a phase already done, ``wipe: manual``
overridden by an explicit ``wipe``) are the same in every front end.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import JsonObject, Message
from remotemac.engine.context import RunContext, RunOptions
from remotemac.errors import EXIT_INTERRUPTED, RemotemacError, TransientHostError
from remotemac.events import EventBus, RunFinished, Sink
from remotemac.journal import Journal, RunRow
from remotemac.phases import Phase
from remotemac.playbook import Playbook
from remotemac.transport.options import SSHOptions

#: What else a front end asks of the engine, by name, and the module that has it: the
#: front ends import the engine only through this module (and the status view), an
#: import-linter contract. Loaded when first asked for (PEP 562), so a command pays only
#: for what it uses, and the engine's own modules may import this one.
FRONT_DOOR: dict[str, str] = {
    # runs of the journal
    "resolve_run_id": "remotemac.engine.runs",
    "load_run": "remotemac.engine.runs",
    "forgettable_runs": "remotemac.engine.runs",
    "remove_made_dirs": "remotemac.engine.runs",
    "shown_state": "remotemac.engine.runs",
    "phase_already_done": "remotemac.engine.runs",
    "tail_logs": "remotemac.engine.logtail",
    "format_entry": "remotemac.engine.ledger",
    # plans and fleets
    "make_plan": "remotemac.engine.plan",
    "make_fleet_plan": "remotemac.engine.plan",
    "disk_needed": "remotemac.engine.plan",
    "load_inventory": "remotemac.engine.inventoryfile",
    "is_fleet": "remotemac.engine.fleet",
    "fleet_hosts": "remotemac.engine.fleet",
    "plan_runs": "remotemac.engine.fleet",
    "run_fleet": "remotemac.engine.fleet",
    "variant_label": "remotemac.engine.fleet",
    "FleetRun": "remotemac.engine.fleet",
    "FleetResult": "remotemac.engine.fleet",
    "FLEET_FOLLOW_POLL_S": "remotemac.engine.fleet",
    # hosts: doctor, cleanup
    "open_transport": "remotemac.engine.hosts",
    "doctor": "remotemac.engine.doctorgather",
    "main_cleanup": "remotemac.engine.cleanup",
    "render_markdown": "remotemac.engine.cleanup",
    "cleanup_all": "remotemac.engine.fleet",
}

__all__ = ["AlreadyDone", "RunOptions", "RunSession", "options_of", *FRONT_DOOR]


def __getattr__(name: str) -> Any:
    """``from remotemac.engine.session import make_plan``: the name from its module."""
    module = FRONT_DOOR.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


class AlreadyDone(Exception):
    """``pull``/``wipe`` of a run whose phase is done: said, not redone (not an error)."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


@dataclass
class StoredOptions(Message):
    """The options a journal row keeps for ``attach`` (``stored`` of :meth:`RunSession.start`;
    a fleet's run adds its fleet id and variant, kept in ``extra``)."""

    keep_data: Any = None
    drill: str | None = None
    show_secrets: Any = None


def options_of(row: RunRow, *, show_secrets: bool = True) -> RunOptions:
    """The options a run was started with, for ``attach`` (the journal row keeps them).

    ``show_secrets=False``: the TUI's re-attach, which never carried that option."""
    stored = StoredOptions.from_json(row.options)
    return RunOptions(
        keep_data=bool(stored.keep_data),
        drill=stored.drill,
        show_secrets=bool(stored.show_secrets) if show_secrets else False,
    )


@dataclass
class RunSession:
    """One run of the journal and the bus its events go out on.

    ``host``/``matrix``/``pool``: one run of a fleet (its host, its variant, the fleet's
    shared connections); ``ssh``: how hosts are reached (the laptop's settings).
    """

    run_id: str
    playbook: Playbook
    journal: Journal
    home: Path
    out_dir: Path
    options: RunOptions = field(default_factory=RunOptions)
    ssh: SSHOptions | None = None
    host: str | None = None
    #: a fleet run's matrix variant (its keys and values)
    matrix: dict[str, object] | None = None
    pool: Any = None
    bus: EventBus = field(default_factory=EventBus)
    ctx: RunContext | None = None

    # ------------------------------------------------------------ making one

    @classmethod
    def start(
        cls,
        journal: Journal,
        playbook: Playbook,
        out_dir: Path,
        *,
        home: Path,
        options: RunOptions | None = None,
        ssh: SSHOptions | None = None,
        stored: JsonObject | None = None,
        run_id: str | None = None,
        refuse_used: bool = False,
    ) -> RunSession:
        """A new run: its id, its journal row (``stored``: the options ``attach`` reads
        back); ``refuse_used``: an out dir another run wrote into is refused first."""
        from remotemac.engine.runs import refuse_used_out_dir, register_run
        from remotemac.journal import new_run_id

        run_id = run_id or new_run_id(playbook.name)
        if refuse_used:
            refuse_used_out_dir(out_dir, run_id)
        register_run(journal, run_id, playbook, out_dir, options=stored)
        return cls(run_id, playbook, journal, home, out_dir, options or RunOptions(), ssh)

    @classmethod
    def resume(
        cls,
        journal: Journal,
        run_id: str,
        *,
        home: Path,
        ssh: SSHOptions | None = None,
        options: RunOptions | None = None,
        show_secrets: bool = True,
    ) -> RunSession:
        """A run of the journal (any unique part of its id), with the playbook it started
        with; ``options``: None for the row's own (``show_secrets=False``: but that one)."""
        from remotemac.engine.runs import load_run

        row, pb = load_run(journal, run_id)
        opts = options_of(row, show_secrets=show_secrets) if options is None else options
        return cls(row.run_id, pb, journal, home, Path(row.out_dir), opts, ssh)

    def journal_row(self) -> RunRow:
        """The run's row in the journal now (its state, host, name, out dir)."""
        row = self.journal.get_run(self.run_id)
        if row is None:
            raise KeyError(self.run_id)
        return row

    def subscribe(self, sink: Sink) -> None:
        """``sink`` gets every event of the run (a renderer, the TUI's live state)."""
        self.bus.subscribe(sink)

    # ------------------------------------------------------------ running it

    def open(self) -> RunContext:
        """The run's context on this session's bus (hosts bound, not yet connected)."""
        from remotemac.engine.pipeline import build_context

        if self.ctx is None:
            self.ctx = build_context(
                run_id=self.run_id,
                playbook=self.playbook,
                journal=self.journal,
                bus=self.bus,
                home=self.home,
                out_dir=self.out_dir,
                options=self.options,
                ssh=self.ssh,
                host=self.host,
                matrix=self.matrix,
                pool=self.pool,
            )
        return self.ctx

    async def run(self) -> int:
        """Run (or resume) every phase; the exit code of docs/contract.md."""
        from remotemac.engine.pipeline import run_pipeline

        return await run_pipeline(self.open())

    def phase_done(self, phase: str) -> str | None:
        """What to say instead of running ``phase`` again (it is done), else None."""
        from remotemac.engine.runs import phase_already_done

        return phase_already_done(self.journal, self.run_id, phase)

    async def run_phase(self, phase: str) -> int:
        """One phase by hand (``pull``, ``wipe``); :class:`AlreadyDone` when it is done.

        An explicit ``wipe`` wipes a run whose playbook says ``wipe: manual``."""
        from remotemac.engine.pipeline import run_phase

        done = self.phase_done(phase)
        if done:
            raise AlreadyDone(done)
        if phase == Phase.WIPE.value and self.playbook.wipe == "manual":
            self.playbook = self.playbook.model_copy(update={"wipe": "after_pull"})
        return await run_phase(self.open(), phase)

    async def stop_jobs(self, why: str) -> list[str]:
        """Stop the run's jobs on their hosts, after its follow was cancelled (the
        TUI's "stop the job and quit"); the run is ``failed`` with ``why``, its data
        stays for ``wipe``. Returns what a host left alone (a pid not remotemac's)."""
        from remotemac.engine.stopjobs import stop_jobs

        return await stop_jobs(self.open(), why)

    # ------------------------------------------------------------ how it ended

    def launched(self) -> bool:
        """Whether a job of this run was launched (the journal has a launch phase)."""
        return any(name.startswith(Phase.LAUNCH.value) for name in self.journal.phases(self.run_id))

    def ending(self, exc: BaseException) -> RunFinished:
        """The ``run_finished`` of a run that raised instead of ending with a record:
        ``interrupted`` (Ctrl-C, a cancelled worker), ``detached`` (the link stayed down
        past its deadline: the job goes on) or ``failed``, with its exit code and why."""
        if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
            verdict, code, detail = (
                "interrupted",
                EXIT_INTERRUPTED,
                f"remotemac attach {self.run_id}",
            )
        elif isinstance(exc, RemotemacError):
            verdict = "detached" if isinstance(exc, TransientHostError) else "failed"
            code, detail = exc.exit_code, exc.line()
        else:
            verdict, code, detail = "failed", 1, f"{type(exc).__name__}: {exc}"
        return RunFinished(
            self.run_id, verdict=verdict, exit_code=code, out_dir=str(self.out_dir), detail=detail
        )
