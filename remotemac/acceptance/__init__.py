"""The acceptance record: compare outputs, judge the observations, write the verdict.

``compare`` needs numpy (and torch for .pt files); the rest is standard library,
so the names from ``compare`` are imported on first use only. ``decide`` (the
function) is not re-exported here: it would hide the ``decide`` submodule.
"""

from __future__ import annotations

from typing import Any

from remotemac.acceptance.decide import evaluate_observations, memory_stable
from remotemac.acceptance.markdown import render_markdown
from remotemac.acceptance.record import build_record, validate_record, write_record

_COMPARE_NAMES = ("CompareRule", "ComparisonResult", "compare_outputs")

__all__ = [
    "CompareRule",
    "ComparisonResult",
    "build_record",
    "compare_outputs",
    "evaluate_observations",
    "memory_stable",
    "render_markdown",
    "validate_record",
    "write_record",
]


def __getattr__(name: str) -> Any:
    if name in _COMPARE_NAMES:
        from remotemac.acceptance import compare

        return getattr(compare, name)
    raise AttributeError(f"module 'remotemac.acceptance' has no attribute {name!r}")
