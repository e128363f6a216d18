"""The phase timeline: provision → sync → launch → follow → pull → compare → record → wipe."""

from __future__ import annotations

from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from remotemac.progressrate import transfer_figures
from remotemac.tui.model import PhaseState, human_rate

_ICON = {
    "pending": ("·", "dim"),
    "running": ("▶", "bold cyan"),
    "done": ("✓", "green"),
    "failed": ("✗", "bold red"),
    "skipped": ("↷", "dim"),
}


class PhaseTimeline(Static):
    """One row per phase group: state, a progress bar for transfers, figures and rate."""

    def show(self, phases: dict[str, PhaseState]) -> None:
        table = Table.grid(padding=(0, 1), expand=True)
        table.add_column(width=1, min_width=1, no_wrap=True)
        table.add_column(width=9, min_width=9, no_wrap=True)
        table.add_column(width=12, min_width=12, no_wrap=True)
        table.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        for row in phases.values():
            icon, style = _ICON.get(row.state, ("?", ""))
            table.add_row(
                Text(icon, style=style),
                Text(row.name, style=style),
                self._bar(row),
                Text(self._figures(row), style="dim"),
            )
        self.update(table)

    @staticmethod
    def _bar(row: PhaseState):
        if row.unit == "bytes" and row.total:
            return ProgressBar(total=row.total, completed=min(row.done, row.total), width=12)
        if row.subs:
            marks = {"running": "▶", "done": "✓", "failed": "✗", "skipped": "↷"}
            return Text(" ".join(f"{s[:3]}{marks.get(v, '·')}" for s, v in row.subs.items()))
        return Text("")

    @staticmethod
    def _figures(row: PhaseState) -> str:
        if row.unit == "bytes" and row.total:
            running = row.state == "running"
            return transfer_figures(
                row.done, row.total, row.rate if running else None, row.eta if running else None
            )
        parts = []
        if row.unit != "bytes" and row.done:
            parts.append(f"{row.done:,} {row.unit}")
        rate = human_rate(row.rate, row.unit)
        if rate and row.state == "running":
            parts.append(rate)
        if row.detail and not parts and not row.subs:
            parts.append(row.detail)
        return "  ".join(parts)
