"""Small modal dialogs: confirm, pick a playbook, and the acceptance.md viewer."""

from __future__ import annotations

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

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n", "answer(False)", "No"),
                Binding("escape", "answer(False)", "No", show=False)]

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


class PlaybookPicker(ModalScreen["tuple[str, bool] | None"]):
    """The playbooks given on the command line, or any path typed in; keep-data box."""

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
            yield Input(placeholder="path/to/playbook.yaml", id="path",
                        value=self.playbooks[0] if self.playbooks else "")
            yield Checkbox("keep data on the host (no wipe)", id="keep")
            with Horizontal(id="buttons"):
                yield Button("Start", variant="success", id="start")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#path", Input).cursor_blink = self.blink
        if self.playbooks:
            self.query_one("#playbooks", OptionList).focus()
        else:
            self.query_one("#path", Input).focus()

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self.query_one("#path", Input).value = str(event.option.prompt)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self._start(str(event.option.prompt))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._start(event.value)

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
        self.dismiss((path, self.query_one("#keep", Checkbox).value))


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
