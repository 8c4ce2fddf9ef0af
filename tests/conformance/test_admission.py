"""SGLang's admission of requests that run to their length, asked of the engine's own scheduler code.

With the prefix cache off (--disable-radix-cache), SGLang admits a request that ignores EOS through
PrefillAdder.add_one_req_ignore_eos: its prompt (and, from 0.5.21, one page) must fit beside every running
request's whole remaining output (from 0.5.22), and the pool must then hold it and every running request to their
full lengths as they end, in an order the scheduler keeps through the prefill batch. shardwise's simulation decides
the same (SchedulerPolicy.admits_to_length, holds_whole_output, admission_page_tokens).
conformance/sglang_admission.py builds the engine's PrefillAdder over a pool reduced to its free tokens and asks it
about one to three waiting requests in turn, as one prefill pass does; the simulation is asked the same of the same
state.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from emitted import oracle_python

from shardwise.cost.memory import memory_ledger
from shardwise.engines.check import check_command
from shardwise.serve.requests import draw
from shardwise.serve.simulate import Simulation, _Run
from shardwise.serve.steps import StepTimes
from shardwise.spec.cluster import load_cluster
from shardwise.spec.workload import Lengths, WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --disable-radix-cache"


def _cases(n: int) -> list[dict]:
    """States drawn across the boundary: a few running requests part way through their output, a candidate, and a
    pool with about as much free as they need (seeded: the same cases every run)."""
    rng = random.Random(0)
    cases = []
    for _ in range(n):
        running = []
        for _ in range(rng.randint(0, 5)):
            max_new = rng.randint(8, 400)
            running.append({"prompt": rng.randint(1, 300), "output": rng.randint(0, max_new - 1), "max_new": max_new})
        candidates = [{"prompt": rng.randint(1, 300), "max_new": rng.randint(1, 400)} for _ in range(rng.randint(1, 3))]
        need = sum(r["max_new"] - r["output"] for r in running) + sum(c["prompt"] + c["max_new"] for c in candidates)
        cases.append(
            {
                "free_tokens": rng.randint(need // 4, need),
                "new_token_ratio": rng.choice([0.098, 0.4, 0.7]),
                "prefix_cache": False,
                "running": running,
                "candidates": candidates,
            }
        )
    # at the edge, alone: the walk needs its prompt, its page (from 0.5.21) and its 5 tokens left, one to spare
    for free in (17, 18):  # 10 + 1 + 5 + 1 is not below 17; it is below 18
        cases.append({"free_tokens": free, "new_token_ratio": 0.7, "prefix_cache": False, "running": [],
                      "candidates": [{"prompt": 10, "max_new": 5}]})  # fmt: skip
    return cases


def _shardwise_admits(run: _Run, case: dict) -> list[bool]:
    """The simulation's decisions on the case's state: the running requests first, then the waiting ones, asked in
    order through one prefill batch (each admitted one's prompt allocated, as _prefill_batch allocates it)."""
    waiting = [{**c, "output": 0} for c in case["candidates"]]
    reqs = [*case["running"], *waiting]
    run.isl = np.array([r["prompt"] for r in reqs])
    run.osl = np.array([float(r["max_new"]) for r in reqs])
    run.gen = np.array([float(r["output"]) for r in reqs])
    run.need = run.isl.astype(float)
    run.done_prefill = np.array([float(r["prompt"]) for r in case["running"]] + [0.0] * len(waiting))
    run.ratio = case["new_token_ratio"]
    rank = run.ranks[0]
    rank.running = list(range(len(case["running"])))
    rank.held = float(sum(r["prompt"] + r["output"] for r in case["running"]))
    rank.chunked = None
    run.sim.pool = int(rank.held) + case["free_tokens"]
    run.sim.slots = 1 << 30
    fresh: list[int] = []
    walk: list[int] = []
    admitted = []
    for i in range(len(case["running"]), len(reqs)):
        if not run._admissible(rank, i, fresh, walk):
            break
        admitted.append(True)
        rank.held += run.isl[i]
        run.done_prefill[i] = run.isl[i]
        rank.running.append(i)
        fresh.append(i)
    return admitted + [False] * (len(waiting) - len(admitted))


def test_admission_of_requests_that_run_to_their_length_is_the_engines():
    python = oracle_python("sglang", "0.5.23")
    if not python.exists():
        if os.environ.get("SHARDWISE_REQUIRE_ORACLES"):
            pytest.fail("the sglang 0.5.23 oracle is not installed: run conformance/setup-sglang.sh")
        pytest.skip("no sglang 0.5.23 oracle here (conformance/setup-sglang.sh)")
    cases = _cases(300)
    done = subprocess.run(
        [str(python), str(ROOT / "conformance" / "sglang_admission.py")],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answers = [a["admitted"] for a in json.loads(done.stdout)]
    engine = [first for first, *_ in answers]
    cluster = load_cluster("1xh100")
    checked = check_command(COMMAND, cluster=cluster, version="0.5.23")
    layout = checked.setup.layout
    policy = layout.options.scheduler
    assert policy.admits_to_length and policy.holds_whole_output and policy.admission_page_tokens == 1
    memory = memory_ledger(checked.model, layout, cluster)
    workload = WorkloadSpec(input=Lengths.fixed(1), output=Lengths.fixed(1), num_requests=1, offline=True)
    run = _Run(Simulation(StepTimes(checked.model, layout, cluster), memory), draw(workload), None, None, offline=True)
    ours = [_shardwise_admits(run, case) for case in cases]
    assert 0.2 < sum(engine) / len(engine) < 0.8  # the cases straddle the boundary: the test can tell the rules apart
    assert engine[-2:] == [False, True]  # the page is charged
    later = [a[1:] for a in answers if len(a) > 1 and a[0]]  # requests asked after one the same batch admitted
    assert sum(map(any, later)) > 10 and sum(not all(a) for a in later) > 10  # admitted and refused, both
    differ = [(case, e) for case, e, o in zip(cases, answers, ours, strict=True) if e != o]
    assert not differ, f"{len(differ)} of {len(cases)} decided otherwise, first: {differ[0]}"
