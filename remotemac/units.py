"""Sizes like ``2GiB`` and durations like ``2h``, as users write them in playbooks; and the
one timestamp form every record uses (``2026-05-01T12:00:00Z``)."""

from __future__ import annotations

import re
import time

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_NUMBER = r"(\d+(?:\.\d+)?)"


def parse_size(value: object) -> int:
    """``2GiB`` → 2147483648; plain integers are bytes. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a size like 2GiB, got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    text = str(value).strip()
    match = re.fullmatch(_NUMBER + r"\s*([a-zA-Z]*)", text)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r} (write e.g. 500MB, 2GiB or a byte count)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def parse_duration(value: object) -> float:
    """``2h`` → 7200.0, ``90s``, ``1h30m``; plain numbers are seconds. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 2h, got a boolean")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError("a duration must be positive")
        return float(value)
    text = str(value).strip().lower()
    parts = re.findall(_NUMBER + r"\s*([a-z]*)", text)
    if not parts or re.sub(_NUMBER + r"\s*([a-z]*)", "", text).strip():
        raise ValueError(f"not a duration: {value!r} (write e.g. 90s, 30m, 2h)")
    total = 0.0
    for number, unit in parts:
        if unit not in _DURATION_UNITS:
            raise ValueError(f"not a duration: {value!r} (unknown unit {unit!r})")
        total += float(number) * _DURATION_UNITS[unit]
    if total <= 0:
        raise ValueError("a duration must be positive")
    return total


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
