"""Predicted against measured, row by row, and the error summary."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from shardwise.measure.gaps import Mechanism, beyond
from shardwise.measure.reference import METRICS, Checked, ErrorSummary, RankAgreement, group_of_row

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
        if not metrics:
            continue
        errors = ", ".join(f"{LABELS[m]} {c.error(m):+.0%}" for m in metrics)
        lines.append(Text(f"{c.row.id} ({errors}):", style="bold"))
        mechanisms = gaps.get(c.row.id, [])
        if not mechanisms:
            lines.append(Text("  no mechanism shardwise knows applies"))
        for m in mechanisms:
            lines.append(Text(f"  {m.name}: {m.why}{_predicted_text(m, c)}"))
    return lines


def validation_view(
    checked: list[Checked], summary: list[ErrorSummary], ranks: RankAgreement, gaps: Gaps | None = None
) -> Group:
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
        "! = beyond the stated accuracy (the plain or speculative median below)"
    )
    lines = [
        Text(
            f"{s.group} {s.metric}: mean absolute error {s.mape:.0%}, median {s.median_ape:.0%} over {s.rows} rows "
            f"(worst {s.worst})"
        )
        for s in summary
    ]
    gap_text = gap_lines(checked, gaps or {})
    if gap_text:
        gap_text.insert(0, Text("\nbeyond the stated accuracy, and what could explain it:"))
    return Group(table, *lines, Text(_ranks_line(ranks)), *gap_text)


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


def validation_payload(
    checked: list[Checked], summary: list[ErrorSummary], ranks: RankAgreement, gaps: Gaps | None = None
) -> dict[str, Any]:
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
                "measured": {m: getattr(c.row, m) for m in METRICS},
                "predicted": {m: c.value(m) for m in METRICS},
                "beyond_stated_accuracy": beyond(c),
                "mechanisms": [m.payload() for m in (gaps or {}).get(c.row.id, [])],
            }
            for c in checked
        ],
        "rank_agreement": {"groups": ranks.groups, "pairs": ranks.pairs, "concordant": ranks.concordant},
        "summary": [
            {
                "group": s.group,
                "metric": s.metric,
                "rows": s.rows,
                "mape": s.mape,
                "median_ape": s.median_ape,
                "worst": s.worst,
            }
            for s in summary
        ],
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
