"""What the TUI knows about one run, folded from engine events (no Textual here).

Widgets never read events themselves: the driver folds every event into a
:class:`RunLive` the moment it is emitted (cheap, synchronous), and widgets
render from that state. This keeps a burst of thousands of log lines a second
away from the widget tree (lines wait in a :class:`LineStore` until the log view
takes them in one batch) and makes the screens easy to test with hand-made
events.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remotemac.events import (
    ConnectionState,
    Event,
    LogLine,
    Metric,
    PhaseFinished,
    PhaseProgress,
    PhaseStarted,
    RunFinished,
    Warning,
)
from remotemac.phases import PhaseKey
from remotemac.progressrate import RateMeter
from remotemac.termsafe import escape_controls
from remotemac.vocab import (
    clock,
    human_age,  # noqa: F401 - re-exported for the screens
    human_rate,  # noqa: F401 - re-exported for the widgets
    human_size,
    log_prefix,
    phase_word,
)

PHASE_GROUPS = ("provision", "sync", "launch", "follow", "pull", "compare", "record", "wipe")
LIVE_STATES = ("running", "detached", "interrupted")
MAX_SPARK_POINTS = 120
# the harness prints the first fallback warning of each op, as torch words it
FALLBACK_RE = re.compile(r"The operator '(aten::[^']+)' is not currently supported on the MPS")


@dataclass
class PhaseState:
    """One row of the timeline: a phase group (launch and follow cover every side)."""

    name: str
    state: str = "pending"  # pending | running | done | failed | skipped
    done: int = 0
    total: int | None = None
    unit: str = "bytes"
    detail: str = ""
    rate: float | None = None  # units per second, smoothed, from the events' own timestamps
    eta: float | None = None  # seconds left at that rate
    subs: dict[str, str] = field(default_factory=dict)  # side -> state, for launch/follow
    _meter: RateMeter = field(default_factory=RateMeter, repr=False)

    def progress(self, event: PhaseProgress) -> None:
        self._meter.update(event.ts, event.done)
        self.rate = self._meter.rate
        self.eta = self._meter.eta(event.done, event.total)
        self.done, self.total, self.unit = event.done, event.total, event.unit
        if event.detail:
            self.detail = event.detail


@dataclass
class LinkState:
    """The connection badge's facts: the last ConnectionState seen."""

    state: str = "unknown"  # unknown | local | connected | disconnected | reconnecting | lost
    host: str = ""
    attempt: int = 0
    next_in_s: float | None = None
    detail: str = ""
    deadline_left_s: float | None = None


@dataclass(frozen=True)
class LogRecord:
    """One log line with its device and, when it came live, the time it was emitted."""

    device: str
    text: str
    ts: float | None = None

    def render(self) -> str:
        """``15:21:03 cpu        │ line``: a fixed-width time and device column."""
        return (
            f"{clock(self.ts) if self.ts is not None else ' ' * 8} "
            f"{log_prefix(self.device)}{self.text}"
        )


class LineStore:
    """Every log line of a run, numbered; old ones dropped past ``keep`` lines.

    The log view remembers how many lines it has taken (``total`` when it last
    looked) and asks for the rest, so nothing is taken twice and, unless a
    reader falls more than ``keep`` lines behind, nothing is skipped.
    """

    def __init__(self, keep: int = 20_000) -> None:
        self.keep = keep
        self.base = 0  # number of the first line still held
        self._lines: list[LogRecord] = []
        self.devices: list[str] = []  # in order of first appearance, for the device filter

    @property
    def total(self) -> int:
        return self.base + len(self._lines)

    def append(self, line: LogRecord) -> None:
        if line.device not in self.devices:
            self.devices.append(line.device)
        self._lines.append(line)
        if len(self._lines) >= 2 * self.keep:
            drop = len(self._lines) - self.keep
            del self._lines[:drop]
            self.base += drop

    def extend(self, lines: list[LogRecord]) -> None:
        for line in lines:
            self.append(line)

    def held(self) -> list[LogRecord]:
        """Every line still held (a device filter redraws the view from these)."""
        return list(self._lines)

    def since(self, seen: int) -> list[LogRecord]:
        """Lines numbered ``seen`` and later (what a reader has not taken yet)."""
        return self._lines[max(0, seen - self.base) :]


class RunLive:
    """A run as the TUI shows it; ``apply`` folds one engine event in."""

    def __init__(self, run_id: str, *, host: str = "", name: str = "", keep_lines: int = 20_000):
        self.run_id = run_id
        self.host = host
        self.name = name
        self.phases: dict[str, PhaseState] = {g: PhaseState(g) for g in PHASE_GROUPS}
        self.link = LinkState(state="local" if host == "local" else "unknown", host=host)
        self.lines = LineStore(keep_lines)
        self.memory: list[float] = []
        self.memory_device = ""  # whose samples ``memory`` holds (the side running last)
        self.started_at: float | None = None  # first event's time: the elapsed clock
        self.ended_at: float | None = None
        self.fallback_ops: list[str] = []
        self.warnings: list[str] = []
        self.current_phase = ""
        self.verdict: str | None = None
        self.exit_code: int | None = None
        self.out_dir = ""
        self.error: str | None = None
        self.active = False  # a worker is driving it in this TUI
        self.link_history: list[str] = []

    # ------------------------------------------------------------ folding

    def apply(self, event: Event) -> None:
        if self.started_at is None:
            self.started_at = event.ts
        if isinstance(event, LogLine):
            self.add_line(event.device, event.line, event.ts)
        elif isinstance(event, PhaseProgress):
            self._group(event.phase).progress(event)
        elif isinstance(event, PhaseStarted):
            row, side = self._group(event.phase), _side(event.phase)
            row.state = "running"
            self.current_phase = event.phase
            if side:
                row.subs[side] = "running"
            elif row.unit == "bytes":
                row.done, row.total, row.rate, row.eta = 0, None, None, None
                row._meter = RateMeter()
        elif isinstance(event, PhaseFinished):
            row, side = self._group(event.phase), _side(event.phase)
            state = "skipped" if event.skipped else ("done" if event.ok else "failed")
            row.state = state
            if side:
                row.subs[side] = state
            if event.detail and not event.skipped:
                row.detail = escape_controls(event.detail)
        elif isinstance(event, Metric):
            if event.name in ("peak_rss_bytes", "rss_bytes"):
                if event.device != self.memory_device:  # a new side: its own series
                    self.memory, self.memory_device = [], event.device
                self.memory.append(event.value)
                del self.memory[:-MAX_SPARK_POINTS]
        elif isinstance(event, ConnectionState):
            state = "connected" if event.state == "reconnected" else event.state
            self.link = LinkState(
                state,
                event.host,
                event.attempt,
                event.next_in_s,
                escape_controls(event.detail or ""),
                event.deadline_left_s,
            )
            self.link_history.append(state)
        elif isinstance(event, Warning):
            self.warnings.append(escape_controls(event.message))
        elif isinstance(event, RunFinished):
            self.ended_at = event.ts
            self.verdict, self.exit_code, self.out_dir = (
                event.verdict,
                event.exit_code,
                event.out_dir or self.out_dir,
            )

    def add_line(self, device: str, line: str, ts: float | None = None) -> None:
        """Keep one job line for the log view, its terminal controls shown, not obeyed."""
        self.lines.append(LogRecord(escape_controls(device), escape_controls(line), ts))
        found = FALLBACK_RE.search(line)
        if found and found.group(1) not in self.fallback_ops:
            self.fallback_ops.append(found.group(1))

    def _group(self, phase: str) -> PhaseState:
        group = PhaseKey.group(phase)
        if group not in self.phases:
            self.phases[group] = PhaseState(group)
        return self.phases[group]

    # ------------------------------------------------------------ from the journal

    def load_phases(self, phases: dict[str, dict[str, Any]]) -> None:
        """Timeline of a run this TUI is not driving, from the journal's phase rows."""
        for name, info in phases.items():
            row, side = self._group(name), _side(name)
            state = phase_word(info.get("state"))
            row.state = state
            if side:
                row.subs[side] = state
            summary = (info.get("result") or {}).get("summary")
            if summary:
                row.detail = escape_controls(str(summary))
            self.current_phase = name


def _side(phase: str) -> str:
    return PhaseKey.side(phase) or ""


# ---------------------------------------------------------------- acceptance


@dataclass
class Acceptance:
    """The parts of acceptance.json the run screen shows."""

    verdict: str
    conditions: list[tuple[str, str]]
    observations: list[tuple[str, str]]
    md_path: Path | None
    peak_memory: float | None = None  # observations.memory.peak_bytes: the gauge shows it


def read_acceptance(out_dir: str | Path) -> Acceptance | None:
    """``None`` while the record is not written (or unreadable: the run screen says so)."""
    path = Path(out_dir) / "acceptance.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    obs = data.get("observations") or {}
    ops = obs.get("operators") or {}
    mem = obs.get("memory") or {}
    res = obs.get("results") or {}
    rows = [
        ("tensors on device", _fmt(obs.get("tensors_on_device"))),
        ("fallback ops", _fmt_list(ops.get("fallback_ops"))),
        ("unsupported ops", _fmt_list(ops.get("unsupported_ops"))),
        ("dtype errors", _fmt_list(ops.get("dtype_errors"))),
        ("peak memory", human_bytes(mem.get("peak_bytes"))),
        ("memory stable", _fmt(mem.get("stable"))),
        ("within tolerance", _fmt(res.get("within_tolerance"))),
    ]
    conds = [
        (str(c.get("code", "")), str(c.get("detail", "")))
        for c in data.get("stopping_conditions") or []
    ]
    md = Path(out_dir) / "acceptance.md"
    peak = mem.get("peak_bytes")
    return Acceptance(
        str(data.get("verdict", "?")),
        conds,
        rows,
        md if md.exists() else None,
        float(peak) if isinstance(peak, (int, float)) else None,
    )


def _fmt(value: Any) -> str:
    return (
        "—"
        if value is None
        else ("yes" if value is True else "no" if value is False else str(value))
    )


def _fmt_list(value: Any) -> str:
    if value is None:
        return "—"
    if not value:
        return "none"
    names = [v.get("op", str(v)) if isinstance(v, dict) else str(v) for v in value]
    return ", ".join(names)


# ---------------------------------------------------------------- formatting


human_bytes = human_size  # the TUI's old names for the shared formatters


def cost_so_far(
    playbook: dict[str, Any], created_at: float, finished_at: float | None, now: float
) -> str:
    """Rental cost of the run's wall time at the playbook's hourly rate ("" if no rate)."""
    cost = playbook.get("cost") or {}
    rate = float(cost.get("hourly_rate") or 0.0)
    if rate <= 0:
        return "—"
    hours = max(0.0, ((finished_at or now) - created_at) / 3600)
    return f"{hours * rate:.2f} {cost.get('currency', 'USD')}"
