"""The collectives of a forward step: which run, over which group, and their bytes, against hand counts."""

import pytest

from shardwise import Collective, load_model
from shardwise.engines.check import check_command
from shardwise.engines.layout import Layout
from shardwise.ops.build import StepModel
from shardwise.ops.collectives import comm_steps
from shardwise.ops.types import Comm, Phase
from shardwise.spec.cluster import load_cluster

KIMI_DCP4 = ("python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp-size 8 --dcp-size 4 "
             "--attention-backend flashinfer --kv-cache-dtype fp8_e4m3 --mem-fraction-static 0.85")  # fmt: skip


def sglang(**kw) -> Layout:
    tp = kw.pop("stage_gpus", 8)
    fields = {"dense_tp": tp, "shared_tp": tp, "lm_head_tp": tp, **kw}
    return Layout(engine="sglang", version="0.5.23", stage_gpus=tp, **fields)


def test_tp8_kimi_has_122_all_reduces_per_step():
    # the reference count: about two all-reduces per layer over 61 layers (attention + MLP)
    steps = comm_steps(sglang(), load_model("kimi-k2.6"))
    per_layer = [s for s in steps if s.op is Collective.ALL_REDUCE and s.per != "step"]
    counts = {"layer": 61, "moe_layer": 60, "dense_layer": 1}
    assert sum(counts[s.per] for s in per_layer) == 122
    assert all(s.bytes_per_token == 7168 * 2 for s in per_layer)


def test_attention_dp_gathers_instead_of_all_reducing():
    steps = comm_steps(sglang(attn_dp=8, moe_ep=8), load_model("kimi-k2.6"))
    ops = {(s.op, s.per) for s in steps}
    assert (Collective.ALL_GATHER, "moe_layer") in ops and (Collective.REDUCE_SCATTER, "moe_layer") in ops
    assert not any(s.group == "attn_tp" for s in steps)  # attention TP 1: nothing to reduce


def test_a2a_dispatch_and_combine():
    lay = sglang(moe_ep=8, moe_comm="all2all", shared_tp=1)
    steps = comm_steps(lay, load_model("kimi-k2.6"))
    a2a = [s for s in steps if s.op is Collective.ALL_TO_ALL]
    assert [s.where for s in a2a] == ["MoE dispatch", "MoE combine"]
    assert a2a[0].bytes_per_token == 7168 * 2 * 8  # each token goes to its top-8 experts


def _dcp(steps):
    return {s.where: s for s in steps if s.where.startswith("DCP")}


def test_mla_dcp_gathers_queries_and_exchanges_partials():
    # Kimi K2.6: 64 heads over attention TP 8 → 8 per GPU, 32 once 4 DCP ranks gather them; the absorbed query is
    # latent 512 + RoPE 64 wide, the partial output 512 wide, in BF16, with an FP32 LSE per head packed beside it
    dcp = _dcp(comm_steps(sglang(dcp=4, dcp_comm="a2a"), load_model("kimi-k2.6")))
    q, out = dcp["DCP query gather"], dcp["DCP partial outputs and LSE exchange"]
    assert (q.op, q.group_size, q.per, q.phase) == (Collective.ALL_GATHER, 4, "attention_layer", "decode")
    assert q.bytes_per_token == 32 * 576 * 2 == 36_864
    assert out.op is Collective.ALL_TO_ALL and out.bytes_per_token == 32 * (512 * 2 + 4) == 32_896
    kv = dcp["DCP cached-prefix KV gather"]
    assert (kv.phase, kv.sized_by, kv.bytes_per_token) == ("prefill", "cached", 576 * 2)  # BF16 latent + RoPE key


def test_mla_dcp_all_gather_reduce_scatter_in_fp32():
    dcp = _dcp(comm_steps(sglang(dcp=4, dcp_comm="ag_rs", dcp_partial_bytes=4), load_model("kimi-k2.6")))
    assert dcp["DCP LSE gather"].bytes_per_token == 4 * 32 * 4  # every rank's LSE of its 32 heads
    assert dcp["DCP partial outputs reduce-scatter"].bytes_per_token == 32 * 512 * 4


def test_replicated_queries_skip_the_gather():
    dcp = _dcp(comm_steps(sglang(dcp=4, dcp_comm="a2a", dcp_q_replicate=True), load_model("kimi-k2.6")))
    assert "DCP query gather" not in dcp and "DCP partial outputs and LSE exchange" in dcp


def test_gqa_dcp_gathers_queries_in_every_phase():
    # Qwen3-235B: 64 query heads of 128 over TP 8, gathered over DCP 2 → 16 heads
    lay = Layout(engine="vllm", version="0.33.0", stage_gpus=8, dense_tp=8, shared_tp=8, lm_head_tp=8, dcp=2)
    dcp = _dcp(comm_steps(lay, load_model("qwen3-235b-a22b")))
    assert dcp["DCP query gather"].phase is None and dcp["DCP query gather"].bytes_per_token == 16 * 128 * 2
    assert dcp["DCP partial outputs reduce-scatter"].bytes_per_token == 16 * 128 * 2  # vLLM keeps the output dtype
    assert "DCP cached-prefix KV gather" not in dcp


def test_no_dcp_no_dcp_collectives():
    assert not _dcp(comm_steps(sglang(), load_model("kimi-k2.6")))


@pytest.fixture(scope="module")
def kimi_dcp4():
    cluster = load_cluster("8xrtx-pro-6000")
    checked = check_command(KIMI_DCP4, cluster=cluster)
    return checked, StepModel(checked.model, checked.setup.layout, cluster)


def test_engine_defaults_pick_the_combine(kimi_dcp4):
    checked, _ = kimi_dcp4
    lay = checked.setup.layout
    assert (lay.dcp, lay.dcp_comm, lay.dcp_partial_bytes) == (4, "a2a", 2)  # SGLang on CUDA: all-to-all
    cluster = load_cluster("8xh200")
    ag = check_command(KIMI_DCP4 + " --dcp-comm-backend ag_rs", cluster=cluster).setup.layout
    assert (ag.dcp_comm, ag.dcp_partial_bytes) == ("ag_rs", 4)
    vllm = check_command("vllm serve moonshotai/Kimi-K2.6 -tp 8 -dcp 4 --trust-remote-code", cluster=cluster)
    assert (vllm.setup.layout.dcp_comm, vllm.setup.layout.dcp_partial_bytes) == ("ag_rs", 2)


def test_decode_and_prefill_steps_carry_their_dcp_collectives(kimi_dcp4):
    _, step = kimi_dcp4

    def comms(phase, requests, new, context):
        ops = step.ops(phase=phase, requests=requests, new_tokens=new, context_tokens=context)
        return {op.name: op for op in ops if isinstance(op, Comm) and op.name.startswith("DCP")}

    decode = comms(Phase.DECODE, 64, 1, 2000)
    assert decode["DCP query gather"].size_bytes == 64 * 36_864 and decode["DCP query gather"].count == 61
    assert "DCP cached-prefix KV gather" not in decode
    prefill = comms(Phase.PREFILL, 2, 1024, 3000)
    assert set(prefill) == {"DCP cached-prefix KV gather"}
    assert prefill["DCP cached-prefix KV gather"].size_bytes == 2 * 3000 * 576  # the FP8 cache, 1 byte a value


@pytest.mark.parametrize(
    ("flags", "rule"),
    [("--dcp-size 4 --dcp-comm-backend ag_rs --dcp-replicate-q-proj", "dcp_replicate_q_needs_a2a"),
     ("--dcp-comm-backend a2a", "dcp_options_without_dcp"),
     ("--dcp-replicate-q-proj", "dcp_options_without_dcp")],
)  # fmt: skip
def test_sglang_refuses_dcp_options_it_cannot_use(flags, rule):
    command = "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp-size 8 " + flags
    checked = check_command(command, cluster=load_cluster("8xh200"))
    assert rule in [r.rule for r in checked.setup.rejections]


def _tbo(lay: Layout) -> Layout:
    return lay.model_copy(update={"options": lay.options.model_copy(update={"two_batch_overlap": True})})


@pytest.mark.parametrize("requests", [8 * 64, 8 * 65, 8])
def test_two_batch_overlap_runs_each_moe_layer_once_per_half(requests):
    """SGLang halves the requests (two_batch_overlap.py compute_split_seq_index: one request does not split) and
    runs each MoE layer once per half, its dense layers whole (deepseek_v2.py): each half reads the experts
    again and gathers its own tokens. Only an all-to-all's dispatch and combine hide behind the other half's
    compute (operations_strategy.py); attention DP's gathers of the all-reduce path do not (Kimi's layers)."""
    model, cluster = load_model("kimi-k2.6"), load_cluster("8xrtx-pro-6000")
    per_rank = requests // 8
    halves = 2 if per_rank >= 2 else 1
    half = -(-per_rank // halves)  # the larger half
    for plain in (sglang(attn_dp=8, moe_ep=8), sglang(attn_dp=8, moe_ep=8, moe_comm="all2all", shared_tp=1)):
        one, two = (
            StepModel(model, lay, cluster).ops(phase=Phase.DECODE, requests=requests, new_tokens=1, context_tokens=2048)
            for lay in (plain, _tbo(plain))
        )
        experts = [next(o for o in ops if o.name == "routed experts") for ops in (one, two)]
        assert experts[1].count == halves * experts[0].count == halves * 60
        assert experts[1].tokens == half * 8  # every DP rank's tokens of one half
        dense = [next(o for o in ops if o.name.startswith("dense_mlp")) for ops in (one, two)]
        assert dense[0] == dense[1]  # the dense layer runs whole
        moe_comms = [o for o in two if isinstance(o, Comm) and o.count == halves * 60]
        assert moe_comms
        for c in moe_comms:
            before = next(o for o in one if isinstance(o, Comm) and o.name == c.name)
            assert c.size_bytes == pytest.approx(before.size_bytes * half / per_rank)
            assert c.overlapped == (halves == 2 and c.collective is Collective.ALL_TO_ALL)
        assert any(c.collective is Collective.ALL_TO_ALL for c in moe_comms) == (plain.moe_comm == "all2all")


def test_vllm_dual_batch_overlap_splits_from_its_token_threshold():
    """vLLM microbatches a decode step from --dbo-decode-token-threshold tokens (default 32: ubatch_utils.py
    check_ubatch_thresholds), a given threshold too."""
    base = ("vllm serve deepseek-ai/DeepSeek-V3 -tp 8 --enable-expert-parallel --all2all-backend "
            "deepep_low_latency --enable-dbo")  # fmt: skip
    cluster = load_cluster("8xh200")
    for extra, threshold in (("", 32), (" --dbo-decode-token-threshold 8", 8)):
        checked = check_command(base + extra, cluster=cluster)
        assert checked.setup.valid, checked.setup.rejections
        model = StepModel(checked.model, checked.setup.layout, cluster)
        for requests, halves in ((threshold - 1, 1), (threshold, 2)):
            ops = model.ops(phase=Phase.DECODE, requests=requests, new_tokens=1, context_tokens=1024)
            experts = next(o for o in ops if o.name == "routed experts")
            assert experts.count == halves * 58, (extra, requests)  # DeepSeek-V3: 58 MoE layers
