"""Fitting the TUI to the terminal, and what each action applies to (no Textual here).

Why a module of its own: which columns a table keeps at 80 columns, what a
``/`` filter matches, when wipe or attach is offered and what the cleanup dialog
lists are decisions, not drawing; they are tested without a terminal.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from remotemac.units import format_size

GAP = 2  # columns between two cells of a DataTable (its cell padding)


@dataclass(frozen=True)
class Column:
    """A table column: its key, its priority (0 is never dropped) and its longest cell."""

    key: str
    priority: int
    width: int = 0


def fit_columns(columns: Sequence[Column], available: int) -> list[str]:
    """The keys of the columns that fit in ``available`` cells, in their original order.

    Columns go in priority order (lowest first) while their full width fits, so an
    id or a verdict is dropped never and cut never: the columns of priority 0 are
    kept whatever the width (a terminal narrower than them scrolls sideways).
    """
    kept: set[str] = set()
    used = 0
    for col in sorted(columns, key=lambda c: c.priority):
        need = col.width + GAP
        if col.priority == 0 or used + need <= available:
            kept.add(col.key)
            used += need
    return [c.key for c in columns if c.key in kept]


def widths(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[int]:
    """The longest cell (or header) of each column, in cells."""
    out = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            out[i] = max(out[i], len(str(cell)))
    return out


def matches(term: str, cells: Iterable[Any]) -> bool:
    """A ``/`` filter: every word of ``term`` is in some cell (case-insensitive)."""
    words = term.lower().split()
    if not words:
        return True
    text = " ".join(str(c) for c in cells).lower()
    return all(w in text for w in words)


# ---------------------------------------------------------------- which actions apply


@dataclass(frozen=True)
class RunFacts:
    """What decides which run actions are offered: journal state, phases done, attached."""

    state: str = ""
    phases_done: frozenset[str] = frozenset()
    attached: bool = False
    local: bool = False


def done_phases(phases: dict[str, Any]) -> frozenset[str]:
    """The journal's phases that did their work: a wipe kept by ``--keep-data`` or
    ``wipe: manual`` is "done" in the journal but did nothing (as ``phase_already_done``)."""
    return frozenset(
        name
        for name, info in (phases or {}).items()
        if (info or {}).get("state") == "done"
        and ((info or {}).get("result") or {}).get("done") is not False
    )


def run_actions(facts: RunFacts | None) -> set[str]:
    """The run actions that apply: attach only to a run left going and not followed here,
    wipe only once it ended and before its wipe is done, pull not while followed here."""
    from remotemac.vocab import LIVE_RUN_STATES

    if facts is None:
        return set()
    live = facts.state in LIVE_RUN_STATES
    out = {"drill"} if facts.attached and not facts.local else set()
    if live and not facts.attached:
        out.add("attach")
    if not facts.attached:
        out.add("pull")
        if not live and "wipe" not in facts.phases_done:
            out.add("wipe")
    return out


# ---------------------------------------------------------------- the cleanup dialog


@dataclass(frozen=True)
class CleanupItem:
    kind: str
    path: str
    size: int
    why: str = ""


@dataclass
class CleanupPlan:
    """A dry run's record as the CLI prints it: what would go, what stays and why, the total."""

    host: str
    remove: list[CleanupItem] = field(default_factory=list)
    keep: list[CleanupItem] = field(default_factory=list)
    total: int = 0
    error: str | None = None

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CleanupPlan:
        """From the engine's cleanup record (``remotemac cleanup HOST --dry-run --json``)."""
        plan = cls(str(record.get("host", "?")), error=record.get("error"))
        for item in record.get("items") or []:
            fate = item.get("fate")
            one = CleanupItem(
                str(item.get("kind", "?")),
                str(item.get("path", "?")),
                int(item.get("bytes") or 0),
                str(item.get("why") or ""),
            )
            if fate == "would remove":
                plan.remove.append(one)
            elif fate in ("failed", "left alone"):
                plan.keep.append(one)
        plan.total = int(record.get("bytes_to_free") or sum(i.size for i in plan.remove))
        return plan

    def question(self) -> str:
        if self.error:
            return f"{self.host} could not be checked: nothing to clean up"
        if not self.remove:
            return f"Nothing of remotemac's is left on {self.host}"
        n = len(self.remove)
        return (
            f"Remove these {n} item{'s' if n != 1 else ''} ({format_size(self.total)}) "
            f"from {self.host}?"
        )

    def total_line(self) -> str:
        return f"total {format_size(self.total)}; nothing is touched until you say yes"


def quit_question(live_ids: Sequence[str]) -> tuple[str, str]:
    """The quit dialog's question and details while runs are live here."""
    n = len(live_ids)
    what = "run is" if n == 1 else "runs are"
    details = (
        f"{n} {what} still going. Keep running: "
        + ("the job goes on on its host" if n == 1 else "the jobs go on on their hosts")
        + " and this TUI stops following; pick up again with\n\n"
        + "\n".join(f"  remotemac attach {run_id}" for run_id in live_ids)
        + "\n\nor by opening the TUI again (it re-attaches). Stop & quit: "
        + ("the job is" if n == 1 else "the jobs are")
        + " stopped on the host, the data stays there until `remotemac wipe`."
    )
    return f"Quit while {n} {what} live?", details
