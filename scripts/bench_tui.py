"""Throughput of the TUI's log view: 50,000 lines streamed, key latency measured meanwhile.

Usage: python scripts/bench_tui.py [--lines 50000] [--burst 250] [--every-ms 25]

A producer feeds LogLine events through the same sink the engine's EventBus
calls (bursts of ``--burst`` lines every ``--every-ms``), while a key (``n``,
search-next on the run screen) is pressed every 100 ms; the time from the press
to the screen's handler running is the latency. Headless (no terminal), 140x40.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from remotemac.events import LogLine  # noqa: E402
from remotemac.settings import LocalSettings  # noqa: E402
from remotemac.tui.app import RemotemacApp  # noqa: E402
from remotemac.tui.model import RunLive  # noqa: E402
from remotemac.tui.screens.run import RunScreen  # noqa: E402
from remotemac.tui.widgets.log_view import LogView  # noqa: E402


class _NoRuns:
    def list_runs(self, limit: int = 200) -> list:
        return []

    def get_run(self, run_id: str) -> None:
        return None

    def phases(self, run_id: str) -> dict:
        return {}


async def bench(total: int, burst: int, every_ms: float) -> int:
    home = Path(tempfile.mkdtemp(prefix="rm-bench-"))
    app = RemotemacApp(
        LocalSettings.from_options(str(home)),
        journal=_NoRuns(),
        reattach=False,
        blink=False,
        out_root=home / "runs",
    )
    latencies: list[float] = []
    async with app.run_test(size=(140, 40)) as pilot:
        live = app.driver.lives["bench"] = RunLive("bench", host="local")
        app.open_run("bench")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RunScreen)
        log = screen.query_one("#log", LogView)
        handled: list[float] = []
        original = screen.action_next_match

        def timed(older: bool) -> None:
            handled.append(time.perf_counter())
            original(older)

        screen.action_next_match = timed  # type: ignore[method-assign]
        sink = app.driver.sink(live)
        done = asyncio.Event()

        async def produce() -> None:
            sent = 0
            while sent < total:
                for _ in range(min(burst, total - sent)):
                    sent += 1
                    sink(
                        LogLine(
                            "bench",
                            device="mps",
                            line=f"step {sent:06d} loss 0.{sent:05d}"
                            " lr 1e-4 throughput 1234.5 samples/s",
                        )
                    )
                await asyncio.sleep(every_ms / 1000)
            done.set()

        start = time.perf_counter()
        producer = asyncio.ensure_future(produce())
        while not done.is_set():
            before = len(handled)
            pressed = time.perf_counter()
            await pilot.press("n")
            while len(handled) == before:
                await asyncio.sleep(0.001)
            latencies.append((handled[-1] - pressed) * 1000)
            await asyncio.sleep(0.1)
        await producer
        streamed = time.perf_counter() - start
        while log.seen < live.lines.total:
            await asyncio.sleep(0.01)
        drained = time.perf_counter() - start
        last = log.lines[-1] if log.lines else ""
    lat = sorted(latencies)
    p95 = lat[int(0.95 * (len(lat) - 1))]
    print(f"lines streamed        {total:,} ({burst} every {every_ms:g} ms)")
    print(f"streaming time        {streamed:.2f} s  → {total / streamed:,.0f} lines/s offered")
    print(f"all lines in view at  {drained:.2f} s  ({total / drained:,.0f} lines/s)")
    print(f"log view batches      {log.batches} (≈{total / max(log.batches, 1):,.0f} lines each)")
    print(
        f"log view holds        {len(log.lines):,} lines (max_lines {log.max_lines:,}); "
        f"last: {last!r}"
    )
    print(f"key presses           {len(lat)}")
    print(
        f"key→handler latency   median {statistics.median(lat):.1f} ms, p95 {p95:.1f} ms, "
        f"max {lat[-1]:.1f} ms"
    )
    ok = lat[-1] < 100 and last.endswith(
        f"step {total:06d} loss 0.{total:05d} lr 1e-4 throughput 1234.5 samples/s"
    )
    print("result                " + ("OK: every key handled in < 100 ms" if ok else "SLOW"))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=50_000)
    ap.add_argument("--burst", type=int, default=250)
    ap.add_argument("--every-ms", type=float, default=25.0)
    args = ap.parse_args()
    return asyncio.run(bench(args.lines, args.burst, args.every_ms))


if __name__ == "__main__":
    sys.exit(main())
