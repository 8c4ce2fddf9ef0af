"""JSON text of shardwise's payloads and records: one conversion to JSON's own types for every writer."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from shardwise.errors import SpecError


def dumps(payload: Any) -> str:
    """Stable, readable JSON of a payload a command prints (see `plain`)."""
    return json.dumps(plain(payload), indent=2, sort_keys=False, allow_nan=False)


def line(record: Any) -> str:
    """One JSON line of a record (a sweep's runs, a benchmark's levels), with the same conversions as `dumps`."""
    return json.dumps(plain(record), allow_nan=False)


def append_line(path: Path, record: Any) -> None:
    """Add `record` to a JSONL file as one line and make it durable before going on (a benchmark's level, a sweep's
    run: what Ctrl-C or a crash must not lose)."""
    try:
        with path.open("a", encoding="utf-8") as out:
            out.write(line(record) + "\n")
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        raise SpecError(
            f"cannot append to {path}: {exc.strerror or exc}; give a file in a folder you can write to"
        ) from exc


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
