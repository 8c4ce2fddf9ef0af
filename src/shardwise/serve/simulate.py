"""A discrete-event simulation of one engine serving a workload: continuous batching, chunked prefill,
KV-cache admission and eviction, attention-DP ranks with their own queues, speculative decoding.

The engine repeats steps. When a rank can start or continue a prefill, the next step carries it (alone on
that rank when the engine runs prefill first, as SGLang does; beside the decode tokens under the token budget
when it mixes them, as vLLM does). Otherwise every rank decodes. Between two events (an arrival, a
finished request, a full KV pool, a stalled queue to re-check) decode steps repeat with the same batch, so
the simulation advances them together: time advances by k cycles priced at the span's mean context, every
request gains k × τ tokens. Its cost grows with events, not with tokens.

The scheduler reads newly sent requests before it forms each step's batch, or (SGLang --scheduler-recv-interval N)
only every N decode steps, at once after a prefill step or while idle: a request sent mid-way waits for that read.
Before that, the front end tokenises each text prompt, one after another in the order they were sent
(StepTimes.tokenize_s_per_token: prose where the requests come from a dataset of conversations, decoded
random token ids where the benchmark draws lengths), so the prompts of a burst reach the scheduler one by one; an
offline batch or a decode-only run hands the engine tokens and skips it. A busy scheduler reads again right after
it hands out the tokens of the step that just ended, sooner than a client's next request can come back through the
HTTP server and the hops between the engine's processes (taken to need less than a step; a longer trip is a
calibrated first_token_host_s), so a closed loop's next request waits for the read after. A scheduler that overlaps
the GPU (SGLang's overlap schedule, vLLM's async scheduling) forms each batch while the step before it runs: what it
reads joins the step after the one in flight, a step later. SGLang also runs the step it formed before it learned
that requests had their last token (`SchedulerPolicy.runs_finished_step`), so even when that leaves it idle it
reads their clients' next requests only after that step. A pipeline reads once per micro-batch, far more often
than once per simulated cycle: there a request is read at the step boundary it reaches, as before any of this.

Admission follows the engine's scheduler policy (engines' `SchedulerPolicy`): a new request needs room for its
prompt plus its output (SGLang holds back a decaying share of every running request's remaining output; vLLM
holds nothing back). When a decode step would not fit, requests go back to the queue (the one with the fewest
output tokens first in SGLang, the newest in vLLM) and later prefill again what they had.

A cold start (`WorkloadSpec.cold_start_s`) holds the engine's first step back by that long after the first request
reaches the scheduler: what arrives meanwhile waits.

Ranks of one instance step together (the MoE layers synchronise them): a step lasts as long as its slowest
rank. Replicas behind a router are independent: the simulation runs one, with every replicas-th request, and
scales its throughput (and gives it a front end of its own: the engines' data-parallel replicas share one, SGLang's
tokenizer manager or vLLM's API server, so a burst's tokenising queue is longer there than simulated). Metrics
follow the benchmark tools: TTFT and E2E from the send, TPOT per request (e2e − ttft) / (output − 1), ITL per
streamed chunk, throughput over the whole run.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from shardwise.cost.memory import MemoryLedger
from shardwise.engines.layout import Layout, SchedulerPolicy, reads
from shardwise.errors import SpecError
from shardwise.serve.requests import Requests, draw
from shardwise.serve.steps import StepTimes
from shardwise.spec.workload import WorkloadSpec

RECHECK_STEPS = 32  # a queue held back by the decaying reserve is re-checked this often (SGLang checks every step)
# a send at the instant of a busy scheduler's read (a token it has just handed out) misses it; an idle one reads it
BEFORE_READ_S, AT_READ_S = -1e-9, 1e-12


@dataclass(frozen=True, kw_only=True)
class Stats:
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: np.ndarray, weights: np.ndarray | None = None) -> Stats:
        if len(values) == 0:
            return cls(mean=math.nan, p50=math.nan, p90=math.nan, p99=math.nan)
        w = np.ones(len(values)) if weights is None else np.asarray(weights, dtype=float)
        order = np.argsort(values)
        v, cum = np.asarray(values)[order], np.cumsum(w[order])
        q = [float(v[min(np.searchsorted(cum, p * cum[-1]), len(v) - 1)]) for p in (0.5, 0.9, 0.99)]
        return cls(mean=float(np.average(v, weights=w[order])), p50=q[0], p90=q[1], p99=q[2])


@dataclass(frozen=True, kw_only=True)
class ServeResult:
    """What a benchmark of the simulated engine would report, plus what the engine did."""

    requests: int
    duration_s: float
    output_tok_s: float
    total_tok_s: float
    request_per_s: float
    ttft_s: Stats
    tpot_s: Stats
    itl_s: Stats
    e2e_s: Stats
    mean_running: float  # requests decoding per rank, averaged over decode time
    peak_running: int
    retractions: int
    tokens_per_step: float
    steps: int  # engine steps simulated
    concurrency: int | None = None
    request_rate: float | None = None


@dataclass
class _Rank:
    waiting: deque[int] = field(default_factory=deque)
    running: list[int] = field(default_factory=list)
    chunked: int | None = None  # a request part way through its prefill
    held: float = 0.0  # KV tokens its requests hold (kept up to date at every change)


class Simulation:
    """One engine instance of a layout, priced by `steps`, with the KV pools of `memory`."""

    def __init__(self, steps: StepTimes, memory: MemoryLedger) -> None:
        layout: Layout = steps.layout
        self.steps, self.memory = steps, memory
        self.policy: SchedulerPolicy = layout.options.scheduler
        self.ranks_per_instance = max(1, memory.ranks // layout.replicas)
        self.replicas = layout.replicas
        self.scale = self.ranks_per_instance * layout.replicas  # requests per rank → StepTimes' whole-layout view
        self.pool = memory.kv_usable_tokens_per_rank  # less what the engine holds back (vLLM: its null block)
        self.slots = memory.max_running_requests_per_rank or 1 << 30
        self.chunk = layout.options.chunked_prefill_tokens  # None: prompts are never cut
        self.poll = self.policy.poll_decode_steps
        self.reads = reads(layout)
        self.tau = steps.tokens
        self.verify = steps.plan.verify_tokens if steps.plan else 1
        self.micro = max(1, layout.pp)  # a pipeline's scheduler admits for one micro-batch at a time

    def run(self, workload: WorkloadSpec, *, progress: Callable[[int], None] | None = None) -> ServeResult:
        if self.memory.verdict != "ok":
            raise SpecError(f"the layout does not serve: {self.memory.reason or self.memory.verdict}")
        requests = draw(workload)
        share = requests if self.replicas == 1 else _every(requests, self.replicas)
        clients = None if workload.concurrency is None else max(1, math.ceil(workload.concurrency / self.replicas))
        self._check_fits(share)
        front_end = not (workload.offline or workload.decode_only)
        per_token_s = self.steps.tokenize_s_per_token(prose=bool(workload.pairs)) if front_end else 0.0
        run = _Run(self, share, clients, progress, decode_only=workload.decode_only, offline=workload.offline,
                   cold_start_s=workload.cold_start_s, tokenize_s_per_token=per_token_s)  # fmt: skip
        run.loop()
        return run.result(workload, self.replicas)

    def _check_fits(self, requests: Requests) -> None:
        """Every request must fit one rank's pool on its own, or it could never finish."""
        worst = int((requests.input_tokens + requests.output_tokens).max())
        if self.memory.request_tokens(worst) > self.pool:
            raise SpecError(
                f"a request of {worst:,} tokens (prompt + output) does not fit one rank's KV pool of "
                f"{self.pool:,} tokens: shorten the requests or give the KV cache more memory"
            )


def _every(requests: Requests, n: int) -> Requests:
    return Requests(requests.send_s[::n], requests.input_tokens[::n], requests.output_tokens[::n])


class _Run:
    """The state of one simulation run."""

    def __init__(
        self,
        sim: Simulation,
        reqs: Requests,
        clients: int | None,
        progress: Callable[[int], None] | None,
        *,
        decode_only: bool = False,
        offline: bool = False,
        cold_start_s: float = 0.0,
        tokenize_s_per_token: float = 0.0,
    ):
        self.sim, self.progress, self.decode_only = sim, progress, decode_only
        # from a client's send to the scheduler seeing it; an in-process batch has no front end to cross
        self.first_token_host_s = 0.0 if offline else sim.steps.first_token_host_s
        n = len(reqs)
        self.isl, self.osl = reqs.input_tokens, reqs.output_tokens.astype(float)
        self.send = reqs.send_s
        self.sent = np.full(n, np.nan)  # when each client sent its request: what its latencies count from
        self.tokenize_s = self.isl * tokenize_s_per_token  # the front end's time on each prompt
        self.tokenized = 0.0  # when the front end has tokenised every prompt sent so far
        self.need = self.isl.astype(float).copy()  # tokens to prefill (the prompt, or all held after eviction)
        self.done_prefill = np.zeros(n)  # tokens of `need` prefilled
        self.gen = np.zeros(n)  # output tokens so far
        self.arrive = np.full(n, np.nan)
        self.first = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.stall = np.zeros(n)  # time since the last token spent on other requests' prefills
        self.ranks = [_Rank() for _ in range(sim.ranks_per_instance)]
        self.t = 0.0
        self.sends: list[tuple[float, int]] = []
        self.next_send = 0
        self.clients = clients
        self.completed = 0
        self.ratio = sim.policy.reserve_ratio_start
        self.itl_values: list[np.ndarray] = []
        self.itl_weights: list[np.ndarray] = []
        self.decode_time = self.running_time = 0.0
        self.peak = self.retractions = self.steps = 0
        self.rr = 0  # round-robin over ranks
        self.unread = 0  # decode steps since the scheduler last read new requests
        self.last_cycle = 0.0  # the last decode step's time
        self.last_step_s = 0.0  # the last step's time
        self.busy = False  # a step just ended and the engine goes on: its scheduler's read came before any reply
        self.last_finished: list[int] = []  # the requests that finished last: the step formed with them runs
        for _ in range(n if clients is None else min(clients, n)):
            self._send_next(0.0)
        if cold_start_s and self.sends:  # the engine meets its first request, then spends its cold start
            self.t = self.sends[0][0] + cold_start_s

    # --- arrivals and completions ------------------------------------------------------------------------

    def _send_next(self, now: float) -> None:
        if self.next_send < len(self.isl):
            i = self.next_send
            self.next_send += 1
            self.sent[i] = max(now, float(self.send[i]))
            self.tokenized = max(self.sent[i], self.tokenized) + float(self.tokenize_s[i])
            heapq.heappush(self.sends, (self.tokenized + self.first_token_host_s, i))

    def _deliver(self) -> None:
        """Queue the requests sent before the scheduler's last read: now, or where it reads only every `poll` decode
        steps, the last of those steps (a read after a prefill step or while idle is now); a step earlier where it
        overlaps the GPU. What clients send on the tokens of the step that just ended misses a busy scheduler's read;
        an idle one reads a request as it comes."""
        seen_until = self.t
        if self.sim.poll > 1:
            if self.unread < self.sim.poll:
                return
            seen_until -= (self.unread % self.sim.poll) * self.last_cycle
            self.unread %= self.sim.poll
        busy = self.busy and self.sim.reads.lagged
        if busy and self.sim.reads.overlap:
            seen_until -= self.last_step_s
        seen_until += BEFORE_READ_S if busy else AT_READ_S
        while self.sends and self.sends[0][0] <= seen_until:
            _, i = heapq.heappop(self.sends)
            self.arrive[i] = self.sent[i]
            self.ranks[self.rr % len(self.ranks)].waiting.append(i)
            self.rr += 1

    def _complete(self, rank: _Rank) -> None:
        finished = [i for i in rank.running if self.gen[i] >= self.osl[i] - 1e-9]
        if not finished:
            return
        rank.running = [i for i in rank.running if self.gen[i] < self.osl[i] - 1e-9]
        self.last_finished = finished
        rank.held -= float(self._charge(self._kv(finished)).sum())
        for i in finished:
            self.finish[i] = self.t
            self.completed += 1
            if self.clients is not None:
                self._send_next(self.t)
        if self.progress:
            self.progress(self.completed)

    # --- KV accounting ------------------------------------------------------------------------------------

    def _kv(self, ids: list[int] | int) -> np.ndarray:
        """KV tokens each request holds: what it prefilled plus what it generated since (an evicted request
        prefills its earlier output again, so that output is counted once)."""
        return self.done_prefill[ids] + self.gen[ids] - (self.need[ids] - self.isl[ids])

    def _charge(self, tokens: np.ndarray | float) -> np.ndarray | float:
        """Pool tokens requests of `tokens` hold (the ledger's rule: fewer where sliding-window layers keep only
        their window, as vLLM's hybrid KV manager does)."""
        return self.sim.memory.request_tokens(tokens)

    def _growth(self, ids: list[int] | int, tokens: float) -> float:
        """Pool tokens these requests take on when each gains `tokens`."""
        if self.sim.memory.kv_window_tokens is None:
            return tokens * (len(ids) if isinstance(ids, list) else 1)
        kv = self._kv(ids)
        return float(np.sum(self._charge(kv + tokens) - self._charge(kv)))

    def _reserved(self, rank: _Rank, fresh: list[int]) -> float:
        """The running requests' output held back from an admission: their share of it (whole for requests that
        ignore EOS from SGLang 0.5.22), and the whole of it for the requests admitted earlier in the same prefill
        batch (`fresh`: PrefillAdder._update_prefill_budget), each up to the clip. A pipeline's scheduler forms each
        micro-batch's prefill against that micro-batch's running requests alone (SGLang scheduler_pp_mixin.py),
        about one in `micro` of them. An engine that holds nothing back (vLLM) holds back nothing."""
        p = self.sim.policy
        if not p.reserve_ratio_start:
            return 0.0
        ratio = 1.0 if p.holds_whole_output else self.ratio
        ids = [j for j in rank.running[:: self.sim.micro] if j not in fresh]
        return self._left(ids) * ratio + self._left(fresh)

    def _left(self, ids: list[int]) -> float:
        """These requests' remaining output, each up to the scheduler's clip."""
        if not ids:
            return 0.0
        return float(np.minimum(self.osl[ids] - self.gen[ids], self.sim.policy.reserve_clip_tokens).sum())

    def _admissible(self, rank: _Rank, i: int, fresh: list[int], walk: list[int]) -> bool:
        """Whether request i joins this prefill batch: `fresh`, the requests the batch admitted before it; `walk`,
        the order in which the scheduler walks the requests to their ends this batch (`_holds_to_length`)."""
        p = self.sim.policy
        if len(rank.running) + (rank.chunked is not None) >= self.sim.slots:
            return False
        room = self.sim.pool - rank.held - self._reserved(rank, fresh)
        if p.admits_to_length:  # its prompt beside the running requests' reserve, then every request to its length
            # with a page for it and for each request the batch admitted before it (PrefillBudget.reserve)
            prompt = self._charge(self.need[i]) + p.admission_page_tokens * (1 + len(fresh))
            return bool(prompt <= room) and self._holds_to_length(rank, i, prompt, walk)
        reserve = min(self.osl[i] - self.gen[i], p.reserve_clip_tokens) if p.reserve_ratio_start else 0.0
        return bool(self._charge(self.need[i] + reserve) <= room)

    def _holds_to_length(self, rank: _Rank, i: int, prompt: float, walk: list[int]) -> bool:
        """Whether, with request i's `prompt` tokens in the pool, the pool holds i and every running request to its
        full length as they end: the requests in `walk`'s order, the k-th of n needing (n − k) × its tokens left,
        one token each to spare, beyond what is free and what the ones before it freed (SGLang
        add_one_req_ignore_eos: a request's tokens left as its whole remaining output, what it frees as its prompt
        and output). The scheduler keeps the order through a prefill batch: sorted by tokens left the first time it
        asks (the request asked first among equals), then each later request put in before the first with at least
        as many tokens left, or where none has, before the last (add_req_state's insert)."""
        if not walk:
            first = [i, *rank.running[:: self.sim.micro], *([rank.chunked] if rank.chunked is not None else [])]
            walk.extend(np.asarray(first)[np.argsort(self.osl[first] - self.gen[first], kind="stable")].tolist())
        else:
            ahead = np.flatnonzero(self.osl[i] - self.gen[i] <= self.osl[walk] - self.gen[walk])
            walk.insert(int(ahead[0]) if len(ahead) else len(walk) - 1, i)
        left, occupied = self.osl[walk] - self.gen[walk], self.isl[walk] + self.gen[walk]
        ending = len(walk) - np.arange(len(walk))  # requests still running when each ends
        freed = np.concatenate(([0.0], np.cumsum(occupied)[:-1]))
        free = self.sim.pool - rank.held - prompt
        return bool(np.all(free + freed - left * ending > ending))

    # --- one step with prefill ----------------------------------------------------------------------------

    def _prefill_batch(self, rank: _Rank) -> list[tuple[int, float]]:
        """(request, tokens) this rank prefills in the next step: the request part way through first, then the queue
        in order while each fits the KV pool, under two budgets. The chunk cuts the last request to fit (unchunked,
        each prompt goes whole); the scheduler's prefill budget (SGLang's max_prefill_tokens) closes the batch once
        spent, asked after each request added (and before the first, where the engine asks so: `budget_first`), and
        where the engine asks it (`whole_prompts`) lets a request after the first in only if its whole prompt fits
        what is left: it waits for the next prefill instead. Its KV is allocated now, as engines do."""
        policy = self.sim.policy
        chunk = float(self.sim.chunk) if self.sim.chunk else math.inf
        budget = math.inf if policy.max_prefill_tokens is None else float(policy.max_prefill_tokens)
        if policy.mixed_batches:  # the decode tokens share both
            chunk -= len(rank.running) * self.sim.verify
            budget -= len(rank.running) * self.sim.verify
        batch: list[tuple[int, float]] = []
        fresh: list[int] = []  # the requests this batch admits from the queue
        walk: list[int] = []  # the order the scheduler walks requests to their ends in, kept through the batch
        asked = policy.budget_first  # whether the budget is asked before the next waiting request
        candidates = [rank.chunked] if rank.chunked is not None else []
        while chunk >= 1:
            if candidates:
                i = candidates.pop()
            elif rank.waiting and self._admissible(rank, rank.waiting[0], fresh, walk):
                if asked and budget <= 0:
                    break  # the prefill budget is spent
                i = rank.waiting[0]
                if self.decode_only and self.done_prefill[i] == 0 and self.need[i] == self.isl[i]:
                    rank.waiting.popleft()
                    self._cached(rank, i)
                    continue
                if batch and policy.whole_prompts and self.need[i] - self.done_prefill[i] >= budget:
                    break  # its whole prompt does not fit what is left of the prefill budget
                rank.waiting.popleft()
                fresh.append(i)
                rank.chunked = i  # held while its prefill is under way
                asked = True  # the engine asks the budget after each request it adds
            else:
                break
            take = min(self.need[i] - self.done_prefill[i], chunk)
            batch.append((i, take))
            rank.held += self._growth(i, take)
            self.done_prefill[i] += take
            chunk -= take
            budget -= take
            if self.done_prefill[i] < self.need[i] - 1e-9:
                break  # part of it waits for the next step, as the rank's chunked request
            rank.chunked = None
            rank.running.append(i)
        return batch

    def _cached(self, rank: _Rank, i: int) -> None:
        """A decode-only request: its prompt's KV is in the pool already, so it joins the decode batch at once
        (its first token comes from its first decode step). Evicted later, it prefills what it lost."""
        self.done_prefill[i] = self.need[i]
        rank.held += float(self._charge(self._kv(i)))
        rank.running.append(i)

    def _mixed_step(self, batches: list[list[tuple[int, float]]]) -> None:
        """One step in which some ranks prefill: alone on their rank (prefill first) or beside its decode (mixed).
        Ranks that do not prefill decode one step. The step lasts as long as its slowest rank."""
        sim = self.sim
        duration, decoding, paused = 0.0, [], []
        for rank, batch in zip(self.ranks, batches, strict=True):
            fresh = {i for i, _ in batch}
            cost = 0.0
            if batch:
                tokens = sum(take for _, take in batch)
                before = float(np.mean([self.done_prefill[i] - take for i, take in batch]))
                cost += sim.steps.prefill_s(len(batch) * sim.scale, math.ceil(tokens) * sim.scale, before)
            if sim.policy.mixed_batches or not batch:
                self._make_room(rank)
                old = [i for i in rank.running if i not in fresh]
                if old:
                    cost += sim.steps.decode_s(len(old) * sim.scale, self._context(old))
                    decoding.append((rank, old))
            else:
                paused += [i for i in rank.running if i not in fresh]  # wait out the prefill
            duration = max(duration, cost)
        self.t += duration
        self.steps += 1
        self.last_step_s, self.busy = duration, True
        self.unread = self.sim.poll  # any step but a decode step lets the scheduler read at once
        for rank, batch in zip(self.ranks, batches, strict=True):
            for i, _ in batch:
                if self.done_prefill[i] >= self.need[i] - 1e-9:
                    rank.held += self._growth(i, 1)
                    self.gen[i] += 1  # a finished prefill samples the next token
                    if np.isnan(self.first[i]):
                        self.first[i] = self.t
                    self.stall[i] = 0.0
        self.stall[paused] += duration
        for rank, ids in decoding:
            self._record_itl(ids, duration, 1)
            self._first_from_decode(ids, self.t)
            rank.held += self._growth(ids, sim.tau)
            self.gen[ids] += sim.tau
        for rank in self.ranks:
            self._complete(rank)

    # --- decode spans -------------------------------------------------------------------------------------

    def _context(self, ids: list[int]) -> float:
        """Mean tokens in the KV cache of these requests."""
        return float(np.mean(self._kv(ids)))

    def _make_room(self, rank: _Rank) -> None:
        """Evict running requests until one more decode step fits this rank's pool."""
        while rank.running:
            if self.sim.pool - rank.held >= self._growth(rank.running, self.sim.verify):
                return
            victim = self._victim(rank)
            rank.running.remove(victim)
            rank.held -= float(self._charge(self._kv(victim)))
            self.need[victim] = self.isl[victim] + math.floor(self.gen[victim])
            self.done_prefill[victim] = 0.0
            rank.waiting.appendleft(victim)
            self.retractions += 1
            kept = rank.running
            if kept and self.sim.policy.reserve_ratio_start:
                decoded = float(self.gen[kept].sum()) + self.sim.policy.reserve_retract_steps * len(kept)
                self.ratio = min(1.0, decoded / float(self.osl[kept].sum()))

    def _victim(self, rank: _Rank) -> int:
        if self.sim.policy.evict == "newest":
            return rank.running[-1]
        return min(rank.running, key=lambda i: (self.gen[i], -self.isl[i]))

    def _span(self) -> None:
        """Decode steps on every rank until the next event."""
        sim = self.sim
        for rank in self.ranks:
            self._make_room(rank)
        active = [r for r in self.ranks if r.running]
        if not active:
            return
        k = math.inf
        for rank in active:
            ids = rank.running
            left = self.osl[ids] - self.gen[ids]
            k = min(k, int(np.ceil(left.min() / sim.tau - 1e-9)))
            per_step = self._growth(ids, sim.tau)
            free = sim.pool - rank.held - (self._growth(ids, sim.verify) - per_step)
            if per_step > 0:
                k = min(k, max(1, int(free // per_step)))
            if rank.waiting and len(ids) < sim.slots:
                k = min(k, RECHECK_STEPS)
        busiest = max(len(r.running) for r in active)
        all_ids = [i for r in active for i in r.running]
        context = self._context(all_ids)
        cycle = sim.steps.decode_s(busiest * sim.scale, context)
        if self.sends:  # up to the scheduler's first read that takes the next send: after it (a step later where it
            gap = (self.sends[0][0] - self.t) / cycle  # overlaps), or at the boundary it reaches (a pipeline)
            sent = max(1, math.floor(gap) + 1 + int(sim.reads.overlap) if sim.reads.lagged else math.ceil(gap))
            k = min(k, sent + (-(self.unread + sent)) % sim.poll)
        k = max(1, int(k))
        cycle = sim.steps.decode_s(busiest * sim.scale, context + (k - 1) / 2 * sim.tau)
        self.t += k * cycle
        self.steps += k
        self.unread += k
        self.last_cycle = self.last_step_s = cycle
        self.busy = True
        self.decode_time += k * cycle
        self.running_time += k * cycle * len(all_ids) / len(active)
        self.peak = max(self.peak, busiest)
        for rank in active:
            self._record_itl(rank.running, cycle, k)
            self._first_from_decode(rank.running, self.t - (k - 1) * cycle)
            rank.held += self._growth(rank.running, k * sim.tau)
            self.gen[rank.running] += k * sim.tau
        if sim.policy.reserve_ratio_start:
            p = sim.policy
            decay = (p.reserve_ratio_start - p.reserve_ratio_min) / p.reserve_decay_steps
            self.ratio = max(p.reserve_ratio_min, self.ratio - k * decay)
        for rank in active:
            self._complete(rank)

    def _first_from_decode(self, ids: list[int], when: float) -> None:
        """Decode-only requests get their first token from their first decode step, ending at `when`."""
        if self.decode_only:
            fresh = [i for i in ids if np.isnan(self.first[i])]
            self.first[fresh] = when

    def _record_itl(self, ids: list[int], cycle: float, k: int) -> None:
        """ITL samples of `k` steps of `cycle` for these requests; the first gap also holds the prefill steps
        each request sat through since its last token."""
        stalls = self.stall[ids]
        if stalls.any():
            values, counts = np.unique(stalls, return_counts=True)
            self.itl_values.append(values + cycle)
            self.itl_weights.append(counts.astype(float))
            self.stall[ids] = 0.0
            k -= 1
        if k:
            self.itl_values.append(np.array([cycle]))
            self.itl_weights.append(np.array([float(len(ids) * k)]))

    # --- the loop -----------------------------------------------------------------------------------------

    def loop(self) -> None:
        n = len(self.isl)
        while self.completed < n:
            self._deliver()
            batches = [self._prefill_batch(rank) for rank in self.ranks]
            if any(batches):
                self._mixed_step(batches)
            elif any(rank.running for rank in self.ranks):
                self._span()
            elif self.sends:  # idle until the next request, read at once; an idle SGLang resets its reserve ratio
                if self.sim.reads.runs_finished_step and self.busy:  # the step it formed with the last requests to
                    ids = self.last_finished  # finish still runs, one more token each at their last context
                    self.t += self.sim.steps.decode_s(len(ids) * self.sim.scale, self._context(ids))
                self.t = max(self.t, self.sends[0][0])
                self.unread = self.sim.poll
                self.busy = False
                self.ratio = self.sim.policy.reserve_ratio_start
            else:
                raise RuntimeError("simulation stalled with requests left")  # a bug, not a user error

    def result(self, workload: WorkloadSpec, replicas: int) -> ServeResult:
        start = float(np.nanmin(self.arrive))
        duration = float(np.nanmax(self.finish)) - start
        ttft = self.first - self.arrive
        e2e = self.finish - self.arrive
        multi = self.osl > 1
        tpot = (e2e[multi] - ttft[multi]) / (self.osl[multi] - 1)
        out_tokens = float(self.osl.sum()) * replicas
        in_tokens = float(self.isl.sum()) * replicas
        itl_v = np.concatenate(self.itl_values) if self.itl_values else np.array([])
        itl_w = np.concatenate(self.itl_weights) if self.itl_weights else None
        return ServeResult(
            requests=len(self.isl) * replicas,
            duration_s=duration,
            output_tok_s=out_tokens / duration,
            total_tok_s=(out_tokens + in_tokens) / duration,
            request_per_s=len(self.isl) * replicas / duration,
            ttft_s=Stats.of(ttft),
            tpot_s=Stats.of(tpot),
            itl_s=Stats.of(itl_v, itl_w),
            e2e_s=Stats.of(e2e),
            mean_running=self.running_time / self.decode_time if self.decode_time else 0.0,
            peak_running=self.peak,
            retractions=self.retractions,
            tokens_per_step=self.sim.tau,
            steps=self.steps,
            concurrency=workload.concurrency,
            request_rate=None if math.isinf(workload.request_rate) else workload.request_rate,
        )


def simulate(
    steps: StepTimes,
    memory: MemoryLedger,
    workload: WorkloadSpec,
    *,
    progress: Callable[[int], None] | None = None,
) -> ServeResult:
    """Serve `workload` on the layout `steps` prices, with the KV pools of `memory`."""
    return Simulation(steps, memory).run(workload, progress=progress)
