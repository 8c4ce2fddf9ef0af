import pytest

from shardwise.errors import DataError
from shardwise.units import format_bytes, format_count, format_time, parse_quantity, to_si


@pytest.mark.parametrize(
    "text, dimension, expected",
    [
        ("64 GB/s", "bytes_per_s", 64e9),
        ("400 Gb/s", "bytes_per_s", 50e9),
        ("96 GiB", "bytes", 96 * 2**30),
        ("97,887 MiB", "bytes", 97887 * 2**20),
        ("25 us", "s", 25e-6),
        ("25µs", "s", 25e-6),
        ("467.8 TFLOPS", "flop_per_s", 467.8e12),
        ("600 W", "W", 600.0),
        ("1e3 B", "bytes", 1000.0),
    ],
)
def test_parse(text, dimension, expected):
    assert parse_quantity(text, dimension=dimension) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text, dimension, message",
    [
        ("64 GB/s", "bytes", "measures bytes_per_s"),
        ("fast", "bytes", "cannot read"),
        ("3 parsecs", "s", "unknown unit"),
    ],
)
def test_bad_quantities(text, dimension, message):
    with pytest.raises(DataError, match=message):
        parse_quantity(text, dimension=dimension)


def test_to_si_and_formatting():
    assert to_si(1.49, "TB/s", dimension="bytes_per_s") == pytest.approx(1.49e12)
    assert format_bytes(594.2e9) == "594.2 GB"
    assert format_bytes(16 * 2**10, binary=True) == "16 KiB"
    assert format_count(1_026_400_000_000) == "1,026.4B"
    assert format_time(25e-6) == "25.0 µs"
