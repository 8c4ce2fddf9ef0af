"""Values made once and remembered by the objects they follow from: one table per kind of value, bounded.

A value is remembered under the ids of the objects it follows from (a model, a cluster, a flag table) and a key of
plain values; the objects are held beside it, so an id cannot name another object while its entry lives, and an entry
whose objects were replaced is made again. The least recently used entry goes first when a table is full.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from operator import is_
from typing import Any, TypeVar

T = TypeVar("T")


class Memo:
    """One table of remembered values, at most `limit` of them."""

    __slots__ = ("_table", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._table: OrderedDict[tuple, tuple[tuple[object, ...], Any]] = OrderedDict()

    def get(self, owners: tuple[object, ...], key: Hashable, make: Callable[[], T]) -> T:
        """What `make` gives for `key` and the objects `owners`, made once while remembered (on hot paths: a search
        asks a hundred thousand times)."""
        table = self._table
        if len(owners) == 1:  # the common case, spelled out
            full = (key, id(owners[0]))
            held = table.get(full)
            fresh = held is not None and held[0][0] is owners[0]
        else:
            full = (key, *map(id, owners))
            held = table.get(full)
            fresh = held is not None and all(map(is_, held[0], owners))
        if fresh:
            table.move_to_end(full)
            return held[1]  # type: ignore[index]
        if len(table) >= self.limit:
            table.popitem(last=False)
        value = make()
        table[full] = (owners, value)
        return value

    def __len__(self) -> int:
        return len(self._table)
