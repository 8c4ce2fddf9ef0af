"""Speed of the spec layer: read every bundled config, build its weight ledger, cost a grid of collectives.

Run: python benchmarks/bench_spec.py   (prints wall time per step; not a test)
"""

from __future__ import annotations

import time

from shardwise import Collective, catalog, collective_cost, load_cluster, load_model, weight_ledger


def timed(label: str, repeat: int, func) -> None:
    start = time.perf_counter()
    for _ in range(repeat):
        func()
    per_call_ms = (time.perf_counter() - start) / repeat * 1e3
    print(f"{label:<48} {per_call_ms:8.2f} ms per run")


def all_ledgers() -> None:
    for alias in catalog():
        weight_ledger(load_model(alias))


def collective_grid() -> None:
    cluster = load_cluster("8xrtx-pro-6000")
    for op in Collective:
        for n in (2, 4, 8):
            for size in (2**k for k in range(9, 30)):
                collective_cost(cluster, op, size_bytes=size, gpus=n)


if __name__ == "__main__":
    timed("load + ledger of kimi-k2.6", 20, lambda: weight_ledger(load_model("kimi-k2.6")))
    timed(f"load + ledger of all {len(catalog())} bundled models", 3, all_ledgers)
    timed("collectives: 5 ops x 3 groups x 21 sizes", 10, collective_grid)
