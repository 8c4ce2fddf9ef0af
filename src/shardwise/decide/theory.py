"""The whole answer to "what is the best way to serve this model on these GPUs, and why": search, ranking,
explanation, ceiling, what-ifs, the winner at each concurrency, and the commands to start and check it.
When nothing fits, what would: how many such GPUs, or which smaller weight format.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from shardwise.decide.benchmark import BenchmarkRanking, simulate_best
from shardwise.decide.ceiling import Ceiling, ceiling
from shardwise.decide.economics import Economics, Pricing, economics
from shardwise.decide.explain import Explanation, explain
from shardwise.decide.rank import (
    Objective,
    ParetoPoint,
    Ranking,
    Score,
    Winner,
    crossovers,
    pareto,
    rank,
    winners_by_concurrency,
)
from shardwise.decide.search import Candidate, SearchResult, search
from shardwise.decide.whatif import WhatIf, what_ifs
from shardwise.engines.base import BenchLoad, get_engine
from shardwise.engines.check import model_reference
from shardwise.engines.flags import HEAD_IP, command_text
from shardwise.hardware.load import runtime
from shardwise.serve.accuracy import Confidence, confidence, regime_of
from shardwise.spec.catalog import DEFAULT_MODEL, load_model
from shardwise.spec.cluster import DEFAULT_CLUSTER, ClusterSpec, load_cluster
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import weight_ledger
from shardwise.spec.workload import WorkloadSpec

SCREEN_LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # clients the steady-state screen predicts at by default
PROMPTS_PER_CLIENT = 10  # benchmark requests per client: enough for the steady state to dominate the ramp


@dataclass(frozen=True, kw_only=True)
class Theory:
    result: SearchResult
    ranking: Ranking
    explanation: Explanation | None
    ceiling: Ceiling | None
    what_ifs: tuple[WhatIf, ...]
    winners: tuple[Winner, ...]
    crossovers: tuple[tuple[Winner, Winner], ...]
    frontier: tuple[ParetoPoint, ...]
    verify: tuple[tuple[str, ...], ...]  # commands that check the winner: its launch on each node, then the checks
    would_fit: tuple[str, ...]  # when nothing serves: what would
    benchmark: BenchmarkRanking | None = None  # the best setups simulated as a benchmark would send the load
    pricing: Pricing = field(default_factory=Pricing)  # the rates costs are priced at

    def economics_of(self, score: Score) -> Economics:
        """Cost and power of a ranked setup at the load its score comes from."""
        c = score.candidate
        cluster = c.priced_by.cluster if c.priced_by is not None else self.result.case.cluster
        return economics(score.at, cluster, c.layout, self.pricing)

    @property
    def best(self) -> Candidate | None:
        return self.ranking.best.candidate if self.ranking.best else None

    def verify_lines(self) -> list[str]:
        """The verify commands as shell lines, each node's launch under a comment where it spans several nodes."""
        nodes = len(self.best.launches) if self.best else 0
        lines = []
        for i, cmd in enumerate(self.verify):
            if nodes > 1 and i < nodes:
                lines.append(
                    f"# on node {i} of {nodes}" + (" (set HEAD_IP to its address on every node)" if i == 0 else "")
                )
            lines.append(command_text(list(cmd)))
        return lines


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector paused inside (the one place shardwise pauses it: `theorise`, which every command
    that searches goes through). A search makes millions of small objects, all freed by their reference
    counts (it makes no reference cycles: a test checks), and the collector would walk the thousands of setups it
    holds again and again (a quarter of a large search's time). Resumed on the way out, if it was running, with what
    was made inside counted as old (frozen and thawed into the oldest generation: walked young, all of it would be
    walked at once on the next allocation; as old, with the next full collection)."""
    running = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if running:
            if not gc.get_freeze_count():  # (a process that froze objects of its own keeps them frozen)
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def theorise(
    model: ModelSpec | str = DEFAULT_MODEL,
    cluster: ClusterSpec | str = DEFAULT_CLUSTER,
    *,
    model_ref: str | None = None,
    engines: Sequence[str] = ("sglang",),
    isl: int = 1024,
    osl: int = 1024,
    concurrency: Sequence[int] | None = None,
    objective: Objective = Objective.MAX_THROUGHPUT,
    tpot_s: float | None = None,
    ttft_s: float | None = None,
    accept_length: float | None = None,
    version: str | None = None,
    workloads: Sequence[WorkloadSpec] = (),
    lengths: str | None = None,
    range_ratio: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    pricing: Pricing | None = None,
) -> Theory:
    """Search, rank and explain; with `workloads` (a benchmark's loads, drawn from `lengths` or with `range_ratio`
    as the command line asked), also simulate the best setups under them, and verify the best of those. `model` and
    `cluster` are specs or the names `shardwise theorise` takes (a bundled name, a path, a Hub id; `model_ref` is
    then the model's name in the launch commands); the defaults are the command's: the user's case on SGLang,
    1024 in / 1024 out, 1 to 512 clients and on, doubling, until every setup's KV pool binds (given levels are
    used as they are)."""
    if isinstance(model, str):
        model_ref, model = model_ref or model, load_model(model)
    if isinstance(cluster, str):
        cluster = load_cluster(cluster)
    model_ref = model_ref or model.name
    with no_cycle_collection():  # the search, ranking and frontier make no reference cycles
        result = search(
            model,
            cluster,
            model_ref=model_ref,
            engines=engines,
            isl=isl,
            osl=osl,
            concurrency=SCREEN_LEVELS if concurrency is None else concurrency,
            version=version,
            progress=progress,
            saturate=concurrency is None,
        )
        if objective is Objective.MIN_COST:  # fewer GPUs rented may cost less per token: search those too
            parts = [
                search(
                    model,
                    part,
                    model_ref=model_ref,
                    engines=engines,
                    isl=isl,
                    osl=osl,
                    concurrency=result.concurrency,  # the whole cluster's levels: every setup at the same loads
                    version=version,
                )
                for part in rented_parts(cluster)
            ]
            ranked = result.candidates + tuple(c for r in parts for c in r.candidates)
        else:
            ranked = result.candidates
        gpu = cluster.gpu.name

        def confidence_of(s: Score) -> Confidence:
            c = s.candidate
            return confidence(c.engine, c.layout.family(), regime_of(s.at.concurrency), gpu)

        ranking = rank(
            ranked,  # under min-cost, the parts' setups too; the rest of the report reads the whole cluster's
            objective,
            tpot_s=tpot_s,
            ttft_s=ttft_s,
            confidence_of=confidence_of,
            pricing=pricing,
        )
        winners = winners_by_concurrency(result.candidates)
        benchmark = simulate_best(result, ranking, workloads) if workloads and ranking.scores else None
        if benchmark is not None and benchmark.best is not None and objective is Objective.MAX_THROUGHPUT:
            verify = _verify_benchmark(
                benchmark, model_ref, cluster, isl=isl, osl=osl, lengths=lengths, range_ratio=range_ratio
            )
        else:
            verify = _verify(ranking, model_ref, cluster, isl=isl, osl=osl)
        return Theory(
            result=result,
            ranking=ranking,
            explanation=explain(ranking),
            ceiling=ceiling(model, cluster, isl=isl, osl=osl),
            what_ifs=tuple(what_ifs(result, ranking, accept_length=accept_length)),
            winners=tuple(winners),
            crossovers=tuple(crossovers(winners)),
            frontier=tuple(pareto(result.candidates)),
            verify=verify,
            would_fit=() if result.candidates else _too_long(result) + would_fit(model, cluster, isl=isl, osl=osl),
            benchmark=benchmark,
            pricing=pricing or Pricing(),
        )


def rented_parts(cluster: ClusterSpec) -> list[ClusterSpec]:
    """The smaller parts of `cluster` a team could rent instead, largest first: half the nodes (again while more than
    one), then one node with half its GPUs (again down to one), each on the same GPUs and links."""
    parts = []
    nodes = cluster.nodes
    while nodes > 1:
        nodes //= 2
        name = f"{nodes}x{cluster.gpus_per_node}x{cluster.gpu.name}" if nodes > 1 else None
        parts.append(
            cluster.model_copy(
                update={
                    "nodes": nodes,
                    "name": name or f"{cluster.gpus_per_node}x{cluster.gpu.name}",
                    "inter": cluster.inter if nodes > 1 else None,
                }
            )
        )
    per = cluster.gpus_per_node
    while per > 1:
        per //= 2
        numa = max(1, cluster.intra.numa_nodes * per // cluster.gpus_per_node)
        intra = cluster.intra.model_copy(update={"numa_nodes": numa})
        parts.append(
            cluster.model_copy(
                update={
                    "nodes": 1,
                    "gpus_per_node": per,
                    "name": f"{per}x{cluster.gpu.name}",
                    "inter": None,
                    "intra": intra,
                }
            )
        )
    return parts


def _verify(
    ranking: Ranking, model_ref: str, cluster: ClusterSpec, *, isl: int, osl: int
) -> tuple[tuple[str, ...], ...]:
    """The winner's launch on each node, the engine's benchmark at the winning load, and shardwise's simulation of
    the same (on the same cluster; the node-0 address is a plain word there, since nothing connects)."""
    if ranking.best is None:
        return ()
    win = ranking.best
    engine = get_engine(win.candidate.engine)
    c = win.at.concurrency
    load = BenchLoad(isl=isl, osl=osl, concurrency=c, prompts=max(100, PROMPTS_PER_CLIENT * c))
    bench = engine.benchmark_command(load, model_ref=model_reference(model_ref))
    launch = [token.replace(HEAD_IP, "HEAD_IP") for token in win.candidate.launch]
    load_args = ["--concurrency", str(c), "--isl", str(isl), "--osl", str(osl)]
    return (*win.candidate.launches, tuple(bench), _simulate_command(model_ref, cluster, load_args, launch))


def _verify_benchmark(
    benchmark: BenchmarkRanking,
    model_ref: str,
    cluster: ClusterSpec,
    *,
    isl: int,
    osl: int,
    lengths: str | None,
    range_ratio: float | None,
) -> tuple[tuple[str, ...], ...]:
    """The benchmark's best setup (by output tok/s: the max-throughput objective) launched on each node, the engine's
    benchmark tool sending its first workload (ShareGPT, or random lengths at the means for another length set),
    and shardwise's simulation of the same."""
    assert benchmark.best is not None
    best, w = benchmark.best.candidate, benchmark.workloads[0]
    rate = None if math.isinf(w.request_rate) else w.request_rate
    sent = BenchLoad(
        isl=isl,
        osl=osl,
        concurrency=w.concurrency,
        prompts=w.num_requests,
        dataset=lengths,
        request_rate=rate,
        range_ratio=range_ratio,
    )
    bench = get_engine(best.engine).benchmark_command(sent, model_ref=model_reference(model_ref))
    launch = [token.replace(HEAD_IP, "HEAD_IP") for token in best.launch]
    load = ["--concurrency", str(w.concurrency)] if w.concurrency else []
    load += ["--request-rate", "inf" if rate is None else f"{rate:g}"] if not w.concurrency or rate else []
    shape = ["--lengths", lengths] if lengths else ["--isl", str(isl), "--osl", str(osl)]
    shape += ["--range-ratio", f"{range_ratio:g}"] if range_ratio is not None and not lengths else []
    arrivals = ["--burstiness", f"{w.burstiness:g}"] if rate is not None and w.burstiness != 1.0 else []
    arrivals += ["--seed", str(w.seed)] if w.seed else []
    load_args = [*load, *arrivals, "--num-prompts", str(w.num_requests), *shape]
    return (*best.launches, tuple(bench), _simulate_command(model_ref, cluster, load_args, launch))


def _simulate_command(model_ref: str, cluster: ClusterSpec, load: list[str], launch: list[str]) -> tuple[str, ...]:
    """`shardwise simulate` of a launch command under a load, as `verify` prints it."""
    return ("shardwise", "simulate", "--model", model_ref, "--gpus", cluster.name, *load, "--", *launch)


def _too_long(result: SearchResult) -> tuple[str, ...]:
    """When setups start but none holds one request, the length is the problem, not the GPU count."""
    n = sum(e.verdict == "too_long" for e in result.excluded)
    if not n:
        return ()
    case = result.case
    context = case.model.max_position_embeddings
    if context and case.isl + case.osl > context:
        return (
            f"{n} setups start, but a request of {case.isl:,} + {case.osl:,} tokens is longer than the "
            f"{context:,} tokens of {case.model.name}'s context: shorten the requests",
        )
    return (
        f"{n} setups start, but none holds one request of {case.isl:,} + {case.osl:,} tokens in its KV pool: "
        "shorten the requests, or give the pool more room (more GPUs, FP8 KV cache)",
    )


def would_fit(model: ModelSpec, cluster: ClusterSpec, *, isl: int, osl: int) -> tuple[str, ...]:
    """What would serve a model that no setup on `cluster` serves: more of these GPUs (the fewest, a power of
    two, whose memory less the CUDA stack's measured minimum holds the weights and one request's KV cache; the
    engines' own reserves then decide, so run theorise there), or smaller weights."""
    usable = cluster.gpu.memory_bytes - runtime().non_torch_multi_gpu.si("bytes")
    weights = weight_ledger(model).total_bytes
    need = weights + model.kv_bytes_per_token * (isl + osl)
    gpus = 1 << max(0, math.ceil(math.log2(need / usable)))
    if gpus <= cluster.num_gpus:  # the bytes fit; the engines' reserves for activations and graphs do not
        gpus = 2 * cluster.num_gpus
    per_node = max(cluster.gpus_per_node, min(gpus, 8))
    nodes = math.ceil(gpus / per_node)
    spec = f"{nodes}x{per_node}x{cluster.gpu.name}" if nodes > 1 else f"{per_node}x{cluster.gpu.name}"
    out = [
        f"the weights ({weights / 1e9:,.0f} GB) and one request's KV cache ({(need - weights) / 1e9:,.1f} GB) "
        f"against {cluster.num_gpus} × {usable / 2**30:,.0f} GiB usable: try {gpus} {cluster.gpu.name} GPUs "
        f"(--gpus {spec})"
    ]
    for fmt in ("fp8", "int4"):
        smaller = weight_ledger(model.with_overrides(weight_dtype=fmt)).total_bytes
        if smaller < weights * 0.9:  # only formats that shrink the checkpoint materially are worth naming
            share = smaller / (cluster.num_gpus * usable)
            out.append(
                f"in {fmt.upper()} the weights would be {smaller / 1e9:,.0f} GB, {share:.0%} of this cluster's memory"
            )
    return tuple(out)
