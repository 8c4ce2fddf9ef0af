"""Serving figures at a fixed concurrency, from step times: the steady state of a closed loop.

C clients each send a request of `isl` prompt tokens and wait for `osl` output tokens, then send the next
(what `sglang.bench_serving --max-concurrency C` and `vllm bench serve --max-concurrency C` do). At most
`running` of them decode at once: the KV pool and the engine's request slots cap it, the rest queue. Each
decode step gives every running request one token at the mean context isl + osl/2; every request also
needs its prefill, which the engine runs between decode steps in chunks of its prefill budget, so
in steady state each decode step carries running/osl prefills on top:

    time per token   = decode_cycle + running × prefill_per_request / osl
    output_tok_s     = running / time per token
    TPOT             = time per token (the benchmark's (e2e − ttft)/(osl − 1) sees the prefills between tokens)
    e2e (closed loop)= C × osl / output_tok_s,   TTFT = e2e − (osl − 1) × TPOT  (≥ one prefill)

With pipeline parallelism the running requests split into up to `pp` micro-batches that are in different
stages at once; a token then takes the longer of one micro-batch's trip through every stage and the time
the busiest stage needs for all micro-batches. The simulation (serve/simulate) refines all of this with
arrivals, queueing and chunk scheduling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from shardwise.cost.memory import MemoryLedger
from shardwise.cost.step import StepCost, StepCostModel
from shardwise.engines.layout import Layout
from shardwise.ops.build import StepModel
from shardwise.ops.types import Phase
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class Prediction:
    concurrency: int
    running: int  # requests decoding at once
    output_tok_s: float
    per_user_tok_s: float  # decode speed one client sees: 1 / TPOT
    tpot_s: float
    ttft_s: float
    bound: str  # compute | memory | comm | launch | host | pipeline | prefill, or kv_capacity when queueing
    decode: StepCost  # one decode step (one micro-batch with PP)
    cycle_s: float  # time per output token of every running request, prefills excluded
    prefill_per_token_s: float  # prefill time each decode step carries
    breakdown_s: dict[str, float] = field(default_factory=dict)  # parts of one token's time: sums to tpot_s


class Predictor:
    """Serving predictions for one layout on one cluster (build once, ask for many concurrencies)."""

    def __init__(self, model: ModelSpec, layout: Layout, cluster: ClusterSpec, memory: MemoryLedger) -> None:
        self.layout, self.memory = layout, memory
        self.costs = StepCostModel(StepModel(model, layout, cluster))
        self.chunk = layout.options.chunked_prefill_tokens or 8192
        self._prefills: dict[tuple[int, int], float] = {}

    def predict(self, *, concurrency: int, isl: int, osl: int) -> Prediction:
        cap = self.memory.max_concurrency(isl=isl, osl=osl)
        if cap < 1:
            raise ValueError(f"no request of {isl} + {osl} tokens fits: memory verdict {self.memory.verdict}")
        running = min(concurrency, cap)
        cycle, decode, parts = self._decode_cycle(running, context=isl + osl // 2)
        per_request, alone = self._prefill(isl, running)
        prefill_per_token = running * per_request / osl
        tpot = cycle + prefill_per_token
        throughput = running / tpot
        e2e = concurrency * osl / throughput
        ttft = max(alone, e2e - (osl - 1) * tpot)
        breakdown = {**parts, "prefill": prefill_per_token}
        bound = max(breakdown, key=breakdown.__getitem__)
        return Prediction(
            concurrency=concurrency, running=running, output_tok_s=throughput, per_user_tok_s=1.0 / tpot,
            tpot_s=tpot, ttft_s=ttft, bound="kv_capacity" if concurrency > cap else bound, decode=decode,
            cycle_s=cycle, prefill_per_token_s=prefill_per_token, breakdown_s=breakdown,
        )  # fmt: skip

    def sweep(self, concurrencies: Sequence[int], *, isl: int, osl: int) -> list[Prediction]:
        return [self.predict(concurrency=c, isl=isl, osl=osl) for c in concurrencies]

    def _decode_cycle(self, running: int, *, context: int) -> tuple[float, StepCost, dict[str, float]]:
        """Time for every running request to gain one token, the step behind it, and its parts."""
        pp = self.layout.pp
        micro = min(pp, running)
        step = self.costs.step(phase=Phase.DECODE, requests=math.ceil(running / micro), context_tokens=context)
        through = step.time_s  # one micro-batch through every stage
        busiest = micro * max(s.time_s for s in step.stages)  # the slowest stage serves every micro-batch
        cycle = max(through, busiest)
        parts = dict(step.parts_s)
        if pp > 1:  # per-GPU view: the parts of one trip, the rest of the cycle waiting on the pipeline
            parts["pipeline"] = max(0.0, cycle - through)
        return cycle, step, parts

    def _prefill(self, isl: int, running: int) -> tuple[float, float]:
        """(prefill time per request when prefills are batched up to the chunk, one request's prefill alone)."""
        alone = self._prefill_batch(1, isl)
        together = max(1, min(running, self.chunk // max(1, isl)))
        return self._prefill_batch(together, isl) / together, alone

    def _prefill_batch(self, requests: int, isl: int) -> float:
        key = (requests, isl)
        if key not in self._prefills:
            self._prefills[key] = self._prefill_chunks(requests, isl)
        return self._prefills[key]

    def _prefill_chunks(self, requests: int, isl: int) -> float:
        total, done = 0.0, 0
        per_chunk = max(1, self.chunk // requests)
        while done < isl:
            new = min(per_chunk, isl - done)
            total += self.costs.step(phase=Phase.PREFILL, requests=requests, new_tokens=new, context_tokens=done).time_s
            done += new
        return total


def predict(
    model: ModelSpec,
    layout: Layout,
    cluster: ClusterSpec,
    memory: MemoryLedger,
    *,
    concurrency: Sequence[int],
    isl: int,
    osl: int,
) -> list[Prediction]:
    """Predicted serving figures of `layout` at each concurrency, for requests of isl in / osl out."""
    return Predictor(model, layout, cluster, memory).sweep(concurrency, isl=isl, osl=osl)
