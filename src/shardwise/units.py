"""Units: the one place where "64 GB/s", "96 GiB" or "25 us" become SI floats, and back for people.

Inside shardwise every quantity is SI (bytes, bytes/s, seconds, FLOP/s, watts) and its name says so
(`memory_bytes`, `mem_bandwidth_bytes_per_s`). Data files state a value with its unit; this module
converts at that edge. Decimal prefixes are powers of 1000 (GB, TB/s), binary ones powers of 1024 (GiB);
"Gb/s" is bits, as network line rates are quoted.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Literal

from shardwise.errors import DataError

Dimension = Literal["bytes", "bytes_per_s", "s", "flop_per_s", "W", "Hz", "count"]

_DECIMAL = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}


def _unit_table() -> dict[str, tuple[Dimension, float]]:
    table: dict[str, tuple[Dimension, float]] = {}
    for prefix, factor in {**_DECIMAL, **_BINARY}.items():
        table[f"{prefix}B"] = ("bytes", factor)
        table[f"{prefix}B/s"] = ("bytes_per_s", factor)
        table[f"{prefix}b/s"] = ("bytes_per_s", factor / 8)  # line rates are in bits
    for prefix, factor in _DECIMAL.items():
        table[f"{prefix}FLOPS"] = ("flop_per_s", factor)
        table[f"{prefix}OPS"] = ("flop_per_s", factor)  # integer tensor ops, counted like FLOPs
        table[f"{prefix}W"] = ("W", factor)
        table[f"{prefix}Hz"] = ("Hz", factor)
    table.update(
        {
            "kW": ("W", 1e3),  # the SI spelling (the prefix table writes K, as in KB)
            "s": ("s", 1.0),
            "ms": ("s", 1e-3),
            "us": ("s", 1e-6),
            "µs": ("s", 1e-6),
            "ns": ("s", 1e-9),
            "count": ("count", 1.0),
        }
    )
    return table


UNITS = _unit_table()
_QUANTITY = re.compile(r"^\s*([-+]?\d[\d_,]*\.?\d*(?:[eE][-+]?\d+)?)\s*([A-Za-zµ/]*)\s*$")


def to_si(value: float, unit: str, *, dimension: Dimension) -> float:
    """Convert `value` in `unit` to SI, checking that the unit measures `dimension`."""
    if unit not in UNITS:
        raise DataError(f"unknown unit {unit!r}; expected one of {', '.join(_units_of(dimension))}")
    unit_dimension, factor = UNITS[unit]
    if unit_dimension != dimension:
        raise DataError(
            f"unit {unit!r} measures {unit_dimension}, not {dimension}; "
            f"expected one of {', '.join(_units_of(dimension))}"
        )
    return float(value) * factor


def parse_quantity(text: str, *, dimension: Dimension) -> float:
    """Parse "64 GB/s", "96 GiB", "25 us" or "1,024" into an SI float of the given dimension."""
    return _parse(str(text), dimension)


@lru_cache(maxsize=4096)
def _parse(text: str, dimension: Dimension) -> float:
    match = _QUANTITY.match(text)
    if match is None:
        raise DataError(f"cannot read {text!r} as a quantity; write a number and a unit, e.g. '64 GB/s'")
    number = float(match.group(1).replace(",", "").replace("_", ""))
    unit = match.group(2) or "count"
    return to_si(number, unit, dimension=dimension)


def _units_of(dimension: Dimension) -> list[str]:
    return [name for name, (dim, _) in UNITS.items() if dim == dimension][:8]


def format_bytes(value_bytes: float, *, binary: bool = False) -> str:
    """Bytes for people: decimal units (checkpoints, GB sold) or binary ones (message sizes, GiB visible)."""
    steps = (
        (("Ti", 2.0**40), ("Gi", 2.0**30), ("Mi", 2.0**20), ("Ki", 2.0**10))
        if binary
        else (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3))
    )
    for prefix, factor in steps:
        if abs(value_bytes) >= factor:
            number = value_bytes / factor
            return f"{number:.0f} {prefix}B" if binary and number == int(number) else f"{number:.1f} {prefix}B"
    return f"{value_bytes:.0f} B"


def format_count(value: float) -> str:
    """Large counts (parameters) as 1,026.4B, 31.7B, 151.0M."""
    for suffix, factor in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= factor:
            return f"{value / factor:,.1f}{suffix}"
    return f"{value:.0f}"


def format_rate(bytes_per_s: float) -> str:
    """Bandwidth for people: GB/s below 1 TB/s, TB/s above."""
    if bytes_per_s >= 1e12:
        return f"{bytes_per_s / 1e12:.2f} TB/s"
    return f"{bytes_per_s / 1e9:.1f} GB/s"


def format_time(seconds: float) -> str:
    """Durations for people: µs, ms or s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
