"""Predicted serving figures as JSON and as a table with the step-time breakdown."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.table import Table

from shardwise.cost.step import StepCost
from shardwise.decide.economics import Economics
from shardwise.serve.accuracy import Confidence
from shardwise.serve.steady import Prediction

ConfidenceOf = Callable[[Prediction], Confidence]
EconomicsOf = Callable[[Prediction], Economics]

PART_LABELS = {
    "memory": "mem",
    "compute": "comp",
    "comm": "comm",
    "launch": "kern",
    "host": "host",
    "pipeline": "pipe",
    "prefill": "pref",
    "draft": "draft",
}


def prediction_payload(
    p: Prediction, confidence_of: ConfidenceOf | None = None, economics_of: EconomicsOf | None = None
) -> dict[str, Any]:
    """One prediction in milliseconds and tokens per second, its breakdown summing to TPOT; with `confidence_of`, the
    errors validate measured on its family (serve/accuracy.py); with `economics_of`, its cost and power
    (decide/economics.py)."""
    confidence = {"confidence": confidence_of(p).to_json()} if confidence_of else {}
    money = economics_payload(economics_of(p)) if economics_of else {}
    return {
        "concurrency": p.concurrency,
        "running": p.running,
        "output_tok_s": round(p.output_tok_s, 2),
        "per_user_tok_s": round(p.per_user_tok_s, 2),
        "tpot_ms": round(p.tpot_s * 1e3, 3),
        "ttft_ms": round(p.ttft_s * 1e3, 2),
        "bound": p.bound,
        "breakdown": {k: round(v * 1e3, 3) for k, v in p.breakdown_s.items()},
        "by_class_ms": {k: round(v * 1e3, 3) for k, v in _step(p).by_class_s().items()},
        "decode_coverage": _step(p).coverage,
        "collectives_ms": {k: round(v * 1e3, 3) for k, v in collective_times_s(p).items()},
        **money,
        **confidence,
    }


def economics_line(p: Prediction, e: Economics, basis: str) -> str:
    """Cost and power of the best of a check's predictions, one sentence."""
    usd = e.usd_per_million_output_tokens
    cost = f"${usd:,.3f} per million output tokens at {basis}" if usd is not None else f"cost unknown: {basis}"
    return (
        f"Cost and power at {p.concurrency} clients: {cost}; {e.output_tok_s_per_kw:,.1f} output tok/s per kW "
        f"({e.power_w / 1e3:,.1f} kW, an estimate: GPUs at TDP while they run kernels, hosts' share)."
    )


def economics_payload(e: Economics) -> dict[str, Any]:
    """Cost and power of one prediction (decide/economics.py; power is an estimate)."""
    usd = e.usd_per_million_output_tokens
    return {
        "usd_per_million_output_tokens": round(usd, 4) if usd is not None else None,
        "output_tok_s_per_kw": round(e.output_tok_s_per_kw, 3),
        "power_w": round(e.power_w, 1),
        "gpu_power_w": round(e.gpu_power_w, 1),
        "gpu_utilisation": round(e.gpu_utilisation, 4),
    }


def _step(p: Prediction) -> StepCost:
    if p.decode is None:  # a search's figures: Candidate.priced() prices the steps again
        raise ValueError(f"the prediction at {p.concurrency} clients has no decode step; price it with its setup")
    return p.decode


def collective_times_s(p: Prediction) -> dict[str, float]:
    """Each collective's time in one decode step (all its layers, every stage), by where it runs."""
    out: dict[str, float] = {}
    for op in _step(p).ops:
        if op.op_class.value == "comm":
            out[op.name] = out.get(op.name, 0.0) + op.time_s
    return out


def collectives_table(predictions: list[Prediction]) -> Table:
    """The collectives' share of a decode step at each concurrency."""
    times = [collective_times_s(p) for p in predictions]
    table = Table(title="collectives of one decode step, ms", title_justify="left")
    table.add_column("where")
    for p in predictions:
        table.add_column(f"C={p.concurrency}", justify="right")
    for name in dict.fromkeys(k for t in times for k in t):
        table.add_row(name, *(f"{t.get(name, 0.0) * 1e3:,.2f}" for t in times))
    return table


def predictions_payload(
    predictions: list[Prediction], confidence_of: ConfidenceOf | None = None, economics_of: EconomicsOf | None = None
) -> list[dict[str, Any]]:
    return [prediction_payload(p, confidence_of, economics_of) for p in predictions]


def confidence_lines(predictions: list[Prediction], confidence_of: ConfidenceOf) -> list[str]:
    """How far to trust the predictions: the confidence of each load regime they fall in, once each."""
    said = {(c.family, c.regime): c for c in map(confidence_of, predictions)}
    return [f"Confidence at {c.regime}: {c.describe()}." for c in said.values()]


def predictions_table(predictions: list[Prediction], *, isl: int, osl: int, decode_only: bool = False) -> Table:
    parts = [k for k in PART_LABELS if any(p.breakdown_s.get(k) for p in predictions)]
    loop = "closed loop, decode only (prompts cached)" if decode_only else "closed loop"
    table = Table(title=f"predicted, {isl} in / {osl} out, {loop}; ms of each output token by part")
    for name in ("C", "run", "tok/s", "/user", "TPOT", "TTFT", "bound"):
        table.add_column(name, justify="left" if name == "bound" else "right")
    for key in parts:
        table.add_column(PART_LABELS[key], justify="right")
    for p in predictions:
        table.add_row(
            str(p.concurrency),
            str(p.running),
            f"{p.output_tok_s:,.0f}",
            f"{p.per_user_tok_s:,.1f}",
            f"{p.tpot_s * 1e3:,.1f}",
            f"{p.ttft_s * 1e3:,.0f}",
            p.bound.replace("kv_capacity", "KV"),
            *(f"{p.breakdown_s.get(k, 0.0) * 1e3:,.1f}" for k in parts),
        )
    return table
