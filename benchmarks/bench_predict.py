"""Speed of the performance model: every SGLang layout of Kimi K2.6 on 8× RTX PRO 6000, at ten concurrencies.

Run: python benchmarks/bench_predict.py   (prints time per layout; the target is under 10 ms; not a test)
"""

from __future__ import annotations

import statistics
import time

from shardwise.cost.memory import memory_ledger
from shardwise.engines.check import layouts
from shardwise.serve.steady import Predictor
from shardwise.serve.steps import StepTimes
from shardwise.spec.catalog import load_model
from shardwise.spec.cluster import load_cluster

CLIENTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def main() -> None:
    cluster = load_cluster("8xrtx-pro-6000")
    model = load_model("kimi-k2.6")
    timings = []
    for setup in layouts("kimi-k2.6", cluster, engine="sglang"):
        if setup.layout is None:
            continue
        memory = memory_ledger(model, setup.layout, cluster)
        if memory.max_concurrency(isl=1024, osl=1024) < 1:
            continue
        start = time.perf_counter()
        predictions = Predictor(StepTimes(model, setup.layout, cluster), memory).sweep(CLIENTS, isl=1024, osl=1024)
        elapsed_ms = (time.perf_counter() - start) * 1e3
        timings.append(elapsed_ms)
        best = max(p.output_tok_s for p in predictions)
        print(f"{setup.layout.describe():<32} {elapsed_ms:7.2f} ms   peak {best:8.0f} tok/s")
    print(
        f"{len(timings)} layouts × {len(CLIENTS)} concurrencies: median {statistics.median(timings):.2f} ms, "
        f"max {max(timings):.2f} ms per layout"
    )


if __name__ == "__main__":
    main()
