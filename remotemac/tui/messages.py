"""Messages the run driver posts to the app (the engine itself knows nothing of Textual)."""

from __future__ import annotations

from textual.message import Message

from remotemac.events import Event


class RunUpdated(Message):
    """A run's live state changed (any event but log lines, which are batched)."""

    def __init__(self, run_id: str, event: Event | None = None) -> None:
        super().__init__()
        self.run_id = run_id
        self.event = event


class RunEnded(Message):
    """The worker driving a run (or one phase of it) is over."""

    def __init__(
        self, run_id: str, exit_code: int | None, error: str | None = None, what: str = "run"
    ) -> None:
        super().__init__()
        self.run_id = run_id
        self.exit_code = exit_code
        self.error = error
        self.what = what
