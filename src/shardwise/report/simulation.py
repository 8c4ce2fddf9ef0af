"""Simulated serving results as JSON and as a table, in the units the benchmark tools print."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shardwise.serve.simulate import ServeResult, Stats


def _ms(name: str, stats: Stats) -> dict[str, float]:
    """mean_/median_/p90_/p99_<name>_ms, as the benchmark tools name them."""
    values = {"mean": stats.mean, "median": stats.p50, "p90": stats.p90, "p99": stats.p99}
    return {f"{k}_{name}_ms": round(v * 1e3, 3) for k, v in values.items()}


def result_payload(r: ServeResult) -> dict[str, Any]:
    """One run, with the keys and definitions of `vllm bench serve --save-result` (SGLang's bench_serving uses
    the same names, except e2e_latency for e2el), then what the simulated engine did."""
    return {
        "concurrency": r.concurrency,
        "request_rate": r.request_rate,
        "completed": r.requests,
        "duration": round(r.duration_s, 3),
        "request_throughput": round(r.request_per_s, 4),
        "output_throughput": round(r.output_tok_s, 2),
        "total_token_throughput": round(r.total_tok_s, 2),
        **_ms("ttft", r.ttft_s),
        **_ms("tpot", r.tpot_s),
        **_ms("itl", r.itl_s),
        **_ms("e2el", r.e2e_s),
        "mean_running_per_rank": round(r.mean_running, 2),
        "peak_running_per_rank": r.peak_running,
        "retractions": r.retractions,
        "tokens_per_step": round(r.tokens_per_step, 4),
        "engine_steps": r.steps,
    }


def results_payload(results: list[ServeResult], baseline: list[ServeResult] | None) -> list[dict[str, Any]]:
    """Every run; with a plain-decoding baseline, its output tok/s and the speedup over it."""
    out = []
    for n, r in enumerate(results):
        row = result_payload(r)
        if baseline:
            row["plain_output_throughput"] = round(baseline[n].output_tok_s, 2)
            row["speedup"] = round(r.output_tok_s / baseline[n].output_tok_s, 3)
        out.append(row)
    return out


def results_table(results: list[ServeResult], *, title: str, baseline: list[ServeResult] | None = None) -> Table:
    table = Table(title=title)
    columns = ("load", "tok/s", "TTFT s", "p99", "TPOT ms", "ITL p99", "E2E s", "run", "evict")
    for name in columns + (("gain",) if baseline else ()):
        table.add_column(name, justify="right")
    for n, r in enumerate(results):
        table.add_row(
            short_load(r),
            f"{r.output_tok_s:,.0f}",
            _fmt(r.ttft_s.mean, 1, 2),
            _fmt(r.ttft_s.p99, 1, 2),
            _fmt(r.tpot_s.mean, 1e3, 1),
            _fmt(r.itl_s.p99, 1e3, 1),
            _fmt(r.e2e_s.mean, 1, 1),
            f"{r.mean_running:,.1f}",
            f"{r.retractions:,}",
            *([f"{r.output_tok_s / baseline[n].output_tok_s:.2f}×"] if baseline else []),
        )
    table.caption = (
        "tok/s = output tokens; TTFT and E2E means in s, TPOT mean and ITL p99 in ms; run = requests decoding "
        "per rank on average; evict = sent back to the queue when the KV pool was full; --json for all"
    )
    if baseline:
        losing = [r for n, r in enumerate(results) if r.output_tok_s < baseline[n].output_tok_s]
        table.caption += "; gain = output tok/s over the same command without speculative decoding: " + (
            f"it stops paying at {_load(losing[0])}" if losing else "it pays at every load simulated"
        )
    return table


def short_load(r: ServeResult) -> str:
    load = f"C={r.concurrency}" if r.concurrency else ""
    if r.request_rate is not None:
        return f"{load} {r.request_rate:g}/s".strip()
    return load or f"{r.requests:,} at once"


def _load(r: ServeResult) -> str:
    rate = f"{r.request_rate:g} requests/s" if r.request_rate else f"{r.requests:,} at once"
    if r.concurrency:
        return f"{r.concurrency} clients" + (f", {rate}" if r.request_rate else "")
    return rate


def _fmt(seconds: float, scale: float, digits: int) -> str:
    return "—" if math.isnan(seconds) else f"{seconds * scale:,.{digits}f}"


@contextmanager
def progress_bar(total: int, *, label: str, delay_s: float = 1.0) -> Iterator[Callable[[str, int], None]]:
    """A progress bar on stderr that appears only on a terminal and only once the work has taken `delay_s`;
    yields update(description, completed)."""
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    task = progress.add_task(label, total=total)
    start, shown = time.monotonic(), False

    def update(description: str, completed: int) -> None:
        nonlocal shown
        if not shown and time.monotonic() - start > delay_s:
            progress.start()
            shown = True
        progress.update(task, description=description, completed=completed)

    try:
        yield update
    finally:
        if shown:
            progress.stop()
