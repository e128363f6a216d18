"""One run: timeline, live log, connection badge, memory, verdict."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Header, Static

from remotemac.events import RunFinished
from remotemac.tui.driver import read_local_logs
from remotemac.tui.fit import RunFacts, done_phases, run_actions
from remotemac.tui.model import RunLive, read_acceptance
from remotemac.tui.widgets.connection_badge import ConnectionBadge
from remotemac.tui.widgets.keybar import KeyBar
from remotemac.tui.widgets.lists import FilterBar
from remotemac.tui.widgets.log_view import LogView
from remotemac.tui.widgets.memory_spark import MemorySpark
from remotemac.tui.widgets.phase_timeline import PhaseTimeline
from remotemac.tui.widgets.verdict_panel import VerdictPanel
from remotemac.vocab import human_duration

NARROW = 110  # columns: below this the side panel folds into one line
SIDE_WIDTH = 40  # the side panel's width (app.tcss)
COMPACT_BELOW = 100  # a log pane narrower than this drops the time column and pads less


class RunScreen(Screen):
    """Shows a run the TUI drives (live) or one from the journal (as it was left)."""

    BINDINGS = [
        Binding("escape", "back", "Runs", tooltip="clears the filter first"),
        Binding("slash", "search", "Filter", tooltip="only log lines holding the words"),
        Binding("n", "next_match(True)", "Next match", tooltip="older match; N: newer"),
        Binding("N", "next_match(False)", "Newer match", show=False),
        Binding("l", "filter_device", "Device", tooltip="log of one device, the next, then all"),
        Binding("f,G,end", "follow", "Follow", tooltip="jump to the end and follow"),
        Binding("g,home", "top", "Top", show=False, tooltip="the first line held"),
        Binding("j", "scroll_log(1)", "Down", show=False, tooltip="one line down"),
        Binding("k", "scroll_log(-1)", "Up", show=False, tooltip="one line up"),
        Binding("i", "side", "Panel", tooltip="phases, link, memory, verdict (narrow terminal)"),
        Binding("a", "acceptance", "Record", tooltip="open acceptance.md"),
        Binding("t", "app.attach", "Attach"),
        Binding("p", "app.pull", "Pull"),
        Binding("w", "app.wipe", "Wipe"),
        Binding("d", "app.drill", "Drill"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.acceptance = None
        self._status = ""
        self._flush_timer: Any = None
        self.state = ""  # the journal's word for a run nobody drives here
        self.phases_done: frozenset[str] = frozenset()
        self.side_open = False  # the side panel shown on a narrow terminal
        self._snapshot_live = RunLive(run_id)

    def compose(self) -> ComposeResult:
        app: Any = self.app
        yield Header(show_clock=False)
        with Vertical(id="run-side"):
            yield PhaseTimeline(id="timeline")
            yield ConnectionBadge(id="badge")
            yield MemorySpark(id="memory")
            yield VerdictPanel(id="verdict")
        with Vertical(id="run-main"):
            yield Static("", id="run-summary")
            yield LogView(max_lines=app.log_max_lines, id="log")
            yield FilterBar("#log", placeholder="filter the log: words in a line (esc clears)")
            yield Static("", id="log-status")
        yield KeyBar()

    @property
    def live(self) -> RunLive:
        app: Any = self.app
        live = app.driver.lives.get(self.run_id)
        if live is None:
            live = self._snapshot_live
        return live

    def on_mount(self) -> None:
        app: Any = self.app
        self.title = self.run_id
        self.sub_title = "run"
        self.query_one(FilterBar).cursor_blink = app.blink
        if self.run_id not in app.driver.lives:
            self.load_from_journal()
        elif self.live.out_dir:
            self.run_worker(self.load_acceptance(), group="run-load")
        self.refresh_state()
        self._layout()
        if self.run_id in app.driver.lives:
            self._journal_phases()
        # The flush timer runs only while the run is live here (lines stream in batches);
        # a finished run's screen has no timer at all: nothing repaints unless something changes.
        self._flush_timer = self.set_interval(app.flush_s, self.flush_logs, pause=True)
        self._wake()
        self.query_one("#log", LogView).focus()

    def _wake(self) -> None:
        """One flush now; the timer goes on only while a worker here drives the run."""
        self.flush_logs()
        if self.live.active:
            self._flush_timer.resume()

    @work(group="run-load")
    async def load_from_journal(self) -> None:
        """A run nobody drives here: its phases, log files and record as they are on disk."""
        app: Any = self.app
        row = await asyncio.to_thread(app.journal.get_run, self.run_id)
        if row is None:
            return
        phases = await asyncio.to_thread(app.journal.phases, self.run_id)
        live = RunLive(self.run_id, host=row.host, name=row.name, keep_lines=app.log_max_lines)
        live.out_dir, live.verdict = row.out_dir, row.verdict
        live.started_at, live.ended_at = row.created_at, row.finished_at
        live.load_phases(phases)
        self.state = row.state
        self.phases_done = done_phases(phases)
        lines = await asyncio.to_thread(
            read_local_logs, row.out_dir, lambda _d: None, app.log_max_lines
        )
        for device, line in lines:
            live.add_line(device, line)
        if self.run_id not in app.driver.lives:
            self._snapshot_live = live
        await self.load_acceptance()
        self.refresh_state()
        self._wake()

    async def load_acceptance(self) -> None:
        out_dir = self.live.out_dir
        if out_dir:
            self.acceptance = await asyncio.to_thread(read_acceptance, out_dir)
        self.refresh_state()

    # ------------------------------------------------------------ updates

    def flush_logs(self) -> None:
        """Every ~50 ms while live: everything new in the line store, in one write.

        Nothing is touched when nothing changed (a widget update is a layout and a
        repaint); the status line changes at most once a second (the elapsed clock).
        """
        log = self.query_one("#log", LogView)
        log.take(self.live.lines)
        live = self.live
        if not live.active and self._flush_timer is not None:
            self._flush_timer.pause()
        status = "following" if log.following else "paused — G/f to follow"
        status += f" · device: {log.device or 'all'}"
        if log.pattern:
            status += f" · filter: {log.pattern!r} (esc clears)"
        status += f" · {live.lines.total:,} lines"
        if live.started_at is not None:
            app: Any = self.app
            end = live.ended_at if live.ended_at is not None and not live.active else app.now()
            status += f" · elapsed {human_duration(max(0.0, end - live.started_at))}"
        if status != self._status:
            self._status = status
            self.query_one("#log-status", Static).update(status)

    def refresh_state(self) -> None:
        live = self.live
        self.query_one("#timeline", PhaseTimeline).show(live.phases)
        self.query_one("#badge", ConnectionBadge).show(live.link)
        record_peak = self.acceptance.peak_memory if self.acceptance is not None else None
        self.query_one("#memory", MemorySpark).show(
            live.memory, live.fallback_ops, device=live.memory_device, record_peak=record_peak
        )
        pending = "pending"
        if live.error:
            pending = f"[red]{live.error}[/]"
        elif live.verdict and not self.acceptance:
            pending = live.verdict
        self.query_one("#verdict", VerdictPanel).show(self.acceptance, pending)
        self.query_one("#run-summary", Static).update(self._summary(pending))
        self.refresh_bindings()

    def _summary(self, pending: str) -> str:
        """One line for a narrow terminal, where the side panel is hidden: where it is."""
        live = self.live
        running = [p.name for p in live.phases.values() if p.state in ("running", "failed")]
        done = [p.name for p in live.phases.values() if p.state == "done"]
        phase = running[-1] if running else (done[-1] if done else "pending")
        verdict = self.acceptance.verdict.upper() if self.acceptance else pending
        return f"{phase} · link {live.link.state} · verdict {verdict} · i: panel"

    def on_resize(self, event: Any) -> None:
        self._layout()

    def _layout(self) -> None:
        """Below 110 columns the log gets the width: the side panel is one line (i opens it)
        and the log drops its time column; the device tag is as wide as the longest name."""
        narrow = self.size.width < NARROW
        self.set_class(narrow, "narrow")
        self.set_class(narrow and self.side_open, "side-open")
        pane = self.size.width - (0 if narrow and not self.side_open else SIDE_WIDTH)
        self.query_one("#log", LogView).set_compact(pane < COMPACT_BELOW, self.live.lines)

    def action_side(self) -> None:
        self.side_open = not self.side_open
        self._layout()

    def applies(self, name: str) -> bool:
        """Attach / pull / wipe / drill offered only where they apply (the app asks)."""
        app: Any = self.app
        attached = app.driver.attached(self.run_id)
        state = "running" if attached else self.state
        facts = RunFacts(state, self.phases_done, attached, self.live.host == "local")
        return name in run_actions(facts)

    def run_updated(self, event: Any) -> None:
        """Called by the app for each state change of this run."""
        self.refresh_state()
        self._wake()
        if isinstance(event, RunFinished) or event is None and self.live.verdict:
            self.run_worker(self.load_acceptance(), group="run-load")

    def _journal_phases(self) -> None:
        """Which phases the journal has done (a skipped wipe, with --keep-data, is not done)."""
        app: Any = self.app
        try:
            phases = app.journal.phases(self.run_id) or {}
        except Exception:  # a locked journal: offer what the live state says
            return
        self.phases_done = done_phases(phases)
        self.refresh_bindings()

    def run_ended(self) -> None:
        if not self.query("#log"):
            # the run ended before this screen was composed (a short run, a loaded
            # machine): on_mount reads the ended run itself
            return
        self._journal_phases()
        self.flush_logs()
        self.run_worker(self.load_acceptance(), group="run-load")

    # ------------------------------------------------------------ keys

    def action_back(self) -> None:
        bar = self.query_one(FilterBar)
        if bar.display or bar.value:
            bar.action_clear()
            return
        self.app.pop_screen()

    def action_search(self) -> None:
        self.query_one(FilterBar).open()

    def on_filter_bar_filtered(self, event: FilterBar.Filtered) -> None:
        log = self.query_one("#log", LogView)
        log.set_pattern(event.term, self.live.lines)
        log.term = event.term
        self.flush_logs()

    def action_top(self) -> None:
        self.query_one("#log", LogView).scroll_home(animate=False)

    def action_scroll_log(self, lines: int) -> None:
        log = self.query_one("#log", LogView)
        log.scroll_to(y=max(0, log.scroll_offset.y + lines), animate=False)

    def action_next_match(self, older: bool) -> None:
        log = self.query_one("#log", LogView)
        if log.term and log.search(log.term, older=older) is None:
            self.notify("no more matches", severity="information")

    def action_filter_device(self) -> None:
        """Cycle the log through all devices, then each device alone."""
        log = self.query_one("#log", LogView)
        devices = self.live.lines.devices
        if not devices:
            self.notify("no log lines yet", severity="warning")
            return
        order: list[str | None] = [None, *devices]
        now = order.index(log.device) if log.device in order else 0
        log.show_device(order[(now + 1) % len(order)], self.live.lines)
        self.flush_logs()

    def action_follow(self) -> None:
        log = self.query_one("#log", LogView)
        log.clear_search()
        log.follow()

    def action_acceptance(self) -> None:
        acc = self.acceptance
        if acc is None or acc.md_path is None:
            self.notify("no acceptance.md yet", severity="warning")
            return
        self.app.open_markdown(Path(acc.md_path))  # type: ignore[attr-defined]

    def selected_run_id(self) -> str:
        return self.run_id

    def selected_host(self) -> str | None:
        return self.live.host or None
