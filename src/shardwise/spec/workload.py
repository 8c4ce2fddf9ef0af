"""What the clients send: request lengths and how requests arrive (a WorkloadSpec is pure description;
serve/requests.py draws the requests from it).

Lengths are whole tokens: fixed, uniform over [low, high] (the benchmark tools' `random` datasets), or drawn
from a list of (input, output) pairs (a user's JSONL file, or a bundled dataset such as ShareGPT, sampled and
filtered as the tools sample it). Arrivals are a closed
loop of `concurrency` clients (`--max-concurrency`: each client sends its next request when the last one
ends) and/or an open loop at `request_rate` requests per second with gamma-distributed gaps (`burstiness`
1 is Poisson; both tools call the shape parameter that). Rate `inf` sends everything at once: with no
concurrency cap that is a burst of all the requests (the tools' default `--request-rate inf`). A decode-only
workload has every prompt in the KV cache already (decode benchmarks that time only the decode steps): its
requests hold their prompt's KV from the start and run no prefill. A cold start delays the engine's first step:
a server that has served nothing since it started compiles and tunes kernels on first use, and a benchmark without
warm-up requests times that wait.
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources
from pathlib import Path

import numpy as np
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
    decode_only: bool = Field(
        False, description="every prompt is already in the KV cache (a decode benchmark): no prefill is run or timed"
    )
    offline: bool = Field(
        False, description="handed to the engine in-process (bench_one_batch): no server front end before the scheduler"
    )
    cold_start_s: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds the engine spends on its first request before it steps (first-use compilation, tuning)",
    )

    @property
    def mean_lengths(self) -> tuple[float, float]:
        """Mean (input, output) tokens per request: of the pairs where given, else of the ranges."""
        if self.pairs:
            return (sum(i for i, _ in self.pairs) / len(self.pairs), sum(o for _, o in self.pairs) / len(self.pairs))
        return self.input.mean, self.output.mean


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


class LengthFilter(Frozen):
    """Which (input, output) pairs a benchmark tool keeps from a dataset."""

    min_input: int = 1
    min_output: int = 1
    max_input: int | None = None
    max_total: int | None = None

    def keeps(self, inputs: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        kept = (inputs >= self.min_input) & (outputs >= self.min_output)
        if self.max_input is not None:
            kept &= inputs <= self.max_input
        if self.max_total is not None:
            kept &= inputs + outputs <= self.max_total
        return kept


class Dataset(Frozen):
    """A bundled set of per-request token counts (data/workloads/lengths.yaml)."""

    name: str
    file: str
    filter: LengthFilter
    source: str

    @functools.cached_property
    def table(self) -> np.ndarray:
        """[N, 2] (input, output) token counts of every record, in the file's order, unfiltered."""
        path = _workloads_dir() / self.file
        return np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)

    @property
    def kept(self) -> np.ndarray:
        table = self.table
        return table[self.filter.keeps(table[:, 0], table[:, 1])]

    def sample(self, n: int, seed: int) -> tuple[tuple[int, int], ...]:
        """n requests as the benchmark tools draw them: the records shuffled with the seed, kept in that order
        while they pass the filter; when fewer pass than asked for, the kept ones repeat in order."""
        table = self.table
        order = np.random.default_rng(seed).permutation(len(table))
        shuffled = table[order]
        kept = shuffled[self.filter.keeps(shuffled[:, 0], shuffled[:, 1])]
        picked = kept[np.arange(n) % len(kept)]
        return tuple((int(i), int(o)) for i, o in picked)

    @property
    def means(self) -> tuple[float, float]:
        kept = self.kept
        return float(kept[:, 0].mean()), float(kept[:, 1].mean())


def _workloads_dir() -> Path:
    return Path(str(resources.files("shardwise") / "data" / "workloads"))


@functools.cache
def dataset(name: str) -> Dataset:
    """A bundled length dataset by name."""
    sets = yaml.safe_load((_workloads_dir() / "lengths.yaml").read_text())
    if name not in sets:
        raise SpecError(f"unknown length set {name!r}; bundled: {', '.join(sets)}, or a JSONL file of lengths")
    return Dataset(name=name, **sets[name])
