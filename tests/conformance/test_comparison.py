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


def _answer(*, refusal=None, crash=None, resolved=None, kv_pool=None, built=False) -> dict:
    return {"ok": refusal is None and crash is None, "refusal": refusal, "crash": crash, "resolved": resolved,
            "kv_pool": kv_pool, "built": built}  # fmt: skip


def _resolved(e: Emitted) -> dict:
    """What the engine resolves when it agrees with shardwise on every size compared."""
    setup = shardwise_check(e, BOX).setup
    f = setup.flags
    return {"mem_fraction_static": f["mem_fraction_static"], "chunked_prefill_size": f["chunked_prefill_size"],
            "max_prefill_tokens": f["max_prefill_tokens"],
            "cuda_graph_max_bs": f["cuda_graph_max_bs"], "max_running_requests": f.get("max_running_requests"),
            "ep_size": f["ep_size"], "attn_dp_size": f["attn_dp_size"], "dp_size": f["dp_size"],
            "page_size": f["page_size"], "enable_dp_lm_head": bool(f.get("enable_dp_lm_head")),
            "disable_overlap_schedule": not setup.layout.options.overlap_schedule,
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


@pytest.mark.parametrize("off_by, slots_off_by, agree", [(0, 0, True), (1, 0, False), (-500, 0, False),
                                                          (0, 1, False)])  # fmt: skip
def test_the_kv_pool_agrees_to_the_token(off_by, slots_off_by, agree):
    """The engines' rounding (pages, SGLang's float32 free memory, vLLM's granules and null block) is modelled, so
    the pool and SGLang's request slots sized from it must agree exactly."""
    e = _emitted("--tp-size 8 --mem-fraction-static 0.9")
    checked = shardwise_check(e, BOX)
    ledger = memory_ledger(checked.model, checked.setup.layout, BOX)
    pool = {"tokens_per_rank": ledger.kv_tokens_per_rank + off_by,
            "max_running_requests": ledger.max_running_requests_per_rank + slots_off_by}  # fmt: skip
    problems = disagreements([(e, BOX)], [_answer(resolved=_resolved(e), kv_pool=pool)])
    assert (problems == []) is agree, problems


def test_a_model_the_engine_builds_where_shardwise_says_it_fails_to_is_a_disagreement():
    """Where vLLM's oracle built the model on every stage, a load-stage refusal of shardwise's that it does not meet
    is a disagreement (gpt-oss at tp 16: 0 KV heads per rank); where it did not build it, nothing is said."""
    tokens = tuple("vllm serve openai/gpt-oss-120b -tp 16 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1".split())
    e = Emitted("vllm", "0.33.0", tokens, _argv("vllm", list(tokens), MODELS / "gpt-oss-120b"))
    box = load_cluster("2x8xh100")
    assert shardwise_check(e, box).setup.rejections[0].rule == "kv_heads_per_rank"
    built = disagreements([(e, box)], [_answer(resolved={}, built=True)])
    assert built and built[0].startswith("shardwise refuses at load (kv_heads_per_rank), the engine builds the model")
    assert disagreements([(e, box)], [_answer(resolved={})]) == []
    refused = {"stage": "load", "type": "ZeroDivisionError", "message": "integer modulo by zero"}
    assert disagreements([(e, box)], [_answer(refusal=refused)]) == []


def test_no_kv_room_on_one_side_only_is_a_disagreement():
    roomy = _emitted("--tp-size 8 --mem-fraction-static 0.9")
    refused = _answer(refusal={"stage": "kv_pool", "type": "ValueError", "message": "Loaded weights leave no GPU "
                               "memory for the KV cache"}, resolved=_resolved(roomy))  # fmt: skip
    assert disagreements([(roomy, BOX)], [refused])[0].startswith("kv pool: the engine finds no room")
    tight = _emitted("--tp-size 8")  # SGLang's default fraction for this checkpoint leaves no room
    checked = shardwise_check(tight, BOX)
    assert memory_ledger(checked.model, checked.setup.layout, BOX).verdict == "no_kv_room"
    sized = _answer(resolved=_resolved(tight), kv_pool={"tokens_per_rank": 1000, "max_running_requests": 2048})
    assert disagreements([(tight, BOX)], [sized])[0].startswith("kv pool: shardwise finds no room")
