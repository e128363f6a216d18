"""The live log: batched writes, a line bound, follow that pauses on scroll-up, search.

Lines never arrive here one by one: the run screen calls :meth:`LogView.take`
every ~50 ms and everything that came in since is written with one
``write_lines`` call (one layout, one repaint), however many thousand lines that is.
"""

from __future__ import annotations

from rich.style import Style
from textual.strip import Strip
from textual.widgets import Log

from remotemac.tui.fit import matches
from remotemac.tui.model import LineStore, LogRecord
from remotemac.vocab import clock

MATCH_STYLE = Style(reverse=True, bold=True)


class LogView(Log):
    """``Log`` plus a cursor into a :class:`LineStore` and a highlighted search match."""

    def __init__(self, max_lines: int = 10_000, **kwargs) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, **kwargs)
        self.seen = 0  # how many lines of the store are taken
        self.dropped = 0  # lines pruned from the top by max_lines
        self.batches = 0
        self.match_line: int | None = None
        self.term = ""
        self.device: str | None = None  # show only this device's lines (None: all)
        self.pattern = ""  # the ``/`` filter: only lines holding these words
        self.compact = False  # narrow pane: no time column, the device tag only as wide as needed
        self.device_width = 3

    @property
    def following(self) -> bool:
        """At the bottom, so new lines scroll into view (scrolling up pauses this)."""
        return self.is_vertical_scroll_end or self.max_scroll_y == 0

    def take(self, store: LineStore) -> int:
        """Write every line of ``store`` not taken yet, in one batch; returns how many."""
        width = min(10, max((len(d) for d in store.devices), default=3))
        if self.compact and width != self.device_width:
            self.device_width = width
            self.redraw(store)  # a longer device name: every tag as wide as the new one
            return 0
        self.device_width = width
        lines = store.since(self.seen)
        self.seen = store.total
        if not lines:
            return 0
        batch = self._shown(lines)
        if not batch:
            return len(lines)
        batch = batch[-self.max_lines :] if self.max_lines else batch
        before = len(self.lines)
        self.write_lines(batch)
        pruned = before + len(batch) - len(self.lines)
        if pruned > 0:
            self.dropped += pruned
            if self.match_line is not None:
                self.match_line = self.match_line - pruned if self.match_line >= pruned else None
        self.batches += 1
        return len(lines)

    def _shown(self, records: list[LogRecord]) -> list[str]:
        return [
            self._line(r)
            for r in records
            if (self.device is None or r.device == self.device)
            and (not self.pattern or matches(self.pattern, (r.device, r.text)))
        ]

    def _line(self, r: LogRecord) -> str:
        if not self.compact:
            return r.render()
        when = f"{clock(r.ts)} " if r.ts is not None else ""  # no blank column for preloaded
        return f"{when}{r.device:<{self.device_width}} │ {r.text}"

    def show_device(self, device: str | None, store: LineStore) -> None:
        """Filter by device (None: every device): the view is redrawn from the store."""
        self.device = device
        self.redraw(store)

    def set_pattern(self, pattern: str, store: LineStore) -> None:
        """The ``/`` filter: only the lines holding every word (empty: all lines)."""
        if pattern != self.pattern:
            self.pattern = pattern
            self.redraw(store)

    def set_compact(self, compact: bool, store: LineStore) -> None:
        if compact != self.compact:
            self.compact = compact
            self.redraw(store)

    def redraw(self, store: LineStore) -> None:
        """Every held line again, as the filters and the width now say."""
        self.clear()
        self.match_line = None
        self.dropped = 0
        batch = self._shown(store.held())
        if batch:
            self.write_lines(batch[-self.max_lines :] if self.max_lines else batch)
        self.seen = store.total
        self.scroll_end(animate=False)

    # ------------------------------------------------------------ search

    def search(self, term: str, *, older: bool = True) -> int | None:
        """Jump to the next match of ``term`` (older = upwards); None if there is none."""
        if not term:
            return None
        if term != self.term:
            self.term, self.match_line = term, None
        lines = self.lines
        if older:
            start = (self.match_line if self.match_line is not None else len(lines)) - 1
            order = range(start, -1, -1)
        else:
            start = (self.match_line + 1) if self.match_line is not None else 0
            order = range(start, len(lines))
        needle = term.lower()
        for y in order:
            if needle in lines[y].lower():
                self._set_match(y)
                return y
        return None

    def clear_search(self) -> None:
        self.term = ""
        self._set_match(None)

    def follow(self) -> None:
        self.scroll_end(animate=False)

    def _set_match(self, y: int | None) -> None:
        self.match_line = y
        if y is not None:
            self.scroll_to(y=max(0, y - self.size.height // 2), animate=False)
        self.refresh()

    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        if self.match_line is not None and self.scroll_offset.y + y == self.match_line:
            strip = strip.apply_style(MATCH_STYLE)
        return strip
