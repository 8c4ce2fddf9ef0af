"""Speed of the serving simulation: 10,000 requests of 1024 in / 1024 out on the user's EP8 setup.

Run: python benchmarks/bench_simulate.py   (prints wall time per load, start-up of the step-time cache
included; the target is under 5 s per load on one core; not a test)
"""

from __future__ import annotations

import math
import time

from shardwise.cost.memory import memory_ledger
from shardwise.engines.check import check_command
from shardwise.serve.simulate import simulate
from shardwise.serve.steps import StepTimes
from shardwise.spec.cluster import load_cluster
from shardwise.spec.workload import Lengths, WorkloadSpec

COMMAND = "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp 8 --ep 8 --mem-fraction-static 0.85"
LOADS = [(1, math.inf), (64, math.inf), (None, 0.5), (None, 20.0), (512, math.inf)]  # (clients, requests/s)


def main() -> None:
    cluster = load_cluster("8xrtx-pro-6000")
    checked = check_command(COMMAND, cluster=cluster)
    memory = memory_ledger(checked.model, checked.setup.layout, cluster)
    for clients, rate in LOADS:
        workload = WorkloadSpec(
            input=Lengths.fixed(1024), output=Lengths.fixed(1024), num_requests=10_000, concurrency=clients,
            request_rate=rate,
        )  # fmt: skip
        start = time.perf_counter()
        steps = StepTimes(checked.model, checked.setup.layout, cluster)  # a fresh cache: its pricing counts
        result = simulate(steps, memory, workload)
        elapsed = time.perf_counter() - start
        load = f"{clients} clients" if clients else f"{rate:g} req/s"
        print(
            f"{load:>12}: {elapsed:5.2f} s for {result.requests} requests, {result.steps:,} engine steps "
            f"({result.output_tok_s:,.0f} tok/s, TTFT p99 {result.ttft_s.p99:,.1f} s)"
        )


if __name__ == "__main__":
    main()
