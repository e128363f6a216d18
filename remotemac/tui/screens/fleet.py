"""The fleet screen: the summary of each fleet run (one row per host and variant).

It reads the ``fleet.json`` files that ``remotemac run`` writes for a fleet or a
matrix sweep under the runs folder, newest first, so a lab renting several Macs
sees every host's verdict, duration, cost and reason in one table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

_VERDICT_STYLE = {"accepted": "green", "rejected": "red", "lost": "magenta",
                  "unreachable": "magenta"}


def load_fleets(out_root: Path) -> list[dict[str, Any]]:
    """Every readable fleet.json one or two levels below ``out_root``, newest first."""
    fleets = []
    for path in sorted(set(out_root.glob("fleet.json")) | set(out_root.glob("*/fleet.json"))):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("runs"), list):
            data["_path"] = str(path)
            fleets.append(data)
    return sorted(fleets, key=lambda f: str(f.get("started_at") or ""), reverse=True)


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

    def __init__(self, out_root: Path) -> None:
        super().__init__()
        self.out_root = Path(out_root)
        self.fleets: list[dict[str, Any]] = []
        self.index = 0

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Static("", id="fleet-title")
        yield DataTable(id="fleet", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "fleet"
        table = self.query_one("#fleet", DataTable)
        for name in ("host", "variant", "verdict", "duration", "cost", "reason"):
            table.add_column(name, key=name)
        self.fleets = load_fleets(self.out_root)
        self.show()

    def action_next_fleet(self) -> None:
        if self.fleets:
            self.index = (self.index + 1) % len(self.fleets)
            self.show()

    def show(self) -> None:
        title = self.query_one("#fleet-title", Static)
        table = self.query_one("#fleet", DataTable)
        table.clear()
        if not self.fleets:
            title.update(f"no fleet runs under {self.out_root} (run a playbook with hosts: "
                         "or matrix:, or --hosts)")
            return
        fleet = self.fleets[self.index]
        counts = ", ".join(f"{n} {v}" for v, n in sorted((fleet.get("counts") or {}).items()))
        cost = (fleet.get("cost") or {}).get("amount")
        title.update(
            f"fleet {fleet.get('fleet_id')} ({self.index + 1}/{len(self.fleets)}) — "
            f"{fleet.get('playbook')}: {counts or 'no runs'}; exit {fleet.get('exit_code')}; "
            f"{len(fleet.get('hosts') or [])} hosts, {fleet.get('duration_s')} s"
            + (f", cost {cost} {(fleet.get('cost') or {}).get('currency', '')}" if cost else ""))
        for run in fleet["runs"]:
            verdict = str(run.get("verdict") or "-")
            duration = run.get("duration_s")
            run_cost = run.get("cost")
            table.add_row(
                str(run.get("host")), variant_text(run.get("variant")),
                Text(verdict, style=_VERDICT_STYLE.get(verdict, "yellow")),
                f"{duration:.1f}s" if isinstance(duration, (int, float)) else "-",
                f"{run_cost:.2f} {run.get('currency') or ''}".strip()
                if isinstance(run_cost, (int, float)) else "-",
                str(run.get("reason") or ""),
            )
