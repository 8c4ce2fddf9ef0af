"""Predicted against measured, row by row, and the error summary."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from shardwise.measure.gaps import Mechanism, beyond
from shardwise.measure.inferencex import Skipped
from shardwise.measure.pcie import Capacity
from shardwise.measure.reference import METRICS, Checked, ErrorSummary, RankAgreement, group_of_row, split_of
from shardwise.serve.accuracy import KINDS, stated_median

Gaps = dict[str, list[Mechanism]]  # row id → the mechanisms that could explain its gap


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _ranks_line(ranks: RankAgreement) -> str:
    if not ranks.pairs:
        return "rank agreement: no workload was measured on two setups"
    return (
        f"rank agreement: {ranks.concordant} of {ranks.pairs} pairs of setups ({ranks.fraction:.0%}) ordered as "
        f"measured, over {ranks.groups} workloads measured on two setups or more"
    )


LABELS = {"output_tok_s": "tok/s", "tpot_ms": "TPOT", "ttft_ms": "TTFT"}


def _err(c: Checked, metric: str) -> str:
    error = c.error(metric)
    if error is None:
        return "—"
    return f"{error:+.0%}" + ("!" if metric in beyond(c) else "")


def _predicted_text(m: Mechanism, c: Checked) -> str:
    if not m.predicted:
        return ""
    parts = []
    for metric, unit in (("output_tok_s", "tok/s"), ("tpot_ms", "ms TPOT"), ("ttft_ms", "ms TTFT")):
        value, measured = m.predicted.get(metric), getattr(c.row, metric)
        if value is not None and measured is not None:
            parts.append(f"{value:,.1f} {unit} ({(value - measured) / measured:+.0%})")
    text = " → " + ", ".join(parts) if parts else ""
    if m.siblings:
        others = ", ".join(f"{k} {v:+.0%}" for k, v in m.siblings.items() if v is not None)
        text += f"; the same change puts the same machine's other rows at {others}"
    return text


def gap_lines(checked: list[Checked], gaps: Gaps) -> list[Text]:
    """Each row beyond the stated accuracy, with the mechanisms that could explain it."""
    lines = []
    for c in checked:
        metrics = beyond(c)
        if not metrics or c.row.id not in gaps:
            continue
        errors = ", ".join(f"{LABELS[m]} {c.error(m):+.0%}" for m in metrics)
        lines.append(Text(f"{c.row.id} ({errors}):", style="bold"))
        mechanisms = gaps.get(c.row.id, [])
        if not mechanisms:
            lines.append(Text("  no mechanism shardwise knows applies"))
        for m in mechanisms:
            lines.append(Text(f"  {m.name}: {m.why}{_predicted_text(m, c)}"))
    return lines


@dataclass(frozen=True)
class Validation:
    """What validate found: each row predicted, the headline errors, their breakdown, the rank agreement, what
    could explain the gaps, and the points it could not predict."""

    checked: list[Checked]
    summary: list[ErrorSummary]
    breakdown: list[ErrorSummary]
    ranks: RankAgreement
    gaps: Gaps
    skipped: list[Skipped]
    capacities: list[Capacity] = dataclasses.field(default_factory=list)  # KV pools from start-up logs


ROWS_SHOWN = 60  # more rows than this are summarised, not listed (validate --json lists every one)


def _summary_line(s: ErrorSummary) -> Text:
    return Text(
        f"{s.group} {s.metric}: mean absolute error {s.mape:.0%}, median {s.median_ape:.0%} over {s.rows} rows "
        f"(worst {s.worst})"
    )


def breakdown_table(groups: list[ErrorSummary]) -> Table:
    """Median absolute error per group, one column per metric: beside the headline, never instead of it."""
    table = Table(title="median absolute error by group (rows in brackets)")
    table.add_column("group")
    for metric in METRICS:
        table.add_column(LABELS[metric], justify="right")
    by: dict[str, dict[str, ErrorSummary]] = {}
    for s in groups:
        by.setdefault(s.group, {})[s.metric] = s
    for group, metrics in by.items():
        cells = [f"{m.median_ape:.0%} ({m.rows})" if (m := metrics.get(k)) else "—" for k in METRICS]
        table.add_row(group, *cells)
    return table


def _skipped_lines(skipped: list[Skipped]) -> list[Text]:
    if not skipped:
        return []
    reasons = Counter(s.reason for s in skipped)
    lines = [Text(f"\n{len(skipped)} points not predicted, by reason (validate --json lists each):")]
    lines += [Text(f"  {n:4d}  {reason}") for reason, n in reasons.most_common()]
    return lines


def _cold_lines(checked: list[Checked]) -> list[Text]:
    """How many predictions hold a wait taken from their own run (reference.py cold_wait), and how long."""
    waits = sorted(c.cold_start_s for c in checked if c.cold_start_s)
    if not waits:
        return []
    return [
        Text(
            f"{len(waits)} run{'s' * (len(waits) != 1)} without warm-up requests waited for the engine's first-use "
            f"compilation ({waits[0]:,.0f}–{waits[-1]:,.0f} s, their p99 TTFT beyond the warm simulation's): their "
            "predictions hold that wait as measured (cold_start_s in --json)"
        )
    ]


def validation_view(v: Validation) -> Group:
    parts: list[Any] = []
    if len(v.checked) <= ROWS_SHOWN:
        parts.append(_rows_table(v.checked))
    parts += [_summary_line(s) for s in v.summary]
    if len(v.checked) > ROWS_SHOWN:
        parts.append(breakdown_table(v.breakdown))
    parts.append(Text(_ranks_line(v.ranks)))
    parts += _cold_lines(v.checked)
    if v.capacities:
        parts.append(capacity_table(v.capacities))
    parts += _skipped_lines(v.skipped)
    gap_text = gap_lines(v.checked, v.gaps)
    if gap_text:
        gap_text.insert(0, Text("\nbeyond the stated accuracy, and what could explain it:"))
    return Group(*parts, *gap_text)


def capacity_table(capacities: list[Capacity]) -> Table:
    """Each KV pool a start-up log reported beside the ledger's for the same command."""
    table = Table(title="KV pool in tokens (the layout's, DCP ranks together): start-up log against prediction")
    for name in ("id", "model", "GPUs", "build", "log", "pred", "err"):
        table.add_column(name, justify="right" if name in ("log", "pred", "err") else "left")
    for c in capacities:
        problem = (c.problem or "does not start").split(";")[0]
        predicted = f"none: {problem}" if c.predicted_tokens is None else f"{c.predicted_tokens:,}"
        error = "—" if c.error is None else f"{c.error:+.1%}"
        table.add_row(c.id, c.model, c.gpus, c.image, f"{c.measured_tokens:,}", predicted, error)
    errors = [abs(c.error) for c in capacities if c.error is not None]
    if errors:
        table.caption = (
            f"median absolute error {statistics.median(errors):.1%} over {len(errors)} pools "
            f"({sum(e <= 0.05 for e in errors)} within 5 %)"
        )
    return table


def _capacity_payload(c: Capacity) -> dict[str, Any]:
    return {
        "id": c.id,
        "model": c.model,
        "gpus": c.gpus,
        "build": c.image,
        "command": c.command,
        "measured_tokens": c.measured_tokens,
        "predicted_tokens": c.predicted_tokens,
        "error": c.error,
        "problem": c.problem,
    }


def _rows_table(checked: list[Checked]) -> Table:
    table = Table(
        title="measurements against predictions, each run simulated as its benchmark sent it; * = speculative decoding"
    )
    for name in (
        "id",
        "model",
        "GPUs",
        "layout",
        "load",
        "tok/s meas",
        "pred",
        "err",
        "TPOT meas",
        "pred",
        "err",
        "TTFT s",
        "err",
        "tables",
    ):
        table.add_column(name, justify="left" if name in ("id", "model", "GPUs", "layout") else "right")
    for c in checked:
        table.add_row(
            c.row.id + ("*" if c.row.accept_length else ""),
            c.row.model,
            c.row.gpus,
            c.layout or c.problem or "",
            c.row.load_text() + (f" {c.row.dataset}" if c.row.dataset else ""),
            _num(c.row.output_tok_s),
            _num(c.value("output_tok_s")),
            _err(c, "output_tok_s"),
            _num(c.row.tpot_ms),
            _num(c.value("tpot_ms")),
            _err(c, "tpot_ms"),
            _num(c.row.ttft_ms / 1e3 if c.row.ttft_ms else None, 2),
            _err(c, "ttft_ms"),
            "—" if c.coverage is None else f"{c.coverage['measured_share']:.0%}",
        )
    table.caption = (
        "tables = share of a decode step at the run's mean batch priced from measured kernel tables; "
        f"! = beyond the stated accuracy, the median over every row validate --set all predicts: {_stated()}"
    )
    return table


def _stated() -> str:
    """The stated medians, plain and speculative, tok/s / TPOT / TTFT."""
    figures = {
        kind: " / ".join("—" if (e := stated_median(kind, m)) is None else f"{e:.0%}" for m in METRICS)
        for kind in KINDS
    }
    return f"{figures['plain']} plain, {figures['speculative']} speculative (tok/s / TPOT / TTFT)"


def _workload_payload(c: Checked) -> dict[str, Any]:
    """The workload a row was simulated with, as its benchmark ran it."""
    row, spec = c.row, c.workload or c.row.workload_spec()
    mean_in, mean_out = spec.mean_lengths
    return {
        "benchmark": row.benchmark,
        "dataset": row.dataset or "fixed",
        "num_prompts": spec.num_requests,
        "max_concurrency": spec.concurrency,
        "request_rate": None if math.isinf(spec.request_rate) else spec.request_rate,
        "mean_input_tokens": mean_in,
        "mean_output_tokens": mean_out,
        "engine_version": row.engine_version,
    }


def _summary_payload(groups: list[ErrorSummary]) -> list[dict[str, Any]]:
    return [
        {
            "group": s.group,
            "metric": s.metric,
            "rows": s.rows,
            "mape": s.mape,
            "median_ape": s.median_ape,
            "worst": s.worst,
        }
        for s in groups
    ]


def validation_payload(v: Validation) -> dict[str, Any]:
    checked, gaps, ranks = v.checked, v.gaps, v.ranks
    return {
        "rows": [
            {
                "id": c.row.id,
                "model": c.row.model,
                "gpus": c.row.gpus,
                "command": c.row.command,
                "layout": c.layout,
                "problem": c.problem,
                "workload": _workload_payload(c),
                "group": group_of_row(c),
                "decode_coverage": c.coverage,
                "accept_length": c.row.accept_length,
                "cold_start_s": c.cold_start_s,
                "split": split_of(c.row),
                "latency_statistic": c.row.latency,
                "not_modelled": list(c.not_modelled),
                "measured": {m: getattr(c.row, m) for m in METRICS},
                "predicted": {m: c.value(m) for m in METRICS},
                "beyond_stated_accuracy": beyond(c),
                "mechanisms": [m.payload() for m in gaps.get(c.row.id, [])],
            }
            for c in checked
        ],
        "rank_agreement": {"groups": ranks.groups, "pairs": ranks.pairs, "concordant": ranks.concordant},
        "summary": _summary_payload(v.summary),
        "breakdown": _summary_payload(v.breakdown),
        "not_predicted": [{"id": s.id, "reason": s.reason} for s in v.skipped],
        "kv_capacity": [_capacity_payload(c) for c in v.capacities],
    }


def calibration_view(payload: dict[str, Any]) -> Group:
    """What a calibration fitted, and the error it leaves (root-mean-square of log predicted ÷ measured)."""
    table = Table(title=f"calibrated on {payload['gpu']}: {', '.join(payload['fitted_on'])}")
    table.add_column("constant")
    table.add_column("value", justify="right")
    for name, value in payload["constants"].items():
        table.add_row(name, f"{value:.4g}")
    lines = [
        Text(
            f"fitted measurements: error {payload['fitted_error_before']:.3f} before, "
            f"{payload['fitted_error_after']:.3f} after"
        )
    ]
    if payload["held_out"]:
        lines.append(
            Text(
                f"held out ({', '.join(payload['held_out'])}): error {payload['held_out_error_before']:.3f} before, "
                f"{payload['held_out_error_after']:.3f} after"
            )
        )
    if payload["at_bounds"]:
        lines.append(
            Text(
                f"at the edge of their plausible range (the data pushes further; suspect the model or the "
                f"measurement): {', '.join(payload['at_bounds'])}"
            )
        )
    lines.append(Text(f"profile written to {payload['profile']}; use it with --profile"))
    return Group(table, *lines)


def memory_fit_view(payload: dict[str, Any]) -> Group:
    """The non-weight memory a start-up log implies, against the default, and the KV pool it predicts."""
    value = payload["constants"]["non_torch_bytes"] / 2**30
    default = payload["default_non_torch_bytes"] / 2**30
    kv = payload["kv_tokens"]
    lines = [
        Text(
            f"{payload['fitted_on'][0]}: {value:.2f} GiB per GPU besides weights, KV cache, activations and "
            f"graphs (the default assumes {default:.2f} GiB)"
        ),
        Text(
            f"KV cache tokens per pool: logged {kv['logged']:,}, predicted {kv['default']:,} before and "
            f"{kv['calibrated']:,} after"
            if kv["logged"] is not None
            else f"KV cache tokens per pool: predicted {kv['default']:,} before, {kv['calibrated']:,} after"
        ),
        Text(f"profile written to {payload['profile']}; use it with --profile"),
    ]
    return Group(*lines)
