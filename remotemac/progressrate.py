"""Rate and time left of a transfer, from the progress events' own timestamps.

Why here and not in the engine: the engine emits data only (done, total, a
timestamp on every event); how fast that is and when it ends is the front end's
reading of it, shared by the CLI renderer and the TUI so both say the same.
Why smoothed: a pull of many small files and a link that stalls for a moment
make the instantaneous rate jump; an exponential average with a few seconds'
half-life keeps the ETA from flickering, and still follows a real change of pace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from remotemac.vocab import human_duration, human_rate, human_size

#: seconds after which an old rate sample counts half
HALF_LIFE_S = 3.0
#: samples closer together than this are folded into the next one (bursty events)
MIN_SAMPLE_S = 0.2


@dataclass
class RateMeter:
    """Smoothed units per second of one transfer; feed it ``(ts, done)`` as events come."""

    half_life_s: float = HALF_LIFE_S
    rate: float | None = None
    _last: tuple[float, int] | None = field(default=None, repr=False)

    def update(self, ts: float, done: int) -> None:
        if self._last is None or done < self._last[1]:  # the start, or the count went back
            self._last, self.rate = (ts, done), None
            return
        t0, d0 = self._last
        elapsed = ts - t0
        if elapsed <= 0 or (elapsed < MIN_SAMPLE_S and self.rate is not None):
            return  # too close to the last sample: it counts with the next one
        now = (done - d0) / elapsed
        if self.rate is None:
            self.rate = now
        else:
            weight = 1 - 0.5 ** (elapsed / self.half_life_s)
            self.rate += weight * (now - self.rate)
        self._last = (ts, done)

    def eta(self, done: int, total: int | None) -> float | None:
        """Seconds left at the smoothed rate (None while the rate is unknown)."""
        if not self.rate or total is None or self.rate <= 0:
            return None
        return max(0.0, (total - done) / self.rate)


def transfer_figures(done: int, total: int | None, rate: float | None, eta: float | None) -> str:
    """``412.0 MiB/1.0 GiB  85.2 MiB/s  ETA 7s``: at most 44 characters, for 80 columns."""
    parts = [f"{human_size(done)}/{human_size(total)}" if total else human_size(done)]
    if rate:
        parts.append(human_rate(rate))
    if eta is not None and total and done < total:
        parts.append(f"ETA {human_duration(eta)}")
    return "  ".join(parts)
