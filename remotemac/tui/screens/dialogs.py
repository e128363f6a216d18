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
    Footer,
    Input,
    Label,
    MarkdownViewer,
    OptionList,
    Static,
)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; ``y`` / ``n`` (or escape) answer from the keyboard."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "No", show=False),
    ]

    def __init__(self, question: str, details: str = "", yes: str = "Yes") -> None:
        super().__init__()
        self.question = question
        self.details = details
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.question, id="question")
            if self.details:
                with VerticalScroll(id="details"):
                    yield Static(self.details, markup=False)
            with Horizontal(id="buttons"):
                yield Button(f"{self.yes} (y)", variant="error", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


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
    """(keys, what they do) for ``screen`` and the app: what the ``?`` screen lists."""
    rows: list[tuple[str, str]] = []
    seen: set[str] = set()
    for binding in [*getattr(type(screen), "BINDINGS", []), *app_bindings]:
        if not isinstance(binding, Binding) or binding.key in seen:
            continue
        seen.add(binding.key)
        keys = " / ".join(_KEY_NAMES.get(k.strip(), k.strip()) for k in binding.key.split(","))
        what = binding.description or binding.action
        rows.append((keys, f"{what}: {binding.tooltip}" if binding.tooltip else what))
    rows.append(("↑ ↓ pgup pgdn home", "move the selection, scroll the log"))
    return rows


_KEY_NAMES = {
    "slash": "/",
    "question_mark": "?",
    "escape": "esc",
    "enter": "enter",
    "ctrl+p": "ctrl+p",
    "ctrl+c": "ctrl+c",
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
        yield Footer()
