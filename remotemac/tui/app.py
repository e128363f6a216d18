"""``remotemac tui``: the app, its actions (keys and command palette) and ``run_tui``.

Actions live on the app so that every screen and the command palette share
them; each acts on the run (or host) selected on the current screen. Every
failure ends as a notification and an error line, never as a crash: engine work
runs in workers whose exceptions are caught and turned into one line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.driver import Driver
from textual.screen import Screen

from remotemac.errors import EXIT_INTERRUPTED
from remotemac.journal import Journal
from remotemac.settings import LocalSettings
from remotemac.tui.driver import AlreadyDone, RunDriver, error_line
from remotemac.tui.fit import CleanupPlan, quit_question
from remotemac.tui.messages import RunEnded, RunUpdated
from remotemac.tui.screens.dialogs import (
    CleanupScreen,
    ConfirmScreen,
    HelpScreen,
    MarkdownScreen,
    PlaybookPicker,
    QuitScreen,
    RunChoice,
    key_rows,
)
from remotemac.tui.screens.hosts import HostsScreen
from remotemac.tui.screens.run import RunScreen
from remotemac.tui.screens.runs import RunsScreen
from remotemac.tui.terminal import driver_class
from remotemac.vocab import human_size

#: the command palette: (title, help, target); a target is an app action
#: (``start_run``: ``action_start_run``) or ``screen:action`` on that kind of screen
PALETTE: tuple[tuple[str, str, str], ...] = (
    ("Run a playbook", "Start a run: playbook, host, keep data, dry run (r)", "start_run"),
    ("Runs", "Back to the table of runs", "runs"),
    ("Open run", "Open the selected run: log, timeline, verdict (enter)", "runs:open"),
    ("Attach", "Re-attach to the selected run (t)", "attach"),
    ("Pull", "Pull the selected run's results (p)", "pull"),
    ("Wipe", "Wipe the selected run's data (asks first) (w)", "wipe"),
    ("Drill disconnect", "Cut the selected run's SSH link on purpose (d)", "drill"),
    ("Filter", "Only the runs, hosts or log lines holding words (/)", "filter"),
    ("Side panel", "Phases, link, memory, verdict on a narrow terminal (i)", "run:side"),
    ("Older match", "Next search match upwards (n)", "run:next_match(True)"),
    ("Newer match", "Next search match downwards (N)", "run:next_match(False)"),
    (
        "Device filter",
        "Show one device's log lines, then the next, then all (l)",
        "run:filter_device",
    ),
    ("Follow log", "Jump to the end and follow (end, f)", "run:follow"),
    ("acceptance.md", "Open the run's acceptance record (a)", "run:acceptance"),
    ("Hosts", "Doctor and host keys (h)", "hosts"),
    ("Doctor host", "Is the selected host fit (d on the hosts screen)", "hosts:doctor"),
    (
        "Trust host key",
        "Pin the selected host's key after comparing it (t on the hosts screen)",
        "hosts:trust",
    ),
    (
        "Cleanup host",
        "Remove everything remotemac put on a host (dry run first, then asks) (c)",
        "cleanup",
    ),
    (
        "Fleet summary",
        "Every fleet run from the journal: host, verdict, duration, cost (f)",
        "fleet",
    ),
    ("Next fleet", "Show the next fleet (n on the fleet screen)", "fleet:next_fleet"),
    ("Keys", "Every key of this screen (?)", "help"),
    ("Quit", "Leave; mid-run it asks: keep the jobs running, or stop them (q)", "quit"),
)


class RemotemacApp(App[int]):
    """The TUI. Tests inject a journal, a fixed ``now`` and ``reattach=False`` for snapshots."""

    CSS_PATH = "app.tcss"
    TITLE = "remotemac"
    BINDINGS = [
        Binding("question_mark", "help", "Keys"),
        Binding("ctrl+p", "command_palette", "Commands", show=False),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("colon", "command_palette", "Commands", show=False),
    ]

    def __init__(
        self,
        settings: LocalSettings,
        playbooks: list[str] | None = None,
        *,
        journal: Journal | None = None,
        now: Callable[[], float] | None = None,
        out_root: Path | None = None,
        reattach: bool = True,
        blink: bool = True,
        log_max_lines: int = 10_000,
        flush_s: float = 0.05,
        remote_root: str = "~/remotemac",
        live_poll_s: float = 30.0,
        start_playbooks: bool = False,
    ) -> None:
        super().__init__()
        self.start_playbooks = start_playbooks  # ``remotemac tui my.yaml`` runs my.yaml
        self.live_poll_s = live_poll_s  # 0: never ask hosts (snapshots, offline)
        self.settings = settings
        self.playbooks = list(playbooks or [])
        self.journal = journal if journal is not None else settings.journal()
        self.now = now or time.time
        self.reattach = reattach
        self.blink = blink
        self.log_max_lines = log_max_lines
        self.flush_s = flush_s
        self.remote_root = remote_root
        self.driver = RunDriver(
            self,
            settings,
            self.journal,
            out_root or Path.cwd() / "runs",
            keep_lines=2 * log_max_lines,
        )
        self.errors: list[str] = []  # every error line shown, for the status and for tests
        self.exit_lines: list[str] = []  # printed once the terminal is back (run_tui)
        self.reattached: list[str] = []

    def get_driver_class(self) -> type[Driver]:
        """Textual's driver, writing each frame whole even on a non-blocking terminal
        (:mod:`remotemac.tui.terminal`)."""
        return driver_class(super().get_driver_class())

    def on_mount(self) -> None:
        self.push_screen(RunsScreen())
        if self.reattach:
            self.reattach_in_flight()
        if self.start_playbooks:
            for path in self.playbooks:
                self.start(RunChoice(path))

    def start(self, choice: RunChoice) -> str | None:
        """Start a run (or show its plan, for a dry run); errors become one line."""
        if choice.dry_run:
            self.run_worker(self._show_plan(choice), group="plan", exit_on_error=False)
            return None
        try:
            run_id = self.driver.start(choice.path, keep_data=choice.keep_data, host=choice.host)
        except Exception as exc:
            self.report_error(f"run {choice.path}: {error_line(exc)}")
            return None
        self.open_run(run_id)
        return run_id

    async def _show_plan(self, choice: RunChoice) -> None:
        """``run --dry-run`` in a viewer: the plan is computed off the UI loop."""
        from remotemac.engine.session import make_plan
        from remotemac.playbook import load_playbook

        try:
            pb = load_playbook(
                choice.path, overrides={"host": choice.host} if choice.host else None
            )
            plan = await asyncio.to_thread(make_plan, pb)
        except Exception as exc:
            self.report_error(f"dry run {choice.path}: {error_line(exc)}")
            return
        self.push_screen(MarkdownScreen(Path(choice.path), plan_markdown(plan)))

    def reattach_in_flight(self) -> list[str]:
        """Pick up runs a previous TUI (or a Ctrl-C'd CLI) left running on their hosts."""
        try:
            run_ids = self.driver.in_flight(self.now())
        except Exception as exc:
            self.report_error(f"journal: {error_line(exc)}")
            return []
        for run_id in run_ids:
            try:
                self.driver.attach(run_id)
            except Exception as exc:
                self.report_error(f"attach {run_id}: {error_line(exc)}")
        if run_ids:
            self.reattached = list(run_ids)
            self.notify(
                f"re-attached {len(run_ids)} run(s) left going: " + ", ".join(run_ids),
                timeout=15,
            )
        return run_ids

    # ------------------------------------------------------------ helpers

    RUN_ACTIONS = ("attach", "pull", "wipe", "drill")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A run action is shown (and its key works) only where it applies: no wipe of a
        wiped run, no attach while attached; the screen on top knows its selection."""
        if action in self.RUN_ACTIONS:
            applies = getattr(self.screen, "applies", None)
            return bool(applies(action)) if applies else True
        return True

    def _applies(self, action: str) -> bool:
        """For the palette (which calls actions directly): say why an action does not apply."""
        if self.check_action(action, ()):
            return True
        run_id = getattr(self.screen, "selected_run_id", lambda: None)()
        why = {
            "attach": "is followed here already, or has ended",
            "wipe": "is wiped already, or still running",
            "pull": "is still running here",
            "drill": "has no SSH link followed here",
        }[action]
        self.notify(f"{action}: {run_id or 'the run'} {why}", severity="warning")
        return False

    def report_error(self, line: str) -> None:
        self.errors.append(line)
        self.notify(line, severity="error", timeout=10)

    def _selected_run(self) -> str | None:
        getter = getattr(self.screen, "selected_run_id", None)
        run_id = getter() if getter else None
        if run_id is None:
            self.notify("select a run first", severity="warning")
        return run_id

    def _selected_host(self) -> str | None:
        getter = getattr(self.screen, "selected_host", None)
        host = getter() if getter else None
        if host is None:
            self.notify("select a host (or a run on it) first", severity="warning")
        return host

    def _known_hosts(self) -> list[str]:
        hosts = ["local"]
        for path in self.playbooks:
            try:
                from remotemac.playbook import load_playbook

                hosts.append(load_playbook(path).host)
            except Exception as exc:
                self.report_error(error_line(exc))
        try:
            hosts += [r.host for r in self.journal.list_runs()]
        except Exception as exc:
            self.report_error(f"journal: {error_line(exc)}")
        return list(dict.fromkeys(hosts))

    def open_run(self, run_id: str) -> None:
        if isinstance(self.screen, RunScreen) and self.screen.run_id == run_id:
            return
        self.push_screen(RunScreen(run_id))

    def open_markdown(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            self.report_error(f"cannot read {path}: {exc.strerror}")
            return
        self.push_screen(MarkdownScreen(path, text))

    # ------------------------------------------------------------ messages from the driver

    def on_run_updated(self, message: RunUpdated) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, RunScreen) and screen.run_id == message.run_id:
                screen.run_updated(message.event)
            elif isinstance(screen, RunsScreen) and message.event is None:
                screen.refresh_runs()

    def on_run_ended(self, message: RunEnded) -> None:
        if message.error:
            self.report_error(f"{message.what} {message.run_id}: {message.error}")
        for screen in self.screen_stack:
            if isinstance(screen, RunScreen) and screen.run_id == message.run_id:
                screen.run_ended()
            elif isinstance(screen, RunsScreen):
                screen.refresh_runs()

    # ------------------------------------------------------------ actions

    def action_start_run(self) -> None:
        def started(choice: RunChoice | None) -> None:
            if choice is not None:
                self.start(choice)

        self.push_screen(PlaybookPicker(self.playbooks, blink=self.blink), started)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        name = getattr(self.screen, "sub_title", "") or type(self.screen).__name__
        self.push_screen(HelpScreen(name, key_rows(self.screen, self.BINDINGS)))

    def action_runs(self) -> None:
        """Back to the runs table from anywhere."""
        while len(self.screen_stack) > 2 and not isinstance(self.screen, RunsScreen):
            self.pop_screen()

    async def on_screen(self, kind: type, action: str) -> None:
        """A palette entry for a screen's own key: run it there, or say where it lives."""
        if isinstance(self.screen, kind):
            await self.run_action(action, self.screen)
        else:
            self.notify(
                f"open the {kind.__name__.removesuffix('Screen').lower()} screen first",
                severity="warning",
            )

    def action_attach(self) -> None:
        if not self._applies("attach"):
            return
        run_id = self._selected_run()
        if run_id is None:
            return
        try:
            self.driver.attach(run_id)
        except Exception as exc:
            self.report_error(f"attach {run_id}: {error_line(exc)}")
            return
        self.open_run(run_id)

    def action_pull(self) -> None:
        if not self._applies("pull"):
            return
        run_id = self._selected_run()
        if run_id is not None:
            self.run_worker(self._one_phase(run_id, "pull"), group="phase", exit_on_error=False)

    def action_wipe(self) -> None:
        if not self._applies("wipe"):
            return
        run_id = self._selected_run()
        if run_id is None:
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._one_phase(run_id, "wipe"), group="phase", exit_on_error=False)
            else:
                self.notify(f"wipe of {run_id} cancelled")

        self.push_screen(
            ConfirmScreen(
                f"Wipe the data of {run_id} on its host and destroy its key?",
                "Removes the dataset (plaintext and ciphertext), caches, tmp and outputs on the "
                "host; logs and status stay until cleanup.",
                yes="Wipe",
            ),
            answered,
        )

    async def _one_phase(self, run_id: str, phase: str) -> None:
        self.notify(f"{phase} {run_id}…")
        try:
            code = await self.driver.one_phase(run_id, phase)
        except asyncio.CancelledError:
            raise
        except AlreadyDone as done:
            self.notify(str(done))
            return
        except Exception as exc:
            self.post_message(RunEnded(run_id, None, error_line(exc), what=phase))
            return
        self.notify(f"{phase} {run_id}: done (exit {code})")
        self.post_message(RunEnded(run_id, code, None, what=phase))

    async def action_drill(self) -> None:
        if not self._applies("drill"):
            return
        run_id = self._selected_run()
        if run_id is None:
            return
        try:
            cut = await self.driver.drill_disconnect(run_id)
        except Exception as exc:
            self.report_error(error_line(exc))
            return
        self.notify(f"drill: cut {cut} link(s) of {run_id}; watch the badge")

    def action_cleanup(self) -> None:
        host = self._selected_host()
        if host is not None:
            self.run_worker(self._cleanup(host), group="cleanup", exit_on_error=False)

    async def _cleanup(self, host: str) -> None:
        """Dry run first, its list in a dialog, then the real cleanup only on yes."""
        try:
            _, listing = await self.driver.cleanup(host, dry_run=True, remote_root=self.remote_root)
            plan = CleanupPlan.from_record(json.loads(listing))
            if plan.error:
                self.report_error(f"cleanup {host}: not verified: {plan.error}")
                return
            if not plan.remove:
                self.notify(plan.question())
                return
            if not await self.push_screen_wait(CleanupScreen(plan)):
                self.notify(f"cleanup of {host} cancelled: nothing was removed")
                return
            code, out = await self.driver.cleanup(host, dry_run=False, remote_root=self.remote_root)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.report_error(f"cleanup {host}: {error_line(exc)}")
            return
        self.notify(f"cleanup {host}: exit {code}")
        self.push_screen(MarkdownScreen(Path(f"cleanup-{host}"), _cleanup_markdown(out)))

    async def action_filter(self) -> None:
        """``/`` of the screen on top (runs, hosts, the run's log), from the palette."""
        if hasattr(self.screen, "action_filter"):
            await self.run_action("filter", self.screen)
        elif hasattr(self.screen, "action_search"):
            await self.run_action("search", self.screen)
        else:
            self.notify("this screen has no filter", severity="warning")

    def action_fleet(self) -> None:
        from remotemac.tui.screens.fleet import FleetScreen

        if not isinstance(self.screen, FleetScreen):
            self.push_screen(FleetScreen(self.journal, self.driver.out_root))

    def action_hosts(self) -> None:
        if not isinstance(self.screen, HostsScreen):
            self.push_screen(HostsScreen(self._known_hosts(), self.remote_root))

    def live_run_ids(self) -> list[str]:
        """Runs a worker of this TUI drives right now (their jobs run on their hosts)."""
        return [run_id for run_id, live in self.driver.lives.items() if live.active]

    def action_quit(self) -> None:
        """Leave; mid-run it asks first, and leaves as the CLI's Ctrl-C does (exit 130,
        the ``attach`` command printed), the jobs going on on their hosts."""
        if isinstance(self.screen, ConfirmScreen):
            return
        live = self.live_run_ids()
        if not live:
            self.run_worker(self._leave([]), group="quit", exclusive=True)
            return
        dialog = QuitScreen(*quit_question(live))

        def answered(yes: bool | None) -> None:
            if yes:
                leave = self._leave(self.live_run_ids(), stop=dialog.stop)
                self.run_worker(leave, group="quit", exclusive=True)

        self.push_screen(dialog, answered)

    async def _leave(self, live: list[str], stop: bool = False) -> None:
        """Stop following (the journal says ``interrupted``); ``stop``: then stop the
        jobs on their hosts too. Exit 130 either way, as the CLI's Ctrl-C."""
        await self.driver.stop_all()
        if not live:
            self.exit(0)
            return
        if stop:
            self.notify("stopping the job(s) on their hosts…", timeout=30)
            failed = await self.driver.stop_jobs(live)
            self.exit_lines = [
                f"remotemac: could not stop the job of {run_id}: {failed[run_id]}. "
                f"Resume with: remotemac attach {run_id}"
                if run_id in failed
                else f"remotemac: stopped the job of {run_id} on its host; its data stays "
                f"there until: remotemac wipe {run_id}"
                for run_id in live
            ]
        else:
            self.exit_lines = [
                f"remotemac: stopped following; the job keeps running on the host. "
                f"Resume with: remotemac attach {run_id}"
                for run_id in live
            ]
        self.exit(EXIT_INTERRUPTED, return_code=EXIT_INTERRUPTED)

    # ------------------------------------------------------------ command palette

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Every action by name: each key of every screen has its palette entry."""
        from remotemac.tui.screens.fleet import FleetScreen

        kinds = {"runs": RunsScreen, "run": RunScreen, "hosts": HostsScreen, "fleet": FleetScreen}
        for title, help_text, target in PALETTE:
            kind, _, action = target.rpartition(":")
            if kind:
                callback: Callable[[], Any] = partial(self.on_screen, kinds[kind], action)
            else:
                callback = getattr(self, f"action_{action}")
            yield SystemCommand(title, help_text, callback)
        ours = {title for title, _, _ in PALETTE}  # ours win: "Keys" is the ? screen here
        yield from (c for c in super().get_system_commands(screen) if c.title not in ours)


def _cleanup_markdown(text: str) -> str:
    """The cleanup's record as ``cleanup.md`` has it (the engine's words), not raw JSON."""
    from remotemac.engine.session import render_markdown

    try:
        return render_markdown(json.loads(text))
    except (ValueError, KeyError, TypeError):
        return f"```\n{text.strip()}\n```\n"


def plan_markdown(plan: dict[str, Any]) -> str:
    """``run --dry-run``'s plan as markdown for the viewer."""
    lines = [
        f"# Plan for {plan['playbook']} on {plan['host']}",
        "",
        "Dry run: nothing was touched.",
        "",
        "**phases:** " + " → ".join(plan["phases"]),
        "",
    ]
    lines += [f"- {key}: `{value}`" for key, value in plan["remote_paths"].items()]
    lines += [
        "",
        f"project: {plan['project']['files']} files, "
        f"{human_size(plan['project']['bytes'])}; dataset: "
        f"{len(plan['data']['files'])} files, {human_size(plan['data']['bytes'])}; "
        f"to send: {human_size(plan['bytes_to_send'])}",
        "",
    ]
    for role, cmd in plan["commands"].items():
        lines += [
            f"**{role}** (device {cmd.get('device', '?')}, on {cmd['host']}):",
            "",
            f"```\n{cmd['command']}\n```",
            "",
        ]
    return "\n".join(lines)


def run_tui(settings: LocalSettings, playbooks: list[str], start: bool = True) -> int:
    """Entry point of ``remotemac tui [PLAYBOOK…]``: each PLAYBOOK starts a run at once."""
    app = RemotemacApp(settings, playbooks, start_playbooks=start)
    result = app.run()
    for line in app.exit_lines:  # as the CLI's Ctrl-C: the way back in, on stderr
        print(line, file=sys.stderr)
    return int(result or 0)
