"""The footer: the keys that apply here, as many as fit, ``? Keys`` always last.

Textual's Footer lays every binding out and cuts the row at the terminal's edge
(at 80 columns it stopped at ``t ▏``). This one renders one line that fits the
width: bindings in the screen's order, the ones that do not apply left out (the
screens' ``check_action``), and when they do not all fit, the last ones give way
to ``? more``. The full list is always the ``?`` screen.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

_KEY_LABEL = {
    "escape": "esc",
    "slash": "/",
    "question_mark": "?",
    "enter": "enter",
    "ctrl+p": "^p",
    "colon": ":",
}
_GAP = "  "


def _label(key: str) -> str:
    return _KEY_LABEL.get(key, key)


class KeyBar(Static):
    """One line of ``key Description`` pairs that fits; refreshed when bindings change."""

    DEFAULT_CSS = """
    KeyBar { dock: bottom; height: 1; background: $panel; color: $text; padding: 0 1; }
    """

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._changed)
        self._last: list[tuple[str, str]] = []

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _changed(self, _screen: object) -> None:
        items = self.items()
        if items != self._last:  # a focus change with the same keys: no repaint
            self._last = items
            self.refresh()

    def on_resize(self, _event: object) -> None:
        self.refresh()

    def items(self) -> list[tuple[str, str]]:
        """(key, description) of each shown, enabled binding, in the screen's order."""
        out: list[tuple[str, str]] = []
        seen: set[str] = set()
        for key, active in self.screen.active_bindings.items():
            binding = active.binding
            if not binding.show or not active.enabled or binding.action in seen:
                continue
            seen.add(binding.action)
            out.append((_label(binding.key_display or key), binding.description))
        keys = [i for i in out if i[0] not in ("?", "q")]
        quit_ = [i for i in out if i[0] == "q"]
        return keys + quit_ + [("?", "Keys")]

    def render(self) -> Text:
        width = max(10, self.size.width - 2)
        items = self.items()
        cut = -2 if len(items) > 1 and items[-2][0] == "q" else -1
        tail = items[cut:]  # "q Quit" and "? Keys" stay
        body = items[:cut]
        while body and _cell_len(body + tail) > width:
            body = body[:-1]
            tail = [*tail[:-1], ("?", "more")]
        text = Text(no_wrap=True, overflow="crop")
        for i, (key, what) in enumerate(body + tail):
            if i:
                text.append(_GAP)
            text.append(key, style="bold reverse")
            text.append(" " + what)
        return text


def _cell_len(items: list[tuple[str, str]]) -> int:
    return sum(len(k) + 1 + len(w) for k, w in items) + len(_GAP) * max(0, len(items) - 1)
