"""Render engine events for a terminal (rich) or for scripts (JSON lines)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from remotemac.events import (
    ConnectionState,
    Event,
    LogLine,
    PhaseFinished,
    PhaseProgress,
    PhaseStarted,
    RunFinished,
    Warning,
)


class JsonRenderer:
    """One JSON object per event per line, on stdout."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout

    def __call__(self, event: Event) -> None:
        self.stream.write(event.to_json() + "\n")
        self.stream.flush()

    def close(self) -> None:
        return None


class RichRenderer:
    """Phases as lines with progress bars for transfers; the job's log as it comes."""

    def __init__(self, verbose: bool = False) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.console = Console(stderr=False, highlight=False)
        self.verbose = verbose
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), console=self.console, transient=True,
        )
        self._tasks: dict[str, Any] = {}
        self._started = False

    def __call__(self, event: Event) -> None:
        c = self.console
        if isinstance(event, PhaseStarted):
            c.print(f"[cyan]▶ {event.phase}[/]" + (f" {event.detail}" if event.detail else ""))
        elif isinstance(event, PhaseProgress) and event.unit in ("files", "runtime", "wheels") \
                and event.detail:
            c.print(f"[dim]  {event.detail}[/]")
        elif isinstance(event, PhaseProgress) and event.unit == "bytes" and event.total:
            if not self._started:
                self.progress.start()
                self._started = True
            task = self._tasks.get(event.phase)
            if task is None:
                task = self._tasks[event.phase] = self.progress.add_task(event.phase,
                                                                          total=event.total)
            self.progress.update(task, completed=event.done, total=event.total)
        elif isinstance(event, PhaseFinished):
            self._end_progress(event.phase)
            mark = "[dim]↷" if event.skipped else ("[green]✓" if event.ok else "[red]✗")
            c.print(f"{mark} {event.phase}[/]" + (f"  [dim]{event.detail}[/]" if event.detail else ""))
        elif isinstance(event, LogLine):
            c.print(f"[dim]{event.device} │[/] ", end="")
            c.out(event.line, highlight=False)
        elif isinstance(event, ConnectionState):
            extra = f" (attempt {event.attempt}, next in {event.next_in_s:.1f}s)" if event.next_in_s else ""
            c.print(f"[yellow]⚡ {event.host}: {event.state}{extra}[/] {event.detail}")
        elif isinstance(event, Warning):
            c.print(f"[yellow]warning:[/] {event.message}")
        elif isinstance(event, RunFinished):
            self._end_progress(None)
            colour = {"accepted": "green", "rejected": "red"}.get(event.verdict, "yellow")
            c.print(f"[bold {colour}]{event.verdict.upper()}[/] (exit {event.exit_code})  {event.detail}")

    def _end_progress(self, phase: str | None) -> None:
        if phase is not None and phase in self._tasks:
            self.progress.remove_task(self._tasks.pop(phase))
        if self._started and (phase is None or not self._tasks):
            self.progress.stop()
            self._started = False
            self._tasks.clear()

    def close(self) -> None:
        self._end_progress(None)
