"""What one run carries through its phases."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from remotemac.agent.protocol import JsonObject
from remotemac.engine.agentclient import AgentClient
from remotemac.engine.jsonpart import plain
from remotemac.engine.ledger import Ledger
from remotemac.engine.phaseresults import (
    RESULT_SCHEMA,
    CompareResult,
    Drill,
    FollowResult,
    LaunchResult,
    PhaseResult,
    PhaseRow,
    ProvisionResult,
    PullResult,
    RecordResult,
    SyncResult,
    WipeResult,
    as_result,
    from_journal,
)
from remotemac.events import Event, EventBus
from remotemac.journal import Journal
from remotemac.phases import Phase, follow_key, launch_key
from remotemac.placeholders import expand
from remotemac.playbook import Playbook
from remotemac.transport.base import Transport
from remotemac.units import iso_utc

if TYPE_CHECKING:  # drift.py imports this module
    from remotemac.engine.drift import DriftSummary


@dataclass
class RunOptions:
    keep_data: bool = False
    detach: bool = False
    drill: str | None = None
    follow_poll_s: float = 0.25
    show_secrets: bool = False  # records keep the command and env values unredacted


@dataclass
class HostBinding:
    """One host the run uses: the target host, the laptop for ``on: local``, or the
    reference's own host (``workload.reference.host``, e.g. a Linux GPU box)."""

    key: str  # "remote" | "local" | "reference" (dual-track: the reference's own host)
    transport: Transport
    agent: AgentClient
    root: str = ""
    run_dir: str = ""


@dataclass
class Side:
    """The reference or the target job."""

    role: str  # "reference" | "target"
    device: str  # as written: cpu | mps | cuda | auto
    label: str  # log and results name: the device, made unique
    host_key: str

    def session(self, run_id: str) -> str:
        return "remotemac-" + re.sub(r"[^A-Za-z0-9_-]", "_", f"{run_id}-{self.label}")


@dataclass(frozen=True)
class HandCut:
    """A link cut by hand while the run was attached (the TUI's drill, ``d``)."""

    host: str
    #: whether the cut found a live link to drop
    dropped: bool
    at: str | None = None


@dataclass
class Continuity:
    """The record's ``continuity``: the link's disconnects and reconnects over the whole
    run, and the drill (its outcome, or the ``--drill`` asked for, or None)."""

    disconnects: int = 0
    reconnects: int = 0
    drill: Drill | str | None = None

    @classmethod
    def of(cls, totals: Mapping[str, Any]) -> Continuity:
        """From engine/jobs.continuity_totals (the tally's counts and ``drill``)."""
        return cls(int(totals["disconnects"]), int(totals["reconnects"]), totals["drill"])

    def record_form(self) -> JsonObject:
        return {
            "disconnects": self.disconnects,
            "reconnects": self.reconnects,
            "drill": plain(self.drill),
        }


@dataclass
class RunContext:
    run_id: str
    playbook: Playbook
    journal: Journal
    bus: EventBus
    home: Path
    out_dir: Path
    options: RunOptions
    hosts: dict[str, HostBinding]
    sides: list[Side]
    ledger: Ledger
    #: each finished phase's result, by wire name (``"launch:target"``); the keys are
    #: phase names only: run state lives in the fields below. Read through
    #: :meth:`result`, :meth:`follow_result` and :meth:`launch_result`.
    results: dict[str, PhaseResult] = field(default_factory=dict)
    #: links cut by hand while the run was attached (the TUI's drill, ``d``); the record
    #: counts them so a drop on purpose is never mistaken for a flaky network
    drills: list[HandCut] = field(default_factory=list)
    #: this process's disconnects/reconnects, counted from ConnectionState events
    link_tally: dict[str, int] = field(default_factory=lambda: {"disconnects": 0, "reconnects": 0})
    #: phases an earlier process finished (their follow results carry their own counts)
    carried_phases: list[str] = field(default_factory=list)
    #: the record's ``continuity`` section as last written (totals over every process)
    continuity: Continuity = field(default_factory=Continuity)
    #: the laptop's CPU seconds when the run started in this process (the record's ``cpu``)
    cpu_start: float | None = None
    #: when the environment-drift check ran in this process (``re-attach``, ``before-target``)
    drift_checked: str | None = None
    #: the record's drift summary (checks, drifts, torch versions)
    drift: DriftSummary | None = None
    #: the dataset slice's bytes, selected once for every host
    slice_bytes: Any = None
    #: host key -> why it could not be reached (``remotemac wipe`` goes on without it)
    unreachable: dict[str, str] = field(default_factory=dict)
    #: one run of a fleet (its summary and record name the run, even one never reached)
    in_fleet: bool = False

    def emit(self, event: Event) -> None:
        self.bus.emit(event)

    def note_cut(self, host: str, dropped: bool) -> None:
        """A link cut by hand now (the TUI's drill): the record counts it."""
        self.drills.append(HandCut(host, dropped, iso_utc(time.time())))

    def host_for(self, side: Side) -> HostBinding:
        return self.hosts[side.host_key]

    def side(self, role: str) -> Side | None:
        return next((s for s in self.sides if s.role == role), None)

    # ------------------------------------------------------------ phase results

    @overload
    def result(self, phase: Literal[Phase.PROVISION]) -> ProvisionResult | None: ...
    @overload
    def result(self, phase: Literal[Phase.SYNC]) -> SyncResult | None: ...
    @overload
    def result(self, phase: Literal[Phase.PULL]) -> PullResult | None: ...
    @overload
    def result(self, phase: Literal[Phase.COMPARE]) -> CompareResult | None: ...
    @overload
    def result(self, phase: Literal[Phase.RECORD]) -> RecordResult | None: ...
    @overload
    def result(self, phase: Literal[Phase.WIPE]) -> WipeResult | None: ...
    def result(self, phase: Phase) -> PhaseResult | None:
        """The result of a phase run once per run, typed; None until it finished."""
        if phase.per_side:
            raise ValueError(f"phase {phase.value} runs per side: follow_result/launch_result")
        return self.results.get(phase.value)

    def provision(self) -> ProvisionResult:
        """The provision's result, for the phases after it (which only run once it is done)."""
        prov = self.result(Phase.PROVISION)
        if prov is None:
            raise LookupError(f"run {self.run_id} was not provisioned")
        return prov

    def follow_result(self, role: str) -> FollowResult | None:
        """How ``role``'s job ended (a side not launched: state ``not-launched``)."""
        found = self.results.get(follow_key(role).name)
        return found if isinstance(found, FollowResult) else None

    def launch_result(self, role: str) -> LaunchResult | None:
        """How ``role``'s job was started; None when it was not (yet)."""
        found = self.results.get(launch_key(role).name)
        return found if isinstance(found, LaunchResult) else None

    def keep_result(self, name: str, result: PhaseResult | JsonObject) -> PhaseResult:
        """Keep what phase ``name`` (a wire name) handed on, typed, for the phases after it."""
        typed = as_result(name, result)
        self.results[name] = typed
        return typed

    def finish_result(self, name: str, result: PhaseResult | JsonObject) -> PhaseResult:
        """Keep ``result`` and write it to the journal as the one of phase ``name``, done."""
        typed = self.keep_result(name, result)
        self.journal.finish_phase(self.run_id, name, typed.to_dict(), schema=RESULT_SCHEMA)
        return typed

    def restore_results(self, phases: Mapping[str, JsonObject]) -> list[str]:
        """Bring back the results of the phases the journal has as done (``Journal.phases``);
        the names, in the journal's order."""
        rows = {name: PhaseRow.from_json(info) for name, info in phases.items()}
        done = [name for name, row in rows.items() if row.done]
        for name in done:
            self.results[name] = from_journal(name, rows[name].result or {}, rows[name].schema)
        return done


def make_sides(playbook: Playbook) -> list[Side]:
    """Reference first (when there is one), then the target, with unique labels."""
    sides: list[Side] = []
    wl = playbook.workload
    if wl.reference is not None:
        key = "local" if wl.reference.on == "local" and playbook.host != "local" else "remote"
        if wl.reference.host and wl.reference.on != "local" and wl.reference.host != playbook.host:
            key = "local" if wl.reference.host == "local" else "reference"
        sides.append(Side("reference", wl.reference.device, wl.reference.device, key))
    key = "local" if wl.target.on == "local" and playbook.host != "local" else "remote"
    label = wl.target.device
    if sides and sides[0].label == label:
        label = f"{label}-target"
    sides.append(Side("target", wl.target.device, label, key))
    return sides


def host_for_key(playbook: Playbook, key: str) -> str:
    """The host spec behind a HostBinding key."""
    if key == "local":
        return "local"
    if key == "reference" and playbook.workload.reference and playbook.workload.reference.host:
        return playbook.workload.reference.host
    return playbook.host


def specialize(
    playbook: Playbook,
    *,
    host: str | None = None,
    matrix: dict[str, object] | None = None,
    remote_root: str | None = None,
    hourly_rate: float | None = None,
) -> Playbook:
    """The playbook of one fleet run: one host, one matrix variant filled into the commands.

    The result is what the journal stores for that run, so ``attach`` resumes it
    as a plain single-host run.
    """
    update: dict[str, object] = {}
    if host is not None:
        update.update(host=host, hosts=None)
    if remote_root is not None:
        update["remote_root"] = remote_root
    if hourly_rate is not None:
        update["cost"] = playbook.cost.model_copy(update={"hourly_rate": hourly_rate})
    if matrix is not None:
        wl = playbook.workload
        filled = {"command": fill_matrix(wl.command, matrix)}
        if wl.resume_command:
            filled["resume_command"] = fill_matrix(wl.resume_command, matrix)
        update.update(workload=wl.model_copy(update=filled), matrix=None)
    return playbook.model_copy(update=update) if update else playbook


def fill_matrix(command: str, matrix: dict[str, object]) -> str:
    """Fill only the {matrix.<key>} placeholders (shell-quoted); keep {device} & co. for later."""
    return expand(command, {}, matrix, keep=True)


def assign_labels(sides: list[Side], devices: dict[str, str]) -> None:
    """Name logs and results by the device each side really ran on (``auto`` resolved)."""
    used: set[str] = set()
    for side in sides:
        label = devices.get(side.role, side.device)
        if label in used:
            label = f"{label}-{side.role}"
        side.label = label
        used.add(label)


def substitute(
    command: str, values: dict[str, str], matrix: dict[str, object] | None = None
) -> str:
    """Fill {device}, {data_dir}, {output_dir} and {matrix.<key>}, each value shell-quoted
    (remotemac/placeholders.py: the one syntax of run and preflight)."""
    return expand(command, values, matrix)


def expand_root(root: str, home: str) -> str:
    if root == "~" or root.startswith("~/"):
        return home.rstrip("/") + root[1:]
    return root
