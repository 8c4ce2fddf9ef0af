"""Serving figures at a fixed concurrency, from step times: the steady state of a closed loop.

C clients each send a request of `isl` prompt tokens and wait for `osl` output tokens, then send the next
(what `sglang.bench_serving --max-concurrency C` and `vllm bench serve --max-concurrency C` do). At most
`running` of them decode at once: the KV pool and the engine's request slots cap it, the rest queue. Each
decode step gives every running request one token at the mean context isl + osl/2; every request also
needs its prefill, which the engine runs between decode steps in chunks of its prefill budget and which
gives the request its first token; in the time a request takes, every running request is replaced once:

    output_tok_s     = running × osl / ((osl − 1) × decode_cycle + running × prefill_per_request)
    TPOT             = decode_cycle + (running − 1) × prefill_per_request / (osl − 1)
                       (the benchmark's (e2e − ttft)/(osl − 1) sees the other requests' prefills between
                       tokens; a request's own prefill is in its TTFT)
    e2e (closed loop)= C × osl / output_tok_s,   TTFT = e2e − (osl − 1) × TPOT  (≥ one prefill)

Where the engine runs prefills first and alone (SGLang), identical requests stay in waves: the running requests
finish together, their successors arrive together, and the whole wave is prefilled (W = running × prefill per
request, in batches of one prefill step each) before any of them decodes. A request then waits for the prefill
batches ahead of its own (TTFT = (W + one batch) / 2 on average) and the rest of the wave's prefill falls
between its first and second token: TPOT = decode_cycle + (W − TTFT) / (osl − 1). Throughput is the same. Text
prompts reach the scheduler one front-end tokenising apart (serve/simulate): the wave's first is prefilled alone,
the rest after it (W = one prefill + the rest's wave), which throughput and TTFT take in. When more clients wait
than the KV pool holds, they are admitted one by one as room frees up: no waves. Unless the engine holds each
running request's whole remaining output as it admits (SGLang from 0.5.22 for requests that ignore EOS, outputs up to
its 4096-token clip, or with the prefix cache off) and admits for all of them at once (not a pipeline's per
micro-batch): then it never admits past the pool, the wave that ends frees the room of a wave, and waves go on.

Decode-only (prompts already in the KV cache, as decode benchmarks run): no prefills, every token from a cycle,
output_tok_s = running / decode_cycle and TPOT = decode_cycle.

With speculative decoding a decode cycle yields the mean accepted length τ per request, and the cycle
time per token is the cycle ÷ τ.

A client's next request waits w before it joins a batch (serve/simulate says why). Requests in step (one client, a
wave, decode-only streams of one length) find the engine idle and are read at once: w is the longer of the host time
h before the scheduler sees a request (the front end's tokenising of a prompt decoded from random token ids, as
the benchmarks' random datasets send, and a calibrated first_token_host_s) and the step SGLang runs with the
requests that just finished. Requests out of step reach a busy scheduler: w is h, then the wait for the next of its
reads (a step on average, (N + 1) / 2 where it reads every N decode steps), then a step more where it overlaps the
GPU; a pipeline reads once per micro-batch and adds only h. w adds to TTFT and e2e, and each client's throughput is
osl / (e2e + w), the engine's batch taken as it is; a queued request was read long before its turn, and under a
queue at least as long as the requests in a host flight h hides in the wait.

Cycle times (pipeline micro-batches, drafting) come from serve/steps. The simulation (serve/simulate)
refines all of this with arrivals, queueing, admission and chunk scheduling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from shardwise.cost.book import PriceBook
from shardwise.cost.memory import MemoryLedger
from shardwise.cost.step import StepCost
from shardwise.engines.layout import Layout, reads
from shardwise.serve.steps import StepTimes
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    concurrency: int
    running: int  # requests decoding at once
    output_tok_s: float
    per_user_tok_s: float  # decode speed one client sees: 1 / TPOT
    tpot_s: float
    ttft_s: float
    bound: str  # compute | memory | comm | launch | host | pipeline | prefill, or kv_capacity when queueing
    decode: StepCost | None  # one decode step (one micro-batch with PP); None where a search keeps only the figures
    cycle_s: float  # time per output token of every running request, prefills excluded
    prefill_per_token_s: float  # other requests' prefill time between two of one request's tokens
    breakdown_s: dict[str, float] = field(default_factory=dict)  # parts of one token's time: sums to tpot_s
    tokens_per_step: float = 1.0  # tokens each request gains per decode step (the mean accepted length)


class _Running(NamedTuple):
    """What follows from the requests running (and whether others queue): every load beyond the KV pool shares it."""

    output_tok_s: float
    tpot_s: float
    least_ttft_s: float  # a request's own prefill: its TTFT when it waits for no other
    breakdown_s: dict[str, float]  # the parts of a token's time
    bound: str  # the largest of them
    cycle_s: float  # the decode cycle per output token
    tokens_per_step: float
    wait_s: float  # from a client's send to the request joining a batch (the host time, the scheduler's reads)


class Predictor:
    """Serving predictions for one layout on one cluster from its step times and memory ledger (build once, ask for
    many concurrencies)."""

    def __init__(
        self, steps: StepTimes, memory: MemoryLedger, *, shared: dict[tuple, Prediction] | None = None
    ) -> None:
        """`steps` may be those of a layout that differs only in how memory is sized (its twin with another memory
        fraction), to share what they have priced; `shared`: the figures-only predictions (`figures`) of such
        layouts, which differ only where their KV pools cap the running requests differently."""
        self.layout, self.memory = steps.layout, memory
        self.steps = steps
        self.chunk = self.layout.options.chunked_prefill_tokens  # None: prompts are never cut
        # prefill times by what they follow from, shared with the layouts that share the step times
        self._prefills = self.steps.prefills.sums
        self._chunks = self.steps.prefills.chunks
        self._shared = {} if shared is None else shared
        self._mixed = self.layout.options.scheduler.mixed_batches
        self._poll = self.layout.options.scheduler.poll_decode_steps
        self._reads = reads(self.layout)
        self._steady: dict[tuple, _Running] = {}

    def figures(self, concurrencies: Sequence[int], *, isl: int, osl: int) -> tuple[Prediction, ...]:
        """The predictions at each concurrency without their decode steps (what a search keeps of thousands of
        setups), shared with the layouts that share this one's step times wherever both run as many requests."""
        cap, ranks = self._cap(isl, osl), self.memory.ranks
        out = []
        for c in concurrencies:
            # a prediction follows from the step times, the load, the requests running and whether others queue
            key = (c, isl, osl, min(c, cap), c > cap, ranks, self.steps.first_token_host_s)
            p = self._shared.get(key)
            if p is None:
                p = self._shared[key] = self._predict(c, cap, isl, osl, decode_only=False, with_step=False)
            out.append(p)
        return tuple(out)

    def predict(
        self, *, concurrency: int, isl: int, osl: int, decode_only: bool = False, with_step: bool = True
    ) -> Prediction:
        """The figures at one concurrency, with its decode step (`with_step`: else None, as a search keeps them)."""
        return self._predict(concurrency, self._cap(isl, osl), isl, osl, decode_only=decode_only, with_step=with_step)

    def _cap(self, isl: int, osl: int) -> int:
        """The most requests of isl + osl tokens that run at once."""
        cap = self.memory.max_concurrency(isl=isl, osl=osl)
        if cap < 1:
            raise ValueError(f"no request of {isl} + {osl} tokens fits: memory verdict {self.memory.verdict}")
        return cap

    def _predict(
        self, concurrency: int, cap: int, isl: int, osl: int, *, decode_only: bool, with_step: bool
    ) -> Prediction:
        running, queued = min(concurrency, cap), concurrency > cap
        # all but the end-to-end time follows from the requests running and whether others queue (every load beyond
        # the KV pool runs as many): worked out once for them
        key = (isl, osl, running, queued, decode_only)
        steady = self._steady.get(key)
        if steady is None:
            steady = self._steady[key] = self._running(running, isl, osl, queued=queued, decode_only=decode_only)
        e2e = concurrency * osl / steady.output_tok_s
        ttft = max(steady.least_ttft_s, e2e - (osl - 1) * steady.tpot_s)
        # the wait before a request joins a batch: each client's request takes that much longer, the engine's batch
        # taken as it is without it (exact at one client); under a queue at least as long as the requests in that
        # host flight, the time hides in the wait and the engine stays as full
        host = steady.wait_s
        if queued and concurrency - cap >= steady.output_tok_s / osl * host:
            host = 0.0
        return Prediction(
            concurrency=concurrency,
            running=running,
            output_tok_s=steady.output_tok_s * (e2e / (e2e + host)),
            per_user_tok_s=1.0 / steady.tpot_s,
            tpot_s=steady.tpot_s,
            ttft_s=ttft + host,
            bound="kv_capacity" if queued else steady.bound,
            decode=self.steps.decode(running, isl + osl // 2).step if with_step else None,
            cycle_s=steady.cycle_s,
            prefill_per_token_s=steady.breakdown_s["prefill"],
            breakdown_s=dict(steady.breakdown_s),
            tokens_per_step=steady.tokens_per_step,
        )

    def _running(self, running: int, isl: int, osl: int, *, queued: bool, decode_only: bool) -> _Running:
        """The figures with `running` requests running, and others queued or not."""
        cycle_s, parts = self.steps.cycle(running, isl + osl // 2)
        tokens = self.steps.tokens
        cycle = cycle_s / tokens  # per output token
        if tokens != 1.0:
            parts = {k: v / tokens for k, v in parts.items()}
        per_request, alone, batch = (0.0, cycle, 0.0) if decode_only else self._prefill(isl, running)
        # a request's first token comes from its prefill, the other osl − 1 from decode cycles; in that time
        # every running request is replaced once, so `running` prefills fall between the cycles. Decode-only:
        # the prompt is cached, every token comes from a decode cycle and no prefill runs.
        steps = max(1, osl - 1)
        cycles = osl if decode_only else osl - 1
        wave = running * per_request  # the prefills of one round
        if decode_only or self._mixed or (queued and not self._refills_waves(osl)):
            # prefills spread between every request's tokens: the engine mixes them in, or requests queue for KV
            # room and are admitted one by one as it frees up
            first, between = alone, (running - 1) * per_request
        else:  # waves: the whole wave's prefill, the batches before a request's own in its TTFT, the rest after
            first = max(alone, (wave + batch) / 2)
            if running > 1 and self._splits(running, isl, osl):
                # the first prompt prefilled alone, then the rest, come meanwhile, in the wave's batches (priced as
                # the whole wave's: no new prefill shapes, which a search of thousands of setups would keep)
                rest_wave = (running - 1) * per_request
                rest_first = max(alone, (rest_wave + batch) / 2)
                first = (alone + (running - 1) * (alone + rest_first)) / running
                wave = alone + rest_wave
            between = max(0.0, wave - first)
        throughput = running * osl / (cycles * cycle + wave)
        wait = self._wait(running, isl, osl, cycle_s, in_step=running == 1 or decode_only or not self._mixed,
                          queued=queued, decode_only=decode_only)  # fmt: skip
        tpot = cycle + between / steps
        breakdown = {**parts, "prefill": between / steps}
        bound = max(breakdown, key=breakdown.__getitem__)
        return _Running(throughput, tpot, first, breakdown, bound, cycle, tokens, wait)

    def _refills_waves(self, osl: int) -> bool:
        """Whether, past the KV pool, the engine admits no more than the pool holds to the requests' lengths, so the
        wave that ends makes room for one wave (SGLang holds the whole remaining output of every running request from
        0.5.22, up to its clip; with the prefix cache off it walks them to their ends). A pipeline's scheduler admits
        for one micro-batch at a time, against its own running requests alone (scheduler_pp_mixin.py): it admits past
        the pool across micro-batches, as an optimistic reserve does."""
        p = self.layout.options.scheduler
        holds = p.admits_to_length or (p.holds_whole_output and osl <= p.reserve_clip_tokens)
        return holds and self.layout.pp == 1

    def _splits(self, running: int, isl: int, osl: int) -> bool:
        """Whether a round's text prompts reach the scheduler apart: the front end hands them over one tokenising
        apart, so an idle scheduler takes the first alone. The request prefilled alone then runs a step ahead (the
        overlapped step formed before the others came) and sends its next prompt that much sooner. Where one rank
        serves every request and the scheduler reads only after the step it formed with the finished ones (SGLang's
        overlap schedule), that step gathers the prompts tokenised by its end, and the rounds after the first are
        whole waves again when all of them are (where only some are, the simulation's rounds settle in between; the
        first is taken alone). Elsewhere the first stays alone: attention-DP ranks decode the request ahead while
        another prefills, which puts it further ahead, and a pipeline reads prompts as they come."""
        tokenize = self._tokenize_prompt_s(isl, decode_only=False)
        if tokenize <= 0:
            return False
        lag, ranks = self._reads, self.memory.ranks // max(1, self.layout.replicas)
        gathered = lag.lagged and lag.runs_finished_step and ranks == 1
        return not (gathered and running * tokenize <= self.steps.cycle(running, isl + osl)[0])

    def _tokenize_prompt_s(self, isl: int, decode_only: bool) -> float:
        """The front end's time on one prompt of `isl` tokens decoded from random token ids, as the benchmarks'
        random datasets send (none decode-only: the prompts are cached)."""
        return 0.0 if decode_only else isl * self.steps.tokenize_s_per_token(prose=False)

    def _wait(
        self, running: int, isl: int, osl: int, step_s: float, *, in_step: bool, queued: bool, decode_only: bool
    ) -> float:
        """From a client's send to its request joining a batch (the module's docstring; serve/simulate): `step_s` is
        a decode step of the running requests."""
        host, lag = self.steps.first_token_host_s + self._tokenize_prompt_s(isl, decode_only), self._reads
        if queued or not lag.lagged:
            return host
        if in_step:  # the step formed with the finished requests, at their last context
            return max(host, self.steps.cycle(running, isl + osl)[0] if lag.runs_finished_step else 0.0)
        # reads every `poll` decode steps, the first after the request came, then the step in flight if overlapped
        return (math.floor(host / step_s) + (self._poll + 1) / 2 + lag.overlap) * step_s

    def sweep(self, concurrencies: Sequence[int], *, isl: int, osl: int, decode_only: bool = False) -> list[Prediction]:
        return [self.predict(concurrency=c, isl=isl, osl=osl, decode_only=decode_only) for c in concurrencies]

    def _prefill(self, isl: int, running: int) -> tuple[float, float, float]:
        """(prefill time per request when each rank batches prefills up to its chunk, one request's prefill
        alone, the time of one such batch). Attention-DP ranks and replicas prefill their own requests in the
        same step."""
        key = (isl, running, self.memory.ranks, self.chunk, self._per_batch(isl))  # layouts share these prices
        made = self._prefills.get(key)
        if made is None:
            ranks = max(1, min(self.memory.ranks, running))  # ranks with a request to prefill
            alone = self._prefill_chunks(1, isl, ranks=1)
            together = min(math.ceil(running / ranks), self._per_batch(isl))
            batch = self._prefill_chunks(together, isl, ranks=ranks)
            made = self._prefills[key] = (batch / (together * ranks), alone, batch)
        return made

    def _per_batch(self, isl: int) -> int:
        """Whole prompts of `isl` tokens one prefill batch takes: as many as its chunk holds, and no more than the
        scheduler's prefill budget lets in (Simulation._prefill_batch: one after the first only under what is left of
        it where the engine asks for whole prompts, else until it is spent). The decode tokens a mixed batch
        (SGLang --enable-mixed-chunk) takes from both budgets are left out here; the simulation counts them."""
        isl = max(1, isl)
        policy = self.layout.options.scheduler
        most = self.chunk // isl if self.chunk else math.inf
        if policy.max_prefill_tokens is not None:
            budget = policy.max_prefill_tokens
            most = min(most, (budget - 1) // isl if policy.whole_prompts else -(-budget // isl))
        return max(1, int(min(most, 1 << 30)))

    def _prefill_chunks(self, per_rank: int, isl: int, *, ranks: int) -> float:
        """Time to prefill `per_rank` requests of `isl` tokens on each of `ranks` ranks, chunk by chunk."""
        key = (per_rank, isl, ranks, self.chunk)
        if key not in self._chunks:
            total, done = 0.0, 0
            per_chunk = max(1, self.chunk // per_rank) if self.chunk else isl
            while done < isl:
                new = min(per_chunk, isl - done)
                total += self.steps.prefill(per_rank * ranks, new, done)
                done += new
            self._chunks[key] = total
        return self._chunks[key]


def predict(
    model: ModelSpec,
    layout: Layout,
    cluster: ClusterSpec,
    memory: MemoryLedger,
    *,
    concurrency: Sequence[int],
    isl: int,
    osl: int,
    accept_length: float | None = None,
    decode_only: bool = False,
    book: PriceBook | None = None,
) -> list[Prediction]:
    """Predicted serving figures of `layout` at each concurrency, for requests of isl in / osl out (with
    speculative decoding, at a mean accepted length of `accept_length` tokens per step; decode-only: prompts
    already cached, no prefill; `book`: the price book of the check, default one of its own)."""
    steps = StepTimes(model, layout, cluster, accept_length=accept_length, book=book)
    predictor = Predictor(steps, memory)
    return predictor.sweep(concurrency, isl=isl, osl=osl, decode_only=decode_only)
