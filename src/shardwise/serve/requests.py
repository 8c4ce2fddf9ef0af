"""Requests drawn from a workload: when each is sent (open loop) and its input and output tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardwise.spec.workload import WorkloadSpec


@dataclass(frozen=True)
class Requests:
    send_s: np.ndarray  # [N] earliest send time; a closed loop may send later, when a client is free
    input_tokens: np.ndarray  # [N] int
    output_tokens: np.ndarray  # [N] int

    def __len__(self) -> int:
        return len(self.input_tokens)


def draw(workload: WorkloadSpec) -> Requests:
    """The workload's requests, reproducibly from its seed (gaps as the benchmark tools draw them: the first
    request at 0, then gamma gaps of mean 1/rate)."""
    rng = np.random.default_rng(workload.seed)
    n = workload.num_requests
    if workload.pairs:
        pairs = np.asarray(workload.pairs, dtype=np.int64)[np.arange(n) % len(workload.pairs)]
        isl, osl = pairs[:, 0], pairs[:, 1]
    else:
        isl = rng.integers(workload.input.low, workload.input.high + 1, size=n)
        osl = rng.integers(workload.output.low, workload.output.high + 1, size=n)
    if math.isinf(workload.request_rate):
        send = np.zeros(n)
    else:
        shape = workload.burstiness
        gaps = rng.gamma(shape, 1.0 / (workload.request_rate * shape), size=n)
        send = np.concatenate(([0.0], np.cumsum(gaps[:-1])))
    return Requests(send_s=send, input_tokens=isl.astype(np.int64), output_tokens=osl.astype(np.int64))
