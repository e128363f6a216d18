"""The runs screen: every run in the journal, and the runs this TUI drives live."""

from __future__ import annotations

import asyncio
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static

from remotemac.settings import LocalSettings
from remotemac.tui.fit import (
    Column,
    RunFacts,
    done_phases,
    fit_columns,
    matches,
    run_actions,
    widths,
)
from remotemac.tui.model import cost_so_far
from remotemac.tui.widgets.keybar import KeyBar
from remotemac.tui.widgets.lists import FilterBar, ListTable
from remotemac.vocab import LIVE_RUN_STATES, human_age, run_word

COLUMNS = ("run", "name", "host", "phase", "state", "verdict", "age", "cost")
# What goes first when the terminal is narrow: the name is the id's head, the cost and
# phase are details; the id and the verdict stay whatever the width.
PRIORITY = {"run": 0, "verdict": 0, "state": 1, "host": 2, "age": 3, "phase": 4, "cost": 5}
PRIORITY["name"] = 6
REFRESH_S = 2.0
LIVE_STATES = LIVE_RUN_STATES


class RunsScreen(Screen):
    """A table of runs; enter opens one, the footer lists the actions."""

    BINDINGS = [
        Binding("enter", "open", "Open", priority=True),  # over the table's hidden enter
        Binding("slash", "filter", "Filter", tooltip="runs whose cells hold the words; esc clears"),
        Binding("r", "app.start_run", "Run"),
        Binding("t", "app.attach", "Attach"),
        Binding("p", "app.pull", "Pull"),
        Binding("w", "app.wipe", "Wipe"),
        Binding("c", "app.cleanup", "Cleanup host"),
        Binding("h", "app.hosts", "Hosts"),
        Binding("f", "app.fleet", "Fleet"),
        Binding("q", "app.quit", "Quit"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.hosts_by_run: dict[str, str] = {}
        self.live_by_run: dict[str, str] = {}
        self._shown: list[tuple[str, str, list[Any]]] | None = None  # what the table holds
        self._polls: list[Any] = []
        self.facts: dict[str, RunFacts] = {}
        self.term = ""
        self._columns: list[str] = []

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield ListTable(id="runs", zebra_stripes=True)
        yield FilterBar("#runs", placeholder="filter runs: words in any column (esc clears)")
        yield Static("", id="runs-hint")
        yield KeyBar()

    def on_mount(self) -> None:
        self.sub_title = "runs"
        self.refresh_runs()
        self._polls = [self.set_interval(REFRESH_S, self.refresh_runs)]
        app: Any = self.app
        if app.live_poll_s > 0:
            self.poll_live()
            self._polls.append(self.set_interval(app.live_poll_s, self.poll_live))

    # ------------------------------------------------------------ keys that apply

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Enter in the filter keeps the filter (the filter's own enter), it opens nothing."""
        return not (action == "open" and isinstance(self.focused, FilterBar))

    def applies(self, name: str) -> bool:
        """Attach, pull, wipe, drill: offered only for a run they apply to (the app asks)."""
        run_id = self.selected_run_id()
        return name in run_actions(self.facts.get(run_id or ""))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.refresh_bindings()

    def action_clear_filter(self) -> None:
        self.query_one(FilterBar).action_clear()

    def action_filter(self) -> None:
        self.query_one(FilterBar).open()

    def on_filter_bar_filtered(self, event: FilterBar.Filtered) -> None:
        self.term = event.term
        if self._shown is not None:
            self._fill(self._shown, force=True)

    def on_resize(self, event: Any) -> None:
        if self._shown is not None:
            self._fill(self._shown, force=True)

    def selected_run_id(self) -> str | None:
        try:
            table = self.query_one("#runs", DataTable)
        except NoMatches:  # closing: the table went first
            return None
        if table.row_count == 0:
            return None
        row_key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
        return str(row_key.value)

    def selected_host(self) -> str | None:
        run_id = self.selected_run_id()
        return self.hosts_by_run.get(run_id) if run_id else None

    def on_screen_resume(self) -> None:
        for timer in self._polls:
            timer.resume()
        if self._shown is not None:  # back from a screen on top: what changed meanwhile
            self.refresh_runs()

    def on_screen_suspend(self) -> None:
        """Covered by another screen: no polling at all. Textual repaints a covered
        screen's every wake-up as a full repaint of the screen on top (its "background
        screen" stays dirty), which made a finished run's screen repaint whole each 2 s."""
        for timer in self._polls:
            timer.pause()

    @work(exclusive=True, group="runs-table")
    async def refresh_runs(self) -> None:
        """Read the journal off the UI loop (SQLite is a blocking call), then fill the table."""
        try:
            rows = await asyncio.to_thread(self._load)
        except Exception as exc:  # a locked or broken journal: say so, keep the UI
            self.query_one("#runs-hint", Static).update(f"journal: {exc}")
            return
        try:
            self._fill(rows)
        except NoMatches:  # the app closed while the journal was read: no table to fill
            return

    @work(exclusive=True, group="runs-live")
    async def poll_live(self) -> None:
        """Ask the hosts of runs nobody here drives what their jobs are doing right now."""
        from remotemac.engine.statusview import LiveView, ask_live

        app: Any = self.app
        settings: LocalSettings = app.settings
        runs = await asyncio.to_thread(app.journal.list_runs)
        for r in runs:
            if r.state not in LIVE_STATES or app.driver.attached(r.run_id):
                self.live_by_run.pop(r.run_id, None)
                continue
            try:
                answer = await ask_live(
                    app.journal,
                    r.run_id,
                    home=settings.home,
                    ssh=settings.ssh_options(),
                    timeout=10,
                )
            except Exception as exc:  # never let one host break the screen
                self.live_by_run[r.run_id] = f"host: {type(exc).__name__}"
                continue
            self.live_by_run[r.run_id] = LiveView.of(answer).summary()
        self.refresh_runs()

    def _load(self) -> list[tuple[str, str, list[Any]]]:
        from remotemac.engine.statusview import run_list

        app: Any = self.app
        now = app.now()
        out = []
        for line in run_list(app.journal):
            r = line.row
            live = app.driver.lives.get(r.run_id)
            phases = app.journal.phases(r.run_id) or {}
            if live is not None and live.current_phase:
                phase = live.current_phase
            else:
                phase = next(reversed(phases), "") if phases else ""
            # the journal's own state: this TUI says ``attached`` for the runs it drives
            state = run_word(r.state, attached=app.driver.attached(r.run_id))
            if r.run_id in self.live_by_run:
                state = f"{state} ({self.live_by_run[r.run_id]})"
            self.facts[r.run_id] = RunFacts(
                state=r.state,
                phases_done=done_phases(phases),
                attached=app.driver.attached(r.run_id),
                local=r.host == "local",
            )
            out.append(
                (
                    r.run_id,
                    r.host,
                    [
                        r.run_id,
                        r.name,
                        r.host,
                        phase or "—",
                        state,
                        r.verdict or "—",
                        human_age(now - r.created_at),
                        cost_so_far(r.playbook, r.created_at, r.finished_at, now),
                    ],
                )
            )
        return out

    def _fill(self, rows: list[tuple[str, str, list[Any]]], force: bool = False) -> None:
        if rows == self._shown and not force:
            return  # nothing changed: no clear, no repaint
        self._shown = rows
        table = self.query_one("#runs", DataTable)
        keep = self.selected_run_id()
        self.hosts_by_run = {run_id: host for run_id, host, _ in rows}
        seen = [(run_id, cells) for run_id, _h, cells in rows if matches(self.term, cells)]
        width = widths(COLUMNS, [cells for _, _, cells in rows])
        cols = fit_columns(
            [Column(n, PRIORITY[n], w) for n, w in zip(COLUMNS, width, strict=True)],
            self.size.width - 2,
        )
        if cols != self._columns:
            table.clear(columns=True)
            for name in cols:
                table.add_column(name, key=name)
            self._columns = cols
        else:
            table.clear()
        index = [COLUMNS.index(c) for c in cols]
        for run_id, cells in seen:
            table.add_row(*(cells[i] for i in index), key=run_id)
        if keep is not None and any(run_id == keep for run_id, _ in seen):
            table.move_cursor(row=table.get_row_index(keep), animate=False)
        if not rows:
            hint = "no runs yet — r starts one"
        elif self.term:
            hint = f"{len(seen)} of {len(rows)} runs match {self.term!r} — esc clears"
        else:
            hint = f"{len(rows)} runs"
        app: Any = self.app
        if app.reattached:
            hint += " · re-attached on start: " + ", ".join(app.reattached)
        if len(cols) < len(COLUMNS):
            hint += " · hidden at this width: " + ", ".join(c for c in COLUMNS if c not in cols)
        self.query_one("#runs-hint", Static).update(hint)
        self.refresh_bindings()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.app.open_run(str(event.row_key.value))  # type: ignore[attr-defined]

    def action_open(self) -> None:
        run_id = self.selected_run_id()
        if run_id:
            self.app.open_run(run_id)  # type: ignore[attr-defined]
