"""The fleet screen: the summary of each fleet run (one row per host and variant).

Fleets come from the journal (every fleet run's row names its fleet), wherever
their ``--out`` went and whatever folder the TUI started in; each fleet's
``fleet.json`` (next to its runs) adds the summary when it is there, and a
fleet still running (or whose folder is gone) is shown from the journal alone.
A lab renting several Macs sees every host's verdict, duration, cost and reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static

from remotemac.tui.fit import Column, fit_columns, widths
from remotemac.tui.widgets.keybar import KeyBar
from remotemac.tui.widgets.lists import ListTable
from remotemac.vocab import human_duration, human_time, run_word

COLUMNS = ("host", "variant", "verdict", "duration", "cost", "reason")
# As the runs table: what goes first when the terminal is narrow. The host is the row's
# id and the verdict its answer: both stay whole whatever the width (issue 30: at 80
# columns long hosts and matrix variants pushed the verdict off the screen).
PRIORITY = {"host": 0, "verdict": 0, "variant": 1, "duration": 2, "cost": 3, "reason": 4}

_VERDICT_STYLE = {
    "accepted": "green",
    "rejected": "red",
    "lost": "magenta",
    "unreachable": "magenta",
}


def _read_summary(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        data["_path"] = str(path)
        return data
    return None


def load_fleets(journal: Any, out_root: Path | None = None) -> list[dict[str, Any]]:
    """Every fleet the journal knows (plus fleet.json files under ``out_root``), newest first."""
    groups: dict[str, list[Any]] = {}
    for row in journal.list_runs(limit=100_000):
        fleet_id = (row.options or {}).get("fleet")
        if fleet_id:
            groups.setdefault(str(fleet_id), []).append(row)
    fleets: dict[str, dict[str, Any]] = {}
    for fleet_id, rows in groups.items():
        summary = None
        for folder in {Path(r.out_dir).parent for r in rows}:
            found = _read_summary(folder / "fleet.json")
            if found is not None and found.get("fleet_id") == fleet_id:
                summary = found
                break
        fleets[fleet_id] = summary or _from_journal(fleet_id, rows)
    if out_root is not None:
        for path in sorted(set(out_root.glob("fleet.json")) | set(out_root.glob("*/fleet.json"))):
            found = _read_summary(path)
            if found is not None and str(found.get("fleet_id")) not in fleets:
                fleets[str(found.get("fleet_id"))] = found
    return sorted(fleets.values(), key=lambda f: str(f.get("started_at") or ""), reverse=True)


def _from_journal(fleet_id: str, rows: list[Any]) -> dict[str, Any]:
    """A fleet without its fleet.json (still running, or its folder moved): journal rows."""
    rows = sorted(rows, key=lambda r: r.run_id)
    counts: dict[str, int] = {}
    runs = []
    for r in rows:
        verdict = r.verdict or run_word(r.state)
        counts[verdict] = counts.get(verdict, 0) + 1
        end = r.finished_at
        cost = (r.playbook or {}).get("cost") or {}
        rate = float(cost.get("hourly_rate") or 0.0)
        runs.append(
            {
                "host": r.host,
                "variant": (r.options or {}).get("variant"),
                "run_id": r.run_id,
                "verdict": verdict,
                "duration_s": (end - r.created_at) if end else None,
                "cost": (end - r.created_at) / 3600 * rate if end and rate else None,
                "currency": cost.get("currency"),
                "reason": "" if end else run_word(r.state),
            }
        )
    started = min(r.created_at for r in rows)
    ends = [r.finished_at for r in rows]
    return {
        "fleet_id": fleet_id,
        "playbook": rows[0].name,
        "counts": counts,
        "started_at": human_time(started),
        "exit_code": None,
        "hosts": sorted({r.host for r in rows}),
        "duration_s": (max(ends) - started) if all(ends) else None,
        "runs": runs,
        "state": "finished" if all(ends) else "running",
        "_path": "journal",
    }


def variant_text(variant: Any) -> str:
    if not variant:
        return "-"
    return ", ".join(f"{k}={v}" for k, v in sorted(variant.items()))


class FleetScreen(Screen):
    """All fleets found under the runs folder; the table shows one row per run."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Runs"),
        Binding("n", "next_fleet", "Next fleet"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, journal: Any, out_root: Path | None = None) -> None:
        super().__init__()
        self.journal = journal
        self.out_root = out_root
        self.fleets: list[dict[str, Any]] = []
        self.index = 0
        self._columns: list[str] = []

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Static("", id="fleet-title")
        yield ListTable(id="fleet", zebra_stripes=True)
        yield KeyBar()

    def on_mount(self) -> None:
        self.sub_title = "fleet"
        try:
            self.fleets = load_fleets(self.journal, self.out_root)
        except Exception as exc:  # a locked journal: say so, keep the screen
            self.query_one("#fleet-title", Static).update(f"journal: {exc}")
            return
        self.show()

    def action_next_fleet(self) -> None:
        if self.fleets:
            self.index = (self.index + 1) % len(self.fleets)
            self.show()

    def on_resize(self, event: Any) -> None:
        if self.fleets:
            self.show()

    def show(self) -> None:
        title = self.query_one("#fleet-title", Static)
        table = self.query_one("#fleet", DataTable)
        table.clear()
        if not self.fleets:
            title.update(
                "no fleet runs in the journal yet (run a playbook with hosts: "
                "or matrix:, or --hosts)"
            )
            return
        fleet = self.fleets[self.index]
        counts = ", ".join(f"{n} {v}" for v, n in sorted((fleet.get("counts") or {}).items()))
        cost = (fleet.get("cost") or {}).get("amount")
        exit_code = fleet.get("exit_code")
        line = (
            f"fleet {fleet.get('fleet_id')} ({self.index + 1}/{len(self.fleets)}) — "
            f"{fleet.get('playbook')}: {counts or 'no runs'}; "
            + (
                f"exit {exit_code}; "
                if exit_code is not None
                else f"{fleet.get('state', 'running')}; "
            )
            + f"{len(fleet.get('hosts') or [])} hosts, "
            f"{human_duration(fleet.get('duration_s'))}"
            + (
                f", cost {cost:.2f} {(fleet.get('cost') or {}).get('currency', '')}"
                if isinstance(cost, (int, float))
                else ""
            )
        )
        rows = [self._cells(run) for run in fleet["runs"]]
        cols = fit_columns(
            [
                Column(n, PRIORITY[n], w)
                for n, w in zip(COLUMNS, widths(COLUMNS, rows), strict=True)
            ],
            self.size.width - 2,
        )
        if cols != self._columns:
            table.clear(columns=True)
            for name in cols:
                table.add_column(name, key=name)
            self._columns = cols
        index = [COLUMNS.index(c) for c in cols]
        for cells in rows:
            table.add_row(*(cells[i] for i in index))
        if len(cols) < len(COLUMNS):
            line += " · hidden at this width: " + ", ".join(c for c in COLUMNS if c not in cols)
        title.update(line)

    @staticmethod
    def _cells(run: dict[str, Any]) -> list[Any]:
        """One run's cells, in :data:`COLUMNS` order."""
        verdict = str(run.get("verdict") or "-")
        duration = run.get("duration_s")
        run_cost = run.get("cost")
        return [
            str(run.get("host")),
            variant_text(run.get("variant")),
            Text(verdict, style=_VERDICT_STYLE.get(verdict, "yellow")),
            human_duration(duration) if isinstance(duration, (int, float)) else "—",
            f"{run_cost:.2f} {run.get('currency') or ''}".strip()
            if isinstance(run_cost, (int, float))
            else "-",
            str(run.get("reason") or ""),
        ]
