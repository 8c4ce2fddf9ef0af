"""Which ops take their time from measured kernel tables, and the lookup (hardware/kernel_tables.py reads them).

An op family is priced from tables where data/hardware/kernel_tables.yaml turns it on (`priced`): that choice
is made by `shardwise validate` against measurements, and stated in the README. Everything else, and any shape
no table holds, stays on the roofline.
"""

from __future__ import annotations

import math

from shardwise.cost.roofline import Measured
from shardwise.hardware.kernel_tables import (
    gemm_grid,
    gqa_decode_grid,
    mla_decode_grid,
    mla_prefill_grid,
    moe_curve,
    spec,
)
from shardwise.ops.types import Compute


class MeasuredKernels:
    """Measured times of one GPU's kernels as one engine release runs them."""

    def __init__(self, gpu: str, engine: str, release: str, *, enabled: bool = True) -> None:
        self.gpu, self.engine, self.release = gpu, engine, release
        self.families = set(spec().priced) if enabled else set()

    def time(self, op: Compute) -> Measured | None:
        if op.moe is not None and "moe" in self.families:
            curve = moe_curve(self.gpu, self.engine, self.release, op.moe)
            if curve is not None:
                seconds, beyond = curve.time_s(op.tokens)
                return Measured(seconds=seconds, source=curve.source, extrapolated=beyond, release=curve.release)
        if op.mla_decode is not None and "mla_decode" in self.families:
            grid = mla_decode_grid(self.gpu, self.engine, self.release, op.mla_decode)
            found = grid.time_s(op.tokens, op.context) if grid is not None else None
            if grid is not None and found is not None:
                return Measured(seconds=found[0], source=grid.source, extrapolated=found[1], release=grid.release)
        if op.mla_prefill is not None and "mla_prefill" in self.families:
            # the tables timed whole prompts; a later chunk of `new` tokens also attends to the `cached` ones before
            # it: timed as the whole prompt with as many query-key pairs, new × (cached + new / 2)
            new, cached = op.new_tokens, op.context - op.new_tokens
            same_pairs = math.sqrt(new * (2 * cached + new))
            grid = mla_prefill_grid(self.gpu, self.engine, self.release, op.mla_prefill)
            found = grid.time_s(op.tokens, same_pairs) if grid is not None else None
            if grid is not None and found is not None:
                return Measured(seconds=found[0], source=grid.source, extrapolated=found[1] or cached > 0,
                                release=grid.release)  # fmt: skip
        if op.gqa_decode is not None and "gqa_decode" in self.families:
            grid = gqa_decode_grid(self.gpu, self.engine, self.release, op.gqa_decode)
            found = grid.time_s(op.tokens, op.context) if grid is not None else None
            if grid is not None and found is not None:
                return Measured(seconds=found[0], source=grid.source, extrapolated=found[1], release=grid.release)
        if op.gemms and "gemm" in self.families:
            return self._gemms(op)
        return None

    def _gemms(self, op: Compute) -> Measured | None:
        """An op of one or more GEMMs (a fused one counted by its share): measured only if every one of them is;
        with several table releases or formats, the source named is the last GEMM's."""
        seconds, beyond, grid = 0.0, False, None
        for gemm in op.gemms:
            grid = gemm_grid(self.gpu, self.engine, self.release, gemm.weight_format)
            found = grid.time_s(op.tokens, gemm.n, gemm.k) if grid is not None else None
            if grid is None or found is None:
                return None
            seconds += found[0] * gemm.share
            beyond = beyond or found[1]
        assert grid is not None
        return Measured(
            seconds=seconds,
            source=grid.source,
            extrapolated=beyond,
            release=grid.release,
            untimed_kernels=op.untimed_kernels,
        )
