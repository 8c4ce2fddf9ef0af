"""Ranking by an objective, the winner at each concurrency, and the Pareto frontier.

Objectives:
- max-throughput: the most output tokens per second at any concurrency of the sweep;
- max-throughput-under-slo: the same, counting only concurrencies whose TPOT (and TTFT) meet the limits;
- min-latency: the fastest decode one client sees (output tokens per second per user at one request).
Setups that predict within `TIE` of each other are ties: the model's own error is larger than that.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from shardwise.decide.search import Candidate
from shardwise.errors import SpecError
from shardwise.serve.steady import Prediction

TIE = 0.02  # relative gap under which two predictions are reported as a tie


class Objective(str, Enum):
    MAX_THROUGHPUT = "max-throughput"
    UNDER_SLO = "max-throughput-under-slo"
    MIN_LATENCY = "min-latency"


@dataclass(frozen=True, kw_only=True)
class Score:
    candidate: Candidate
    value: float  # output tok/s (throughput objectives) or tok/s per user (min-latency)
    at: Prediction  # the concurrency that gives it


@dataclass(frozen=True, kw_only=True)
class Ranking:
    objective: Objective
    scores: tuple[Score, ...]  # best first
    unmet: tuple[Candidate, ...]  # setups that meet the SLO at no concurrency
    tpot_s: float | None = None
    ttft_s: float | None = None

    @property
    def best(self) -> Score | None:
        return self.scores[0] if self.scores else None

    def ties(self) -> tuple[Score, ...]:
        """Setups within TIE of the best."""
        if not self.scores:
            return ()
        top = self.scores[0].value
        return tuple(s for s in self.scores[1:] if s.value >= top * (1 - TIE))


def rank(
    candidates: tuple[Candidate, ...] | list[Candidate],
    objective: Objective,
    *,
    tpot_s: float | None = None,
    ttft_s: float | None = None,
) -> Ranking:
    if objective is Objective.UNDER_SLO and tpot_s is None and ttft_s is None:
        raise SpecError("max-throughput-under-slo needs a limit: give --tpot-ms and/or --ttft-ms")
    scores, unmet = [], []
    for c in candidates:
        score = _score(c, objective, tpot_s=tpot_s, ttft_s=ttft_s)
        if score is None:
            unmet.append(c)
        else:
            scores.append(score)
    scores.sort(key=lambda s: (-s.value, s.candidate.gpus, s.candidate.name))
    return Ranking(objective=objective, scores=tuple(scores), unmet=tuple(unmet), tpot_s=tpot_s, ttft_s=ttft_s)


def _score(c: Candidate, objective: Objective, *, tpot_s: float | None, ttft_s: float | None) -> Score | None:
    if objective is Objective.MIN_LATENCY:
        first = min(c.predictions, key=lambda p: p.concurrency)
        return Score(candidate=c, value=first.per_user_tok_s, at=first)
    usable = [
        p
        for p in c.predictions
        if objective is Objective.MAX_THROUGHPUT
        or ((tpot_s is None or p.tpot_s <= tpot_s) and (ttft_s is None or p.ttft_s <= ttft_s))
    ]
    if not usable:
        return None
    best = max(usable, key=lambda p: p.output_tok_s)
    return Score(candidate=c, value=best.output_tok_s, at=best)


@dataclass(frozen=True, kw_only=True)
class Winner:
    concurrency: int
    candidate: Candidate
    prediction: Prediction


def winners_by_concurrency(candidates: tuple[Candidate, ...] | list[Candidate]) -> list[Winner]:
    """The setup with the most output tok/s at each concurrency of the sweep."""
    out = []
    for n, prediction in enumerate(candidates[0].predictions if candidates else ()):
        best = max(candidates, key=lambda c: c.predictions[n].output_tok_s)
        out.append(Winner(concurrency=prediction.concurrency, candidate=best, prediction=best.predictions[n]))
    return out


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
    points = [
        ParetoPoint(candidate=c, prediction=p, tok_s_per_gpu=p.output_tok_s / c.gpus, per_user_tok_s=p.per_user_tok_s)
        for c in candidates
        for p in c.predictions
    ]
    points.sort(key=lambda q: (-q.per_user_tok_s, -q.tok_s_per_gpu))
    frontier, best = [], -1.0
    for q in points:
        if q.tok_s_per_gpu > best:
            frontier.append(q)
            best = q.tok_s_per_gpu
    return frontier
