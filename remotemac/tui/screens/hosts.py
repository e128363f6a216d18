"""The hosts screen: doctor results per host, and trusting a host key by its fingerprint."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Header, Input, Static

from remotemac.settings import LocalSettings
from remotemac.tui.driver import error_line
from remotemac.tui.fit import matches
from remotemac.tui.screens.dialogs import ConfirmScreen
from remotemac.tui.widgets.keybar import KeyBar
from remotemac.tui.widgets.lists import FilterBar, ListTable

NARROW = 100  # columns: below this the hosts screen stacks its two panes
_STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "n/a": "dim"}


class HostsScreen(Screen):
    """Hosts known from the journal and the playbooks; doctor and trust act on the selected one."""

    BINDINGS = [
        Binding("escape", "back", "Runs", tooltip="clears the filter first"),
        Binding("slash", "filter", "Filter", tooltip="hosts whose name holds the words"),
        Binding("d", "doctor", "Doctor"),
        Binding("t", "trust", "Trust key", tooltip="asks first, showing the fingerprint"),
        Binding("c", "app.cleanup", "Cleanup host"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, hosts: list[str], remote_root: str = "~/remotemac") -> None:
        super().__init__()
        self.hosts = list(dict.fromkeys(hosts))
        self.remote_root = remote_root
        self.reports: dict[str, Any] = {}
        self.term = ""
        self._trusted: dict[str, bool] = {}

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal(id="hosts-body"):
            with Vertical(id="hosts-side"):
                yield ListTable(id="hosts")
                yield FilterBar("#hosts", placeholder="filter hosts (esc clears)")
                yield Input(placeholder="add: alias or user@host:port", id="add-host")
            with Vertical(id="hosts-main"):
                yield Static("", id="doctor-title")
                with VerticalScroll(id="checks-scroll"):
                    yield Static("", id="checks")
        yield KeyBar()

    def on_mount(self) -> None:
        app: Any = self.app
        self.sub_title = "hosts"
        self.query_one("#add-host", Input).cursor_blink = app.blink
        hosts = self.query_one("#hosts", DataTable)
        hosts.add_column("host", key="host")
        hosts.add_column("doctor", key="doctor")
        self._fill()
        self.show_report(self.selected_host())
        hosts.focus()

    def _fill(self) -> None:
        table = self.query_one("#hosts", DataTable)
        keep = self.selected_host()
        table.clear()
        for host in self.hosts:
            if matches(self.term, [host]):
                table.add_row(host, self._fit_cell(host), key=host)
        if keep is not None and keep in table.rows:
            table.move_cursor(row=table.get_row_index(keep), animate=False)
        self.show_report(self.selected_host())

    def action_filter(self) -> None:
        self.query_one(FilterBar).open()

    def on_filter_bar_filtered(self, event: FilterBar.Filtered) -> None:
        self.term = event.term
        self._fill()

    def action_back(self) -> None:
        bar = self.query_one(FilterBar)
        if bar.display or bar.value:
            bar.action_clear()
            return
        self.app.pop_screen()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Trust only a host with a key to trust and none pinned yet; doctor a selected host."""
        if action == "trust":
            host = self.selected_host()
            return bool(host) and host != "local" and not self.is_trusted(host or "")
        if action == "doctor":
            return self.selected_host() is not None
        return True

    def is_trusted(self, host: str) -> bool:
        """A key for ``host`` is pinned already (remotemac's known_hosts or the user's)."""
        if host not in self._trusted:
            from pathlib import Path

            from remotemac.transport.hostkeys import HostKeyPolicy
            from remotemac.transport.sshconfig import resolve

            app: Any = self.app
            s: LocalSettings = app.settings
            try:
                params = resolve(host, ssh_config=s.ssh_config, identity=s.identity)
                keys, _cas, _revoked = HostKeyPolicy(Path(s.home), params.known_hosts_files).lookup(
                    params.key_name
                )
                self._trusted[host] = bool(keys)
            except Exception:  # an alias that does not resolve: nothing is pinned for it
                self._trusted[host] = False
        return self._trusted[host]

    def on_resize(self, event: Any) -> None:
        """Below 100 columns the host list goes above the report, so "why / fix" keeps room."""
        self.set_class(self.size.width < NARROW, "narrow")

    # ------------------------------------------------------------ selection

    def selected_host(self) -> str | None:
        table = self.query_one("#hosts", DataTable)
        if table.row_count == 0:
            return None
        row_key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
        return str(row_key.value)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "hosts":
            self.show_report(str(event.row_key.value))
            self.refresh_bindings()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "add-host":
            return
        host = event.value.strip()
        event.input.value = ""
        if host and host not in self.hosts:
            self.hosts.append(host)
            self.query_one("#hosts", DataTable).add_row(host, self._fit_cell(host), key=host)
        table = self.query_one("#hosts", DataTable)
        if host:
            table.move_cursor(row=table.get_row_index(host))
            table.focus()

    # ------------------------------------------------------------ doctor

    def _fit_cell(self, host: str) -> Text:
        report = self.reports.get(host)
        if report is None:
            return Text("not run", style="dim")
        return Text("fit", style="green") if report.fit else Text("not fit", style="bold red")

    def show_report(self, host: str | None) -> None:
        title = self.query_one("#doctor-title", Static)
        checks = self.query_one("#checks", Static)
        checks.update("")
        report = self.reports.get(host) if host else None
        if host is None:
            title.update("no hosts yet: type one below")
            return
        if report is None:
            title.update(f"{host}: doctor not run yet — press d")
            return
        verdict = "[green]fit[/]" if report.fit else "[bold red]not fit[/]"
        title.update(f"{host}: {verdict}")
        table = Table(expand=True, show_edge=False, header_style="bold")
        table.add_column("check", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("value", ratio=2, overflow="fold")
        table.add_column("why / fix", ratio=3, overflow="fold")  # wraps: never cut
        for c in report.checks:
            notes = c.why + (f"\nfix: {c.fix}" if c.fix else "")
            table.add_row(
                c.name, Text(c.status, style=_STATUS_STYLE.get(c.status, "")), c.value, notes
            )
        checks.update(table)

    def set_report(self, host: str, report: Any) -> None:
        self.reports[host] = report
        table = self.query_one("#hosts", DataTable)
        if host in self.hosts:
            table.update_cell(host, "doctor", self._fit_cell(host))
        if self.selected_host() == host:
            self.show_report(host)

    def action_doctor(self) -> None:
        host = self.selected_host()
        if host:
            self.query_one("#doctor-title", Static).update(f"{host}: running doctor…")
            self.run_doctor(host)

    @work(group="doctor", exit_on_error=False)
    async def run_doctor(self, host: str) -> None:
        from remotemac.engine.session import doctor, open_transport

        app: Any = self.app
        settings: LocalSettings = app.settings
        try:
            transport = open_transport(host, settings.home, settings.ssh_options())
            async with transport:
                report = await doctor(transport, host, self.remote_root)
        except Exception as exc:
            self.query_one("#doctor-title", Static).update(f"{host}: [red]{error_line(exc)}[/]")
            app.report_error(f"doctor {host}: {error_line(exc)}")
            return
        self.set_report(host, report)

    # ------------------------------------------------------------ trust

    def action_trust(self) -> None:
        host = self.selected_host()
        if host == "local":
            self.notify("local has no host key", severity="warning")
        elif host and self.is_trusted(host):
            self.notify(f"{host}: a key is pinned already (a changed key is refused, not asked)")
        elif host:
            self.trust(host)

    @work(group="trust", exit_on_error=False)
    async def trust(self, host: str) -> None:
        """Show the key the host offers; pin exactly that fingerprint if the user says yes."""
        from remotemac.transport.hostkeys import fetch_host_key, trust_host_async

        app: Any = self.app
        s: LocalSettings = app.settings
        try:
            key, fp = await fetch_host_key(
                host, home_dir=s.home, ssh_config=s.ssh_config, identity=s.identity
            )
        except Exception as exc:
            app.report_error(f"trust {host}: {error_line(exc)}")
            return
        if not await app.push_screen_wait(trust_question(host, key.get_algorithm(), fp)):
            self.notify(f"{host}: key not trusted")
            return
        try:
            result = await trust_host_async(
                host, s.home, fp, lambda _q: False, ssh_config=s.ssh_config, identity=s.identity
            )
        except Exception as exc:
            app.report_error(f"trust {host}: {error_line(exc)}")
            return
        self._trusted[host] = True
        self.refresh_bindings()
        state = "already trusted" if result.already_trusted else "trusted"
        self.notify(f"{result.name}: {state} {result.fingerprint}")
        self.query_one("#doctor-title", Static).update(f"{host}: {state} {result.fingerprint}")


def trust_question(host: str, algorithm: str, fingerprint: str) -> ConfirmScreen:
    """The question before a host key is pinned: the key the host offers, and what yes does."""
    details = (
        f"{algorithm} {fingerprint}\n\nCompare it with the fingerprint your "
        "provider published before saying yes. Yes pins this key in remotemac's "
        "known_hosts: every later connection to this host must offer exactly it."
    )
    return ConfirmScreen(f"Trust {host}'s host key?", details, yes="Trust")
