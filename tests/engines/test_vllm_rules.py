"""vLLM's flags and checks: EP = tp × dp, heads % tp, unknown flags reported."""

import pytest

from shardwise import load_cluster, load_model
from shardwise.engines.base import get_engine
from shardwise.engines.check import check_command

VLLM = get_engine("vllm")


def resolve(flags: str, *, model="kimi-k2.6", cluster="8xrtx-pro-6000", env=None):
    return VLLM.resolve(flags.split(), model=load_model(model), cluster=load_cluster(cluster), env=env)


def rules(setup):
    return [r.rule for r in setup.rejections]


@pytest.mark.parametrize(
    "flags, ep, moe_tp, attn_tp, attn_dp",
    [
        ("-tp 8 --enable-expert-parallel", 8, 1, 8, 1),
        ("-tp 2 -dp 4 -ep", 8, 1, 2, 4),
        ("-dp 8 -ep", 8, 1, 1, 8),
        ("-tp 4 -dp 2", 1, 8, 4, 2),  # no EP: experts tensor-sliced over tp × dp
        ("-tp 8", 1, 8, 8, 1),
    ],
)
def test_expert_parallel_is_tp_times_dp(flags, ep, moe_tp, attn_tp, attn_dp):
    layout = resolve(flags).layout
    assert (layout.moe_ep, layout.moe_tp, layout.attn_tp, layout.attn_dp) == (ep, moe_tp, attn_tp, attn_dp)
    assert layout.gpus_used == 8 and layout.replicas == 1


def test_dense_model_dp_ranks_are_replicas():
    layout = resolve("-tp 2 -dp 4", model="llama-3.1-70b").layout
    assert layout.replicas == 4 and layout.stage_gpus == 2 and layout.attn_dp == 1


def test_heads_divisible_by_tp():
    assert resolve("-tp 4").valid
    setup = resolve("-tp 3")
    assert "heads_divisible" in rules(setup)
    assert setup.rejections[0].engine_error == (
        "ValueError: Total number of attention heads (64) must be divisible by tensor parallel size (3)."
    )


def test_ep_is_a_switch_not_a_size():
    setup = resolve("moonshotai/Kimi-K2.6 -tp 8 -ep 8")  # the model is the positional; 8 is one too many
    assert rules(setup) == ["arguments"]
    assert "unrecognized arguments: 8" in setup.rejections[0].engine_error
    assert "switch, not a size" in setup.rejections[0].reason


def test_unknown_flag_is_reported_not_ignored():
    setup = resolve("-tp 8 --tensor-paralel-size 8")
    assert rules(setup) == ["arguments"] and "unrecognized arguments" in setup.rejections[0].engine_error
    assert resolve("-tp 8 --max-num-seqs 64 --disable-log-requests").valid  # real flags shardwise does not model


def test_underscored_flags_and_switch_negations():
    assert resolve("--tensor_parallel_size 8").layout.attn_tp == 8
    assert resolve("-tp 8 -ep --no-enable-expert-parallel").layout.moe_ep == 1


def test_ep_needs_experts():
    assert resolve("-tp 8 -ep", model="mixtral-8x7b").valid
    assert "ep_needs_moe" in rules(resolve("-tp 8 -ep", model="llama-3.1-70b"))


def test_kv_heads_and_gpu_count():
    assert resolve("-tp 8", model="llama-3.1-70b").valid
    assert "not_enough_gpus" in rules(resolve("-tp 8 -dp 2"))
    assert "not_enough_gpus" in rules(resolve("-tp 8", env={"CUDA_VISIBLE_DEVICES": "0,1"}))


def test_kv_heads_that_neither_split_nor_replicate(odd_kv_model):
    assert rules(resolve("-tp 6", model=odd_kv_model, cluster="6xh100")) == ["kv_heads_split"]
    assert resolve("-tp 4", model=odd_kv_model, cluster="4xh100").valid


def test_fp8_block_slices_without_ep():
    # DeepSeek-V3 FP8, MoE sliced over tp × dp = 32: 2048 / 32 = 64 is not a whole 128-wide block
    nodes = "--nnodes 4 --master-addr 10.0.0.1"
    bad = resolve(f"-tp 8 -dp 4 {nodes}", model="deepseek-v3", cluster="4x8xh200")
    assert "partition" in rules(bad) and "block_n = 128" in bad.rejections[0].engine_error
    assert resolve(f"-tp 8 -dp 4 -ep {nodes}", model="deepseek-v3", cluster="4x8xh200").valid


def test_eplb_rules():
    assert "eplb" in rules(resolve("-tp 8 --enable-eplb"))
    assert resolve("-tp 8 -ep --enable-eplb").valid
    uneven = resolve('-tp 8 -ep --enable-eplb --eplb-config {"num_redundant_experts":3}')
    assert "eplb_even" in rules(uneven)


def test_dcp_rules():
    assert resolve("-tp 8 -dcp 8").valid
    assert "dcp" in rules(resolve("-tp 8 -dcp 3"))
    # GQA: DCP needs tp above the KV head count (Llama-70B has 8 KV heads)
    assert "dcp" in rules(resolve("-tp 8 -dcp 2", model="llama-3.1-70b"))


def test_memory_utilization_bounds():
    assert resolve("-tp 8 --gpu-memory-utilization 0.95").flags["gpu_memory_utilization"] == 0.95
    assert "gpu_memory_utilization" in rules(resolve("-tp 8 --gpu-memory-utilization 1.5"))


def test_defaults_by_gpu_size():
    f = resolve("-tp 8").flags  # 96 GB: the 70-160 GiB tier
    assert f["max_num_seqs"] == 1024 and f["max_num_batched_tokens"] == 8192 and f["cuda_graph_max_bs"] == 512
    assert resolve("-tp 8", cluster="8xb200").flags["cuda_graph_max_bs"] == 1024  # data-center Blackwell
    a100 = resolve("-tp 8", model="llama-3.1-70b", cluster="8xa100").flags
    assert a100["max_num_seqs"] == 256
    assert not resolve("-tp 8 --enforce-eager").flags["cuda_graph"]


def test_model_found_from_the_command_and_the_api_server_launcher():
    box = load_cluster("8xrtx-pro-6000")
    checked = check_command(
        "python -m vllm.entrypoints.openai.api_server --model moonshotai/Kimi-K2.6 -tp 8", cluster=box
    )
    assert checked.model.name == "kimi-k2.6" and checked.setup.valid
    served = check_command("vllm serve Qwen/Qwen3-235B-A22B -tp 8 -ep", cluster=load_cluster("8xh200"))
    assert served.model.name == "qwen3-235b-a22b" and served.setup.layout.moe_ep == 8
