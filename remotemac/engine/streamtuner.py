"""How many streams a push runs, adapted while it runs: add streams while the rate grows
with them, go back when it does not.

Why: the window arithmetic (sshd's 2 MiB window carries ~1 MiB per round trip per
channel) says how many channels fill a long fat link when the two ends have cores to
spare; it cannot say whether they do. Measured through the fault proxy at 80 ms,
100 MB/s, on a 2-core box where both ends share the cores: 5 streams 58.4 MB/s, the
window count of 10 53.9 MB/s (the host's threads waited for a core). A laptop and a
rented Mac have cores of their own, and there the window count is the cap. So the push
starts at one connection's worth, measures the rate, and probes upwards: a probe that
pays (the rate grows by a fair share of what the added windows could carry) is kept
and the next one tried; one that does not is undone, and the tuner holds for a while
(hysteresis) before it probes again.

A pure state machine fed (time, bytes sent, streams running, bytes left): it decides,
the session (engine/synctalk.py) opens or retires channels, so it is unit-tested on
synthetic rate series (tests/test_streamtuner.py).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

#: a level's rate is measured over at least this long, and this many round trips (a
#: half-second window through the fault proxy's 16 MB/s read 12.5 MB/s one time, 15.4
#: the next: too noisy to tell 6 streams from 8)
MIN_WINDOW_S = 0.8
WINDOW_RTTS = 8
#: after a change, the new streams' windows fill for this many round trips first
SETTLE_RTTS = 2
#: a probe pays when the rate grows by this share of what the added windows would add
#: if the window were the only limit (6 → 8 streams: +33 % possible, +11 % needed) ...
GAIN_SHARE = 1 / 3
#: ... and by this much at least (the noise of a half-second window on a busy machine)
MIN_GAIN = 0.06
#: after an undone probe, windows held at the kept level before probing again
HOLD_WINDOWS = 6
#: no probe unless the work left would keep the streams busy this long at the kept
#: rate, and four measuring windows: opening a second SSH connection took ~1 s on the
#: shared 2-core machine, and the probe must then settle and be measured
PROBE_WORK_S = 3.0


@dataclass
class StreamTuner:
    """The stream count for one push attempt: ``observe`` it, open or retire to ``level``.

    ``start``: the streams it begins with; ``cap``: never more (the window count, the
    files, the host's channels: :meth:`refused` lowers it when the host opened fewer);
    never fewer than ``floor``. ``rtt``: the measured round trip (sizes the windows).
    """

    start: int
    cap: int
    rtt: float
    floor: int = 1
    level: int = 0
    #: (seconds since the first sample, target) at every change: "streams 6→8→6"
    steps: list[tuple[float, int]] = field(default_factory=list)
    #: the rate measured at the kept level, and that level
    base_rate: float | None = None
    base_level: int = 0
    _t0: float | None = None
    _since: float | None = None  # when ``level``'s streams were all running (+ settle)
    #: (time, bytes) samples of the current measurement, the last window_s of them
    _samples: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)
    #: a probe's streams are opening: the kept level still runs alone, and its rate over
    #: the last window before they are up is the one the probe is judged against
    _extending: bool = False
    _hold_until: float = 0.0
    _done: bool = False
    _last_t: float = 0.0

    def __post_init__(self) -> None:
        self.cap = max(self.floor, self.cap)
        self.level = min(max(self.start, self.floor), self.cap)
        self.base_level = self.level
        self.steps = [(0.0, self.level)]

    @property
    def window_s(self) -> float:
        return max(MIN_WINDOW_S, WINDOW_RTTS * self.rtt)

    def step(self) -> int:
        """Streams one probe adds: a third more (6 → 8 → 10 → 13), at least one."""
        return max(1, self.level // 3)

    def refused(self, running: int) -> None:
        """The host opened only ``running`` of the streams asked for (MaxSessions, a
        refused second login): that is the cap from now on."""
        self.cap = max(self.floor, min(self.cap, running))
        if self.level > self.cap:
            self._set(self.cap, self._last_t)

    def observe(self, now: float, sent: int, running: int, left: int) -> int:
        """The streams wanted after this sample: ``sent`` bytes the host has taken so far,
        ``running`` streams taking work, ``left`` bytes not yet sent."""
        if self._t0 is None:
            self._t0 = now
        self._last_t = now
        if self._done:
            return self.level
        if running != self.level:  # opening or retiring: not yet measurable
            if self._extending and running == self.base_level:
                rate = self._add(now, sent, min_span=self.window_s / 2)
                self.base_rate = rate if rate is not None else self.base_rate
            else:
                self._extending = False
                self._samples.clear()
            self._since = None
            return self.level
        if self._since is None:
            self._extending = False
            self._samples.clear()
            # the first level warms up for a window (the first windows fill, the
            # readers start); a change settles for a few round trips
            first = len(self.steps) == 1 and self.base_rate is None
            self._since = now + (self.window_s if first else SETTLE_RTTS * self.rtt)
        if now < self._since:
            return self.level
        rate = self._add(now, sent, min_span=self.window_s)
        if rate is not None:
            self._judge(now, rate, left)
        return self.level

    def _add(self, now: float, sent: int, min_span: float) -> float | None:
        """Add a sample; the rate over the last window, once the samples span ``min_span``."""
        samples = self._samples
        samples.append((now, sent))
        while len(samples) > 2 and now - samples[1][0] >= self.window_s:
            samples.popleft()
        began, at = samples[0]
        if now - began < min_span:
            return None
        return (sent - at) / (now - began)

    def _judge(self, now: float, rate: float, left: int) -> None:
        if self.base_rate is None or self.level == self.base_level:
            # the kept level, (re)measured: probe upwards when it may pay
            self.base_rate, self.base_level = rate, self.level
            self._restart(now)
            if now >= self._hold_until:
                self._probe(now, rate, left)
            return
        added = self.level - self.base_level
        need = max(MIN_GAIN, GAIN_SHARE * added / self.base_level)
        if rate >= self.base_rate * (1 + need):
            self.base_rate, self.base_level = rate, self.level  # it paid: keep, go on
            self._restart(now)
            self._probe(now, rate, left)
        else:  # it did not: back to the kept level, and hold
            self._hold_until = now + HOLD_WINDOWS * self.window_s
            self._set(self.base_level, now)

    def _probe(self, now: float, rate: float, left: int) -> None:
        more = min(self.level + self.step(), self.cap)
        if more <= self.level:
            return
        # the work left must keep the probed count busy past its measurement
        if left < rate * max(PROBE_WORK_S, 4 * self.window_s):
            self._done = True  # the tail: streams run dry one by one, rates mean nothing
            return
        self._set(more, now)

    def _restart(self, now: float) -> None:
        """Measure the same level again from now (its last sample starts the window)."""
        last = self._samples[-1] if self._samples else None
        self._samples.clear()
        if last is not None:
            self._samples.append(last)
        self._since = now

    def _set(self, level: int, now: float) -> None:
        level = min(max(level, self.floor), self.cap)
        if level != self.level:
            probe = level > self.level == self.base_level
            self.level = level
            self.steps.append((round(now - (self._t0 or now), 3), level))
            self._extending = probe
        self._since = None

    def summary(self) -> str:
        """The counts it went through: ``6→8→6``."""
        return "→".join(str(n) for _, n in self.steps)


def probe_cap(window_count: int, hard_cap: int) -> int:
    """How far a push may probe: twice the window count (its 1 MiB per round trip per
    channel is a rule of thumb: 5 channels measured 91 % of it), within ``hard_cap``."""
    return max(1, min(hard_cap, 2 * window_count))
