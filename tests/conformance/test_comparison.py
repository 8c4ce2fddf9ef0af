"""The conformance suite's comparisons fail where they should, without the engines installed: an answer the oracle
never gave is an error of the suite, a refusal for another reason or at another stage is a disagreement, and so is a
KV pool beyond the engine's rounding. Each answer here is shaped as the oracles write theirs."""

from __future__ import annotations

import pytest
from emitted import MODELS, Emitted, _argv, shardwise_check
from test_engine_conformance import crashes, disagreements, same_reason

from shardwise.cost.memory import memory_ledger
from shardwise.spec.cluster import load_cluster

BOX = load_cluster("8xrtx-pro-6000")
KIMI = "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6"


def _emitted(flags: str) -> Emitted:
    tokens = tuple(f"{KIMI} {flags} --trust-remote-code".split())
    return Emitted("sglang", "0.5.23", tokens, _argv("sglang", list(tokens), MODELS / "kimi-k2.6"))


def _answer(*, refusal=None, crash=None, resolved=None, kv_pool=None) -> dict:
    return {"ok": refusal is None and crash is None, "refusal": refusal, "crash": crash, "resolved": resolved,
            "kv_pool": kv_pool}  # fmt: skip


def _resolved(e: Emitted) -> dict:
    """What the engine resolves when it agrees with shardwise on every size compared."""
    setup = shardwise_check(e, BOX).setup
    f = setup.flags
    return {"mem_fraction_static": f["mem_fraction_static"], "chunked_prefill_size": f["chunked_prefill_size"],
            "cuda_graph_max_bs": f["cuda_graph_max_bs"], "max_running_requests": f.get("max_running_requests"),
            "ep_size": f["ep_size"], "attn_dp_size": f["attn_dp_size"], "dp_size": f["dp_size"],
            "page_size": f["page_size"], "enable_dp_lm_head": bool(f.get("enable_dp_lm_head")),
            "dcp_comm_backend": setup.layout.dcp_comm}  # fmt: skip


def test_a_crash_is_an_error_of_the_suite_not_a_refusal():
    e = _emitted("--tp-size 8")
    died = _answer(crash={"type": "WorkerDied", "message": "exit code 3", "where": "worker"})
    assert crashes([(e, died)]) == [f"worker: WorkerDied: exit code 3: {e.text}"]
    assert crashes([(e, _answer(resolved={}))]) == []


def test_a_refusal_is_compared_by_stage_and_reason():
    e = _emitted("--tp-size 2 --ep-size 4")  # shardwise: refused while resolving the arguments (publish)
    rejection = shardwise_check(e, BOX).setup.rejections[0]
    message = rejection.engine_error.partition(": ")[2]
    same = {"stage": "publish", "type": "ValueError", "message": message}
    assert same_reason(rejection, same) and disagreements([(e, BOX)], [_answer(refusal=same)]) == []
    other = {"stage": "publish", "type": "ValueError", "message": "tp_size 2 must be divisible by ep_size 4"}
    assert disagreements([(e, BOX)], [_answer(refusal=other)])[0].startswith("refusal reason")
    kind = {**same, "type": "AssertionError"}
    assert disagreements([(e, BOX)], [_answer(refusal=kind)])[0].startswith("refusal reason")
    accepted = _answer(resolved=_resolved(_emitted("--tp-size 8")))
    assert disagreements([(e, BOX)], [accepted])[0].startswith("shardwise refuses (moe_tp_zero)")


def test_a_command_shardwise_accepts_and_the_engine_refuses_is_a_disagreement():
    e = _emitted("--tp-size 8 --mem-fraction-static 0.9")
    refused = _answer(refusal={"stage": "check", "type": "ValueError", "message": "something shardwise missed"})
    assert disagreements([(e, BOX)], [refused])[0].startswith("engine refuses at arguments, shardwise nowhere")


@pytest.mark.parametrize("off_by, agree", [(0, True), (1, True), (2, False), (-500, False)])
def test_the_kv_pool_agrees_within_the_engines_rounding(off_by, agree):
    e = _emitted("--tp-size 8 --mem-fraction-static 0.9")
    checked = shardwise_check(e, BOX)
    tokens = memory_ledger(checked.model, checked.setup.layout, BOX).kv_tokens_per_rank  # page size 1
    answer = _answer(resolved=_resolved(e), kv_pool={"tokens_per_rank": tokens + off_by})
    problems = disagreements([(e, BOX)], [answer])
    assert (problems == []) is agree, problems


def test_no_kv_room_on_one_side_only_is_a_disagreement():
    roomy = _emitted("--tp-size 8 --mem-fraction-static 0.9")
    refused = _answer(refusal={"stage": "kv_pool", "type": "ValueError", "message": "Loaded weights leave no GPU "
                               "memory for the KV cache"}, resolved=_resolved(roomy))  # fmt: skip
    assert disagreements([(roomy, BOX)], [refused])[0].startswith("kv pool: the engine finds no room")
    tight = _emitted("--tp-size 8")  # SGLang's default fraction for this checkpoint leaves no room
    checked = shardwise_check(tight, BOX)
    assert memory_ledger(checked.model, checked.setup.layout, BOX).verdict == "no_kv_room"
    sized = _answer(resolved=_resolved(tight), kv_pool={"tokens_per_rank": 1000})
    assert disagreements([(tight, BOX)], [sized])[0].startswith("kv pool: shardwise finds no room")
