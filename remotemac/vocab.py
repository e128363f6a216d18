"""The words and figures both front ends show: sizes, durations, times and state names.

The CLI and the TUI import their formatters from here (and nothing else), so a
run that is ``running`` in ``remotemac status`` is ``running`` in the TUI, an age
reads ``1h05m`` in both, and a size reads ``306.2 MiB`` everywhere. No rich,
click or textual here: the engine may use it too.
"""

from __future__ import annotations

import time

from remotemac.units import format_size

# ------------------------------------------------------------------ states

# A run's state as the journal stores it → the one word users see.
RUN_STATES: dict[str, str] = {
    "created": "created",  # registered, nothing done yet
    "running": "running",  # a remotemac process is driving it
    "detached": "detached",  # launched with --detach: the host runs it, nobody follows
    "interrupted": "interrupted",  # the follower stopped (Ctrl-C, quit): the host runs on
    "finished": "finished",  # the pipeline ended; see the verdict
    "failed": "failed",  # the pipeline stopped on an error
    "lost": "lost",  # the job vanished on the host
}
ATTACHED = "attached"  # the TUI drives it right now (a TUI-only fact, one word for it)

# A phase's state as the journal stores it (or the TUI folds from events) → its word.
PHASE_STATES: dict[str, str] = {
    "pending": "pending",
    "started": "running",
    "running": "running",
    "done": "done",
    "failed": "failed",
    "interrupted": "interrupted",  # Ctrl-C here; the host's part goes on
    "skipped": "skipped",
}
LIVE_RUN_STATES = ("created", "running", "detached", "interrupted")


def run_word(state: str | None, *, attached: bool = False) -> str:
    """The word for a run's journal state (``attached`` when a TUI drives it)."""
    if attached:
        return ATTACHED
    return RUN_STATES.get(state or "", state or "unknown")


def phase_word(state: str | None) -> str:
    return PHASE_STATES.get(state or "", state or "pending")


# ------------------------------------------------------------------ figures

DASH = "—"


def human_size(n: float | None) -> str:
    """``321454080`` → ``306.6 MiB``; ``None`` → ``—``."""
    return DASH if n is None else format_size(n)


def human_rate(rate: float | None, unit: str = "bytes") -> str:
    """Bytes per second as ``12.0 MiB/s``; other units as ``1,200 lines/s``."""
    if not rate:
        return ""
    if unit == "bytes":
        return f"{human_size(rate)}/s"
    return f"{rate:,.0f} {unit}/s"


def human_duration(seconds: float | None) -> str:
    """One duration format everywhere: ``0.4s``, ``12s``, ``1m55s``, ``2h05m``, ``3d04h``."""
    if seconds is None:
        return DASH
    if seconds < 10 and seconds != int(seconds):
        return f"{max(0.0, seconds):.1f}s"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def human_age(seconds: float) -> str:
    """How long ago, in the duration format (whole seconds)."""
    return human_duration(float(int(max(0.0, seconds))))


def human_time(ts: float | None) -> str:
    """One time format everywhere: UTC, to the second, ``2026-11-30 15:21:03Z``."""
    if ts is None:
        return DASH
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def clock(ts: float) -> str:
    """The time of day of a log line, UTC: ``15:21:03``."""
    return time.strftime("%H:%M:%S", time.gmtime(ts))


DEVICE_WIDTH = 10  # "cpu-target": labels up to this long line up without knowing them all


def log_prefix(device: str, width: int = DEVICE_WIDTH) -> str:
    """``cpu        │ `` : the device column of a log line, the same width for every device."""
    return f"{device:<{width}} │ "
