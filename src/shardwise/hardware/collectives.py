"""Measured collective tables: nccl-tests and custom all-reduce timings of real GPU boxes.

Owns the schema of `data/hardware/collectives/*.yaml` and turning its published figures (a latency at a
size, or a bus bandwidth at a size) into times. Bus bandwidth follows nccl-tests: busbw = algbw × 2(n−1)/n
for all-reduce and × (n−1)/n for all-gather, reduce-scatter and all-to-all, with algbw = size / time.
"""

from __future__ import annotations

import itertools
from enum import Enum

from pydantic import Field, model_validator

from shardwise.frozen import Frozen
from shardwise.units import parse_quantity


class Collective(str, Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"


def bus_factor(op: Collective, n_gpus: int) -> float:
    """Bytes each GPU moves per byte of message, the nccl-tests bus-bandwidth factor."""
    if op is Collective.ALL_REDUCE:
        return 2 * (n_gpus - 1) / n_gpus
    if op is Collective.SEND_RECV:
        return 1.0
    return (n_gpus - 1) / n_gpus


def ring_steps(op: Collective, n_gpus: int) -> int:
    """Latency-bound steps of a ring algorithm: 2(n−1) for all-reduce, n−1 for the others, 1 for send/recv."""
    if op is Collective.ALL_REDUCE:
        return 2 * (n_gpus - 1)
    if op is Collective.SEND_RECV:
        return 1
    return n_gpus - 1


class Point(Frozen):
    size: str
    time: str | None = None
    busbw: str | None = None

    @model_validator(mode="after")
    def _one_measure(self) -> Point:
        if (self.time is None) == (self.busbw is None):
            raise ValueError("a point gives either a time or a busbw at its size")
        return self


class CollectiveCurve(Frozen):
    """One collective at one group size: measured points, and the best bus bandwidth seen."""

    op: Collective
    impl: str = Field(description="'nccl' or 'custom' (one-shot/two-shot custom all-reduce kernels)")
    gpus: int = Field(ge=2)
    points: tuple[Point, ...] = ()
    max_busbw: str | None = None
    source: str | None = None

    def measured(self) -> list[tuple[float, float]]:
        """(size_bytes, time_s) pairs, sorted by size."""
        factor = bus_factor(self.op, self.gpus)
        pairs = []
        for p in self.points:
            size = parse_quantity(p.size, dimension="bytes")
            if p.time is not None:
                time = parse_quantity(p.time, dimension="s")
            else:
                time = size * factor / parse_quantity(p.busbw or "", dimension="bytes_per_s")
            pairs.append((size, time))
        return sorted(pairs)

    def time_s(self, size_bytes: float, *, latency_floor_s: float) -> float:
        """Time for a message of `size_bytes`: linear between measured points (between two sizes a collective
        costs a latency plus size over bandwidth, which is affine in size), the smallest point's time below it
        (latency does not shrink), and bandwidth-limited growth past the largest.
        `latency_floor_s` stands in for the latency where the table has no small-message point."""
        pairs = self.measured()
        factor = bus_factor(self.op, self.gpus)
        if not pairs:
            return latency_floor_s + size_bytes * factor / self._max_busbw(None)
        if size_bytes <= pairs[0][0]:
            return pairs[0][1]
        for (s0, t0), (s1, t1) in itertools.pairwise(pairs):
            if size_bytes <= s1:
                return t0 + (size_bytes - s0) / (s1 - s0) * (t1 - t0)
        s_last, t_last = pairs[-1]
        return t_last + (size_bytes - s_last) * factor / self._max_busbw(pairs[-1])

    def _max_busbw(self, last: tuple[float, float] | None) -> float:
        if self.max_busbw:
            return parse_quantity(self.max_busbw, dimension="bytes_per_s")
        assert last is not None, "a curve without points must give max_busbw"
        return last[0] * bus_factor(self.op, self.gpus) / last[1]


class AppliesTo(Frozen):
    gpu_family: str
    link: str
    p2p: bool


class CollectiveTables(Frozen):
    """All measured curves of one kind of box."""

    name: str
    description: str
    applies_to: AppliesTo
    source: str
    tables: tuple[CollectiveCurve, ...]

    @model_validator(mode="after")
    def _curves_usable(self) -> CollectiveTables:
        for curve in self.tables:
            if not curve.points and not curve.max_busbw:
                raise ValueError(f"{curve.op.value} on {curve.gpus} GPUs has neither points nor max_busbw")
        return self

    def curve(self, op: Collective, n_gpus: int, impl: str) -> CollectiveCurve | None:
        return next((c for c in self.tables if c.op is op and c.gpus == n_gpus and c.impl == impl), None)
