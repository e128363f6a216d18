"""Typed events the engine emits; the CLI, the TUI and ``--json`` render them.

Events are plain dataclasses so that every front end gets the same facts, and
``to_json`` gives the one-object-per-line form scripts read.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Event:
    run_id: str
    ts: float = field(default_factory=time.time, kw_only=True)

    @property
    def kind(self) -> str:
        name = type(self).__name__
        return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["event"] = self.kind
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)


@dataclass
class PhaseStarted(Event):
    phase: str
    detail: str = ""


@dataclass
class PhaseProgress(Event):
    phase: str
    done: int
    total: int | None = None
    unit: str = "bytes"
    detail: str = ""


@dataclass
class PhaseFinished(Event):
    phase: str
    ok: bool = True
    skipped: bool = False
    detail: str = ""


@dataclass
class LogLine(Event):
    device: str
    line: str
    offset: int = 0


@dataclass
class Metric(Event):
    device: str
    name: str
    value: float


@dataclass
class ConnectionState(Event):
    """state: connected | disconnected | reconnecting | reconnected | lost.

    While reconnecting, ``deadline_left_s`` counts down to the moment the run stops
    locally (exit 3, the job keeps running) out of ``deadline_s`` (the reconnect
    deadline: ``--reconnect-deadline`` / ``connection.reconnect_deadline``).
    """

    host: str
    state: str
    attempt: int = 0
    next_in_s: float | None = None
    detail: str = ""
    deadline_left_s: float | None = None
    deadline_s: float | None = None


@dataclass
class Warning(Event):  # noqa: A001 - the event's name in the JSON stream
    message: str
    code: str = ""


@dataclass
class RunFinished(Event):
    verdict: str
    exit_code: int
    out_dir: str = ""
    detail: str = ""
    #: why a run that has a record was not accepted (its first stopping condition)
    reason: str = ""


Sink = Callable[[Event], None]


class EventBus:
    """Fan events out to subscribers (renderers, the journal, tests)."""

    def __init__(self) -> None:
        self._sinks: list[Sink] = []

    def subscribe(self, sink: Sink) -> None:
        self._sinks.append(sink)

    def emit(self, event: Event) -> None:
        for sink in list(self._sinks):
            sink(event)
