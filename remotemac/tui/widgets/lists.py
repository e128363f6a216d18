"""Lists as lazygit/k9s users expect them: j/k/g/G/Home/End move the selection, ``/`` filters.

``ListTable`` is a DataTable whose keys move the row cursor (Home/End of a plain
DataTable scroll sideways and leave the selection where it was). ``FilterBar`` is
the ``/`` line: while it has focus every letter is text, never a key of the
screen (a ``c`` typed into it is a ``c`` in the filter, not a cleanup).
"""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable, Input


class ListTable(DataTable):
    """A row-cursor table with vi keys; the row keys are the ids the screen acts on."""

    BINDINGS = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g,home", "first", "First", show=False),
        Binding("G,end", "last", "Last", show=False),
    ]

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("cursor_type", "row")
        super().__init__(**kwargs)

    def action_first(self) -> None:
        if self.row_count:
            self.move_cursor(row=0, animate=False)

    def action_last(self) -> None:
        if self.row_count:
            self.move_cursor(row=self.row_count - 1, animate=False)


class FilterBar(Input):
    """The ``/`` filter: each change posts :class:`FilterBar.Filtered`; esc clears and hides."""

    BINDINGS = [Binding("escape", "clear", "Clear filter", show=False)]

    class Filtered(Message):
        def __init__(self, bar: FilterBar, term: str) -> None:
            super().__init__()
            self.bar = bar
            self.term = term

    def __init__(self, target: str, placeholder: str = "filter (esc clears)", **kwargs) -> None:
        super().__init__(placeholder=placeholder, **kwargs)
        self.target = target  # the selector of the list the keys go back to
        self.display = False

    @property
    def active(self) -> bool:
        return bool(self.display and self.value.strip())

    def open(self) -> None:
        self.display = True
        self.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Filtered(self, event.value.strip()))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter keeps the filter and gives the keys back to the list."""
        event.stop()
        if not self.value.strip():
            self.display = False
        self.screen.query_one(self.target).focus()

    def action_clear(self) -> None:
        """Esc: no filter, the bar hidden, the keys back to the list."""
        self.value = ""  # posts Input.Changed, so the list shows every row again
        self.display = False
        self.screen.query_one(self.target).focus()
