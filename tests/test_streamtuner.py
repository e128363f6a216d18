"""The push's stream tuner on synthetic rate series (engine/streamtuner.py).

A simulated link: each 0.1 s sample adds ``rate(streams running)`` bytes; the streams
running follow the tuner's level after a delay (opening a channel costs round trips).
The end-to-end push that adapts is in tests/test_sync_adapt_sshd.py.
"""

from __future__ import annotations

from collections.abc import Callable

from remotemac.engine.streamtuner import HOLD_WINDOWS, StreamTuner, probe_cap

MB = 1e6


def drive(
    tuner: StreamTuner,
    rate: Callable[[int, float], float],
    seconds: float,
    left: float = 1e12,
    open_delay: float = 0.3,
) -> list[int]:
    """Feed ``tuner`` 0.1 s samples of a link whose rate is ``rate(streams, t)``; the
    streams running reach the level ``open_delay`` after it asks (retire: at once)."""
    t, sent, running = 0.0, 0.0, tuner.level
    asked_at: float | None = None
    levels = []
    while t < seconds:
        sent += rate(running, t) * 0.1
        left -= rate(running, t) * 0.1
        t = round(t + 0.1, 6)
        if running > tuner.level:
            running = tuner.level
        elif running < tuner.level:
            asked_at = t if asked_at is None else asked_at
            if t - asked_at >= open_delay:
                running, asked_at = tuner.level, None
        tuner.observe(t, int(sent), running, int(max(left, 0)))
        levels.append(tuner.level)
    return levels


def window_bound(per_stream: float, ceiling: float) -> Callable[[int, float], float]:
    """A link whose rate grows with the streams (each one window per round trip) up to
    ``ceiling`` (the link's rate, or the CPU the ends have)."""
    return lambda n, _t: min(n * per_stream, ceiling)


def test_the_rate_grows_with_the_streams_so_it_adds_them_up_to_the_cap():
    """A laptop and a Mac with cores of their own on a 150 ms, 125 MB/s link: each
    stream carries 7 MB/s; it adds until the cap."""
    tuner = StreamTuner(start=6, cap=14, rtt=0.15)
    drive(tuner, window_bound(7 * MB, 125 * MB), 20)
    assert tuner.level == 14
    assert [n for _, n in tuner.steps] == [6, 8, 10, 13, 14]
    assert tuner.summary() == "6→8→10→13→14"


def test_a_flat_rate_stops_the_adding_and_goes_back():
    """Both ends on two shared cores: 6 streams carry what 8 do (the CPU holds it):
    the probe to 8 is undone and, for the hold, not tried again."""
    tuner = StreamTuner(start=6, cap=14, rtt=0.08)
    levels = drive(tuner, window_bound(12 * MB, 60 * MB), 5)
    assert [n for _, n in tuner.steps] == [6, 8, 6]
    assert tuner.level == 6 and max(levels) == 8
    assert levels[-10:] == [6] * 10


def test_it_stops_where_the_link_is_full():
    """80 ms, 100 MB/s with the cores to spare: 12.8 MB/s per stream, so 8 streams fill
    the link; the probe to 10 gains nothing and is undone."""
    tuner = StreamTuner(start=6, cap=14, rtt=0.08)
    drive(tuner, window_bound(12.8 * MB, 100 * MB), 6)
    assert [n for _, n in tuner.steps] == [6, 8, 10, 8]
    assert tuner.level == 8


def test_it_drops_streams_when_the_rate_falls_after_an_add():
    """More streams make it slower (the host's threads wait for a core): back down."""

    def crowded(n: int, _t: float) -> float:
        return 58 * MB if n <= 5 else 50 * MB

    tuner = StreamTuner(start=5, cap=10, rtt=0.08)
    levels = drive(tuner, crowded, 4)
    assert [n for _, n in tuner.steps] == [5, 6, 5]
    assert levels[-1] == 5


def test_a_noisy_flat_rate_does_not_make_it_climb():
    """±4 % noise on a flat rate is not growth: it never keeps a probe."""
    noise = [1.04, 0.96, 1.02, 0.98, 1.03, 0.97]

    def flat(_n: int, t: float) -> float:
        return 60 * MB * noise[int(t * 10) % len(noise)]

    tuner = StreamTuner(start=6, cap=14, rtt=0.08)
    drive(tuner, flat, 30)
    counts = [n for _, n in tuner.steps]
    assert set(counts) == {6, 8} and len(counts) >= 3  # it probed, and again after a hold
    assert all(after == 6 for before, after in zip(counts, counts[1:], strict=False) if before == 8)


def test_after_the_hold_it_probes_again_and_takes_what_the_link_now_gives():
    """Hysteresis: an undone probe is not retried for HOLD_WINDOWS windows; then it is,
    and when the other tenants have gone (the rate now grows), it is kept."""

    def busy_then_idle(n: int, t: float) -> float:
        return min(n * 12 * MB, 60 * MB if t < 5 else 125 * MB)

    tuner = StreamTuner(start=6, cap=10, rtt=0.08)
    levels = drive(tuner, busy_then_idle, 15)
    counts = [n for _, n in tuner.steps]
    assert counts[:3] == [6, 8, 6] and tuner.steps[2][0] < 5
    undone_at, again_at = tuner.steps[2][0], tuner.steps[3][0]
    assert counts[3] == 8 and again_at - undone_at >= HOLD_WINDOWS * tuner.window_s
    assert levels[-1] == 10 and counts[-1] == 10


def test_never_below_the_floor_nor_above_the_cap_nor_what_the_host_opened():
    tuner = StreamTuner(start=0, cap=3, rtt=0.08)
    assert tuner.level == 1  # never below one
    tuner = StreamTuner(start=20, cap=14, rtt=0.08)
    assert tuner.level == 14
    tuner = StreamTuner(start=6, cap=14, rtt=0.15)
    tuner.refused(7)  # MaxSessions: the host opened seven
    drive(tuner, window_bound(7 * MB, 125 * MB), 20)
    assert tuner.level == 7 and max(n for _, n in tuner.steps) == 7
    tuner = StreamTuner(start=10, cap=14, rtt=0.08)
    tuner.refused(6)  # a second login refused: one connection's six
    assert tuner.level == 6


def test_no_probe_in_the_tail_of_the_push():
    """With little work left the streams run dry one by one and a rate means nothing:
    it keeps the level it has."""
    tuner = StreamTuner(start=6, cap=14, rtt=0.08)
    drive(tuner, window_bound(7 * MB, 125 * MB), 3, left=60 * MB)
    assert [n for _, n in tuner.steps] == [6]


def test_no_measurement_while_streams_open_or_retire():
    """A sample while the running streams differ from the level decides nothing."""
    tuner = StreamTuner(start=6, cap=14, rtt=0.08)
    for i in range(1, 40):
        tuner.observe(i * 0.1, i * 10**7, 5, 10**12)  # one of the six never came up
    assert tuner.steps == [(0.0, 6)]


def test_the_probe_cap_is_twice_the_window_count_within_the_hard_cap():
    assert probe_cap(5, 14) == 10
    assert probe_cap(10, 14) == 14
    assert probe_cap(3, 4) == 4
    assert probe_cap(0, 14) == 1
