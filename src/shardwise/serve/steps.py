"""The step times a serving loop needs, priced from the cost model and remembered.

`StepTimes(model, layout, cluster)` answers two questions for any batch:
- `decode(running, context)`: one decode cycle, the time in which every running request gains `tokens`
  tokens (one; τ with speculative decoding), with its parts. With pipeline parallelism the running requests
  split into up to `pp` micro-batches in different stages at once: a cycle is the longer of one micro-batch's
  trip through every stage and the time the busiest stage needs for all of them. With speculative decoding a
  cycle is the drafter's forwards plus the target's verify of every drafted token.
- `prefill(requests, new_tokens, context)`: one prefill step.
It also carries the host time before a request reaches the scheduler: the machine's calibrated trip
(`first_token_host_s`) and the front end's tokenising of the prompt (`tokenize_s_per_token`), which the serving
models add before each request's first step.
Exact answers are cached by their arguments. The simulation asks for thousands of shapes, so `decode_s` and
`prefill_s` interpolate linearly between exact answers on a grid (every batch up to 64, then 16 per
doubling; contexts every 256 tokens): step time is close to linear in context and smooth in batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from shardwise.cost.book import PriceBook
from shardwise.cost.step import Figures, StepCost, StepCostModel, longest_stage_s, parts_s, time_s
from shardwise.engines.layout import Layout
from shardwise.errors import SpecError
from shardwise.hardware.load import overheads
from shardwise.ops.types import Phase
from shardwise.serve.speculative import SpecPlan, check_accept_length, spec_plan
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.drafter import Drafter, load_drafter, mtp_drafter
from shardwise.spec.model import ModelSpec

CONTEXT_GRID = 256  # tokens between exact context points
EXACT_BATCH = 64  # every batch size up to this is priced exactly; beyond, 16 points per doubling


@dataclass(frozen=True, kw_only=True)
class DecodeCycle:
    running: int
    context_tokens: int
    cycle_s: float  # every running request gains `tokens` tokens in this time
    tokens: float  # tokens per request per cycle: 1, or the mean accepted length
    step: StepCost  # the target's step of one micro-batch (the verify, with speculative decoding)
    parts_s: dict[str, float] = field(default_factory=dict)  # sums to cycle_s


class StepTimes:
    """Decode and prefill step times of one layout on one cluster (build once, ask many times)."""

    def __init__(
        self,
        model: ModelSpec,
        layout: Layout,
        cluster: ClusterSpec,
        *,
        accept_length: float | None = None,
        drafter: Drafter | None = None,
        tables: bool = True,
        prefill_scale: float = 1.0,
        book: PriceBook | None = None,
        text_prompts: bool = True,
    ) -> None:
        """`book`: the price book of the search or check (default one of its own); `text_prompts` False: the prompts
        reach the engine as token ids, which no front end tokenises."""
        self.layout = layout
        self.prefill_scale = prefill_scale  # a what-if: every prefill step takes this multiple of its priced time
        # host time before a request reaches the scheduler: no measured default, a calibration may set it
        self.first_token_host_s = cluster.calibration.value("first_token_host_s", 0.0) if cluster.calibration else 0.0
        oh = overheads()  # the front end encodes each text prompt, one after another, before the scheduler sees it
        self._tokenize_per_token_s = (oh.tokenize_cpu_per_prose_token.si("s"), oh.tokenize_cpu_per_random_token.si("s"))
        if not text_prompts:
            self._tokenize_per_token_s = (0.0, 0.0)
        book = book or PriceBook()
        self.target = StepCostModel.of(model, layout, cluster, tables=tables, book=book)
        self.plan: SpecPlan | None = None
        self.draft: StepCostModel | None = None
        self.tokens = 1.0
        spec = layout.options.spec
        if spec is not None:
            drafter = drafter or _drafter_for(model, spec.draft_model)
            self.plan = spec_plan(spec, block_size=drafter.block_size if drafter else None)
            if accept_length is None:
                raise SpecError(
                    f"{spec.algorithm} speculative decoding needs its acceptance: give --accept-length (mean tokens "
                    f"kept per step, 1 to {self.plan.drafted + 1}) or --accept-rate (per drafted token, 0 to 1)"
                )
            self.tokens = check_accept_length(accept_length, self.plan)
            if self.plan.needs_drafter:
                if drafter is None:
                    raise SpecError(
                        f"{spec.algorithm} drafting needs a draft model: give --speculative-draft-model-path "
                        f"({model.name} has no MTP layers)"
                    )
                # the drafter runs on the target's GPUs inside the engine step: no scheduler step of its own
                options = layout.options.model_copy(update={"spec": None, "overlap_schedule": True})
                draft_layout = layout.model_copy(update={"pp": 1, "options": options})
                self.draft = StepCostModel.of(drafter.model, draft_layout, cluster, tables=tables, book=book)
        self._decode: dict[tuple[int, int], DecodeCycle] = {}
        self._cycles: dict[tuple[int, int], tuple[float, dict[str, float]]] = {}
        self._shared_cycles = self.target.prices.cycles
        self._verify = self.plan.verify_tokens if self.plan else 1  # tokens each request runs per decode step
        # a prefill step's time follows from the ops and how the host issues them, never graphed: shared, with what the
        # serving models built on these times keep of their prefills, by the layouts that share the ops and the
        # scheduler (a search's CUDA-graph and memory-fraction twins)
        self.prefills = self.target.prices.prefill(layout.options.overlap_schedule, prefill_scale)
        self._prefill = self.prefills.steps

    # --- exact -----------------------------------------------------------------------------------------

    def decode(self, running: int, context: int) -> DecodeCycle:
        key = (running, context)
        made = self._decode.get(key)
        if made is None:
            cycle_s, parts = self.cycle(running, context)
            step = self.target.step(
                phase=Phase.DECODE,
                requests=self._micro_requests(running),
                new_tokens=self._verify,
                context_tokens=context,
            )
            made = self._decode[key] = DecodeCycle(
                running=running,
                context_tokens=context,
                cycle_s=cycle_s,
                tokens=self.tokens,
                step=step,
                parts_s=dict(parts),
            )
        return made

    def cycle(self, running: int, context: int) -> tuple[float, dict[str, float]]:
        """`decode`'s cycle time and its parts, without the step (what a search and the simulation read; the parts
        are shared: copy them to change them)."""
        key = (running, context)
        made = self._cycles.get(key)
        if made is None:
            made = self._cycles[key] = self._cycle(running, context)
        return made

    def tokenize_s_per_token(self, *, prose: bool) -> float:
        """Front-end host time per prompt token: of prose (a dataset of conversations), or of a prompt decoded from
        random token ids (the benchmark clients' random datasets)."""
        return self._tokenize_per_token_s[0] if prose else self._tokenize_per_token_s[1]

    def prefill(self, requests: int, new_tokens: int, context: int) -> float:
        key = (requests, new_tokens, context)
        if key not in self._prefill:
            figures = self.target.figures(
                phase=Phase.PREFILL, requests=requests, new_tokens=new_tokens, context_tokens=context
            )
            self._prefill[key] = time_s(figures) * self.prefill_scale
        return self._prefill[key]

    def _micro_requests(self, running: int) -> int:
        """The requests of one pipeline micro-batch when `running` run at once."""
        return math.ceil(running / min(self.layout.pp, running))

    def _cycle(self, running: int, context: int) -> tuple[float, dict[str, float]]:
        micro = min(self.layout.pp, running)
        name, figures = self.target.named_figures(
            phase=Phase.DECODE, requests=self._micro_requests(running), new_tokens=self._verify, context_tokens=context
        )
        # the target's part follows from its step's figures and the micro-batches alone: shared by the layouts that
        # share the figures (a search's CUDA-graph twins, where neither graphs the step)
        made = self._shared_cycles.get((name, micro))
        if made is None:
            made = self._shared_cycles[(name, micro)] = self._through(figures, micro)
        if self.draft is None or self.plan is None:
            return made
        cycle, parts = made[0], dict(made[1])
        parts["draft"] = sum(
            p.count
            * time_s(
                self.draft.figures(
                    phase=Phase.DECODE, requests=running, new_tokens=p.tokens_per_request, context_tokens=context
                )
            )
            for p in self.plan.passes
        )
        return cycle + parts["draft"], parts

    def _through(self, figures: Figures, micro: int) -> tuple[float, dict[str, float]]:
        """The cycle of `micro` micro-batches whose step has these figures: the longer of one micro-batch's trip
        through every stage and the busiest stage's time for all of them; and its parts."""
        through = time_s(figures)
        cycle = max(through, micro * longest_stage_s(figures))
        parts = parts_s(figures)
        if self.layout.pp > 1:  # per-GPU view: the parts of one trip, the rest of the cycle waiting on the pipeline
            parts["pipeline"] = max(0.0, cycle - through)
        return cycle, parts

    # --- interpolated (for the simulation) ---------------------------------------------------------------

    def decode_s(self, running: int, context: float) -> float:
        """Cycle time at any batch and mean context, from the exact grid around it."""
        lo, hi = _batch_points(running)
        c0 = int(context // CONTEXT_GRID) * CONTEXT_GRID
        fc = (context - c0) / CONTEXT_GRID

        def at(b: int) -> float:
            a = self.cycle(b, c0)[0]
            return a + (self.cycle(b, c0 + CONTEXT_GRID)[0] - a) * fc if fc else a

        if hi == lo:
            return at(lo)
        return at(lo) + (at(hi) - at(lo)) * (running - lo) / (hi - lo)

    def prefill_s(self, requests: int, tokens: int, context: float) -> float:
        """A prefill step of `tokens` new tokens over `requests` requests (an even share each), after `context`
        cached tokens per request on average."""
        per = max(1, math.ceil(tokens / requests))
        lo, hi = _batch_points(per)
        c = int(round(context / CONTEXT_GRID)) * CONTEXT_GRID
        a = self.prefill(requests, lo, c)
        if hi == lo:
            return a
        return a + (self.prefill(requests, hi, c) - a) * (per - lo) / (hi - lo)


def _batch_points(n: int) -> tuple[int, int]:
    """Grid points around n: n itself up to EXACT_BATCH, then 16 per doubling."""
    if n <= EXACT_BATCH:
        return n, n
    step = 2 ** (int(math.log2(n)) - 4)
    lo = n // step * step
    return lo, (lo if lo == n else lo + step)


def _drafter_for(model: ModelSpec, draft_model: str | None) -> Drafter | None:
    if draft_model:
        return load_drafter(draft_model)
    return mtp_drafter(model) if model.num_mtp_layers > 0 else None
