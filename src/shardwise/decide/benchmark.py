"""The best setups of the steady-state screen, simulated as a benchmark would send the load.

The search prices every setup in closed form: clients in a closed loop at fixed mean lengths. A benchmark
sends something else: a dataset's spread of lengths, a request rate or a burst, a fixed number of prompts.
Its tail (the few longest requests at a small batch) and its queueing decide what it measures, so the best
setups of the screen are simulated under that workload, request by request, and ranked again by what the
benchmark would report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardwise.decide.rank import Ranking
from shardwise.decide.search import Candidate, SearchResult
from shardwise.errors import SpecError
from shardwise.serve.simulate import ServeResult, simulate
from shardwise.serve.steps import StepTimes
from shardwise.spec.workload import WorkloadSpec

SIMULATED = 5  # setups of the screen simulated under the benchmark's workload


@dataclass(frozen=True, kw_only=True)
class Simulated:
    candidate: Candidate
    screen_rank: int  # its place in the steady-state ranking, from 1
    results: tuple[ServeResult, ...]  # one per workload, in the workloads' order

    @property
    def output_tok_s(self) -> float:
        """The mean over the workloads of what the benchmark would report."""
        return sum(r.output_tok_s for r in self.results) / len(self.results)


@dataclass(frozen=True, kw_only=True)
class BenchmarkRanking:
    workloads: tuple[WorkloadSpec, ...]
    ranked: tuple[Simulated, ...]  # best first
    dropped: tuple[tuple[str, str], ...] = ()  # (setup, why) of screened setups that could not run the workload

    @property
    def best(self) -> Simulated | None:
        return self.ranked[0] if self.ranked else None


def simulate_best(
    result: SearchResult,
    ranking: Ranking,
    workloads: Sequence[WorkloadSpec],
    *,
    top: int = SIMULATED,
) -> BenchmarkRanking:
    """The `top` best setups of the screen (by its objective; speculative ones aside: their acceptance is not known
    here), simulated under every workload, ranked by their mean output tok/s over the workloads."""
    scores = enumerate(ranking.scores, start=1)
    chosen = [(n, s.candidate) for n, s in scores if s.candidate.layout.options.spec is None][:top]
    ranked, dropped = [], []
    for place, candidate in chosen:
        steps = StepTimes(result.case.model, candidate.layout, result.case.cluster, book=result.case.book)
        try:
            runs = [simulate(steps, candidate.memory, workload) for workload in workloads]
        except SpecError as exc:  # a request longer than the setup's KV pool
            dropped.append((candidate.name, str(exc)))
            continue
        ranked.append(Simulated(candidate=candidate, screen_rank=place, results=tuple(runs)))
    ranked.sort(key=lambda s: -s.output_tok_s)
    return BenchmarkRanking(workloads=tuple(workloads), ranked=tuple(ranked), dropped=tuple(dropped))
