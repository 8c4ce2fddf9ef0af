"""Time of one engine step, per pipeline stage, as a ledger whose parts add up to the whole.

The GPU side of a stage is the sum of its ops (collectives included; those two-batch overlap hides count
only where they outlast the compute beside them). The host side is what it takes to issue the kernels:
each launch in eager mode, one graph replay with CUDA graphs. The host runs ahead of the GPU, so a stage
takes the longer of the two; the difference, when the host is longer, is launch overhead. A scheduler
that does not overlap (pipeline parallelism, --disable-overlap-schedule) adds its host time to every stage;
a speculative decode step without it (SGLang), the host time of its draft, verify and keep, measured whole.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from operator import attrgetter
from typing import NamedTuple

from shardwise.cost.book import ENTRIES, LayoutPrices, PriceBook
from shardwise.cost.measured import MeasuredKernels
from shardwise.cost.roofline import OpCost, collective_s, comm_cost, compute_cost, rates
from shardwise.engines.layout import Layout, shape_key, with_kv_dtype
from shardwise.hardware.load import overheads
from shardwise.ops.build import (
    CommsPiece,
    LayerPiece,
    OpKey,
    PieceKey,
    StepModel,
    comm_ops,
    layer_gemm_keys,
    layer_other_keys,
    piece_op_keys,
)
from shardwise.ops.types import OpClass, Phase
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec

PARTS = ("compute", "memory", "comm", "launch", "host")
# options that change what an op costs; the others size memory or decide how the host issues the kernels
COST_OPTIONS = ("two_batch_overlap", "overlap_from_tokens", "eplb", "allreduce_norm_fusion_tokens", "kv_cache_dtype")
_COST_OPTIONS = attrgetter(*COST_OPTIONS)


@dataclass(frozen=True, kw_only=True)
class StageCost:
    stage: int
    gpu_s: float
    host_s: float
    time_s: float
    parts_s: dict[str, float]  # compute / memory / comm / launch / host: sums to time_s


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """One step of a batch through every stage (the latency of one micro-batch through the pipeline)."""

    phase: Phase
    requests: int
    new_tokens: int
    context_tokens: int
    figures: Figures  # per stage
    listing: Callable[[], tuple[tuple[int, int, PricedPiece], ...]] = field(repr=False, compare=False)
    release: str = ""  # the engine release modelled

    @cached_property
    def pieces(self) -> tuple[tuple[int, int, PricedPiece], ...]:
        """(stage, times run, its ops' costs, one run each) of every piece (listed when asked: a search sums each
        kind of stage once and reads only the times)."""
        return self.listing()

    @cached_property
    def stages(self) -> tuple[StageCost, ...]:
        """Each stage's cost (made when asked: a search reads only the step's times)."""
        return tuple(
            StageCost(
                stage=i,
                gpu_s=f.gpu_s,
                host_s=f.host_s,
                time_s=f.time_s,
                parts_s=dict(zip(PARTS, f.parts_s, strict=True)),
            )
            for i, f in enumerate(self.figures)
        )

    @property
    def longest_stage_s(self) -> float:
        return longest_stage_s(self.figures)

    @cached_property
    def ops(self) -> tuple[OpCost, ...]:
        """Every op of the step with its cost, in order (listed when asked: a search needs only the stages' times)."""
        return tuple(c.run(count, stage) for stage, count, piece in self.pieces for c in piece.costs)

    @property
    def time_s(self) -> float:
        return time_s(self.figures)

    @property
    def parts_s(self) -> dict[str, float]:
        """compute / memory / comm / launch / host seconds over all stages: they sum to time_s."""
        return parts_s(self.figures)

    @property
    def bound(self) -> str:
        parts = self.parts_s
        return max(parts, key=parts.__getitem__)

    @property
    def coverage(self) -> dict[str, float | list[str]]:
        """Share of the step's GPU time on the critical path priced from measured kernel tables (the rest from
        the roofline and the link model), the share looked up beyond a table's range, the share from tables another
        engine release measured than the one modelled, and the tables used."""
        ops = [op for op in self.ops if not op.hidden]
        total = sum(op.time_s for op in ops) or 1.0
        measured = [op for op in ops if op.measured]
        return {
            "measured_share": sum(op.time_s for op in measured) / total,
            "extrapolated_share": sum(op.time_s for op in measured if op.extrapolated) / total,
            "other_release_share": sum(op.time_s for op in measured if op.measured_release != self.release) / total,
            "tables": sorted({op.measured for op in measured if op.measured}),
        }

    def by_class_s(self) -> dict[str, float]:
        """GPU time per op class (gemm, experts, attention, elementwise, sampling, comm), every stage."""
        out: dict[str, float] = defaultdict(float)
        for op in self.ops:
            if not op.hidden:
                out[op.op_class.value] += op.time_s
        return dict(out)


class PieceSums(NamedTuple):
    """A piece's ops (or a stage's pieces) summed as a stage adds them up (`_added`): every figure is linear in how
    often the piece runs."""

    compute_s: float  # GPU time of compute-bound ops, launches apart
    memory_s: float  # GPU time of memory-bound ops, launches apart
    launch_s: float  # the GPU's share of kernel launches
    comm_s: float  # collectives on the critical path
    hidden_comm_s: float  # collectives two-batch overlap hides behind the other half's compute
    kernels: float  # kernels launched (the host's work when it launches each)


NO_SUMS = PieceSums(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class StageFigures(NamedTuple):
    """One stage of a step: its GPU's time, its host's, the stage's time (the longer, as the scheduler overlaps them)
    and that time's parts in PARTS order."""

    gpu_s: float
    host_s: float
    time_s: float
    parts_s: tuple[float, float, float, float, float]


Figures = tuple[StageFigures, ...]  # per stage


def time_s(figures: Figures) -> float:
    """A step's time from its stages' figures (`StepCost.figures`): through every stage."""
    return sum(f.time_s for f in figures)


def longest_stage_s(figures: Figures) -> float:
    return max(f.time_s for f in figures)


def parts_s(figures: Figures) -> dict[str, float]:
    """compute / memory / comm / launch / host seconds over all stages: they sum to `time_s`."""
    compute = memory = comm = launch = host = 0.0  # added stage by stage, left to right (`sum` compensates from 3.12)
    for f in figures:
        c, m, k, la, h = f.parts_s  # in PARTS order
        compute += c
        memory += m
        comm += k
        launch += la
        host += h
    return {"compute": compute, "memory": memory, "comm": comm, "launch": launch, "host": host}


class StepCostModel:
    """Prices steps of one layout on one cluster; build once, call `step` for each batch. `tables=False` prices
    every op on the roofline (what the measured kernel tables change is then visible)."""

    def __init__(
        self,
        step_model: StepModel,
        *,
        tables: bool = True,
        layout: Layout | None = None,
        book: PriceBook | None = None,
        prices: LayoutPrices | None = None,
    ) -> None:
        """`layout`: the layout whose host side is priced, where `step_model` is shared with layouts whose ops cost
        the same (default its own); `book`: the price book of the search or check (default one of its own);
        `prices`: the tables of the layouts that share the ops, where the caller has them (`of`)."""
        self.step_model = step_model
        layout = self.layout = layout or step_model.layout
        self.cluster: ClusterSpec = step_model.cluster
        oh, cal = overheads(), self.cluster.calibration
        eager, scheduler = oh.eager_kernel_cpu.si("s"), oh.scheduler_step_cpu.si("s")
        request = 0.0  # host time per running request per step: no measured default, a calibration may set it
        if cal is not None:
            eager = cal.value("eager_kernel_cpu_s", eager)
            scheduler = cal.value("scheduler_step_cpu_s", scheduler)
            request = cal.value("request_cpu_s", 0.0)
        self._eager_s = eager
        # an eager prefill's launches: measured whole for some engines and model families (overheads.yaml)
        self._eager_prefill_s = oh.eager_prefill_kernel_s(layout.engine, step_model.model.family) or eager
        self._request_s = request
        self._overlap = layout.options.overlap_schedule
        self._graph_s = oh.graph_launch_cpu.si("s")
        self._scheduler_s = scheduler
        # SGLang's speculative decode step without the overlap scheduler waits on the host for each of its forwards
        spec = layout.options.spec is not None and layout.engine == "sglang"
        self._spec_step_s = oh.speculative_step_cpu.si("s") if spec else scheduler
        self._graphs = layout.options.cuda_graph
        self._graph_max = layout.options.cuda_graph_max_bs
        book = book or PriceBook()
        self.prices = prices or _layout_prices(book, step_model.model, layout, self.cluster, tables)
        pricer = self.prices.pricer  # one for the layouts that share the tables (their engine release too)
        if pricer is None or pricer.step_model is not step_model or pricer.tables is not tables:
            pricer = self.prices.pricer = _Pricer(step_model, layout, tables, book)
        self._pricer, self.rates = pricer, pricer.rates

    @classmethod
    def of(
        cls,
        model: ModelSpec,
        layout: Layout,
        cluster: ClusterSpec,
        *,
        tables: bool = True,
        book: PriceBook | None = None,
    ) -> StepCostModel:
        """The cost model of `layout`, its step model shared with every layout in `book` whose ops cost the same."""
        book = book or PriceBook()
        prices = _layout_prices(book, with_kv_dtype(model, layout), layout, cluster, tables)
        if prices.step_model is None:
            prices.step_model = StepModel(model, layout, cluster, book.ops)
        return cls(prices.step_model, tables=tables, layout=layout, book=book, prices=prices)

    def step(self, *, phase: Phase, requests: int, new_tokens: int = 1, context_tokens: int = 0) -> StepCost:
        key, whole, figures = self._figures(phase, requests, new_tokens, context_tokens)
        step = self.prices.steps.get(whole)
        if step is None:
            step = self.prices.steps[whole] = StepCost(
                phase=phase,
                requests=requests,
                new_tokens=new_tokens,
                context_tokens=context_tokens,
                figures=figures,
                listing=partial(self._pricer.listed, key, requests),
                release=self.layout.version,
            )
        return step if step.requests == requests else replace(step, requests=requests)

    def figures(self, *, phase: Phase, requests: int, new_tokens: int = 1, context_tokens: int = 0) -> Figures:
        """`step(...).figures` without the step (what a search reads of tens of thousands of steps)."""
        return self._figures(phase, requests, new_tokens, context_tokens)[2]

    def named_figures(
        self, *, phase: Phase, requests: int, new_tokens: int = 1, context_tokens: int = 0
    ) -> tuple[tuple, Figures]:
        """`figures`, and a key that names them among the layouts that share this one's ops (`prices`): equal keys,
        equal figures."""
        _, whole, figures = self._figures(phase, requests, new_tokens, context_tokens)
        return whole, figures

    def _figures(self, phase: Phase, requests: int, new_tokens: int, context: int) -> tuple[tuple, tuple, Figures]:
        """(the key of the step's ops, the key of its figures, its figures): kept for the layouts that share the ops,
        by what the host side follows from besides the cluster."""
        layout = self.layout
        # a step follows from the busiest attention-DP rank's requests (StepModel.pieces; the host's work likewise)
        rank_batch = -(-requests // (layout.attn_dp * layout.replicas))
        key = (phase.value, rank_batch, new_tokens, context)
        if phase is Phase.DECODE:
            graphed = self._graphs and (self._graph_max is None or rank_batch <= self._graph_max)
        else:  # a prefill step under a graph holds at most so many prompt tokens (SGLang's piecewise and breakable)
            graphed = rank_batch * new_tokens <= layout.options.prefill_graph_tokens
        scheduler = self._spec_step_s if phase is Phase.DECODE else self._scheduler_s
        whole = (key, graphed, self._overlap, scheduler)  # the host side: the rest follows from the cluster and the key
        prices = self.prices
        figures = prices.figures.get(whole)
        if figures is None:
            sums = prices.sums.get(key)
            if sums is None:  # each piece priced once and counted as often as it runs: a step is linear in them
                sums = prices.sums[key] = self._stage_sums(phase, requests, new_tokens, context)
            per_request = rank_batch * self._request_s  # the scheduler's work for the running requests, once a step
            # stages with the same pieces have the same figures (but the first, where the scheduler's work is)
            classes = self.step_model.stage_classes(phase)
            eager = None if graphed else self._eager_s if phase is Phase.DECODE else self._eager_prefill_s
            alike = {c: self._stage(stage_sums, eager, scheduler) for c, stage_sums in sums.items() if c}
            figures = prices.figures[whole] = (
                self._stage(sums[0], eager, scheduler, per_request),
                *[alike[c] for c in classes[1:]],
            )
        return key, whole, figures

    def _stage_sums(self, phase: Phase, requests: int, new_tokens: int, context: int) -> dict[int, PieceSums]:
        """The sums of each class of stages (`StepModel.stage_classes`), by its first stage: `PricedPiece.sums` times as
        often as each piece runs, in its pieces' order (each piece priced once)."""
        firsts = self.step_model.class_firsts(phase)
        shape, keys = self.step_model.piece_keys(
            phase=phase, requests=requests, new_tokens=new_tokens, context_tokens=context, stages=firsts
        )
        price = self._pricer.piece
        pieces = [price(key).sums for key in keys]
        sums: dict[int, tuple[float, ...]] = dict.fromkeys(firsts, NO_SUMS)
        for stage, count, slot in shape:  # field by field, as PieceSums orders them
            a, b, c, d, e, f = sums[stage]
            pa, pb, pc, pd, pe, pf = pieces[slot]
            sums[stage] = (
                a + count * pa,
                b + count * pb,
                c + count * pc,
                d + count * pd,
                e + count * pe,
                f + count * pf,
            )
        return {stage: PieceSums(*added) for stage, added in sums.items()}

    def _stage(
        self, sums: PieceSums, eager_s: float | None, scheduler_s: float, per_request: float = 0.0
    ) -> StageFigures:
        """One stage's figures from the sums of its pieces (`PricedPiece.sums`): its GPU work,
        and the host's where it is longer. `eager_s` is the host's time per kernel launched (None: a CUDA graph's
        replay launches them all); `scheduler_s` is the host's time per step that the overlap scheduler hides
        (a speculative decode step's, or a plain step's); `per_request` the scheduler's work for the running
        requests: beside the launches when the scheduler overlaps the GPU, after them otherwise."""
        compute, memory, launch, comm, hidden_comm, kernels = sums
        comm += max(0.0, hidden_comm - compute - memory)
        gpu = compute + memory + comm + launch
        host = self._graph_s if eager_s is None else kernels * eager_s
        if self._overlap:
            host += per_request
            waiting = max(0.0, host - gpu)
        else:  # a scheduler that does not overlap adds its time to every stage
            waiting = max(0.0, host - gpu) + scheduler_s + per_request
        return StageFigures(gpu, host, gpu + waiting, (compute, memory, comm, launch, waiting))


def _layout_prices(
    book: PriceBook, model: ModelSpec, layout: Layout, cluster: ClusterSpec, tables: bool
) -> LayoutPrices:
    """The book's tables for the layouts whose ops cost the same as `layout`'s (`model` as its KV cache stores it): a
    search prices the same structure with the memory fraction raised, CUDA graphs off, other slot counts."""
    return book.layout_prices((model, cluster), (tables, shape_key(layout), _COST_OPTIONS(layout.options)))


class _Pricer:
    """Prices the pieces of the steps of the layouts that share one step model (`StepModel.pieces`), each once, from
    the op costs, collective times and layer pieces every layout on the cluster shares (the book's). A step lists its
    pieces through it when asked: it holds no step, so a step that holds it makes no reference cycle."""

    def __init__(self, step_model: StepModel, layout: Layout, tables: bool, book: PriceBook) -> None:
        self.step_model, self.tables, cluster = step_model, tables, step_model.cluster
        self.cluster, self.rates = cluster, rates(cluster)
        self._comm = book.comm_prices(cluster)
        self._measured = MeasuredKernels(cluster.gpu.name, layout.engine, layout.version, enabled=tables)
        self._listed: dict[tuple, tuple[tuple[int, int, PricedPiece], ...]] = {}  # each step's pieces, when asked
        # an op's cost follows from the op, the cluster and the tables of this engine release: layouts share them
        self._ops = book.op_prices(cluster, layout.engine, layout.version, tables)

    def listed(self, key: tuple, requests: int) -> tuple[tuple[int, int, PricedPiece], ...]:
        """Every piece of the step `key` names (see `step`), each priced once: shared by the layouts that share them."""
        listed = self._listed.get(key)
        if listed is None:
            phase, _, new_tokens, context = key
            pieces = self.step_model.pieces(
                phase=Phase(phase), requests=requests, new_tokens=new_tokens, context_tokens=context
            )
            listed = self._listed[key] = tuple((p.stage, p.count, self.piece(p.key)) for p in pieces)
        return listed

    def piece(self, key: PieceKey) -> PricedPiece:
        """A piece's costs and sums: its key holds all they follow from, so it is priced once for every layout that
        runs it alike."""
        piece = self._ops.pieces.get(key)
        if piece is None:
            if len(self._ops.pieces) >= ENTRIES:
                self._ops.pieces.clear()
            if type(key) is LayerPiece:
                piece = self._layer(key)
            elif type(key) is CommsPiece:
                piece = self._comms(key)
            else:
                piece = self._once(key)
            self._ops.pieces[key] = piece
        return piece

    def _layer(self, key: LayerPiece) -> PricedPiece:
        """A layer's piece: its GEMMs' costs and sums kept for every layout that runs them alike (they follow from the
        layer's matrices, the phase and the tokens alone), then its other ops added in their order."""
        inputs, phase, rank_tokens, stage_tokens = key.inputs, key.phase, key.rank_tokens, key.stage_tokens
        shared = (inputs.gemms, inputs.gathered, inputs.dense_gathered, phase, rank_tokens, stage_tokens)
        gemms = self._ops.gemm_sums.get(shared)
        if gemms is None:
            costs = tuple(self._cost(k) for k in layer_gemm_keys(inputs, phase, rank_tokens, stage_tokens))
            gemms = self._ops.gemm_sums[shared] = (costs, _added(costs, NO_SUMS))
        known, cost = self._ops.ops, self._cost
        rest = tuple(known.get(k) or cost(k) for k in layer_other_keys(key))
        return PricedPiece(gemms[0] + rest, _added(rest, gemms[1]))

    def _once(self, key: PieceKey) -> PricedPiece:
        """The embedding's or the head's piece: its ops priced here (no other piece runs them)."""
        return PricedPiece(tuple(self._priced(k) for k in piece_op_keys(key)))

    def _cost(self, key: OpKey) -> OpCost:
        """The cost of the op `key` names, kept by its key."""
        cost = self._ops.ops.get(key)
        if cost is None:
            if len(self._ops.ops) >= ENTRIES:
                self._ops.ops.clear()
            cost = self._ops.ops[key] = self._priced(key)
        return cost

    def _priced(self, key: OpKey) -> OpCost:
        op = key.op()
        return compute_cost(op, self.rates, self._measured.time(op))

    def _comms(self, key: CommsPiece) -> PricedPiece:
        """A stage's collectives: summed from each collective's time (the ops and their costs listed when asked)."""
        comm, hidden, kernels = 0.0, 0.0, 0
        times, cluster = self._comm.times, self.cluster
        tokens = key.tokens
        for e in key.template.entries:
            seconds = collective_s(
                cluster, e.collective, e.bytes_per_token * tokens[e.sized_by], e.group, e.impl, times, e.span
            )
            if e.overlapped:
                hidden += seconds * e.count
            else:
                comm += seconds * e.count
            kernels += e.count
        # listed when asked, from the key alone
        return PricedPiece(
            sums=PieceSums(0.0, 0.0, 0.0, comm, hidden, kernels),
            costs=lambda: tuple(comm_cost(op, cluster, times) for op in comm_ops(key)),
        )


class PricedPiece:
    """The costs of a piece's ops, each run once, and their sums as a stage adds them up: compute-bound and
    memory-bound GPU time (launches apart), per-kernel GPU time, collectives on the critical path, those two-batch
    overlap hides, and kernel launches. Every figure is linear in how often the piece runs. `costs` is either the
    ops' costs or how to price them when asked (a stage's collectives: their sums come from the link model)."""

    __slots__ = ("_costs", "sums")

    def __init__(
        self,
        costs: tuple[OpCost, ...] | Callable[[], tuple[OpCost, ...]],
        sums: PieceSums | None = None,
    ) -> None:
        self._costs = costs
        if sums is None:
            assert isinstance(costs, tuple)
            sums = _added(costs, NO_SUMS)
        self.sums = sums

    @property
    def costs(self) -> tuple[OpCost, ...]:
        if not isinstance(self._costs, tuple):
            self._costs = self._costs()
        return self._costs


def _added(costs: tuple[OpCost, ...], start: PieceSums) -> PieceSums:
    """`start` with the ops' costs added, one by one in their order."""
    compute, memory, launch, comm, hidden_comm, kernels = start
    for c in costs:
        kernels += c.kernels
        if c.hidden:
            hidden_comm += c.comm_s
        elif c.op_class is OpClass.COMM:
            comm += c.comm_s
        else:
            launch += c.launch_s
            if c.compute_s > c.memory_s:
                compute += c.time_s - c.launch_s
            else:
                memory += c.time_s - c.launch_s
    return PieceSums(compute, memory, launch, comm, hidden_comm, kernels)
