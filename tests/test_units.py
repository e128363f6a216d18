import pytest

from remotemac.units import format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2GiB", 2 * 1024**3),
        ("500MB", 500 * 1000**2),
        ("1.5KiB", 1536),
        (4096, 4096),
        ("10", 10),
        ("3 mib", 3 * 1024**2),
        ("1TB", 10**12),
    ],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["2XB", "-1GB", "GiB", True, -5, "1.2.3MB"])
def test_bad_sizes(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2h", 7200),
        ("90s", 90),
        ("30m", 1800),
        ("1h30m", 5400),
        (12, 12),
        ("1d", 86400),
    ],
)
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["-3", 0, -1, "2 weeks", "h", "0s", False])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_format_size():
    assert format_size(2 * 1024**3) == "2.0 GiB"
    assert format_size(12) == "12 B"
