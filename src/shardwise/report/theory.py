"""The theory as people read it: a short narrative, the ranking, the winner at each load, why the others lose,
the ceiling, the what-ifs, what is excluded and why, and the commands; as rich tables, JSON and Markdown.
Every number comes from the Theory (decide/theory.py); nothing is recomputed here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from shardwise.decide.economics import Economics, Pricing, economics
from shardwise.decide.rank import KNEE, VALUE_OF, Objective, Score, flag_gains, knee, option_gains, tied
from shardwise.decide.search import Candidate
from shardwise.decide.theory import Theory
from shardwise.engines.flags import command_text
from shardwise.report.predictions import PART_LABELS, economics_payload, prediction_payload
from shardwise.report.simulation import short_load
from shardwise.report.table import ShellLine
from shardwise.serve.accuracy import Confidence, confidence, measured_on, regime_of, stated_median
from shardwise.serve.steady import Prediction

PART_NAMES = {
    "memory": "memory",
    "compute": "compute",
    "comm": "communication",
    "launch": "kernel time",
    "host": "host",
    "pipeline": "pipeline wait",
    "prefill": "prefill",
    "draft": "drafting",
}


def score_text(t: Theory, value: float, *, unit: bool = True) -> str:
    """A ranking score as its objective reads: dollars per million output tokens under min-cost, tok/s per kW under
    max-tokens-per-watt, else the tok/s figure ("tok/s" after it where `unit`)."""
    objective = t.ranking.objective
    if objective is Objective.MIN_COST:
        return f"${1e6 / value:,.3f} per million output tokens" if value > 0 else "free"
    if objective is Objective.MAX_TOKENS_PER_WATT:
        return f"{value:,.1f} tok/s per kW"
    return f"{value:,.0f}" + (" tok/s" if unit else "")


def relative(t: Theory, other: float, mine: float, digits: int = 0) -> str:
    """How one score compares with another, as the objective reads: cheaper or dearer under min-cost (scores there
    are tokens per dollar), else a signed share."""
    if t.ranking.objective is Objective.MIN_COST:
        share = mine / other - 1  # the other's cost per token relative to mine
        return f"{abs(share):.{digits}%} {'cheaper' if share < 0 else 'dearer'}"
    return f"{other / mine - 1:+.{digits}%}"


def economics_line(t: Theory, score: Score) -> str:
    """What the setup costs and draws at its load."""
    e = t.economics_of(score)
    cluster = t.result.case.cluster
    cost = (
        f"${e.usd_per_million_output_tokens:,.3f} per million output tokens at {t.pricing.basis(cluster)}"
        + (f" plus ${t.pricing.kwh_usd:,.3f} per kWh" if t.pricing.kwh_usd else "")
        if e.usd_per_million_output_tokens is not None
        else f"cost unknown: {t.pricing.basis(cluster)}"
    )
    return (
        f"Cost and power at {score.at.concurrency} clients: {cost}; {e.output_tok_s_per_kw:,.1f} output tok/s per "
        f"kW ({e.power_w / 1e3:,.1f} kW: the GPUs {e.gpu_power_w / 1e3:,.1f} at their TDP for the "
        f"{e.gpu_utilisation:.0%} of each token's time they run kernels, the hosts {e.host_power_w / 1e3:,.1f}; an "
        "estimate)."
    )


def _fastest_line(t: Theory) -> list[str]:
    """Under min-cost or max-tokens-per-watt, where the fastest setup is another: why the winner is not it."""
    win = t.ranking.best
    if t.ranking.objective not in (Objective.MIN_COST, Objective.MAX_TOKENS_PER_WATT) or win is None:
        return []
    fastest = max(t.ranking.scores, key=lambda s: (s.candidate.peak.output_tok_s, -s.candidate.gpus))
    if fastest.candidate is win.candidate:
        return [
            f"It is also the fastest setup: on {win.candidate.gpus} GPUs at one rate, the most tokens are the "
            "cheapest per token."
            if t.ranking.objective is Objective.MIN_COST
            else "It is also the fastest setup."
        ]
    peak = fastest.candidate.peak
    cluster = fastest.candidate.priced_by.cluster if fastest.candidate.priced_by else t.result.case.cluster
    theirs, ours = economics(peak, cluster, fastest.candidate.layout, t.pricing), t.economics_of(win)
    more = f"{peak.output_tok_s / win.at.output_tok_s - 1:+.0%}"
    fast = (
        f"The fastest setup, {fastest.candidate.name}, makes {more} the tokens ({peak.output_tok_s:,.0f} tok/s on "
        f"{fastest.candidate.gpus} GPUs drawing {theirs.power_w / 1e3:,.1f} kW, against {win.at.output_tok_s:,.0f} on "
        f"{win.candidate.gpus} drawing {ours.power_w / 1e3:,.1f} kW)"
    )
    if t.ranking.objective is Objective.MIN_COST:
        mine, other = ours.usd_per_million_output_tokens, theirs.usd_per_million_output_tokens
        if mine is None or other is None:
            return []
        money = f"{fast} at ${other:,.3f} per million against ${mine:,.3f}"
        if other >= mine:
            return [f"{money}: more tokens, dearer ones."]
        if tied(1 / other, 1 / mine, t.ranking.band):
            if fastest.candidate.gpus <= win.candidate.gpus:
                return [f"{money}: within the model's {t.ranking.band:.0%} error, a tie (the lines below say why)."]
            copies = "×" in fastest.candidate.name.split(",")[0]
            return [
                f"{money}: within the model's {t.ranking.band:.0%} error, no cheaper per token than renting "
                f"{win.candidate.gpus} GPUs for this one"
                + (" (it runs copies of such a setup side by side)." if copies else ".")
            ]
        return [f"{money}: predicted cheaper, but less certain: the lines below say why it is not recommended."]
    mine_kw, other_kw = ours.output_tok_s_per_kw, theirs.output_tok_s_per_kw
    if other_kw < mine_kw:
        relation = "fewer per watt"
    elif tied(mine_kw, other_kw, t.ranking.band):
        relation = f"about as many per watt, within the model's {t.ranking.band:.0%} error"
    else:
        relation = "more per watt, predicted, but less certain: the lines below say why it is not recommended"
    return [f"{fast}: {other_kw:,.1f} tok/s per kW against {mine_kw:,.1f}, {relation}."]


def headline(t: Theory) -> str:
    r = t.result
    engines = " and ".join(r.engines)
    return (
        f"{r.case.model.name} on {r.case.cluster.name} ({r.case.cluster.intra.link.display_name}), {engines}; "
        f"{r.case.isl} in / {r.case.osl} out; objective {t.ranking.objective.value}"
    )


def narrative(t: Theory) -> list[str]:
    """The answer in sentences, each carrying its numbers."""
    r, win, ex = t.result, t.ranking.best, t.explanation
    if win is None or ex is None:
        if not r.candidates:
            return [f"No setup of {r.case.model.name} serves on {r.case.cluster.name}.", *t.would_fit]
        limit = _slo_text(t)
        return [f"No setup meets {limit} at any concurrency of the sweep; relax the limit or add GPUs."]
    c, p = win.candidate, win.at
    one = min(c.predictions, key=lambda q: q.concurrency)
    if t.ranking.objective is Objective.MIN_LATENCY:
        lines = [
            f"Fastest for one user: {c.name}: {p.per_user_tok_s:,.1f} tok/s per user ({p.tpot_s * 1e3:.1f} ms "
            f"per output token) at {p.concurrency} client(s)."
        ]
    else:
        whole = r.case.cluster.num_gpus
        part = f" on {c.gpus} of the {whole} GPUs" if c.gpus < whole else ""
        lines = [
            f"Best for {t.ranking.objective.value}: {c.name}{part}: {p.output_tok_s:,.0f} output tok/s at "
            f"{p.concurrency} clients ({p.output_tok_s / c.gpus:,.0f} per GPU, {p.per_user_tok_s:,.1f} per user); "
            f"{one.output_tok_s:,.1f} tok/s at {one.concurrency} client."
        ]
    parts = ", ".join(
        f"{PART_NAMES.get(k, k)} {v * 1e3:.1f}"
        for k, v in sorted(ex.breakdown_s.items(), key=lambda kv: -kv[1])
        if v > 0
    )
    bound = PART_NAMES.get(ex.bound, ex.bound)
    if ex.bound == "kv_capacity":
        holder = c.memory.holder(isl=r.case.isl, osl=r.case.osl)
        bound = "linear-attention state capacity" if "state" in holder else "KV-cache capacity"
    comm = (
        f" A decode step spends {ex.collective_s * 1e3:.1f} ms in {ex.collectives_per_step} collectives."
        if ex.collectives_per_step
        else ""
    )
    lines.append(
        f"What bounds it: {bound}. It runs {p.running} requests at once (KV pool {c.memory.kv_tokens_total:,} "
        f"tokens); each output token takes {p.tpot_s * 1e3:.1f} ms: {parts} ms.{comm}"
    )
    if t.ranking.objective is not Objective.MIN_LATENCY:
        lines.append(_saturation_line(t, c))
    lines.append(economics_line(t, win))
    lines += _fastest_line(t)
    lines.append(_memory_line(c))
    lines += _defaults_lines(t)
    lines += _confidence_lines(t)
    ties = [s for s in t.ranking.ties() if s is not t.ranking.preferred_over]
    if ties:
        lines.append(
            f"Within {t.ranking.band:.0%} of it in the same family (a tie: the model's median error over every "
            "validated run): "
            + "; ".join(f"{s.candidate.name} ({score_text(t, s.value, unit=False)})" for s in ties[:4])
            + "."
        )
    if t.ceiling:
        ce = t.ceiling
        lines.append(
            f"Speed of light on these GPUs: {ce.output_tok_s:,.0f} tok/s ({ce.batch:,} requests at once, every byte "
            f"of memory for weights once and KV, {ce.bound}-bound, no communication or overheads); the winner "
            + (
                f"reaches {p.output_tok_s / ce.output_tok_s:.1%} of it."
                if c.gpus == r.case.cluster.num_gpus
                else f"reaches {p.output_tok_s / c.gpus / (ce.output_tok_s / r.case.cluster.num_gpus):.1%} of it per "
                f"GPU on its {c.gpus}."
            )
            if t.ranking.objective is not Objective.MIN_LATENCY
            else f"Speed of light on these GPUs: {ce.output_tok_s:,.0f} tok/s at full batch."
        )
    if t.crossovers:
        gpu = t.result.case.cluster.gpu.name

        here = [measured_on(b.candidate.engine, b.candidate.layout.family(), gpu) for _, b in t.crossovers]
        named = [
            f"{b.candidate.name}{'' if ok else '*'} from {b.concurrency} clients"
            for (_, b), ok in zip(t.crossovers, here, strict=True)
        ]
        starred = not all(here)
        lines.append(
            "The best prediction changes with load: "
            + "; ".join(named)
            + (" (* its family was not measured on these GPUs)" if starred else "")
            + "."
        )
    lines.append(_trust_line())
    return lines


def _confidence_lines(t: Theory) -> list[str]:
    """How far to trust the winner (its family's validated error), the better prediction it was recommended over
    where that one's family is less validated here, and the families measured on these GPUs."""
    win, over = t.ranking.best, t.ranking.unvalidated_over
    mine = t.ranking.confidence(win) if win else None
    if win is None or mine is None:
        return []
    lines = [f"How far to trust it: {mine.describe()}."]
    if over is not None and (theirs := t.ranking.confidence(over)) is not None:
        why = (
            "no run of its family was measured on these GPUs" if theirs.basis != "this GPU" else "its family errs more"
        )
        lines.append(
            f"Recommended over {over.candidate.name} ({score_text(t, over.value)} predicted, "
            f"{relative(t, over.value, win.value)}): {why} ({theirs.family}, uncertainty "
            f"±{theirs.uncertainty:.0%}), and "
            f"its predicted gain is within that; {mine.family} was measured here. Measure it before relying on it."
        )
    alt = t.ranking.measured_alternative
    if alt is not None and (theirs := t.ranking.confidence(alt)) is not None:
        lines.append(
            f"Its family was not measured on these GPUs, and its predicted gain ({win.value / alt.value - 1:+.0%}) "
            f"exceeds its uncertainty (±{mine.uncertainty:.0%}) over the best setup whose family was: "
            f"{alt.candidate.name} ({score_text(t, alt.value)}, {theirs.family} ±{theirs.uncertainty:.0%}). Measure "
            "the winner before relying on it; that one is the measured fallback."
        )
    gpu, regime = t.result.case.cluster.gpu.name, mine.regime
    searched = sorted({(s.candidate.engine, s.candidate.layout.family()) for s in t.ranking.scores})
    measured = [
        f"{engine} {family} (±{confidence(engine, family, regime, gpu).uncertainty:.0%})"
        for engine, family in searched
        if measured_on(engine, family, gpu)
    ]
    if measured:
        lines.append(
            f"Families measured on {gpu}: {', '.join(measured)}; the other {len(searched) - len(measured)} families "
            "searched are extrapolated from other GPUs or from no run."
        )
    return lines


def _saturation_line(t: Theory, c: Candidate) -> str:
    """Where the winner's throughput stops rising, and the knee: the least load within KNEE of it."""
    isl, osl = t.result.case.isl, t.result.case.osl
    peak, k, cap = c.peak, knee(c), c.memory.max_concurrency(isl=isl, osl=osl)
    holder = c.memory.holder(isl=isl, osl=osl)
    levels = t.result.concurrency
    if peak.concurrency == levels[-1] and peak.running < cap:
        where = (
            f"It is still rising at {peak.concurrency} clients, the most asked for ({holder} holds {cap:,} "
            "requests at once)"
        )
    elif peak.running >= cap:
        where = f"Its throughput stops rising at {peak.concurrency} clients: {holder} holds {cap:,} requests at once"
    else:
        where = f"Its throughput peaks at {peak.concurrency} clients, before {holder} ({cap:,} requests) binds"
    return (
        f"{where}; it is within {KNEE:.0%} of its most from {k.concurrency} clients ({k.output_tok_s:,.0f} tok/s, "
        f"{k.per_user_tok_s:,.1f} per user, {k.tpot_s * 1e3:,.0f} ms per token)."
    )


def _defaults_lines(t: Theory) -> list[str]:
    """Where a tie put the engine's defaults first, and what each non-default option of the winner buys."""
    win, lines = t.ranking.best, []
    if win is None:
        return lines
    over = t.ranking.preferred_over
    if over is not None:
        lines.append(
            f"Recommended over {over.candidate.name} ({score_text(t, over.value, unit=False)}, "
            f"{relative(t, over.value, win.value, 1)}): within "
            f"the model's {t.ranking.band:.0%} error, the setup closer to the engine's defaults wins the tie."
        )

    def bought(gain: float, without: float) -> str:
        tie = "; a tie, within the model's error" if tied(without, win.value, t.ranking.band) else ""
        share = f"{gain:+.0%}" if abs(gain) >= 0.01 else f"{gain:+.1%}"
        return f"{share} ({score_text(t, without, unit=False)} without{tie})"

    said = []
    for g in option_gains(t.ranking):
        gain = g.gain(win.value)
        said.append(
            f"{g.option} {bought(gain, g.without.value)}"
            if gain is not None and g.without
            else f"{g.option} (without it the setup does not serve this workload)"
        )
    for f in flag_gains(t.ranking):
        said.append(f"{' with '.join(f.flags)} {bought(f.gain(win.value), f.without.value)}")
    if said:
        lines.append("Its options beyond the engine's defaults, and what each buys: " + "; ".join(said) + ".")
    return lines


def _trust_line() -> str:
    """How far the predictions agree with published measurements (the figures validate states)."""
    tok, tpot = stated_median("plain", "output_tok_s"), stated_median("plain", "tpot_ms")
    ttft = stated_median("plain", "ttft_ms")
    return (
        f"How far to trust the numbers: over every published run of SGLang and vLLM validate replays, the predictions "
        f"err by a median of {tok:.0%} in output tok/s, {tpot:.0%} in TPOT and {ttft:.0%} in TTFT (`shardwise "
        "validate --set all`, which also says what could explain each run far from its prediction); first tokens "
        "mostly come out early."
    )


def _memory_line(c: Candidate) -> str:
    """Where each GPU's memory goes in the winner, read off its memory ledger (the fullest GPU)."""
    row = max(c.memory.per_gpu, key=lambda r: r.weights_bytes + r.kv_bytes)
    opts = c.layout.options
    gib = 2**30
    fraction = f"memory fraction {opts.memory_fraction:.2f}" if opts.memory_fraction is not None else "its memory rule"
    states = f"linear-attention states {row.state_bytes / gib:.1f}, " if row.state_bytes else ""
    return (
        f"Each GPU at {fraction}: weights {row.weights_bytes / gib:.1f} GiB, KV cache {row.kv_bytes / gib:.1f}, "
        f"{states}CUDA stack and buffers {row.runtime_bytes / gib:.1f}, "
        f"activation peak {row.activation_bytes / gib:.1f}, CUDA graphs {row.cuda_graph_bytes / gib:.1f}; "
        f"{row.free_bytes / gib:.1f} GiB left over"
        f"{_kept_for(opts, raised=c.variant.memory_fraction is not None)}."
    )


def _kept_for(opts: Any, *, raised: bool) -> str:
    """What the left-over memory is kept for, where the fraction says so: the engine's padding of attention-DP
    batches; at the engine's own default for a multimodal model, its image encoder; at a raised fraction, the
    CUDA-stack estimate's uncertainty (and no image encoder: text requests)."""
    kept = []
    if opts.fraction_reserve_bytes:
        kept.append(f"attention DP's padded batches ({opts.fraction_reserve_bytes / 2**30:.1f} GiB)")
    if raised:
        kept.append("the uncertainty of the CUDA-stack estimate")
    elif opts.fraction_scale < 1:
        kept.append(f"images' activations (the engine's ×{opts.fraction_scale:.4f} for a multimodal model)")
    text = f", kept for {' and '.join(kept)}" if kept else ""
    if raised and opts.fraction_scale < 1:
        text += (
            f"; the engine's own default keeps back ×{opts.fraction_scale:.4f} of it for a multimodal model's "
            "image encoder, which text requests do not run: serving images, stay at the default"
        )
    return text


def _slo_text(t: Theory) -> str:
    limits = []
    if t.ranking.tpot_s is not None:
        limits.append(f"TPOT ≤ {t.ranking.tpot_s * 1e3:g} ms")
    if t.ranking.ttft_s is not None:
        limits.append(f"TTFT ≤ {t.ranking.ttft_s * 1e3:g} ms")
    return " and ".join(limits)


def family_lines(t: Theory) -> list[str]:
    if t.explanation is None:
        return []
    out = []
    for f in t.explanation.families:
        why = "; ".join(r.text for r in f.reasons) or "a tie within the model's accuracy"
        out.append(
            f"{f.family}: best is {f.best.name}, {score_text(t, f.value, unit=False)} ({f.ratio:.0%} of the winner"
            + (f"'s {VALUE_OF[t.ranking.objective]}" if t.ranking.objective in VALUE_OF else "")
            + f"): {why}"
        )
    return out


def _excluded_rows(t: Theory) -> list[tuple[str, str, str]]:
    rows = [(command_text(list(e.launch)), e.verdict, e.reason) for e in t.result.excluded if e.hand_tried]
    return rows


def _excluded_counts(t: Theory) -> str:
    counts = Counter(e.verdict for e in t.result.excluded)
    return ", ".join(f"{n} {verdict.replace('_', ' ')}" for verdict, n in counts.most_common())


# --- rich -------------------------------------------------------------------------------------------------


def theory_view(t: Theory, *, top: int) -> Group:
    parts: list[Any] = [Text(headline(t), style="bold")]
    parts += [Text("• " + line) for line in narrative(t)]
    if t.ranking.scores:
        parts.append(_ranked_table(t, top))
        parts.append(_winners_table(t))
    families = family_lines(t)
    if families:
        parts.append(Text("Why the others lose (each family's best, at the winner's concurrency):", style="bold"))
        parts += [Text("• " + line) for line in families]
    if t.benchmark is not None:
        parts.append(_benchmark_table(t))
        parts += [Text("• " + line) for line in benchmark_lines(t)]
    if t.what_ifs:
        parts.append(_what_if_table(t))
    parts.append(_excluded_table(t))
    if t.verify:
        parts.append(Text("Start it and check it:", style="bold"))
        parts += [ShellLine(line) for line in t.verify_lines()]
    return Group(*parts)


def distinct_layouts(t: Theory) -> list[Score]:
    """Each layout of the ranking once, at its best options (its other option sets are further down the ranking)."""
    shown, seen = [], set()
    for s in t.ranking.scores:
        key = (s.candidate.engine, s.candidate.layout.structure())
        if key not in seen:
            seen.add(key)
            shown.append(s)
    return shown


def _ranked_table(t: Theory, top: int) -> Table:
    """The best `top` layouts, each at its best options."""
    shown = distinct_layouts(t)
    table = Table(
        title=f"top {min(top, len(shown))} of {len(shown)} layouts that start, each at its best options "
        f"({len(t.ranking.scores)} setups); ±: its family's uncertainty (* not measured on these GPUs)"
    )
    # dollars and watts as columns where the objective ranks by them (the narrative and --json give them always)
    priced = t.ranking.objective in (Objective.MIN_COST, Objective.MAX_TOKENS_PER_WATT)
    money = ("$/Mtok", "tok/s/kW") if priced else ()
    for name in ("#", "setup", "tok/s", "±", "at C", "/GPU", "/user", "C=1", *money, "bound", "KV req"):
        table.add_column(name, justify="left" if name in ("setup", "bound") else "right")
    for n, s in enumerate(shown[:top], start=1):
        c, p = s.candidate, s.at
        one = min(c.predictions, key=lambda q: q.concurrency)
        conf = t.ranking.confidence(s)
        e = t.economics_of(s)
        table.add_row(
            str(n),
            c.name,
            f"{p.output_tok_s:,.0f}",
            f"{conf.uncertainty:.0%}" + ("" if conf.basis == "this GPU" else "*") if conf else "",
            str(p.concurrency),
            f"{p.output_tok_s / c.gpus:,.0f}",
            f"{p.per_user_tok_s:,.1f}",
            f"{one.output_tok_s:,.1f}",
            *(
                (
                    f"{e.usd_per_million_output_tokens:,.2f}" if e.usd_per_million_output_tokens is not None else "?",
                    f"{e.output_tok_s_per_kw:,.0f}",
                )
                if priced
                else ()
            ),
            p.bound.replace("kv_capacity", _capacity(c, t)),
            str(c.memory.max_concurrency(isl=t.result.case.isl, osl=t.result.case.osl)),
        )
    return table


def _capacity(c: Candidate, t: Theory) -> str:
    """The pool whose capacity queues requests: the KV pool, or the linear-attention state pool."""
    return "states" if "state" in c.memory.holder(isl=t.result.case.isl, osl=t.result.case.osl) else "KV"


def _winners_table(t: Theory) -> Table:
    table = Table(title="the best setup at each concurrency")
    for name in ("C", "setup", "tok/s", "/user", "TPOT ms"):
        table.add_column(name, justify="left" if name == "setup" else "right")
    for w in t.winners:
        p = w.prediction
        table.add_row(
            str(w.concurrency),
            w.candidate.name,
            f"{p.output_tok_s:,.0f}",
            f"{p.per_user_tok_s:,.1f}",
            f"{p.tpot_s * 1e3:,.1f}",
        )
    return table


def _workload_text(t: Theory) -> str:
    assert t.benchmark is not None
    w = t.benchmark.workloads[0]
    mean_in, mean_out = w.mean_lengths
    shape = (
        f"sampled lengths, mean {mean_in:,.0f} in / {mean_out:,.0f} out"
        if w.pairs
        else f"{mean_in:,.0f} in / {mean_out:,.0f} out"
    )
    return f"{w.num_requests:,} prompts of {shape}"


def _benchmark_rows(t: Theory) -> list[list[str]]:
    assert t.benchmark is not None
    rows = []
    for n, s in enumerate(t.benchmark.ranked, start=1):
        for r in s.results:
            rows.append(
                [
                    str(n),
                    s.candidate.name,
                    str(s.screen_rank),
                    short_load(r),
                    f"{r.output_tok_s:,.0f}",
                    f"{r.tpot_s.mean * 1e3:,.1f}",
                    f"{r.ttft_s.mean:,.2f}",
                    f"{r.mean_running:,.0f}",
                ]
            )
    return rows


def _benchmark_table(t: Theory) -> Table:
    table = Table(
        title=f"the best {len(t.benchmark.ranked) if t.benchmark else 0} of the screen, simulated as the "
        f"benchmark sends it: {_workload_text(t)}"
    )
    for name in ("#", "setup", "screen #", "load", "tok/s", "TPOT ms", "TTFT s", "running"):
        table.add_column(name, justify="left" if name == "setup" else "right")
    for row in _benchmark_rows(t):
        table.add_row(*row)
    return table


def benchmark_lines(t: Theory) -> list[str]:
    """What the simulation changes: the winner under the benchmark's workload, against the screen's."""
    b = t.benchmark
    if b is None or b.best is None:
        return []
    best = b.best
    lines = []
    if best.screen_rank == 1:
        lines.append(
            f"Under this workload the screen's winner stays best: {best.candidate.name}, "
            f"{best.output_tok_s:,.0f} tok/s as the benchmark would report it."
        )
    else:
        lines.append(
            f"Under this workload {best.candidate.name} (#{best.screen_rank} of the screen) is best with "
            f"{best.output_tok_s:,.0f} tok/s: the spread of lengths, the arrivals and the run's tail rank the "
            "setups differently from a steady closed loop at mean lengths."
        )
    lines += [f"Not simulated: {name}: {why}" for name, why in b.dropped]
    return lines


def _benchmark_payload(t: Theory) -> dict[str, Any] | None:
    b = t.benchmark
    if b is None:
        return None
    return {
        "workloads": [
            {
                "num_prompts": w.num_requests,
                "max_concurrency": w.concurrency,
                "request_rate": None if w.request_rate == float("inf") else w.request_rate,
                "burstiness": w.burstiness,
                "seed": w.seed,
                "pairs": len(w.pairs),
            }
            for w in b.workloads
        ],
        "ranked": [
            {
                "setup": s.candidate.name,
                "screen_rank": s.screen_rank,
                "output_tok_s": round(s.output_tok_s, 2),
                "launch": list(s.candidate.launch),
                "results": [
                    {
                        "load": short_load(r),
                        "output_tok_s": round(r.output_tok_s, 2),
                        "tpot_ms_mean": round(r.tpot_s.mean * 1e3, 3),
                        "ttft_s_mean": round(r.ttft_s.mean, 4),
                        "mean_running": round(r.mean_running, 1),
                        "retractions": r.retractions,
                    }
                    for r in s.results
                ],
            }
            for s in b.ranked
        ],
        "dropped": [{"setup": name, "why": why} for name, why in b.dropped],
    }


def _what_if_table(t: Theory) -> Table:
    table = Table(title="what would change it")
    for name in ("what if", "tok/s", "gain", "how"):
        table.add_column(name, justify="right" if name in ("tok/s", "gain") else "left")
    for w in t.what_ifs:
        value = "—" if w.output_tok_s is None else f"{w.output_tok_s:,.0f}"
        gain = "—" if w.gain is None else f"{w.gain:.2f}×"
        table.add_row(w.label, value, gain, (w.setup + ": " if w.setup else "") + w.note)
    return table


def _excluded_table(t: Theory) -> Table:
    table = Table(title=f"excluded: {_excluded_counts(t) or 'nothing'}; the commands tried by hand:")
    for name in ("command", "verdict", "why"):
        table.add_column(name)
    for cmd, verdict, why in _excluded_rows(t):
        table.add_row(_short(cmd), verdict, _brief(why))
    return table


def _brief(reason: str) -> str:
    """The first clause of a reason (the JSON, Markdown and HTML reports keep it whole)."""
    return reason.split("; ")[0]


def _short(cmd: str) -> str:
    """The command without its launcher and model: the flags that matter."""
    words = cmd.split()
    keep = [w for i, w in enumerate(words) if i >= 3 and w != "--trust-remote-code"]
    if len(keep) >= 2 and keep[0] in ("--model-path", "--model"):
        keep = keep[2:]
    return " ".join(keep) or cmd


# --- JSON -------------------------------------------------------------------------------------------------


def _candidate_payload(c: Candidate, isl: int, osl: int, gpu: str, pricing: Pricing) -> dict[str, Any]:
    family = c.layout.family()
    cluster = c.priced_by.cluster if c.priced_by is not None else None

    def economics_of(p: Prediction) -> Economics:
        assert cluster is not None, "a ranked setup is priced on its search's cluster"
        return economics(p, cluster, c.layout, pricing)

    def confidence_of(p: Prediction) -> Confidence:
        return confidence(c.engine, family, regime_of(p.concurrency), gpu)

    return {
        "engine": c.engine,
        "layout": c.layout.describe(),
        "variant": c.variant.label or None,
        "launch": list(c.launch),
        "launch_per_node": [list(cmd) for cmd in c.launches],
        "gpus": c.gpus,
        "kv_tokens": c.memory.kv_tokens_total,
        "max_concurrency": c.memory.max_concurrency(isl=isl, osl=osl),
        "bound": c.peak.bound,
        "predicted": [
            prediction_payload(p, confidence_of, economics_of if cluster is not None else None) for p in c.priced()
        ],
    }


def _gains_payload(t: Theory) -> list[dict[str, Any]]:
    """The recommended setup's non-default options and layout flags, each with the setup without it."""
    win = t.ranking.best
    if win is None:
        return []
    out: list[dict[str, Any]] = []
    for g in option_gains(t.ranking):
        gain = g.gain(win.value)
        out.append(
            {
                "flags": [g.option],
                "without": g.without.candidate.name if g.without else None,
                "without_tok_s": round(g.without.value, 3) if g.without else None,
                "gain": round(gain, 4) if gain is not None else None,
                "tie": g.without is not None and tied(g.without.value, win.value, t.ranking.band),
            }
        )
    for f in flag_gains(t.ranking):
        gain = f.gain(win.value)
        out.append(
            {
                "flags": list(f.flags),
                "without": f.without.candidate.name,
                "without_tok_s": round(f.without.value, 3),
                "gain": round(gain, 4),
                "tie": tied(f.without.value, win.value, t.ranking.band),
            }
        )
    return out


def theory_payload(t: Theory, *, top: int | None = None) -> dict[str, Any]:
    r = t.result
    scores = t.ranking.scores if top is None else t.ranking.scores[:top]
    ranked = [
        {
            "rank": n,
            "score": round(s.value, 3),
            "at_concurrency": s.at.concurrency,
            "confidence": conf.to_json() if (conf := t.ranking.confidence(s)) else None,
            **economics_payload(t.economics_of(s)),
            **_candidate_payload(s.candidate, r.case.isl, r.case.osl, r.case.cluster.gpu.name, t.pricing),
        }
        for n, s in enumerate(scores, start=1)
    ]
    ex = t.explanation
    return {
        "model": r.case.model.name,
        "cluster": r.case.cluster.name,
        "engines": list(r.engines),
        "isl": r.case.isl,
        "osl": r.case.osl,
        "concurrency": list(r.concurrency),
        "objective": t.ranking.objective.value,
        "score_unit": VALUE_OF.get(t.ranking.objective, "output tok/s"),
        "pricing": {
            "gpu_hour_usd": t.pricing.hourly_usd(r.case.cluster),
            "kwh_usd": t.pricing.kwh_usd,
            "basis": t.pricing.basis(r.case.cluster),
        },
        "best": ranked[0] if ranked else None,
        "narrative": narrative(t),
        "preferred_over": t.ranking.preferred_over.candidate.name if t.ranking.preferred_over else None,
        "unvalidated_over": t.ranking.unvalidated_over.candidate.name if t.ranking.unvalidated_over else None,
        "measured_alternative": t.ranking.measured_alternative.candidate.name
        if t.ranking.measured_alternative
        else None,
        "what_each_flag_buys": _gains_payload(t),
        "ranked": ranked,
        "why_others_lose": [
            {
                "family": f.family,
                "best": f.best.name,
                "score": round(f.value, 3),
                "ratio": round(f.ratio, 4),
                "reasons": [
                    {"part": x.part, "extra_ms_per_token": round(x.extra_s * 1e3, 3), "text": x.text} for x in f.reasons
                ],
            }
            for f in (ex.families if ex else ())
        ],
        "winner_bound": ex.bound if ex else None,
        "winner_breakdown_ms": {k: round(v * 1e3, 3) for k, v in ex.breakdown_s.items()} if ex else None,
        "ceiling": None
        if t.ceiling is None
        else {
            "output_tok_s": round(t.ceiling.output_tok_s, 1),
            "batch": t.ceiling.batch,
            "bound": t.ceiling.bound,
            "step_ms": round(t.ceiling.step_s * 1e3, 3),
        },
        "winners_by_concurrency": [
            {
                "concurrency": w.concurrency,
                "setup": w.candidate.name,
                "output_tok_s": round(w.prediction.output_tok_s, 2),
            }
            for w in t.winners
        ],
        "pareto": [
            {
                "setup": q.candidate.name,
                "concurrency": q.prediction.concurrency,
                "tok_s_per_gpu": round(q.tok_s_per_gpu, 2),
                "per_user_tok_s": round(q.per_user_tok_s, 2),
            }
            for q in t.frontier
        ],
        "what_ifs": [
            {"label": w.label, "setup": w.setup, "output_tok_s": w.output_tok_s, "gain": w.gain, "note": w.note}
            for w in t.what_ifs
        ],
        "excluded": [
            {
                "launch": list(e.launch),
                "layout": e.layout,
                "verdict": e.verdict,
                "reason": e.reason,
                "engine_error": e.engine_error,
                "hand_tried": e.hand_tried,
            }
            for e in r.excluded
        ],
        "verify": [list(cmd) for cmd in t.verify],
        "would_fit": list(t.would_fit),
        "benchmark": _benchmark_payload(t),
    }


# --- Markdown ---------------------------------------------------------------------------------------------


RANKING_HEADER = ["#", "setup", "tok/s", "at C", "tok/s per GPU", "tok/s per user", "bound"]


def ranking_rows(shown: list[Score], top: int) -> tuple[list[str], list[list[str]]]:
    """The ranking table of the Markdown and HTML reports: its header, and a row per layout shown."""
    rows = [
        [
            str(n),
            s.candidate.name,
            f"{s.at.output_tok_s:,.0f}",
            str(s.at.concurrency),
            f"{s.at.output_tok_s / s.candidate.gpus:,.0f}",
            f"{s.at.per_user_tok_s:,.1f}",
            s.at.bound,
        ]
        for n, s in enumerate(shown[:top], start=1)
    ]
    return RANKING_HEADER, rows


def winner_rows(t: Theory) -> tuple[list[str], list[list[str]]]:
    """The table of the best setup at each concurrency, for the Markdown and HTML reports."""
    rows = [
        [
            str(w.concurrency),
            w.candidate.name,
            f"{w.prediction.output_tok_s:,.0f}",
            f"{w.prediction.per_user_tok_s:,.1f}",
        ]
        for w in t.winners
    ]
    return ["C", "setup", "tok/s", "tok/s per user"], rows


def what_if_rows(t: Theory) -> tuple[list[str], list[list[str]]]:
    """The what-if table of the Markdown and HTML reports: its header, and a row per what-if."""
    rows = [
        [
            w.label,
            "—" if w.output_tok_s is None else f"{w.output_tok_s:,.0f}",
            "—" if w.gain is None else f"{w.gain:.2f}×",
            (w.setup + ": " if w.setup else "") + w.note,
        ]
        for w in t.what_ifs
    ]
    return ["what if", "tok/s", "gain", "how"], rows


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(out)


def theory_markdown(t: Theory, *, top: int) -> str:
    r = t.result
    out = [f"# shardwise theory: {headline(t)}", "", *[f"- {line}" for line in narrative(t)], ""]
    if t.ranking.scores:
        shown = distinct_layouts(t)
        out += [
            "## Ranking",
            "",
            f"The top {min(top, len(shown))} of {len(shown)} layouts that start, each at its "
            f"best options ({len(t.ranking.scores)} setups).",
            "",
            _md_table(*ranking_rows(shown, top)),
            "",
        ]
        out += [
            "## The best setup at each concurrency",
            "",
            _md_table(*winner_rows(t)),
            "",
        ]
    families = family_lines(t)
    if families:
        out += ["## Why the others lose", "", *[f"- {line}" for line in families], ""]
    if t.benchmark is not None:
        out += [
            f"## Simulated as the benchmark sends it ({_workload_text(t)})",
            "",
            _md_table(["#", "setup", "screen #", "load", "tok/s", "TPOT ms", "TTFT s", "running"], _benchmark_rows(t)),
            "",
            *[f"- {line}" for line in benchmark_lines(t)],
            "",
        ]
    if t.what_ifs:
        out += [
            "## What would change it",
            "",
            _md_table(*what_if_rows(t)),
            "",
        ]
    out += [
        f"## Excluded ({_excluded_counts(t) or 'nothing'})",
        "",
        _md_table(["command", "verdict", "why"], [[f"`{_short(c)}`", v, w] for c, v, w in _excluded_rows(t)]),
        "",
    ]
    if t.verify:
        out += ["## Start it and check it", "", "```sh", *t.verify_lines(), "```", ""]
    out.append(
        f"Parts of a token's time: {', '.join(f'{k} = {PART_NAMES[k]}' for k in PART_LABELS)}. "
        f"{len(r.candidates)} setups predicted."
    )
    return "\n".join(out) + "\n"
