"""Sizes like ``2GiB`` and durations like ``2h``, as users write them in playbooks; and the
one timestamp form every record uses (``2026-05-01T12:00:00Z``)."""

from __future__ import annotations

import math
import re
import time

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_NUMBER = r"(\d+(?:\.\d+)?)"
#: Why caps: a playbook value past these is a typo (``1e29TiB``, ``.inf``) that would
#: otherwise overflow later (int(inf), asyncio timeouts) or never stop a job.
MAX_SIZE = 1024**5  # 1 PiB
MAX_DURATION = 366 * 86400.0  # a year
_MAX_DIGITS = 30  # longer numbers are typos, and parsing them is where the cost is


def _show(value: object) -> str:
    """A user's value for a one-line message: its repr, cut at 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_size(value: float, text: object) -> int:
    if value != value or value in (math.inf, -math.inf) or value > MAX_SIZE:
        raise ValueError(f"size {_show(text)} is out of range (at most 1 PiB)")
    if value < 0:
        raise ValueError("a size cannot be negative")
    return int(value)


def _as_float(value: int | float) -> float:
    """A YAML number as a float; an int too large for one becomes ±inf (refused later)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _check_duration(value: float, text: object) -> float:
    if math.isnan(value):
        raise ValueError(f"not a duration: {_show(text)} (write e.g. 90s, 30m, 2h)")
    if value <= 0:
        raise ValueError("a duration must be positive")
    if value > MAX_DURATION:
        raise ValueError(f"duration {_show(text)} is out of range (at most 366d)")
    return float(value)


def parse_size(value: object) -> int:
    """``2GiB`` → 2147483648; plain integers are bytes. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a size like 2GiB, got a boolean")
    if isinstance(value, int):
        return _check_size(value, value)
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return _check_size(value, value)
        raise ValueError(f"not a size: {_show(value)} (write e.g. 500MB, 2GiB or a byte count)")
    text = str(value).strip()
    match = re.fullmatch(_NUMBER + r"\s*([a-zA-Z]*)", text[:100])
    if len(text) > 100 or not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"not a size: {_show(text)} (write e.g. 500MB, 2GiB or a byte count)")
    if len(match.group(1)) > _MAX_DIGITS:
        raise ValueError(f"size {_show(text)} is out of range (at most 1 PiB)")
    return _check_size(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()], text)


def parse_duration(value: object) -> float:
    """``2h`` → 7200.0, ``90s``, ``1h30m``; plain numbers are seconds. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 2h, got a boolean")
    if isinstance(value, (int, float)):
        return _check_duration(_as_float(value), value)
    text = str(value).strip().lower()
    shown = _show(text)
    parts = re.findall(_NUMBER + r"\s*([a-z]*)", text[:200])
    if len(text) > 200 or not parts or re.sub(_NUMBER + r"\s*([a-z]*)", "", text).strip():
        raise ValueError(f"not a duration: {shown} (write e.g. 90s, 30m, 2h)")
    total = 0.0
    for number, unit in parts:
        if unit not in _DURATION_UNITS:
            raise ValueError(f"not a duration: {shown} (unknown unit {unit!r})")
        if len(number) > _MAX_DIGITS:
            raise ValueError(f"duration {shown} is out of range (at most 366d)")
        total += float(number) * _DURATION_UNITS[unit]
    return _check_duration(total, shown)


def format_size(n: int | float) -> str:
    """Human size with binary units, for tables and messages."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def iso_utc(ts: float) -> str:
    """A Unix time as the records write it: UTC, whole seconds, ``Z`` (never ``+00:00``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
