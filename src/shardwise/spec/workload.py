"""What the clients send: request lengths and how requests arrive (a WorkloadSpec is pure description;
serve/requests.py draws the requests from it).

Lengths are whole tokens: fixed, uniform over [low, high] (the benchmark tools' `random` datasets), or drawn
from a list of (input, output) pairs (a user's JSONL file, or a bundled length set). Arrivals are a closed
loop of `concurrency` clients (`--max-concurrency`: each client sends its next request when the last one
ends) and/or an open loop at `request_rate` requests per second with gamma-distributed gaps (`burstiness`
1 is Poisson; both tools call the shape parameter that). Rate `inf` sends everything at once.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

import yaml
from pydantic import Field, model_validator

from shardwise.errors import SpecError
from shardwise.frozen import Frozen


class Lengths(Frozen):
    """Token counts of one side of a request: uniform whole numbers in [low, high] (fixed when equal)."""

    low: int = Field(ge=1)
    high: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Lengths:
        if self.high < self.low:
            raise ValueError(f"length range {self.low}..{self.high} is empty")
        return self

    @classmethod
    def fixed(cls, tokens: int) -> Lengths:
        return cls(low=tokens, high=tokens)

    @classmethod
    def sglang_random(cls, tokens: int, range_ratio: float) -> Lengths:
        """sglang.bench_serving --dataset-name random: uniform over [max(int(len × ratio), 1), len]."""
        return cls(low=max(int(tokens * range_ratio), 1), high=tokens)

    @classmethod
    def vllm_random(cls, tokens: int, range_ratio: float) -> Lengths:
        """vllm bench serve --dataset-name random: uniform over [floor(len × (1 − r)), ceil(len × (1 + r))]."""
        return cls(low=max(math.floor(tokens * (1 - range_ratio)), 1), high=math.ceil(tokens * (1 + range_ratio)))

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2


class WorkloadSpec(Frozen):
    """Requests to serve and how they arrive."""

    input: Lengths = Field(description="prompt tokens per request")
    output: Lengths = Field(description="output tokens per request (the engine is told to produce exactly these)")
    pairs: tuple[tuple[int, int], ...] = Field(
        (), description="(input, output) token pairs to draw from instead of the ranges, in order, cycling"
    )
    num_requests: int = Field(ge=1)
    concurrency: int | None = Field(None, ge=1, description="clients in a closed loop; None = no cap")
    request_rate: float = Field(math.inf, gt=0, description="requests per second sent; inf = all at once")
    burstiness: float = Field(1.0, gt=0, description="gamma shape of the gaps between requests; 1 = Poisson")
    seed: int = 0

    @model_validator(mode="after")
    def _bounded(self) -> WorkloadSpec:
        if self.concurrency is None and math.isinf(self.request_rate):
            raise ValueError("give a concurrency (closed loop) or a finite request rate (open loop), or both")
        return self


def read_pairs(path: Path) -> tuple[tuple[int, int], ...]:
    """(input, output) token counts from a JSONL file, one object per line with `input_tokens` and
    `output_tokens`; every way it can be wrong is one SpecError line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read lengths file {path}: {exc}") from exc
    pairs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            pair = int(row["input_tokens"]), int(row["output_tokens"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise SpecError(
                f"{path} line {number}: expected a JSON object with whole-number input_tokens and output_tokens, "
                f'e.g. {{"input_tokens": 812, "output_tokens": 240}}'
            ) from None
        if min(pair) < 1:
            raise SpecError(f"{path} line {number}: token counts must be at least 1, got {pair}")
        pairs.append(pair)
    if not pairs:
        raise SpecError(f"{path} holds no requests; expected one JSON object per line")
    return tuple(pairs)


def bundled_lengths(name: str) -> tuple[Lengths, Lengths, str]:
    """A bundled length set by name: (input lengths, output lengths, source)."""
    path = Path(str(resources.files("shardwise") / "data" / "workloads" / "lengths.yaml"))
    sets = yaml.safe_load(path.read_text())
    if name not in sets:
        raise SpecError(f"unknown length set {name!r}; bundled: {', '.join(sets)}, or a JSONL file of lengths")
    entry = sets[name]
    return Lengths(**entry["input"]), Lengths(**entry["output"]), entry["source"]
