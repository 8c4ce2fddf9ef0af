"""Ranking by an objective, the winner at each concurrency, and the Pareto frontier.

Objectives:
- max-throughput: the most output tokens per second at any concurrency of the sweep;
- max-throughput-under-slo: the same, counting only concurrencies whose TPOT (and TTFT) meet the limits;
- min-latency: the fastest decode one client sees (output tokens per second per user at one request);
- min-cost: the fewest dollars per million output tokens at any concurrency (decide/economics.py: the GPUs' hourly
  rate, and energy where an electricity price is given);
- max-tokens-per-watt: the most output tokens per second per kilowatt drawn (the same module's estimate).
Each prediction carries the confidence of its family (serve/accuracy.py: the errors validate measured on the rows of
its engine and parallelism mechanisms). The best prediction does not win over a setup whose family was measured on
this GPU with a smaller error unless its predicted gain exceeds its own uncertainty: an extrapolated mechanism must
promise more than it may be off by. Variants of one layout (options on or off) share their family's error, so
between them the model's stated error (its median error in output tok/s over every validated run) decides: within
it they are ties, broken toward the engine's defaults (the same layout with fewer non-default options), and the
ranking says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from itertools import groupby

import numpy as np

from shardwise.decide.economics import Pricing, economics
from shardwise.decide.search import Candidate
from shardwise.engines.base import get_engine
from shardwise.engines.flags import flag_table, flag_words, parse_version
from shardwise.errors import SpecError
from shardwise.serve.accuracy import Confidence, stated_median
from shardwise.serve.steady import Prediction


def tie_band() -> float:
    """The relative gap under which two predictions are a tie: the median tok/s error over every validated row."""
    return stated_median("plain", "output_tok_s") or 0.0


class Objective(str, Enum):
    MAX_THROUGHPUT = "max-throughput"
    UNDER_SLO = "max-throughput-under-slo"
    MIN_LATENCY = "min-latency"
    MIN_COST = "min-cost"
    MAX_TOKENS_PER_WATT = "max-tokens-per-watt"


OBJECTIVES = ", ".join(o.value for o in Objective)
# what a score's value is under each objective (higher is better under every one)
VALUE_OF = {
    Objective.MIN_COST: "output tokens per USD",
    Objective.MAX_TOKENS_PER_WATT: "output tok/s per kW",
    Objective.MIN_LATENCY: "output tok/s per user",
}


@dataclass(frozen=True, kw_only=True)
class Score:
    candidate: Candidate
    value: float  # output tok/s (throughput objectives), tok/s per user (min-latency), tokens per USD (min-cost) or
    # tok/s per kW (max-tokens-per-watt): higher is better
    at: Prediction  # the concurrency that gives it


@dataclass(frozen=True, kw_only=True)
class Ranking:
    objective: Objective
    scores: tuple[Score, ...]  # best first
    unmet: tuple[Candidate, ...]  # setups that meet the SLO at no concurrency
    tpot_s: float | None = None
    ttft_s: float | None = None
    band: float = 0.0  # relative gap under which two variants of one layout are a tie
    preferred_over: Score | None = None  # the top prediction, where a tie put the engine's defaults before it
    unvalidated_over: Score | None = None  # the top prediction, where a better validated setup came before it
    # the best setup whose family was measured on these GPUs, where the recommended one's was not (its gain beat it)
    measured_alternative: Score | None = None
    confidence_of: Callable[[Score], Confidence] | None = None

    def confidence(self, score: Score) -> Confidence | None:
        return self.confidence_of(score) if self.confidence_of else None

    @property
    def best(self) -> Score | None:
        return self.scores[0] if self.scores else None

    def ties(self) -> tuple[Score, ...]:
        """The other setups of the recommended one's family within the tie band of it, either side: variants the
        model cannot tell apart (other families carry errors of their own: `confidence`)."""
        if not self.scores:
            return ()
        best = self.scores[0]
        family = best.candidate.layout.family()
        return tuple(
            s
            for s in self.scores[1:]
            if s.candidate.layout.family() == family
            and tied(s.value, best.value, self.band)
            and tied(best.value, s.value, self.band)
        )


def rank(
    candidates: tuple[Candidate, ...] | list[Candidate],
    objective: Objective,
    *,
    tpot_s: float | None = None,
    ttft_s: float | None = None,
    confidence_of: Callable[[Score], Confidence] | None = None,
    pricing: Pricing | None = None,
) -> Ranking:
    """Rank by `objective`; `confidence_of`: each score's confidence (none: the predictions alone decide); `pricing`:
    the rates min-cost prices at (default: each GPU's published price)."""
    if objective is Objective.UNDER_SLO and tpot_s is None and ttft_s is None:
        raise SpecError("max-throughput-under-slo needs a limit: give --tpot-ms and/or --ttft-ms")
    pricing = pricing or Pricing()
    scores, unmet = [], []
    for c in candidates:
        score = _score(c, objective, tpot_s=tpot_s, ttft_s=ttft_s, pricing=pricing)
        if score is None:
            unmet.append(c)
        else:
            scores.append(score)
    # equal to the figures shown, fewer GPUs first, then fewer non-default options (CUDA graphs on before off), then
    # by name (named only where the rest ties: a search ranks thousands of setups)
    first = [(-_shown(s.value), s.candidate.gpus, len(s.candidate.options)) for s in scores]
    order = sorted(range(len(scores)), key=first.__getitem__)
    ranked: list[Score] = []
    for _, group in groupby(order, key=first.__getitem__):
        alike = [scores[i] for i in group]
        ranked += sorted(alike, key=lambda s: s.candidate.name) if len(alike) > 1 else alike
    scores = ranked
    unvalidated = None
    if confidence_of is not None and scores:
        validated = _validated_first(scores, confidence_of)
        if validated is not scores[0]:
            unvalidated = scores[0]
            scores.remove(validated)
            scores.insert(0, validated)
    alternative = _measured_alternative(scores, confidence_of) if confidence_of is not None else None
    band = tie_band()
    default = _closest_to_defaults(scores, band)
    top = scores[0] if scores else None
    if default is not None and top is not None and default is not top:
        scores.remove(default)
        scores.insert(0, default)
    return Ranking(
        objective=objective,
        scores=tuple(scores),
        unmet=tuple(unmet),
        tpot_s=tpot_s,
        ttft_s=ttft_s,
        band=band,
        preferred_over=top if default is not None and default is not top else None,
        unvalidated_over=unvalidated,
        measured_alternative=alternative,
        confidence_of=confidence_of,
    )


def _validated_first(scores: list[Score], confidence_of: Callable[[Score], Confidence]) -> Score:
    """The setup to recommend: the best prediction, unless a setup whose family was measured on this GPU with a smaller
    error comes within the best's uncertainty of it (the best's gain over it is no more than what the best may be off
    by); then that one, and the same question again from it."""
    top = scores[0]
    while True:
        mine = confidence_of(top)
        better = next(
            (
                s
                for s in scores
                if s is not top
                and (c := confidence_of(s)).basis == "this GPU"
                and c.uncertainty < mine.uncertainty
                and top.value <= s.value * (1 + mine.uncertainty)
            ),
            None,
        )
        if better is None:
            return top
        top = better


def _measured_alternative(scores: list[Score], confidence_of: Callable[[Score], Confidence]) -> Score | None:
    """Where the setup to recommend belongs to a family no run measured on this GPU, the best setup whose family was,
    with a smaller error than the recommended one's uncertainty: what to fall back on, and to measure. The
    recommended one beats it by more than its own uncertainty (else `_validated_first` would have put it first)."""
    if not scores:
        return None
    mine = confidence_of(scores[0])
    if mine.basis == "this GPU":
        return None
    return next(
        (s for s in scores if (c := confidence_of(s)).basis == "this GPU" and c.uncertainty < mine.uncertainty),
        None,
    )


def tied(value: float, top: float, band: float) -> bool:
    """`top` is no more than `band` above `value` (the model's stated error): the model cannot tell them apart."""
    return bool(top <= value * (1 + band))  # a NumPy float gives a NumPy bool


def _closest_to_defaults(scores: list[Score], band: float) -> Score | None:
    """The top setup's layout with the fewest non-default options (a subset of the top's: CUDA graphs on, the
    model's KV dtype, the engine's memory fraction) that predicts within the tie band of it: the engine's defaults
    where the model cannot tell the options apart. Layout flags stay: `flag_gains` says what each buys."""
    if not scores or not scores[0].candidate.options:
        return None
    top = scores[0]
    c = top.candidate
    same = [
        s
        for s in scores
        if tied(s.value, top.value, band)
        and s.candidate.engine == c.engine
        and s.candidate.layout.structure() == c.layout.structure()
        and set(s.candidate.options) <= set(c.options)
    ]
    return min(same, key=lambda s: (len(s.candidate.options), -s.value))


def _score(
    c: Candidate, objective: Objective, *, tpot_s: float | None, ttft_s: float | None, pricing: Pricing
) -> Score | None:
    if objective is Objective.MIN_LATENCY:
        first = min(c.predictions, key=lambda p: p.concurrency)
        return Score(candidate=c, value=first.per_user_tok_s, at=first)
    # the loads that meet the limits given (every load where none is given)
    usable = [
        p
        for p in c.predictions
        if objective is Objective.MAX_THROUGHPUT
        or ((tpot_s is None or p.tpot_s <= tpot_s) and (ttft_s is None or p.ttft_s <= ttft_s))
    ]
    if not usable:
        return None
    if objective in (Objective.MIN_COST, Objective.MAX_TOKENS_PER_WATT):
        assert c.priced_by is not None, "a setup is priced in dollars and watts on its search's cluster"
        cluster = c.priced_by.cluster

        def value(p: Prediction) -> float:
            e = economics(p, cluster, c.layout, pricing)
            if objective is Objective.MAX_TOKENS_PER_WATT:
                return e.output_tok_s_per_kw
            if e.cost_per_hour_usd is None:
                raise SpecError(f"min-cost needs a price: {pricing.basis(cluster)}")
            if e.cost_per_hour_usd <= 0:
                raise SpecError(
                    "min-cost at $0 per GPU-hour with no --kwh-usd prices every setup at nothing: give a rate"
                )
            return p.output_tok_s * 3600 / e.cost_per_hour_usd

        best = max(usable, key=value)
        return Score(candidate=c, value=value(best), at=best)
    best = max(usable, key=lambda p: p.output_tok_s)
    return Score(candidate=c, value=best.output_tok_s, at=best)


KNEE = 0.05  # the knee: the least load within this share of a setup's most throughput


def knee(c: Candidate) -> Prediction:
    """The lowest concurrency at which a setup's throughput is within KNEE of its most."""
    top = c.peak.output_tok_s
    return min((p for p in c.predictions if p.output_tok_s >= top * (1 - KNEE)), key=lambda p: p.concurrency)


@dataclass(frozen=True, kw_only=True)
class OptionGain:
    option: str  # one non-default option of the recommended setup
    without: Score | None  # the same setup without it; None where that does not start or serve the workload

    def gain(self, value: float) -> float | None:
        """What the option buys: the recommended value over the value without it, less one."""
        return value / self.without.value - 1 if self.without and self.without.value else None


def option_gains(ranking: Ranking) -> list[OptionGain]:
    """For each non-default option of the recommended setup, the same setup without it (its other options kept)."""
    best = ranking.best
    if best is None:
        return []
    c = best.candidate
    out = []
    for option in c.options:
        rest = set(c.options) - {option}
        without = next(
            (
                s
                for s in ranking.scores
                if s.candidate.engine == c.engine
                and s.candidate.layout.structure() == c.layout.structure()
                and set(s.candidate.options) == rest
            ),
            None,
        )
        out.append(OptionGain(option=option, without=without))
    return out


@dataclass(frozen=True, kw_only=True)
class FlagGain:
    flags: tuple[str, ...]  # layout flags of the recommended command, as it spells them ("--dcp-size 2", …)
    without: Score  # the searched setup whose command is the recommended one without them

    def gain(self, value: float) -> float:
        return value / self.without.value - 1 if self.without.value else 0.0


def flag_gains(ranking: Ranking) -> list[FlagGain]:
    """What each layout flag of the recommended command buys beyond the engine's default for it: the searched
    setup whose command drops that flag (and the fewest others, as a flag that needs another goes with it) and
    keeps the rest. Flags that only set option variants are `option_gains`'; a flag whose setup without it was not
    searched (it would leave GPUs idle, or not start) is not listed."""
    best = ranking.best
    if best is None:
        return []
    c = best.candidate
    engine = get_engine(c.engine)
    variant_flags = {k for _, opts in engine.option_variants for k in opts}
    variant_flags |= {engine.memory_fraction_option, engine.context_option}
    layout = _layout_items(c, variant_flags)
    table = flag_table(c.engine)
    version = parse_version(c.version, c.engine)
    # the setups of its engine and option variants whose layout flags are a subset of its own, each read once
    fewer = [
        (s, items)
        for s in ranking.scores
        if s.candidate.engine == c.engine and s.candidate.option_kinds == c.option_kinds
        for items in (_layout_items(s.candidate, variant_flags),)
        if items < layout
    ]
    out = []
    for name in c.given:
        if name in variant_flags:
            continue
        twins = [(s, items) for s, items in fewer if name not in s.candidate.given]
        if not twins:
            continue
        twin, items = max(twins, key=lambda t: (len(t[0].candidate.given), t[0].value))
        dropped = [k for k, _ in sorted(layout - items, key=lambda kv: list(c.given).index(kv[0]))]
        if dropped[0] != name:  # said with the flag it goes with
            continue
        spelled = tuple(" ".join(flag_words(table, version, k, c.given[k])) for k in dropped)
        out.append(FlagGain(flags=spelled, without=twin))
    return out


def _layout_items(c: Candidate, variant_flags: set[str | None]) -> frozenset[tuple[str, str]]:
    """The flags of its command that set its layout, not its option variants."""
    return frozenset((k, repr(v)) for k, v in c.given.items() if k not in variant_flags)


@dataclass(frozen=True, kw_only=True)
class Winner:
    concurrency: int
    candidate: Candidate
    prediction: Prediction


def winners_by_concurrency(candidates: tuple[Candidate, ...] | list[Candidate]) -> list[Winner]:
    """The setup with the most output tok/s at each concurrency of the sweep."""
    out = []
    # each level's output tok/s of every setup (at the first setup's levels), read once
    shown = len(candidates[0].predictions) if candidates else 0
    levels = list(zip(*([p.output_tok_s for p in c.predictions[:shown]] for c in candidates), strict=False))
    for n, prediction in enumerate(candidates[0].predictions if candidates else ()):
        # setups shown alike differ by less than a unit of the fourth digit, under 0.1 % of the top: only those near it
        top = max(levels[n])
        near = [c for c, rate in zip(candidates, levels[n], strict=True) if rate >= top * (1 - 2e-3)] or candidates
        best = max(near, key=lambda c: (_shown(c.predictions[n].output_tok_s), -len(c.options)))
        out.append(Winner(concurrency=prediction.concurrency, candidate=best, prediction=best.predictions[n]))
    return out


def _shown(value: float) -> float:
    """A figure to four significant digits: setups that differ by less (under 0.05 %, no more than the report's
    whole tok/s show below 10,000) are ordered as equal."""
    return float(f"{value:.4g}")


def crossovers(winners: list[Winner]) -> list[tuple[Winner, Winner]]:
    """Consecutive concurrencies where the winning setup changes: (last win of the old, first of the new)."""
    return [(a, b) for a, b in zip(winners, winners[1:], strict=False) if a.candidate.name != b.candidate.name]


@dataclass(frozen=True, kw_only=True)
class ParetoPoint:
    candidate: Candidate
    prediction: Prediction
    tok_s_per_gpu: float
    per_user_tok_s: float


def pareto(candidates: tuple[Candidate, ...] | list[Candidate]) -> list[ParetoPoint]:
    """Points (setup, concurrency) that no other beats on both throughput per GPU and speed per user,
    fastest per user first."""
    # a point each, fastest per user first (ties: more per GPU first, then in order); on the frontier where it gives
    # more per GPU than every point before it
    per_user = np.array([p.per_user_tok_s for c in candidates for p in c.predictions])
    if not len(per_user):
        return []
    per_gpu = np.array([p.output_tok_s / gpus for c in candidates for gpus in (c.gpus,) for p in c.predictions])
    starts = np.cumsum([0] + [len(c.predictions) for c in candidates])  # each setup's first point
    order = np.lexsort((-per_gpu, -per_user))  # stable: equal points keep their order
    ranked = per_gpu[order]
    before = np.fmax.accumulate(np.concatenate(([-1.0], ranked[:-1])))  # a NaN is on no frontier and bars none
    out = []
    for i in order[ranked > before]:
        n = int(np.searchsorted(starts, i, side="right")) - 1
        c = candidates[n]
        out.append(
            ParetoPoint(
                candidate=c,
                prediction=c.predictions[i - starts[n]],
                tok_s_per_gpu=float(per_gpu[i]),
                per_user_tok_s=float(per_user[i]),
            )
        )
    return out
