"""JSON text of shardwise's payloads and records: one conversion to JSON's own types for every writer."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


def dumps(payload: Any) -> str:
    """Stable, readable JSON of a payload a command prints (see `plain`)."""
    return json.dumps(plain(payload), indent=2, sort_keys=False, allow_nan=False)


def line(record: Any) -> str:
    """One JSON line of a record (a sweep's runs, a benchmark's levels), with the same conversions as `dumps`."""
    return json.dumps(plain(record), allow_nan=False)


def plain(value: Any) -> Any:
    """`value` in JSON's own types: NumPy scalars and arrays become Python numbers, booleans and lists (a NumPy
    bool or integer is not JSON-serializable, as a value or as a key), infinities and NaN become null (JSON has
    none), tuples lists."""
    if isinstance(value, np.generic):
        value = value.item()
    elif isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
