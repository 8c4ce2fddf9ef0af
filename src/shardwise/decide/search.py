"""Every setup worth serving a model with on a cluster, predicted; and every setup that is out, and why.

Candidates are each engine's valid layouts on all of the cluster's GPUs (its own enumeration: TP, PP, EP,
attention DP, dense TP, DCP, replicas), each with the engine's default options and with every combination of
the option variants the engine declares (CUDA graphs off, FP8 KV cache), each also with the memory fraction
raised to what the memory model says leaves activations and graphs room (SGLang), and with the context lowered
to what the workload needs where the engine would refuse the model's whole context (vLLM --max-model-len);
predicted at every concurrency by the closed-form model, the levels doubling until every KV pool binds.
Excluded are the setups the engine refuses, those that do not fit in memory, and those that leave GPUs idle:
from the enumeration and from the commands people try by hand (`Engine.hand_tried`).

Pruning loses no optimum: a setup is dropped only when it cannot start (refused, weights do not load, no
KV room) or cannot hold one request of the workload; every setup that starts is predicted.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import combinations
from typing import Any

from shardwise.cost.book import PriceBook
from shardwise.cost.memory import MemoryLedger, memory_ledger
from shardwise.cost.step import StepCost
from shardwise.engines.base import Engine, Setup, get_engine
from shardwise.engines.check import model_reference
from shardwise.engines.flags import command_text
from shardwise.engines.layout import Layout, sized_alike_key
from shardwise.serve.steady import Prediction, Predictor
from shardwise.serve.steps import StepTimes
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec


@dataclass(frozen=True)
class SearchCase:
    """What a search predicts for: the model, the cluster and the requests' lengths; and the search's price book, which
    the few setups a report explains are priced again from."""

    model: ModelSpec
    cluster: ClusterSpec
    isl: int
    osl: int
    book: PriceBook = field(default_factory=PriceBook, compare=False, repr=False)


@dataclass(frozen=True)
class Variant:
    """The options a setup sets beyond its layout, as data: the engine's declared option variants it turns on, by
    their names ("CUDA graphs off", "FP8 KV cache"), the context it lowers to and the memory fraction it raises to.
    The default variant sets none of them (the engine's defaults)."""

    named: tuple[str, ...] = ()
    max_model_len: int | None = None  # --max-model-len lowered to what the workload needs
    memory_fraction: float | None = None  # the memory fraction raised (`raised_fraction`)

    @property
    def options(self) -> tuple[str, ...]:
        """Each option as a report names it."""
        lowered = (f"max model len {self.max_model_len:,}",) if self.max_model_len is not None else ()
        raised = (f"memory fraction {self.memory_fraction:.2f}",) if self.memory_fraction is not None else ()
        return (*self.named, *lowered, *raised)

    @property
    def label(self) -> str:
        """ "" for the engine's defaults, else its options ("CUDA graphs off, memory fraction 0.93")."""
        return ", ".join(self.options)

    @property
    def kinds(self) -> frozenset[str]:
        """Its options, a raised memory fraction or a lowered context counted as one whatever its value (each
        layout's own)."""
        lowered = ("max model len lowered",) if self.max_model_len is not None else ()
        raised = ("memory fraction raised",) if self.memory_fraction is not None else ()
        return frozenset((*self.named, *lowered, *raised))


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A setup that starts, with its predictions at every concurrency of the search."""

    engine: str
    variant: Variant  # the options it sets beyond its layout
    given: dict[str, Any]  # its options as its command gives them, by canonical name
    version: str  # the engine release it was set up for
    layout: Layout
    predictions: tuple[Prediction, ...]
    model_ref: str  # the model as the commands name it
    remote_code: bool = False  # the commands pass --trust-remote-code
    priced_by: SearchCase | None = field(default=None, repr=False, compare=False)  # what `priced` prices again

    @cached_property
    def setup(self) -> Setup:
        """The engine's setup of its command, set up again from the options it gives (a candidate keeps only its
        figures; a report explains a few)."""
        assert self.priced_by is not None, "a candidate without its setup is set up for its search's model"
        model, cluster = self.priced_by.model, self.priced_by.cluster
        engine = get_engine(self.engine)
        return engine.setup(dict(self.given), model=model, cluster=cluster, version=engine.version(self.version))

    @cached_property
    def memory(self) -> MemoryLedger:
        """How each GPU's memory is used, sized again as the search sized it."""
        assert self.priced_by is not None, "a candidate without its ledger is sized from its search's model"
        return memory_ledger(self.priced_by.model, self.layout, self.priced_by.cluster, book=self.priced_by.book)

    @cached_property
    def launch(self) -> tuple[str, ...]:
        """Node 0's command."""
        engine = get_engine(self.engine)
        return tuple(engine.launch_command(self.setup, model_ref=self.model_ref, remote_code=self.remote_code))

    @cached_property
    def node_launches(self) -> tuple[tuple[str, ...], ...]:
        """One command per node, where the setup spans several; else none."""
        engine = get_engine(self.engine)
        commands = engine.launch_commands(self.setup, model_ref=self.model_ref, remote_code=self.remote_code)
        return tuple(tuple(c) for c in commands) if len(commands) > 1 else ()

    @property
    def launches(self) -> tuple[tuple[str, ...], ...]:
        """The commands that start it: one per node."""
        return self.node_launches or (self.launch,)

    @cached_property
    def name(self) -> str:
        return ", ".join(filter(None, [f"{self.engine} {self.layout.describe()}", self.variant.label]))

    @property
    def options(self) -> tuple[str, ...]:
        """The engine options it sets beyond the layout ("CUDA graphs off", "FP8 KV cache", ...)."""
        return self.variant.options

    @property
    def option_kinds(self) -> frozenset[str]:
        return self.variant.kinds

    @cached_property
    def gpus(self) -> int:
        return self.layout.gpus_used

    @property
    def peak(self) -> Prediction:
        return max(self.predictions, key=lambda p: p.output_tok_s)

    def at(self, concurrency: int) -> Prediction:
        return next(p for p in self.predictions if p.concurrency == concurrency)

    def priced(self, concurrencies: Sequence[int] | None = None) -> tuple[Prediction, ...]:
        """Its predictions (at `concurrencies`, default all) with each decode step's ops: a search keeps only the
        figures of thousands of setups, and a report asks for the ops of a few."""
        levels = [p.concurrency for p in self.predictions] if concurrencies is None else list(concurrencies)
        if self.priced_by is None or all(p.decode is not None for p in self.predictions):
            return tuple(self.at(c) for c in levels)
        w = self.priced_by
        predictor = Predictor(StepTimes(w.model, self.layout, w.cluster, book=w.book), self.memory)
        return tuple(predictor.sweep(levels, isl=w.isl, osl=w.osl))

    def step_at(self, concurrency: int) -> StepCost:
        """The decode step at one of its concurrencies, with its ops."""
        step = self.priced([concurrency])[0].decode
        assert step is not None
        return step

    def __str__(self) -> str:
        peak = self.peak
        command = " ".join(self.launch) + (f" (and {len(self.launches) - 1} more nodes)" if self.node_launches else "")
        return (
            f"{self.name}: {peak.output_tok_s:,.0f} output tok/s at {peak.concurrency} clients "
            f"({peak.per_user_tok_s:,.1f} per user); start it with: {command}"
        )


@dataclass(frozen=True, kw_only=True)
class Excluded:
    """A setup that will not serve, with the reason and the engine's own error where it raises one."""

    engine: str
    launch: tuple[str, ...]
    layout: str | None
    verdict: str  # invalid | oom | no_kv_room | too_long | idle_gpus
    reason: str
    engine_error: str | None = None
    hand_tried: bool = False  # one of the commands people try first


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """What a search found for its case: the setups it predicted at every concurrency, and those it excluded."""

    case: SearchCase  # the model, cluster and request lengths it searched for, and its price book
    model_ref: str
    concurrency: tuple[int, ...]
    candidates: tuple[Candidate, ...]
    excluded: tuple[Excluded, ...]
    engines: tuple[str, ...] = field(default_factory=tuple)


MAX_LEVEL = 65_536  # the most clients a saturating search goes to


class _Search:
    def __init__(
        self, model: ModelSpec, model_ref: str, cluster: ClusterSpec, *, isl: int, osl: int, concurrency: Sequence[int]
    ) -> None:
        self.model, self.model_ref, self.cluster = model, model_ref, cluster
        self.isl, self.osl, self.concurrency = isl, osl, tuple(concurrency)
        self.case = SearchCase(model=model, cluster=cluster, isl=isl, osl=osl)
        self.book = self.case.book
        self.candidates: list[Candidate] = []
        self.pending: list[tuple[Engine, Setup, MemoryLedger, Variant]] = []
        self.excluded: dict[str, Excluded] = {}
        self._seen: set[tuple[str, tuple[int, ...], str]] = set()

    def plan(self, name: str, version: str | None) -> list[tuple[Engine, dict[str, Any], Any, bool]]:
        """What to consider for one engine: the hand-tried commands, then the engine's own enumeration."""
        engine = get_engine(name)
        v = engine.version(version)
        hand = [(engine, dict(g), v, True) for g in engine.hand_tried(self.model, self.cluster)]
        return hand + [(engine, dict(g), v, False) for g in engine.candidates(self.model, self.cluster)]

    def consider(self, engine: Engine, given: dict[str, Any], version: Any, *, hand_tried: bool) -> None:
        setup = engine.setup(given, model=self.model, cluster=self.cluster, version=version)
        if not setup.valid or setup.layout is None:
            first = setup.rejections[0]
            launch = self._launch(engine, setup)
            self._exclude(engine.name, launch, None, "invalid", first.reason, first.engine_error, hand_tried)
            return
        layout = setup.layout
        memory = memory_ledger(self.model, layout, self.cluster, book=self.book)
        if setup.gpus_used < self.cluster.num_gpus:
            why = f"starts on {setup.gpus_used} of the {self.cluster.num_gpus} GPUs"
            if memory.verdict != "ok":
                why += f", and even so: {memory.reason}"
            verdict = "idle_gpus" if memory.verdict == "ok" else memory.verdict
            self._exclude(
                engine.name,
                self._launch(engine, setup),
                layout.describe(),
                verdict,
                why,
                memory.engine_error,
                hand_tried,
            )
            return
        key = (engine.name, layout.structure(), "")
        if key in self._seen:
            return
        self._seen.add(key)
        added, started = 0, None
        for named, options in [(Variant(), {}), *_option_sets(engine, given)]:
            if not options:  # the command as given: set up and sized above
                variant, v_memory = setup, memory
            else:
                variant = engine.setup({**given, **options}, model=self.model, cluster=self.cluster, version=version)
                if not variant.valid or variant.layout is None:
                    continue
                v_memory = memory_ledger(self.model, variant.layout, self.cluster, book=self.book)
            named, options, variant, v_memory = self._with_shorter_context(
                engine, named, {**given, **options}, variant, v_memory, version
            )
            for v_named, v_setup, v_ledger in self._with_raised_fraction(
                engine, named, {**given, **options}, variant, v_memory, version
            ):
                if v_ledger.verdict == "ok" and self._holds(v_setup.layout, v_ledger):
                    self.pending.append((engine, v_setup, v_ledger, v_named))
                    added += 1
                elif v_ledger.verdict == "ok" and started is None:
                    started = (v_setup, v_ledger)
        if not added:  # say why with an option set that starts, where one does: the request is then too long
            shown, shown_memory = started or (setup, memory)
            self._fits(engine.name, self._launch(engine, shown), layout, shown_memory, hand_tried)

    def _holds(self, layout: Layout | None, memory: MemoryLedger) -> bool:
        """One request of the workload fits the context the engine serves and the KV pool."""
        context = (layout.options.max_model_len if layout else None) or self.model.max_position_embeddings
        within = not context or self.isl + self.osl <= context
        return within and memory.max_concurrency(isl=self.isl, osl=self.osl) >= 1

    def _with_shorter_context(
        self, engine: Engine, named: Variant, given: dict[str, Any], setup: Setup, memory: MemoryLedger, version: Any
    ) -> tuple[Variant, dict[str, Any], Setup, MemoryLedger]:
        """Where the engine refuses to start because its KV pool cannot hold one request of the model's whole context
        (vLLM), the option set with the context lowered to the smallest power of two that holds the workload's
        requests, as people set --max-model-len; else the option set as it is."""
        flag = engine.context_option
        if flag is None or flag in given or memory.verdict != "no_kv_room" or setup.layout is None:
            return named, given, setup, memory
        need = 1 << (self.isl + self.osl - 1).bit_length()
        current = setup.layout.options.max_model_len
        if current is not None and need >= current:
            return named, given, setup, memory
        shorter = engine.setup({**given, flag: need}, model=self.model, cluster=self.cluster, version=version)
        if not shorter.valid or shorter.layout is None:
            return named, given, setup, memory
        ledger = memory_ledger(self.model, shorter.layout, self.cluster, book=self.book)
        if ledger.verdict != "ok":
            return named, given, setup, memory
        return replace(named, max_model_len=need), {**given, flag: need}, shorter, ledger

    def _with_raised_fraction(
        self, engine: Engine, named: Variant, given: dict[str, Any], setup: Setup, memory: MemoryLedger, version: Any
    ) -> list[tuple[Variant, Setup, MemoryLedger]]:
        """The option set as the engine sizes it, and with the memory fraction raised (`raised_fraction`)."""
        out = [(named, setup, memory)]
        raised = raised_fraction(
            engine, given, setup, memory, model=self.model, cluster=self.cluster, version=version, book=self.book
        )
        if raised is not None:
            fraction, higher, ledger = raised
            out.append((replace(named, memory_fraction=fraction), higher, ledger))
        return out

    def _fits(self, engine: str, launch: tuple[str, ...], layout: Layout, memory: MemoryLedger, tried: bool) -> bool:
        context = layout.options.max_model_len or self.model.max_position_embeddings
        if context and self.isl + self.osl > context:
            reason = (
                f"a request of {self.isl:,} + {self.osl:,} tokens is longer than the {context:,} tokens the "
                "engine serves for this model (its context length)"
            )
            self._exclude(engine, launch, layout.describe(), "too_long", reason, None, tried)
            return False
        if memory.verdict != "ok":
            self._exclude(
                engine,
                launch,
                layout.describe(),
                memory.verdict,
                memory.reason or memory.verdict,
                memory.engine_error,
                tried,
            )
            return False
        if memory.max_concurrency(isl=self.isl, osl=self.osl) < 1:
            reason = (
                f"its KV pool ({memory.kv_tokens_per_rank:,} tokens per rank) cannot hold one request of "
                f"{self.isl} + {self.osl} tokens"
            )
            self._exclude(engine, launch, layout.describe(), "too_long", reason, None, tried)
            return False
        return True

    def predict(self, *, saturate: bool) -> None:
        """Predict every setup that serves at every level; with `saturate`, the levels go on doubling until every
        setup's KV pool binds (beyond it a setup runs no more requests at once, and gains no throughput)."""
        if saturate and self.pending:
            most = max(memory.max_concurrency(isl=self.isl, osl=self.osl) for *_, memory, _ in self.pending)
            levels = list(self.concurrency)
            while levels and levels[-1] < min(most, MAX_LEVEL):
                levels.append(levels[-1] * 2)
            self.concurrency = tuple(levels)
        ref = model_reference(self.model_ref)
        # by the layout without its memory fraction: the fraction costs nothing
        shared: dict[tuple, tuple[StepTimes, dict[tuple, Prediction]]] = {}
        pending, self.pending = deque(self.pending), []
        while pending:  # each setup's ledger let go once it is predicted: a report sizes the few it shows again
            engine, setup, memory, variant = pending.popleft()
            assert setup.layout is not None
            costs = sized_alike_key(setup.layout)
            held = shared.get(costs)
            if held is None:
                shared.clear()  # variants of one layout are considered together
                held = shared[costs] = (StepTimes(self.model, setup.layout, self.cluster, book=self.book), {})
            predictor = Predictor(held[0], memory, shared=held[1])  # the step times of its memory-fraction twin
            # the figures only: each decode step's ops are priced again for the few setups a report explains
            predictions = predictor.figures(self.concurrency, isl=self.isl, osl=self.osl)
            self.candidates.append(
                Candidate(
                    engine=engine.name,
                    variant=variant,
                    given=setup.given,
                    version=setup.version,
                    layout=setup.layout,
                    predictions=predictions,
                    model_ref=ref,
                    remote_code=self.model.remote_code,
                    priced_by=self.case,
                )
            )
        self.pending = []

    def _launch(self, engine: Engine, setup: Setup) -> tuple[str, ...]:
        return tuple(
            engine.launch_command(setup, model_ref=model_reference(self.model_ref), remote_code=self.model.remote_code)
        )

    def _exclude(
        self,
        engine: str,
        launch: tuple[str, ...],
        layout: str | None,
        verdict: str,
        reason: str,
        error: str | None,
        tried: bool,
    ) -> None:
        text = command_text(list(launch))
        if text not in self.excluded:
            self.excluded[text] = Excluded(
                engine=engine,
                launch=launch,
                layout=layout,
                verdict=verdict,
                reason=reason,
                engine_error=error,
                hand_tried=tried,
            )


def raised_fraction(
    engine: Engine,
    given: dict[str, Any],
    setup: Setup,
    memory: MemoryLedger,
    *,
    model: ModelSpec,
    cluster: ClusterSpec,
    version: Any,
    book: PriceBook | None = None,
) -> tuple[float, Setup, MemoryLedger] | None:
    """The memory fraction raised to the largest value that leaves every GPU its activation peak and CUDA graphs
    (floored to 0.01), with the setup of `given` at it and its ledger; None unless the engine has such a flag, the
    command does not set it, and raising it adds room. theorise searches it beside the defaults; layouts shows it
    where nothing fits at the defaults."""
    flag = engine.memory_fraction_option
    current = setup.layout.options.memory_fraction if setup.layout else None
    if flag is None or flag in given or memory.largest_fraction is None or current is None:
        return None
    raised = math.floor(memory.largest_fraction * 100) / 100
    if raised <= current + 0.005:
        return None
    higher = engine.setup({**given, flag: raised}, model=model, cluster=cluster, version=version)
    if not higher.valid or higher.layout is None:
        return None
    return raised, higher, memory_ledger(model, higher.layout, cluster, book=book)


def _option_sets(engine: Engine, given: dict[str, Any]) -> list[tuple[Variant, dict[str, Any]]]:
    """Every non-empty combination of the engine's option variants the command does not already set."""
    fresh = [
        (label, opts) for label, opts in engine.option_variants if not all(given.get(k) == v for k, v in opts.items())
    ]
    out = []
    for size in range(1, len(fresh) + 1):
        for combo in combinations(fresh, size):
            out.append(
                (
                    Variant(named=tuple(label for label, _ in combo)),
                    {k: v for _, opts in combo for k, v in opts.items()},
                )
            )
    return out


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    model_ref: str,
    engines: Sequence[str],
    isl: int,
    osl: int,
    concurrency: Sequence[int],
    version: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    saturate: bool = False,
) -> SearchResult:
    """Predict every setup of `engines` that serves `model` on `cluster`; list the others with their reasons.
    `progress(done, total)` is called as setups are considered. With `saturate`, the concurrency levels go on
    doubling past the last one given until every setup's KV pool binds."""
    state = _Search(model, model_ref, cluster, isl=isl, osl=osl, concurrency=concurrency)
    plan = [item for name in engines for item in state.plan(name, version if len(engines) == 1 else None)]
    for n, (engine, given, v, tried) in enumerate(plan, start=1):
        state.consider(engine, given, v, hand_tried=tried)
        if progress:
            progress(n, len(plan))
    state.predict(saturate=saturate)
    return SearchResult(
        case=state.case,
        model_ref=model_ref,
        concurrency=state.concurrency,
        candidates=tuple(state.candidates),
        excluded=tuple(state.excluded.values()),
        engines=tuple(engines),
    )
