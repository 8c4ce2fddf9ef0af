"""Benchmark results from the tools people already run, read into one record per load level.

- `python -m sglang.bench_serving --output-file F`: JSON lines, one per run (`mean_e2e_latency_ms`, …);
- `vllm bench serve --save-result`: one JSON object per file (`mean_e2el_ms`, `input_lens`, …);
- `shardwise bench`: JSON lines with `"tool": "shardwise bench"`.
All three name throughput and latency keys alike (`output_throughput`, `mean_ttft_ms`, `mean_tpot_ms`); the
lengths are the mean tokens per completed request. A file from anything else is one clear error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardwise.errors import SpecError


@dataclass(frozen=True, kw_only=True)
class MeasuredLevel:
    source: str  # file:line
    tool: str
    isl: int
    osl: int
    concurrency: int | None
    request_rate: float | None
    num_prompts: int
    output_tok_s: float
    tpot_ms: float | None
    ttft_ms: float | None
    model: str | None = None
    command: str | None = None
    gpus: str | None = None


def read_results(path: Path) -> list[MeasuredLevel]:
    """Every load level in a results file of sglang.bench_serving, vllm bench serve or shardwise bench."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read results file {path}: {exc}") from exc
    try:
        whole = json.loads(text)
        records = [(1, whole)] if isinstance(whole, dict) else None
    except json.JSONDecodeError:
        records = None
    if records is None:
        records = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append((n, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise SpecError(
                        f"{path} line {n} is not JSON ({exc.msg}); expected a benchmark tool's results"
                    ) from None
    levels = [_read_level(rec, f"{path}:{n}") for n, rec in records if isinstance(rec, dict) and _tool(rec)]
    if not levels:
        raise SpecError(
            f"{path} holds no results of a known tool; expected the output of python -m sglang.bench_serving "
            "--output-file, vllm bench serve --save-result or shardwise bench"
        )
    return levels


def _read_level(rec: dict[str, Any], source: str) -> MeasuredLevel:
    try:
        return _level(rec, source)
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        raise SpecError(
            f"{source}: a field has the wrong type or value ({exc}); is this a benchmark tool's output?"
        ) from exc


def _tool(rec: dict[str, Any]) -> str | None:
    if rec.get("tool") == "shardwise bench":
        return "shardwise bench"
    if "output_throughput" not in rec:
        return None
    if "mean_e2e_latency_ms" in rec:
        return "sglang.bench_serving"
    if "mean_e2el_ms" in rec or "model_id" in rec:
        return "vllm bench serve"
    return None


def _level(rec: dict[str, Any], source: str) -> MeasuredLevel:
    completed = int(rec.get("completed") or 0)
    isl = _mean_tokens(rec, "total_input_tokens", "input_lens", "random_input_len", completed)
    osl = _mean_tokens(rec, "total_output_tokens", "output_lens", "random_output_len", completed)
    if isl < 1 or osl < 1:
        raise SpecError(f"{source}: the record gives no input or output token counts")
    rate = rec.get("request_rate")
    rate = (
        None if rate in (None, "inf", float("inf")) or (isinstance(rate, float) and math.isinf(rate)) else float(rate)
    )
    concurrency = rec.get("max_concurrency")
    return MeasuredLevel(
        source=source,
        tool=_tool(rec) or "unknown",
        isl=isl,
        osl=osl,
        concurrency=int(concurrency) if concurrency else None,
        request_rate=rate,
        num_prompts=int(rec.get("num_prompts") or completed),
        output_tok_s=float(rec["output_throughput"]),
        tpot_ms=_number(rec.get("mean_tpot_ms")),
        ttft_ms=_number(rec.get("mean_ttft_ms")),
        model=rec.get("model") or rec.get("model_id"),
        command=rec.get("command"),
        gpus=rec.get("gpus"),
    )


def _mean_tokens(rec: dict[str, Any], total: str, per_request: str, configured: str, completed: int) -> int:
    if rec.get(total) and completed:
        return round(rec[total] / completed)
    if isinstance(rec.get(per_request), list) and rec[per_request]:
        return round(sum(rec[per_request]) / len(rec[per_request]))
    return int(rec.get(configured) or 0)


def _number(value: Any) -> float | None:
    return None if value is None else float(value)
