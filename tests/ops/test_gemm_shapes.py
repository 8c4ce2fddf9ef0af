"""The GEMMs each projection runs, as the measured tables key them: fused where the engines fuse, split along
the axis tensor parallelism splits."""

import pytest

from shardwise.engines.check import check_command
from shardwise.hardware.kernel_tables import GemmShape
from shardwise.ops.build import StepModel
from shardwise.ops.types import Compute, Phase
from shardwise.spec.cluster import load_cluster


def _ops(command: str, gpus: str, phase: Phase) -> dict[str, Compute]:
    cluster = load_cluster(gpus)
    checked = check_command(command, cluster=cluster)
    model = StepModel(checked.model, checked.setup.layout, cluster)
    ops = model.ops(phase=phase, requests=16, new_tokens=1 if phase is Phase.DECODE else 512, context_tokens=0)
    return {op.name: op for op in ops if isinstance(op, Compute) and op.stage == 0}


def test_qwen3_235b_at_tp8_runs_q_k_v_as_one_gemm_and_o_split_along_its_input():
    """64 query heads of 128 over 8 GPUs: 1,024 q rows each; 4 KV heads replicate past 4 ways: 128 k and 128 v
    rows each; one QKV GEMM of 1,280 rows over the hidden 4,096. o_proj keeps its 4,096 outputs and takes 1,024
    of the 8,192 inputs."""
    ops = _ops("vllm serve Qwen/Qwen3-235B-A22B -tp 8", "8xh100", Phase.DECODE)
    assert ops["attn.q"].gemms == (GemmShape(weight_format="bf16", n=1280, k=4096, share=pytest.approx(0.8)),)
    assert ops["attn.k"].gemms == (GemmShape(weight_format="bf16", n=1280, k=4096, share=pytest.approx(0.1)),)
    assert ops["attn.v"].gemms == ops["attn.k"].gemms
    assert ops["attn.o"].gemms == (GemmShape(weight_format="bf16", n=4096, k=1024),)
    assert ops["attn.q"].tokens == 16
    assert ops["lm_head"].gemms == (GemmShape(weight_format="bf16", n=151936 // 8, k=4096),)  # vocab-parallel


def test_mla_kv_b_is_a_gemm_in_prefill_and_absorbed_in_decode():
    command = "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8"
    decode, prefill = _ops(command, "8xh200", Phase.DECODE), _ops(command, "8xh200", Phase.PREFILL)
    assert decode["attn.kv_b"].gemms == ()
    # 128 heads × (128 nope + 128 v) over 8 GPUs, from the 512-wide latent; block-FP8 weights
    assert prefill["attn.kv_b"].gemms == (GemmShape(weight_format="fp8-block", n=4096, k=512),)
    # q_a (1,536) and kv_a (576) are one replicated down-projection of the hidden 7,168
    assert decode["attn.q_a"].gemms == (GemmShape(weight_format="fp8-block", n=2112, k=7168,
                                                  share=pytest.approx(1536 / 2112)),)  # fmt: skip


def test_an_mlps_activation_is_the_one_kernel_no_gemm_table_times():
    """Dense MLP and shared experts run gate-up, an activation, down: the activation is charged apart; a
    projection or a router is one GEMM, wholly timed."""
    ops = _ops("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8", "8xh200", Phase.DECODE)
    assert ops["dense_mlp"].untimed_kernels == 1 and ops["shared_experts"].untimed_kernels == 1
    assert ops["attn.o"].untimed_kernels == 0 and ops["router"].untimed_kernels == 0
