"""Measured load levels as JSON records and as a table; records are appended to a JSONL file one level at a
time, so an interrupted benchmark keeps every level it finished."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

from shardwise.measure.bench import LevelResult
from shardwise.serve.simulate import Stats


def _ms(name: str, stats: Stats) -> dict[str, float | None]:
    values = {"mean": stats.mean, "median": stats.p50, "p90": stats.p90, "p99": stats.p99}
    return {f"{k}_{name}_ms": None if math.isnan(v) else round(v * 1e3, 3) for k, v in values.items()}


def level_record(level: LevelResult, *, url: str, model: str | None, tool: str = "shardwise bench") -> dict[str, Any]:
    """One level with the key names `vllm bench serve --save-result` writes, plus what failed and why."""
    return {
        "tool": tool,
        "url": url,
        "model": model,
        "random_input_len": level.isl,
        "random_output_len": level.osl,
        "max_concurrency": level.concurrency,
        "request_rate": level.request_rate,
        "num_prompts": level.num_prompts,
        "completed": level.completed,
        "failed": level.failed,
        "errors": level.errors,
        "duration": round(level.duration_s, 3),
        "total_input_tokens": level.input_tokens,
        "total_output_tokens": level.output_tokens,
        "request_throughput": round(level.request_throughput, 4),
        "output_throughput": round(level.output_throughput, 2),
        "total_token_throughput": round(level.total_token_throughput, 2),
        **_ms("ttft", level.ttft_s),
        **_ms("tpot", level.tpot_s),
        **_ms("itl", level.itl_s),
        **_ms("e2el", level.e2e_s),
    }


def levels_table(records: list[dict[str, Any]], *, title: str) -> Table:
    table = Table(title=title)
    for name in ("load", "done", "failed", "tok/s", "TTFT ms", "p99", "TPOT ms", "ITL p99", "E2E ms"):
        table.add_column(name, justify="right")
    for r in records:
        load = f"C={r['max_concurrency']}" if r["max_concurrency"] else ""
        if r["request_rate"] is not None:
            load = f"{load} {r['request_rate']:g}/s".strip()
        cells = [r[k] for k in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms", "mean_e2el_ms")]
        table.add_row(
            load,
            str(r["completed"]),
            str(r["failed"]),
            f"{r['output_throughput']:,.1f}",
            *("—" if c is None else f"{c:,.1f}" for c in cells),
        )
    return table


def sweep_table(ranked: list[dict[str, Any]], *, calibrated: bool) -> Table:
    """The swept setups, re-ranked: measured first (by what was measured), then the rest by prediction."""
    table = Table(
        title="swept setups, re-ranked" + (" (predictions recalibrated on the measurements)" if calibrated else "")
    )
    for name in ("setup", "status", "predicted", "calibrated", "measured", "why"):
        table.add_column(name, justify="right" if name in ("predicted", "calibrated", "measured") else "left")
    for r in ranked:
        cells = [r["predicted_output_tok_s"], r["calibrated_output_tok_s"], r["measured_output_tok_s"]]
        why = r["reason"] or ""
        if r.get("detail"):
            why = f"{why}: {r['detail']}"
        table.add_row(
            r["layout"] or _flags(r["command"]), r["status"], *("—" if c is None else f"{c:,.0f}" for c in cells), why
        )
    table.caption = "output tok/s at the highest level; predicted with the default constants and recalibrated"
    return table


def _flags(command: str) -> str:
    """A launch command without its launcher and model: the flags that tell setups apart."""
    words = command.split()
    for flag in ("--model-path", "--model"):
        if flag in words:
            return " ".join(words[words.index(flag) + 2 :]) or command
    return command
