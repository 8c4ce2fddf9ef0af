#!/usr/bin/env python3
"""Ask SGLang's own scheduler whether it admits a request that runs to its length, on a CPU-only box.

Run with the venv made by conformance/setup-sglang.sh:

    .engines/sglang-0.5.23/bin/python conformance/sglang_admission.py < cases.json > answers.json

Input: a JSON list of cases, each
    {"free_tokens": 200, "new_token_ratio": 0.098, "prefix_cache": false,
     "running": [{"prompt": 20, "output": 10, "max_new": 110}, ...],
     "candidates": [{"prompt": 10, "max_new": 20}, ...]}
(`free_tokens`: the KV pool's free tokens, the running requests' prompts and outputs already taken out; every
request ignores EOS, as the benchmarks' requests do).

Output: a JSON list of {"admitted": [bool, ...], "results": ["<AddReqResult name>", ...]}, one per case: for each
waiting request in order, whether it is in the batch the pass forms (the pass stops at the first result that is
not CONTINUE, as the scheduler's does; a request added that spends the budget returns NO_TOKEN too), from
managers/schedule_policy.py PrefillAdder, built as the scheduler builds it for one prefill pass, over a KV-pool
allocator and a prefix cache reduced to what admission reads of them (the free tokens; nothing evictable; the
cache disabled or not). With the prefix cache off, the scheduler sends such a request to add_one_req_ignore_eos;
that is the method asked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import sglang_oracle

    fake_gpu, install_import_stubs = sglang_oracle.fake_gpu, sglang_oracle.install_import_stubs
    install_import_stubs()  # the packages a real install has but a CPU box cannot load, as the launch oracle does
    fake_gpu({"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "count": 1, "capability": [9, 0]})
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.mem_cache.prefill_budget import PrefillBudget

    class Allocator:
        """What PrefillAdder reads of the token-to-KV pool allocator: its page size and its free tokens."""

        page_size = 1

        def __init__(self, free: int) -> None:
            self.free = free

        def available_size(self) -> int:
            return self.free

        def create_prefill_budget(self, tree_cache, *, num_mixed_decode_tokens=0):
            return PrefillBudget(self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)

        def request_slot_reserve(self, *, has_req_pool_slot, prefill_tokens=0) -> int:
            return 0

    class Cache:
        """A prefix cache that holds nothing evictable (the benchmarks' prompts share nothing)."""

        def __init__(self, disable: bool) -> None:
            self.disable = disable

        def evictable_size(self) -> int:
            return 0

        def full_evictable_size(self) -> int:
            return 0

        def supports_mamba(self) -> bool:
            return False

        def supports_prefix_sharing(self) -> bool:
            return not self.disable

    def request(prompt: int, output: int, max_new: int) -> SimpleNamespace:
        return SimpleNamespace(
            sampling_params=SimpleNamespace(max_new_tokens=max_new, ignore_eos=True),
            origin_input_ids=[0] * prompt,
            output_ids=[0] * output,
            full_untruncated_fill_ids=[0] * (prompt + output),
            fill_ids=[0] * (prompt + output),
            prefix_len=0,
            extend_input_len=prompt + output,
            extend_len=prompt + output,
            retracted_stain=False,
            kv=SimpleNamespace(req_pool_idx=None),
        )

    answers = []
    for case in json.load(sys.stdin):
        running = [request(r["prompt"], r["output"], r["max_new"]) for r in case["running"]]
        adder = PrefillAdder(
            page_size=1,
            tree_cache=Cache(disable=not case["prefix_cache"]),
            token_to_kv_pool_allocator=Allocator(case["free_tokens"]),
            running_batch=SimpleNamespace(reqs=running, batch_size=len(running).__int__),
            new_token_ratio=case["new_token_ratio"],
            rem_input_tokens=1 << 30,
            rem_chunk_tokens=None,
        )
        admitted, results = [], []
        for waiting in case["candidates"]:  # the queue in order, as the scheduler's pass asks it
            candidate = request(waiting["prompt"], 0, waiting["max_new"])
            result = adder.add_one_req_ignore_eos(candidate)
            # admitted: in the batch the pass forms (a request added that spends the budget returns NO_TOKEN too)
            admitted.append(any(r is candidate for r in adder.can_run_list))
            results.append(result.name)
            if result.name != "CONTINUE":  # the pass stops here (scheduler.py _get_new_batch_prefill_raw)
                break
        admitted += [False] * (len(case["candidates"]) - len(admitted))
        answers.append({"admitted": admitted, "results": results})
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
