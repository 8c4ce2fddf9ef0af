"""What would change the answer, predicted: the winner's layout with other engine options, the same GPUs
with NVLink, more GPUs, speculative decoding at a stated acceptance.

Each what-if is priced by the same model as the ranking, on a changed input (a flag, the cluster's link,
the GPU count); its gain is its best throughput over the winner's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardwise.cost.memory import memory_ledger
from shardwise.decide.rank import Objective, Ranking, Score
from shardwise.decide.search import Candidate, SearchResult
from shardwise.engines.base import Engine, Setup, get_engine
from shardwise.serve.steady import Prediction, Predictor
from shardwise.serve.steps import StepTimes
from shardwise.spec.catalog import drafter_of
from shardwise.spec.cluster import with_intra_node

HYPOTHETICAL_LINK = "nvlink4"  # 900 GB/s per GPU: the NVLink of H100/H200 boxes
REPREDICTED = 10  # best setups re-predicted on a changed cluster
OPPOSITE = {"CUDA graphs off": "CUDA graphs on", "FP8 KV cache": "KV cache in the model's dtype"}


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    label: str
    setup: str | None  # the setup that gives the figure
    output_tok_s: float | None
    gain: float | None  # over the winner
    note: str


def _twice(result: SearchResult, win: Score) -> str:
    """The --gpus of twice the winner's GPUs on this cluster's kind of node."""
    per, gpu, target = result.case.cluster.gpus_per_node, result.case.cluster.gpu.name, 2 * win.candidate.gpus
    return f"{target}x{gpu}" if target <= per else f"{-(-target // per)}x{per}x{gpu}"


def what_ifs(result: SearchResult, ranking: Ranking, *, accept_length: float | None = None) -> list[WhatIf]:
    win = ranking.best
    if win is None:
        return []
    # what-ifs are priced in output tok/s: the winner's own (its score is another figure under min-latency, min-cost
    # and max-tokens-per-watt; min-latency keeps its per-user figure, which its what-ifs compare)
    base = win.value if ranking.objective is Objective.MIN_LATENCY else win.at.output_tok_s
    out = [_option(result, win.candidate, base, label) for label in ("CUDA graphs off", "FP8 KV cache")]
    out.append(_nvlink(result, ranking, base))
    out.append(
        WhatIf(
            label=f"twice the GPUs ({2 * win.candidate.gpus})",
            setup=f"2× {win.candidate.name}",
            output_tok_s=2 * base,
            gain=2.0,
            note="two copies behind a router; a wider layout may do better: search it with --gpus "
            + _twice(result, win),
        )
    )
    if result.case.model.moe is not None:
        engine = get_engine(win.candidate.engine)
        seen: set[str] = set()
        for label, opts in engine.what_if_options:
            if all(win.candidate.given.get(k) == v for k, v in opts.items()):
                continue
            w = _engine_option(result, win.candidate, engine, label, opts, base)
            if w.output_tok_s is None and w.note in seen:
                w = WhatIf(label=label, setup=None, output_tok_s=None, gain=None, note="refused, as above")
            seen.add(w.note)
            out.append(w)
    out += _speculative(result, win.candidate, base, accept_length)
    return [w for w in out if w is not None]


def _with_options(
    result: SearchResult, winner: Candidate, engine: Engine, options: dict[str, Any], accept: float | None = None
) -> tuple[Setup, list[Prediction]] | str:
    """The winner's command with `options` added, as the engine would take it, predicted over the sweep; or why
    it does not serve (the engine's refusal, or no KV room for one request)."""
    setup = engine.setup(
        {**winner.given, **options},
        model=result.case.model,
        cluster=result.case.cluster,
        version=engine.version(winner.version),
    )
    if not setup.valid or setup.layout is None:
        return f"the engine refuses it: {setup.rejections[0].reason}"
    memory = memory_ledger(result.case.model, setup.layout, result.case.cluster, book=result.case.book)
    if memory.max_concurrency(isl=result.case.isl, osl=result.case.osl) < 1:
        return f"it leaves no KV room for one request{': ' + memory.reason if memory.reason else ''}"
    case = result.case
    predictor = Predictor(
        StepTimes(case.model, setup.layout, case.cluster, accept_length=accept, book=case.book), memory
    )
    return setup, predictor.sweep(result.concurrency, isl=result.case.isl, osl=result.case.osl)


def _engine_option(
    result: SearchResult, winner: Candidate, engine: Engine, label: str, options: dict[str, Any], base: float
) -> WhatIf:
    """The winner's command with `options` added."""
    priced = _with_options(result, winner, engine, options)
    if isinstance(priced, str):
        return WhatIf(label=label, setup=None, output_tok_s=None, gain=None, note=priced)
    setup, sweep = priced
    assert setup.layout is not None
    peak = max(sweep, key=lambda p: p.output_tok_s)
    name = ", ".join(filter(None, [f"{winner.engine} {setup.layout.describe()}", winner.variant.label, label]))
    return WhatIf(
        label=label,
        setup=name,
        output_tok_s=peak.output_tok_s,
        gain=peak.output_tok_s / base,
        note=f"peak at {peak.concurrency} clients, {peak.running} running",
    )


def _option(result: SearchResult, winner: Candidate, base: float, label: str) -> WhatIf | None:
    """The winner's layout and options with one option variant toggled."""
    have = set(winner.option_kinds)
    want = have ^ {label}
    other = next(
        (
            c
            for c in result.candidates
            if c.engine == winner.engine
            and c.layout.structure() == winner.layout.structure()
            and set(c.option_kinds) == want
        ),
        None,
    )
    if other is None:
        return None
    name = label if label not in have else OPPOSITE.get(label, f"without {label}")
    value = other.peak.output_tok_s
    return WhatIf(
        label=name,
        setup=other.name,
        output_tok_s=value,
        gain=value / base,
        note=f"peak at {other.peak.concurrency} clients, {other.peak.running} running",
    )


def _nvlink(result: SearchResult, ranking: Ranking, base: float) -> WhatIf | None:
    cluster = result.case.cluster
    if cluster.intra.link.kind != "pcie":
        return None
    linked = with_intra_node(cluster, f"{cluster.name} with NVLink", {"link": HYPOTHETICAL_LINK, "p2p": True})
    best, best_name = 0.0, None
    for score in ranking.scores[:REPREDICTED]:
        c = score.candidate
        predictor = Predictor(StepTimes(result.case.model, c.layout, linked, book=result.case.book), c.memory)
        peak = max(
            p.output_tok_s for p in predictor.sweep(result.concurrency, isl=result.case.isl, osl=result.case.osl)
        )
        if peak > best:
            best, best_name = peak, c.name
    return WhatIf(
        label=f"NVLink ({linked.intra.link.display_name}) instead of PCIe",
        setup=best_name,
        output_tok_s=best,
        gain=best / base,
        note=f"the best {REPREDICTED} setups re-predicted with the same GPUs linked by NVLink",
    )


def _speculative(result: SearchResult, winner: Candidate, base: float, accept: float | None) -> list[WhatIf]:
    engine = get_engine(winner.engine)
    kinds = []
    if result.case.model.num_mtp_layers > 0:
        kinds.append(("MTP", "mtp", None))
    drafter = drafter_of(result.model_ref.lower(), "dflash")
    if drafter is not None:
        kinds.append(("DFlash", "dflash", drafter.repo))
    out = []
    for label, algorithm, draft in kinds:
        options = engine.speculative_options(algorithm, draft_model=draft)
        if not options:
            continue
        if accept is None:
            out.append(
                WhatIf(
                    label=f"{label} drafting",
                    setup=None,
                    output_tok_s=None,
                    gain=None,
                    note="give --accept-length (mean tokens kept per step) to price it",
                )
            )
            continue
        out.append(_drafted(result, winner, engine, options, label, accept, base))
    return [w for w in out if w is not None]


def _drafted(
    result: SearchResult,
    winner: Candidate,
    engine: Engine,
    options: dict[str, Any],
    label: str,
    accept: float,
    base: float,
) -> WhatIf | None:
    priced = _with_options(result, winner, engine, options, accept)
    if isinstance(priced, str):
        return WhatIf(label=f"{label} drafting", setup=None, output_tok_s=None, gain=None, note=priced)
    _, sweep = priced
    plain = winner.predictions
    losing = next((p.concurrency for p, q in zip(sweep, plain, strict=True) if p.output_tok_s < q.output_tok_s), None)
    best = max(p.output_tok_s for p in sweep)
    one = sweep[0].output_tok_s / plain[0].output_tok_s
    note = f"{accept:g} tokens kept per step: {one:.2f}× at {sweep[0].concurrency} client(s); " + (
        f"stops paying at {losing} clients" if losing else "pays at every concurrency of the sweep"
    )
    return WhatIf(
        label=f"{label} drafting", setup=f"{winner.name} + {label}", output_tok_s=best, gain=best / base, note=note
    )
