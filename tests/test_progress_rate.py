"""Transfer progress shows done/total, a smoothed rate and an ETA, in 80 columns (issue 19).

The clock is the events' own ``ts`` (a fake one here): the front ends read rate and
time left from the engine's data, so these tests need no sleeping and no terminal.
"""

from __future__ import annotations

import io

from rich.console import Console

from remotemac.events import PhaseProgress
from remotemac.progressrate import RateMeter, transfer_figures
from remotemac.render import RichRenderer
from remotemac.tui.model import PhaseState
from remotemac.tui.widgets.phase_timeline import PhaseTimeline

MIB = 1 << 20


def events(phase: str, total: int, per_s: float, seconds: int, t0: float = 1000.0):
    """One PhaseProgress every 0.5 s of a transfer going at ``per_s`` bytes/s."""
    for i in range(2 * seconds + 1):
        t = t0 + i / 2
        yield PhaseProgress("r", phase=phase, done=int((t - t0) * per_s), total=total, ts=t)


def test_rate_and_eta_follow_the_event_clock():
    meter = RateMeter()
    for e in events("pull", 1000 * MIB, 50 * MIB, 10):
        meter.update(e.ts, e.done)
    assert meter.rate is not None and abs(meter.rate - 50 * MIB) < 0.01 * MIB
    assert abs(meter.eta(500 * MIB, 1000 * MIB) - 10.0) < 0.1


def test_rate_is_smoothed_through_a_stall_and_bursts():
    meter = RateMeter()
    meter.update(0.0, 0)
    meter.update(5.0, 500 * MIB)  # 100 MiB/s
    meter.update(6.0, 500 * MIB)  # a one-second stall
    assert 40 * MIB < meter.rate < 100 * MIB  # slowed down, not dropped to zero
    meter.update(6.05, 600 * MIB)  # a burst 50 ms later counts with the next sample
    assert meter.rate < 100 * MIB
    meter.update(7.0, 700 * MIB)
    assert meter.rate > 60 * MIB
    meter.update(8.0, 0)  # a new transfer in the same phase: start over
    assert meter.rate is None and meter.eta(0, 100) is None


def test_figures_fit_44_columns():
    text = transfer_figures(1023 * MIB, 1024 * MIB * 1024, 999.9 * MIB, 3 * 86400.0)
    assert len(text) <= 44 and "ETA" in text and "/s" in text
    assert "ETA" not in transfer_figures(10, 10, 5.0, 0.0)  # done: no ETA


def rendered(renderer: RichRenderer) -> list[str]:
    out = Console(file=io.StringIO(), width=80, record=True, color_system=None)
    out.print(renderer.progress.get_renderable())
    return out.export_text().splitlines()


def test_cli_shows_done_total_rate_and_eta_in_80_columns():
    console = Console(file=io.StringIO(), width=80, color_system=None)
    renderer = RichRenderer(console=console)
    try:
        for e in events("pull", 1024 * MIB, 64 * MIB, 6):
            renderer(e)
        lines = [line for line in rendered(renderer) if line.strip()]
    finally:
        renderer.close()
    [line] = lines
    assert line.startswith("pull") and len(line) <= 80, line
    assert "384.0 MiB/1.0 GiB" in line and "64.0 MiB/s" in line and "ETA 10s" in line, line


def test_tui_timeline_shows_rate_and_eta_while_running():
    row = PhaseState("sync", state="running")
    for e in events("sync", 1024 * MIB, 64 * MIB, 6):
        row.progress(e)
    figures = PhaseTimeline._figures(row)
    assert "384.0 MiB/1.0 GiB" in figures and "64.0 MiB/s" in figures and "ETA 10s" in figures
    row.state = "done"
    assert "ETA" not in PhaseTimeline._figures(row)
