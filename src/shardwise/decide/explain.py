"""Why the winner wins and the others lose, read off the predictions' ledgers (never recomputed).

For the winner: what bounds it at its best concurrency and how each output token's time splits. For every
other family of layouts (by the kinds of parallelism it combines), its best setup, how far behind it is at
the winner's concurrency and the two parts of the token time where it pays most over the winner, each said
with the quantity behind it (collectives per step and their time, bytes read per step, KV requests held).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardwise.decide.rank import Ranking, Score
from shardwise.decide.search import Candidate
from shardwise.ops.types import OpClass
from shardwise.serve.steady import Prediction


@dataclass(frozen=True, kw_only=True)
class Reason:
    part: str  # the ledger part it comes from: comm, memory, launch, host, pipeline, prefill, compute, kv
    extra_s: float  # seconds per output token more than the winner (0 for kv)
    text: str


@dataclass(frozen=True, kw_only=True)
class FamilyVerdict:
    family: str
    best: Candidate
    value: float  # its score under the objective
    at_winner: Prediction  # at the winner's concurrency
    ratio: float  # its score ÷ the winner's
    reasons: tuple[Reason, ...] = field(default_factory=tuple)


@dataclass(frozen=True, kw_only=True)
class Explanation:
    winner: Score
    bound: str
    breakdown_s: dict[str, float]  # per output token at the winner's concurrency; sums to its TPOT
    step_by_class_s: dict[str, float]  # one decode step's GPU time by op class
    collectives_per_step: int
    collective_s: float
    families: tuple[FamilyVerdict, ...]


def family(candidate: Candidate) -> str:
    """The kinds of parallelism a layout combines: 'TP', 'TP+EP', 'PP', 'attention DP+EP', 'TP+EP+DCP', …"""
    lay = candidate.layout
    kinds = ["attention DP" if lay.attn_dp > 1 else ("TP" if lay.attn_tp > 1 else "")]
    kinds += [name for name, on in (("EP", lay.moe_ep > 1), ("PP", lay.pp > 1), ("DCP", lay.dcp > 1)) if on]
    kinds += ["replicas"] if lay.replicas > 1 else []
    return "+".join(k for k in kinds if k) or "one GPU"


def explain(ranking: Ranking) -> Explanation | None:
    win = ranking.best
    if win is None:
        return None
    step = win.candidate.step_at(win.at.concurrency)
    comm = [op for op in step.ops if op.op_class is OpClass.COMM and not op.hidden]
    best_of: dict[str, Score] = {}
    for s in ranking.scores:
        best_of.setdefault(family(s.candidate), s)
    verdicts = tuple(_verdict(name, s, win) for name, s in best_of.items() if s.candidate.name != win.candidate.name)
    return Explanation(
        winner=win,
        bound=win.at.bound,
        breakdown_s=dict(win.at.breakdown_s),
        step_by_class_s=step.by_class_s(),
        collectives_per_step=sum(op.count for op in comm),
        collective_s=sum(op.time_s for op in comm),
        families=tuple(sorted(verdicts, key=lambda v: -v.ratio)),
    )


def _verdict(name: str, s: Score, win: Score) -> FamilyVerdict:
    c = s.candidate
    theirs = c.at(win.at.concurrency)
    return FamilyVerdict(
        family=name,
        best=c,
        value=s.value,
        at_winner=theirs,
        ratio=s.value / win.value if win.value else 0.0,
        reasons=tuple(_reasons(theirs, win.at, c, win.candidate)),
    )


def _reasons(theirs: Prediction, ours: Prediction, c: Candidate, w: Candidate) -> list[Reason]:
    out = []
    if theirs.running < ours.running:
        out.append(
            Reason(
                part="kv",
                extra_s=0.0,
                text=(
                    f"holds {theirs.running} requests at once where the winner holds {ours.running} "
                    f"(KV pool {c.memory.kv_tokens_total:,} tokens against {w.memory.kv_tokens_total:,})"
                ),
            )
        )
    extra = {k: theirs.breakdown_s.get(k, 0.0) - ours.breakdown_s.get(k, 0.0) for k in theirs.breakdown_s}
    for part, delta in sorted(extra.items(), key=lambda kv: -kv[1])[:2]:
        if delta > 0.02 * ours.tpot_s:
            out.append(Reason(part=part, extra_s=delta, text=_say(part, delta, theirs, c)))
    return out


def _say(part: str, delta: float, p: Prediction, c: Candidate) -> str:
    more = f"{delta * 1e3:.2f} ms more per output token"
    step = c.step_at(p.concurrency)
    if part == "comm":
        ops = [op for op in step.ops if op.op_class is OpClass.COMM and not op.hidden]
        n, t = sum(op.count for op in ops), sum(op.time_s for op in ops)
        return f"spends {t * 1e3:.1f} ms of each step in {n} collectives ({more})"
    if part == "memory":
        read = sum(op.bytes for op in step.ops if op.op_class is not OpClass.COMM)
        return f"reads {read / 1e9:.2f} GB per GPU per step ({more})"
    if part in ("launch", "host"):
        kernels = sum(op.kernels for op in step.ops)
        graphs = "with CUDA graphs" if c.layout.options.cuda_graph else "without CUDA graphs"
        return f"{kernels} kernel launches per step {graphs} ({more})"
    if part == "pipeline":
        return f"waits on its {c.layout.pp} pipeline stages ({more})"
    if part == "prefill":
        return f"spends more time on prefills between decode steps ({more})"
    if part == "draft":
        return f"drafting ({more})"
    return f"computes longer ({more})"
