"""Render engine events for a terminal (rich) or for scripts (JSON lines), and the
small text layouts the CLI's tables share (fit to the terminal, never cut an id).

Every string that came from the job or the host is shown with its terminal
controls escaped (:mod:`remotemac.termsafe`) and its rich markup neutralised, so a
job cannot write the clipboard, clear the screen or break the renderer with a
stray ``[/]``. ``raw=True`` (``--raw``) passes the job's own log lines through as
they are, colours included.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
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
from remotemac.progressrate import RateMeter, transfer_figures
from remotemac.termsafe import escape_controls
from remotemac.vocab import human_duration, log_prefix


def shown(text: object) -> str:
    """Host- or job-supplied text as inert rich markup: controls escaped, ``[`` escaped."""
    from rich.markup import escape

    return escape(escape_controls(str(text)))


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

    def __init__(self, verbose: bool = False, raw: bool = False, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        # soft_wrap: the terminal wraps long lines; rich would cut a path or an id in two
        self.console = console or Console(stderr=False, highlight=False, soft_wrap=True)
        self.verbose = verbose
        self.raw = raw
        # done/total, smoothed rate and ETA come from the events' own timestamps
        # (progressrate), so a replayed or a remote stream of events reads the same;
        # phase (8) + bar (24) + figures (at most 44) and spaces fit in 80 columns
        self.progress = Progress(
            TextColumn("[bold]{task.description:<8}"),
            BarColumn(bar_width=24),
            TextColumn("{task.fields[figures]}"),
            console=self.console,
            transient=True,
        )
        self._tasks: dict[str, Any] = {}
        self._meters: dict[str, RateMeter] = {}
        self._started = False

    def __call__(self, event: Event) -> None:
        c = self.console
        if isinstance(event, PhaseStarted):
            c.print(
                f"[cyan]▶ {shown(event.phase)}[/]"
                + (f" {shown(event.detail)}" if event.detail else "")
            )
        elif (
            isinstance(event, PhaseProgress)
            and event.unit in ("files", "runtime", "wheels")
            and event.detail
        ):
            c.print(f"[dim]  {shown(event.detail)}[/]")
        elif isinstance(event, PhaseProgress) and event.unit == "bytes" and event.total:
            if not self._started:
                self.progress.start()
                self._started = True
            task = self._tasks.get(event.phase)
            if task is None:
                task = self._tasks[event.phase] = self.progress.add_task(
                    shown(event.phase), total=event.total, figures=""
                )
            meter = self._meters.setdefault(event.phase, RateMeter())
            meter.update(event.ts, event.done)
            figures = transfer_figures(
                event.done, event.total, meter.rate, meter.eta(event.done, event.total)
            )
            self.progress.update(task, completed=event.done, total=event.total, figures=figures)
        elif isinstance(event, PhaseFinished):
            self._end_progress(event.phase)
            mark = "[dim]↷" if event.skipped else ("[green]✓" if event.ok else "[red]✗")
            c.print(
                f"{mark} {shown(event.phase)}[/]"
                + (f"  [dim]{shown(event.detail)}[/]" if event.detail else "")
            )
        elif isinstance(event, LogLine):
            c.print(f"[dim]{shown(log_prefix(event.device))}[/]", end="")
            if self.raw:  # as the job wrote it: rich itself would drop BEL and friends
                c.file.write(event.line + "\n")
                c.file.flush()
            else:
                c.out(escape_controls(event.line), highlight=False)
        elif isinstance(event, ConnectionState):
            extra = (
                f" (attempt {event.attempt}, next in {event.next_in_s:.1f}s)"
                if event.next_in_s
                else ""
            )
            if event.deadline_left_s is not None:
                extra += f" · gives up in {event.deadline_left_s:.0f}s"
            c.print(
                f"[yellow]⚡ {shown(event.host)}: {shown(event.state)}{extra}[/] "
                f"{shown(event.detail)}"
            )
        elif isinstance(event, Warning):
            c.print(f"[yellow]warning:[/] {shown(event.message)}")
        elif isinstance(event, RunFinished):
            self._end_progress(None)
            colour = {"accepted": "green", "rejected": "red"}.get(event.verdict, "yellow")
            why = f": {shown(event.reason)}" if event.reason else ""
            c.print(
                f"[bold {colour}]{shown(event.verdict.upper())}[/] (exit {event.exit_code})"
                f"{why}  {shown(event.detail)}"
            )

    def _end_progress(self, phase: str | None) -> None:
        if phase is not None and phase in self._tasks:
            self.progress.remove_task(self._tasks.pop(phase))
            self._meters.pop(phase, None)
        if self._started and (phase is None or not self._tasks):
            self.progress.stop()
            self._started = False
            self._tasks.clear()
            self._meters.clear()

    def close(self) -> None:
        self._end_progress(None)


# ------------------------------------------------------------------ plain layouts


def width() -> int:
    """The terminal's width (``COLUMNS`` or 80 when output is not a terminal)."""
    return shutil.get_terminal_size((80, 24)).columns


def fit_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], columns: int | None = None
) -> list[str]:
    """Aligned columns when they fit in ``columns``; otherwise one block per row.

    The first column (a run id, a host, a path) is never cut: when the row does
    not fit, it gets a line of its own and the other cells follow below it as
    ``header: value`` pairs, wrapped at word boundaries.
    """
    import textwrap

    columns = columns or width()
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if sum(widths) + 2 * (len(widths) - 1) <= columns:
        fmt = "  ".join(f"{{:{w}}}" for w in widths)
        return [fmt.format(*headers).rstrip()] + [fmt.format(*r).rstrip() for r in cells]
    out: list[str] = []
    for r in cells:
        out.append(r[0])
        rest = "  ".join(f"{h}: {v}" for h, v in zip(headers[1:], r[1:], strict=True) if v)
        out += (
            textwrap.wrap(
                rest,
                columns - 2,
                initial_indent="  ",
                subsequent_indent="  ",
                break_long_words=False,
                break_on_hyphens=False,
            )
            or []
        )
    return out


@contextlib.contextmanager
def progress(
    what: str, after_s: float = 1.0, stream: TextIO | None = None
) -> Iterator[Callable[[], None]]:
    """Say what is going on (on stderr) when it takes longer than ``after_s``.

    On a terminal a spinner line counts the seconds and disappears at the end; in a
    pipe or a log file one line says what is running, so nothing is silent for long.
    Quick work prints nothing. The context gives a ``stop()`` to call before the
    work prints or asks something itself, so the spinner never mixes with it.
    """
    stream = stream or sys.stderr
    done = threading.Event()
    started = time.monotonic()
    tty = stream.isatty()

    def tick() -> None:
        if done.wait(after_s):
            return
        if not tty:
            stream.write(f"remotemac: {what}…\n")
            stream.flush()
            return
        frames = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
        i = 0
        while not done.wait(0.1):
            stream.write(
                f"\r{frames[i % len(frames)]} {what}… "
                f"{human_duration(time.monotonic() - started)}\x1b[K"
            )
            stream.flush()
            i += 1
        stream.write("\r\x1b[K")
        stream.flush()

    def stop() -> None:
        done.set()
        if thread.is_alive():
            thread.join(timeout=1.0)

    thread = threading.Thread(target=tick, name="progress", daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop()
