"""Small modal dialogs: confirm, pick a playbook, and the acceptance.md viewer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import (
    Button,
    Checkbox,
    Input,
    Label,
    MarkdownViewer,
    OptionList,
    Static,
)

from remotemac.tui.fit import CleanupPlan
from remotemac.tui.widgets.keybar import KeyBar


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; ``y`` / ``n`` (or escape) answer from the keyboard.

    "No" has the focus, so an enter typed out of habit destroys nothing; the details
    scroll and the buttons stay on screen at any height (80x24 included).
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "No", show=False),
    ]

    def __init__(
        self,
        question: str,
        details: str = "",
        yes: str = "Yes",
        no: str = "No",
        safe: bool = False,
    ) -> None:
        super().__init__()
        self.question = question
        self.details = details
        self.yes = yes
        self.no = no
        self.safe = safe  # yes destroys nothing (quit, keeping the jobs): not red

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.question, id="question")
            with VerticalScroll(id="details"):
                yield from self.body()
            yield from self.after()
            with Horizontal(id="buttons"):
                yield Button(
                    f"{self.yes} (y)", variant="primary" if self.safe else "error", id="yes"
                )
                yield from self.more_buttons()
                yield Button(f"{self.no} (n)", variant="default", id="no")

    def body(self) -> ComposeResult:
        if self.details:
            yield Static(self.details, markup=False, id="details-text")

    def after(self) -> ComposeResult:
        yield from ()

    def more_buttons(self) -> ComposeResult:
        yield from ()

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()
        self._fit()

    def on_resize(self, event: object) -> None:
        self._fit()

    def _fit(self) -> None:
        """The details get what the screen has left after the question and the buttons."""
        height = self.app.size.height
        dialog = self.query_one("#dialog")
        dialog.styles.max_height = max(8, height - 2)
        # border 2 + padding 2 + question (2 lines) + margins 3 + lines after + buttons 3
        question = 2 if len(self.question) > 68 else 1
        after = 2 * len(list(self.query("#plan-total")))
        self.query_one("#details").styles.max_height = max(
            2, height - 2 - (2 + 2 + question + 3 + after + 3)
        )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class QuitScreen(ConfirmScreen):
    """Quitting mid-run: keep the jobs running (y), stop them on their hosts (s), or
    stay (n). Yes either way; :attr:`stop` says which yes, for the app's callback."""

    BINDINGS = [Binding("s", "stop", "Stop jobs, quit")]

    def __init__(self, question: str, details: str) -> None:
        super().__init__(question, details, yes="Keep running, quit", no="Stay here", safe=True)
        self.stop = False

    def more_buttons(self) -> ComposeResult:
        yield Button("Stop & quit (s)", variant="error", id="stop")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "stop":
            self.action_stop()
        else:
            super().on_button_pressed(event)

    def action_stop(self) -> None:
        self.stop = True
        self.dismiss(True)


class CleanupScreen(ConfirmScreen):
    """The cleanup's dry run as the CLI prints it: kind, path, size of each item, the total."""

    def __init__(self, plan: CleanupPlan) -> None:
        super().__init__(plan.question(), yes="Clean up")
        self.plan = plan

    def body(self) -> ComposeResult:
        from rich.table import Table
        from rich.text import Text

        from remotemac.termsafe import escape_controls
        from remotemac.units import format_size

        table = Table(box=None, show_edge=False, expand=True, header_style="bold", pad_edge=False)
        table.add_column("kind", no_wrap=True)
        table.add_column("path", overflow="fold", ratio=1)  # wraps: a path is never cut
        table.add_column("size", justify="right", no_wrap=True)
        for item in self.plan.remove:
            table.add_row(item.kind, Text(escape_controls(item.path)), format_size(item.size))
        for item in self.plan.keep:
            table.add_row(
                Text(f"keep {item.kind}", style="yellow"),
                Text(f"{escape_controls(item.path)}: {escape_controls(item.why)}", style="dim"),
                "",
            )
        yield Static(table, id="plan-table")

    def after(self) -> ComposeResult:
        from rich.text import Text

        yield Static(Text(self.plan.total_line(), style="bold"), id="plan-total")


@dataclass(frozen=True)
class RunChoice:
    """What the run dialog asks for: as ``remotemac run PATH [--host H] [--keep-data] [--dry-run]``."""

    path: str
    keep_data: bool = False
    host: str | None = None
    dry_run: bool = False


class PlaybookPicker(ModalScreen["RunChoice | None"]):
    """The playbooks given on the command line, or any path typed in; host, keep data, dry run."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, playbooks: list[str], blink: bool = True) -> None:
        super().__init__()
        self.playbooks = playbooks
        self.blink = blink

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label("Start a run", id="question")
            if self.playbooks:
                yield OptionList(*self.playbooks, id="playbooks")
            yield Input(
                placeholder="path/to/playbook.yaml",
                id="path",
                value=self.playbooks[0] if self.playbooks else "",
            )
            yield Input(placeholder="host (empty: the playbook's)", id="host")
            with Horizontal(id="run-boxes"):
                yield Checkbox("keep data (no wipe)", id="keep")
                yield Checkbox("dry run (plan only)", id="dry-run")
            with Horizontal(id="buttons"):
                yield Button("Start", variant="success", id="start")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#path", Input).cursor_blink = self.blink
        self.query_one("#host", Input).cursor_blink = self.blink
        if self.playbooks:
            self.query_one("#playbooks", OptionList).focus()
        else:
            self.query_one("#path", Input).focus()

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self.query_one("#path", Input).value = str(event.option.prompt)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self._start(str(event.option.prompt))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._start(self.query_one("#path", Input).value)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self._start(self.query_one("#path", Input).value)
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _start(self, path: str) -> None:
        path = path.strip()
        if not path:
            self.notify("type the path of a playbook", severity="warning")
            return
        host = self.query_one("#host", Input).value.strip() or None
        self.dismiss(
            RunChoice(
                path,
                self.query_one("#keep", Checkbox).value,
                host,
                self.query_one("#dry-run", Checkbox).value,
            )
        )


def key_rows(screen: Screen, app_bindings: list[Binding]) -> list[tuple[str, str]]:
    """(keys, what they do) for ``screen``, its list and the app: what ``?`` lists.

    Made from the bindings themselves, so the help cannot promise a key that does
    nothing (Home/End once were listed and did not move the selection).
    """
    from remotemac.tui.widgets.lists import ListTable

    rows: list[tuple[str, str]] = []
    seen: set[str] = set()
    lists = ListTable.BINDINGS if screen.query(ListTable) else []
    for binding in [*getattr(type(screen), "BINDINGS", []), *lists, *app_bindings]:
        if not isinstance(binding, Binding) or binding.action in seen:
            continue
        seen.add(binding.action)
        keys = " / ".join(_KEY_NAMES.get(k.strip(), k.strip()) for k in binding.key.split(","))
        if binding.action == "command_palette":
            keys = "ctrl+p / :"
        what = binding.description or binding.action
        rows.append((keys, f"{what}: {binding.tooltip}" if binding.tooltip else what))
    return rows


_KEY_NAMES = {
    "slash": "/",
    "question_mark": "?",
    "escape": "esc",
    "colon": ":",
}


class HelpScreen(ModalScreen[None]):
    """``?``: every key of the screen underneath and of the app, and the command palette."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, title: str, rows: list[tuple[str, str]]) -> None:
        super().__init__()
        self.title_text = title
        self.rows = rows

    def compose(self) -> ComposeResult:
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for keys, what in self.rows:
            table.add_row(keys, what)
        with Vertical(id="dialog"):
            yield Label(f"Keys: {self.title_text}", id="question")
            with VerticalScroll(id="details"):
                yield Static(table)
            yield Label(
                "ctrl+p opens the command palette: every action by name. esc closes this.",
                id="help-hint",
            )

    def action_close(self) -> None:
        self.dismiss(None)


class MarkdownScreen(Screen):
    """acceptance.md (or any markdown file) in a viewer; escape goes back."""

    BINDINGS = [Binding("escape,q", "app.pop_screen", "Back")]

    def __init__(self, path: Path, text: str) -> None:
        super().__init__()
        self.path = path
        self.text = text

    def compose(self) -> ComposeResult:
        yield MarkdownViewer(self.text, show_table_of_contents=False, id="markdown")
        yield KeyBar()
