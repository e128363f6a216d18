"""What ``status`` shows of the journal's runs, for every front end to render.

Why here and not in a front end: the CLI's ``status`` (text and ``--json``) and the
TUI's runs screen show the same facts (a run's shown state, its phases and their
summaries, what its host says the jobs are doing right now); built in each front end,
the two drifted (one said ``interrupted`` where the other said ``running``). The view
is plain data with the words of remotemac.vocab; laying it out (columns, colours,
widths) stays with the front end. No rich, click or textual here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from remotemac.agent.protocol import JsonObject
from remotemac.engine.jsonpart import JsonPart
from remotemac.engine.runs import resolve_run_id, shown_state
from remotemac.journal import Journal, RunRow
from remotemac.transport.options import SSHOptions
from remotemac.vocab import human_duration, human_time, phase_word, run_word


@dataclass
class RunLine:
    """One run of the list: its journal row and the state it is shown in."""

    row: RunRow
    journal: Journal

    @property
    def shown(self) -> str:
        """The journal state as the user should read it (a dead driver: ``interrupted``);
        a front end that drives runs itself (the TUI) says ``attached`` instead."""
        return shown_state(self.journal, self.row)

    @property
    def run_id(self) -> str:
        return self.row.run_id

    @property
    def state_word(self) -> str:
        return run_word(self.shown)

    def to_json(self) -> JsonObject:
        """``status --json``: one object per run."""
        r = self.row
        return {
            "run_id": r.run_id,
            "name": r.name,
            "host": r.host,
            "state": self.state_word,
            "verdict": r.verdict,
            "created_at": r.created_at,
            "finished_at": r.finished_at,
        }


def run_list(journal: Journal) -> list[RunLine]:
    """Every run of the journal, newest first."""
    return [RunLine(r, journal) for r in journal.list_runs()]


def short_id_hint(lines: list[RunLine]) -> str:
    """The line under the list: any unique part of a run id works."""
    return (
        f"(any unique part of a run id works, e.g. remotemac logs "
        f"{lines[0].run_id.rsplit('-', 1)[-1]}; or 'latest')"
    )


@dataclass
class PhaseLine:
    name: str
    state: str  # the word (remotemac.vocab.phase_word)
    summary: str | None


@dataclass
class LiveSide(JsonPart):
    """What the host said of one side's job: its state, exit code, heartbeat, log size."""

    state: str | None = None
    exit_code: int | None = None
    heartbeat_age_s: float | None = None
    log_bytes: int | None = None
    tmux: bool | None = None


@dataclass
class LiveView(JsonPart):
    """What the run's host said its jobs are doing (``status``, the TUI's poll); its
    JSON form is ``status RUN --json``'s ``live``."""

    answered: bool = False
    sides: dict[str, LiveSide] = field(default_factory=dict)
    detail: str = ""
    asked_at: float | None = None

    PART_MAPS = {"sides": LiveSide}

    @classmethod
    def of(cls, answer: LiveView | JsonObject) -> LiveView:
        """The view of an answer (engine/livestatus's, or its JSON form)."""
        return cls.from_json(answer)

    def side_states(self) -> list[tuple[str, str]]:
        """(device label, the job's state) per side the host answered for."""
        return [(str(label), str(info.state)) for label, info in (self.sides or {}).items()]

    def summary(self) -> str:
        """One short line: ``host: mps running, cpu finished`` or that it did not answer."""
        if not self.answered:
            return "host did not answer"
        return "host: " + ", ".join(f"{label} {state}" for label, state in self.side_states())


@dataclass
class RunView:
    """One run in detail: its row, shown state, phases and (in flight) its host's answer."""

    row: RunRow
    shown: str
    phases: list[PhaseLine]
    live: LiveView | None = None

    @property
    def in_flight(self) -> bool:
        """Not ended: its host may say what the job is doing."""
        return self.row.state not in ("finished", "failed")

    def to_json(self) -> JsonObject:
        """``status RUN --json``: one object."""
        row = self.row
        data: JsonObject = {
            "run_id": row.run_id,
            "name": row.name,
            "host": row.host,
            "state": run_word(self.shown),
            "verdict": row.verdict,
            "exit_code": row.exit_code,
            "out_dir": row.out_dir,
            "created_at": row.created_at,
            "finished_at": row.finished_at,
            "phases": {p.name: {"state": p.state, "summary": p.summary} for p in self.phases},
        }
        if row.failed_phase or row.error:
            data.update(failed_phase=row.failed_phase, error=row.error)
        if self.live is not None:
            data["live"] = self.live.to_json()
        return data

    def facts(self, now: float | None = None) -> list[tuple[str, str]]:
        """(label, value) lines of ``status RUN``, in order; values not yet escaped."""
        row = self.row
        ended = row.finished_at or (time.time() if now is None else now)
        facts = [
            ("run", row.run_id),
            ("name", row.name),
            ("host", row.host),
            ("state", run_word(self.shown)),
            ("verdict", row.verdict or "—"),
            ("exit code", "—" if row.exit_code is None else str(row.exit_code)),
            ("started", human_time(row.created_at)),
            ("finished", human_time(row.finished_at)),
            ("duration", human_duration(ended - row.created_at)),
            ("out", row.out_dir),
        ]
        if row.failed_phase or row.error:
            facts += [("failed in", row.failed_phase or "—"), ("error", row.error or "—")]
        if self.shown in ("interrupted", "detached"):  # nothing follows it: how to go on
            facts.append(("resume", f"remotemac attach {row.run_id}"))
        return facts

    def live_view(self) -> LiveView | None:
        return self.live


def run_row(journal: Journal, run_id: str) -> RunRow:
    """The journal row of RUN_ID (any unique part, or latest)."""
    row = journal.get_run(resolve_run_id(journal, run_id))
    assert row is not None  # resolve_run_id found it
    return row


def run_view(journal: Journal, run_id: str) -> RunView:
    """RUN_ID (any unique part, or latest) in detail, without asking its host."""
    row = run_row(journal, run_id)
    phases = [
        PhaseLine(k, phase_word(v["state"]), (v.get("result") or {}).get("summary"))
        for k, v in journal.phases(row.run_id).items()
    ]
    return RunView(row, shown_state(journal, row), phases)


async def ask_live(
    journal: Journal,
    run_id: str,
    *,
    home: Path,
    ssh: SSHOptions | None,
    timeout: float | None = None,
) -> LiveView:
    """What the run's host says its jobs are doing now (read-only, never raises for a
    host that does not answer: ``{"answered": False, "detail": why}``)."""
    from remotemac.engine.livestatus import live_status
    from remotemac.engine.runs import load_run

    row, pb = load_run(journal, run_id)
    extra = {} if timeout is None else {"timeout": timeout}
    return await live_status(
        run_id=row.run_id,
        playbook=pb,
        journal=journal,
        home=home,
        out_dir=Path(row.out_dir),
        ssh=ssh,
        **extra,
    )
