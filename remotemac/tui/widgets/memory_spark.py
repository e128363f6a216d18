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

    def show(
        self,
        values: list[float],
        fallback_ops: list[str],
        *,
        device: str = "",
        record_peak: float | None = None,
    ) -> None:
        """Live samples of one side while it runs; the record's peak once it is written.

        The record's figure wins when there is one, so the gauge and the verdict
        panel never disagree, and a finished run shows its figure, not "—".
        """
        label = self.query_one("#mem-label", Label)
        spark = self.query_one("#mem-spark", Sparkline)
        if record_peak is not None:
            label.update(f"memory peak {human_bytes(record_peak)} (from the record)")
        elif values:
            who = f" {device}" if device else ""
            label.update(f"memory{who} {human_bytes(values[-1])} (peak {human_bytes(max(values))})")
        if values and list(spark.data or []) != values:
            spark.data = list(values)
        ops = ", ".join(fallback_ops) if fallback_ops else "none seen"
        self.query_one("#fallback-label", Label).update(f"fallback ops: {ops}")
