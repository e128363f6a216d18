"""Throughput of the TUI's log view: 50,000 lines streamed, key latency measured meanwhile;
then what the TUI costs in a real terminal: idle on a finished run, and streaming.

Usage: python scripts/bench_tui.py [--lines 50000] [--burst 250] [--every-ms 25] [--idle-s 30]

A producer feeds LogLine events through the same sink the engine's EventBus
calls (bursts of ``--burst`` lines every ``--every-ms``), while a key (``n``,
search-next on the run screen) is pressed every 100 ms; the time from the press
to the screen's handler running is the latency. Headless (no terminal), 140x40.

The terminal part runs the app in a real tmux pane at 120x40 (its own server,
``pipe-pane`` counting every byte the app writes to the terminal) and reads the
app's CPU seconds from /proc: over ``--idle-s`` seconds on a finished run's screen
(goal: under 0.3 s and 20 KB), and while ``--lines`` lines stream into a live run
until the last is in view. The machine is shared: the load average is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
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
        live.active = True  # driven here: the screen flushes lines as they come
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


ROOT = Path(__file__).resolve().parent.parent


class _Pane:
    """The app in a tmux pane of its own server; every byte it writes counted."""

    def __init__(self, *scene: str) -> None:
        self.socket = f"rm-bench-{os.getpid()}-{time.monotonic_ns()}"
        self.out = Path(tempfile.mkdtemp(prefix="rm-bench-pane-")) / "bytes"
        self.out.touch()
        env = dict(os.environ, LANG="C.UTF-8", PYTHONPATH=str(ROOT))
        cmd = f"cd {ROOT} && exec {sys.executable} -m tests.tuiscene " + " ".join(scene)
        self._tmux("new-session", "-d", "-x", "120", "-y", "40", cmd, env=env)
        self._tmux("pipe-pane", "-o", "-t", "0", f"cat >> {self.out}")
        self.pid = int(self._tmux("list-panes", "-F", "#{pane_pid}").split()[0])

    def _tmux(self, *args: str, env: dict | None = None) -> str:
        cmd = ["tmux", "-u", "-L", self.socket, *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout

    def text(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "0")

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def written(self) -> int:
        return self.out.stat().st_size

    def until(self, needle: str, timeout: float) -> float:
        start = time.monotonic()
        while needle not in self.text():
            if time.monotonic() - start > timeout:
                raise SystemExit(f"bench: {needle!r} never showed in the pane")
            time.sleep(0.05)
        return time.monotonic() - start

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def terminal(idle_s: float, lines: int) -> int:
    """Idle on a finished run, then streaming, each in a real tmux pane at 120x40."""
    scene = tempfile.mkdtemp(prefix="rm-bench-scene-")
    pane = _Pane("finished", scene)
    try:
        pane.until("241 lines", 60)
        time.sleep(1.0)  # the first paint and the loads are done
        cpu0, bytes0 = pane.cpu_s(), pane.written()
        time.sleep(idle_s)
        idle_cpu, idle_bytes = pane.cpu_s() - cpu0, pane.written() - bytes0
    finally:
        pane.close()
    pane = _Pane("stream", scene, str(lines))
    try:
        cpu0, bytes0 = pane.cpu_s(), pane.written()
        took = pane.until(f"{lines:,} lines", 600)
        stream_cpu, stream_bytes = pane.cpu_s() - cpu0, pane.written() - bytes0
    finally:
        pane.close()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"terminal (tmux 120x40; machine shared with other work, load {load}):")
    print(
        f"idle {idle_s:g} s on a finished run  {idle_cpu:.2f} s CPU, {idle_bytes / 1024:.1f} KB "
        f"written (goal < 0.3 s, < 20 KB)"
    )
    print(
        f"streaming {lines:,} lines        {took:.1f} s, {stream_cpu:.2f} s CPU, "
        f"{stream_bytes / 1024:.0f} KB written ({stream_bytes / lines:.0f} B a line)"
    )
    ok = idle_cpu < 0.3 and idle_bytes < 20 * 1024
    print("result                " + ("OK: idle is idle" if ok else "BUSY WHEN IDLE"))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=50_000)
    ap.add_argument("--burst", type=int, default=250)
    ap.add_argument("--every-ms", type=float, default=25.0)
    ap.add_argument("--idle-s", type=float, default=30.0)
    ap.add_argument("--no-terminal", action="store_true", help="the headless part only")
    args = ap.parse_args()
    code = asyncio.run(bench(args.lines, args.burst, args.every_ms))
    if not args.no_terminal:
        code |= terminal(args.idle_s, args.lines)
    return code


if __name__ == "__main__":
    sys.exit(main())
