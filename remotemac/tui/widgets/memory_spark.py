"""Memory sparkline from Metric events, and the MPS fallback ops seen so far."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline

from remotemac.tui.model import human_bytes


class MemorySpark(Vertical):
    """Peak RSS per sample as a sparkline, its last value, and fallback ops as found."""

    def compose(self) -> ComposeResult:
        yield Label("memory —", id="mem-label")
        yield Sparkline([], id="mem-spark")
        yield Label("fallback ops: none seen", id="fallback-label")

    def show(self, values: list[float], fallback_ops: list[str]) -> None:
        label = self.query_one("#mem-label", Label)
        spark = self.query_one("#mem-spark", Sparkline)
        if values:
            label.update(f"memory {human_bytes(values[-1])} (peak {human_bytes(max(values))})")
            if list(spark.data or []) != values:
                spark.data = list(values)
        ops = ", ".join(fallback_ops) if fallback_ops else "none seen"
        self.query_one("#fallback-label", Label).update(f"fallback ops: {ops}")
