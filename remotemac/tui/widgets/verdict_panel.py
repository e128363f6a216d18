"""The acceptance verdict and its observations, once acceptance.json is written."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from remotemac.tui.model import Acceptance

_COLOUR = {"accepted": "bold green", "rejected": "bold red"}


class VerdictPanel(Static):
    """Empty ("verdict: pending") until the record exists; then verdict, conditions, facts."""

    def show(self, acc: Acceptance | None, pending: str = "pending") -> None:
        self.verdict = acc.verdict if acc else None
        if acc is None:
            self.update(Text(f"verdict: {pending}", style="dim"))
            return
        table = Table.grid(padding=(0, 1))
        table.add_column(style="dim", no_wrap=True)
        table.add_column(overflow="fold")
        table.add_row(
            "verdict", Text(acc.verdict.upper(), style=_COLOUR.get(acc.verdict, "bold yellow"))
        )
        for code, detail in acc.conditions:
            table.add_row("stop", Text(f"{code}: {detail}", style="red"))
        for name, value in acc.observations:
            table.add_row(name, value)
        if acc.md_path is not None:
            table.add_row("", Text("a: open acceptance.md", style="italic"))
        self.update(table)
