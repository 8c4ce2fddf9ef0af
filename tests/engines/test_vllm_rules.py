"""vLLM's flags and checks: EP = tp × dp, heads % tp, unknown flags reported."""

import pytest

from shardwise import load_cluster, load_model
from shardwise.engines.base import get_engine
from shardwise.engines.check import check_command
from shardwise.engines.flags import flag_table, parse_version, unmodelled_flags

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
    """MoE sliced over tp × dp = 32 without EP. DeepSeek-V3 FP8: 2048 / 32 = 64 is not a whole 128-wide block, but
    vLLM refines the expert scales to 64 × 64 blocks at load (gcd(128, 64, 7168) = 64 ≥ 32: fused_moe/oracle/fp8.py
    refine_fp8_moe_block_shape), and it starts. Qwen3-235B FP8: 1536 / 32 = 48, gcd(128, 48, 4096) = 16 < 32: no
    refinement, and validate_fp8_block_shape_moe refuses it."""
    nodes = "--nnodes 4 --master-addr 10.0.0.1"
    assert resolve(f"-tp 8 -dp 4 {nodes}", model="deepseek-v3", cluster="4x8xh200").valid
    bad = resolve(f"-tp 8 -dp 4 {nodes}", model="qwen3-235b-a22b-fp8", cluster="4x8xh200")
    assert "partition" in rules(bad)
    assert "weight = 48 is not divisible by weight quantization block_n = 128" in bad.rejections[0].engine_error
    assert resolve(f"-tp 8 -dp 4 -ep {nodes}", model="qwen3-235b-a22b-fp8", cluster="4x8xh200").valid


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


def test_gqa_decode_cp_as_vllm_refuses_it():
    """config/model.py verify_with_parallel_config: tp above the KV heads, dcp ≤ tp / KV heads, and the query
    heads of each KV head divisible by dcp (Llama-3.1-70B: 64 query heads, 8 KV heads)."""
    low = resolve("-tp 8 -dcp 2", model="llama-3.1-70b", cluster="8xh100")
    assert "greater than the model's total number of KV heads (8)" in low.rejections[0].engine_error
    nodes = "--nnodes 2 --master-addr 10.0.0.1"
    assert resolve(f"-tp 16 -dcp 2 {nodes}", model="llama-3.1-70b", cluster="2x8xh100").valid
    too_wide = resolve(f"-tp 16 -dcp 4 {nodes}", model="llama-3.1-70b", cluster="2x8xh100")
    assert "exceeds the maximum supported value (2)" in too_wide.rejections[0].engine_error


def test_human_readable_lengths():
    """utils/argparse_utils.py: k = 1000, K = 1024, auto / -1 fit the length to the KV cache."""
    assert resolve("-tp 8 --max-model-len 32k").layout.options.max_model_len == 32_000
    assert resolve("-tp 8 --max-model-len 32K").layout.options.max_model_len == 32_768
    for auto in ("auto", "-1"):
        fitted = resolve(f"-tp 8 --max-model-len={auto}")
        assert fitted.valid and fitted.layout.options.max_model_len is None
    assert "Decimals are not allowed" in resolve("-tp 8 --max-model-len 3.5K").rejections[0].reason


def test_multi_node_needs_nnodes_and_an_address():
    single = resolve("-tp 8 -pp 2", model="deepseek-v3", cluster="2x8xh100")
    assert "World size (16) is larger than the number of available GPUs (8)" in single.rejections[0].engine_error
    loopback = resolve("-tp 8 -pp 2 --nnodes 2", model="deepseek-v3", cluster="2x8xh100")
    assert rules(loopback) == ["multi_node_address"] and loopback.rejections[0].stage == "run"
    ok = resolve("-tp 8 -pp 2 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --headless", model="deepseek-v3",
                 cluster="2x8xh100")  # fmt: skip
    assert ok.valid and ok.gpus_used == 16
    bad_rank = resolve("-tp 8 -pp 2 --nnodes 2 --node-rank 2 --master-addr 10.0.0.1", model="deepseek-v3",
                       cluster="2x8xh100")  # fmt: skip
    assert "`--node-rank` must be between 0 and 1" in bad_rank.rejections[0].engine_error


def test_every_node_gets_its_command():
    """Node 0 serves the API; the others run the same command --headless with their rank."""
    setup = resolve("-tp 8 -pp 2 --nnodes 2 --master-addr 10.0.0.1", model="deepseek-v3", cluster="2x8xh100")
    node0, node1 = VLLM.launch_commands(setup, model_ref="deepseek-ai/DeepSeek-V3")
    assert node0[node0.index("--node-rank") + 1] == "0" and "--headless" not in node0
    assert node1[node1.index("--node-rank") + 1] == "1" and "--headless" in node1


def test_dual_batch_overlap():
    """DBO needs a DeepEP or NIXL EP backend (config/vllm.py); from 0.34 not on multimodal models."""
    base = "-tp 8 --enable-expert-parallel --enable-dbo"
    assert "Microbatching currently only supports" in resolve(base, model="deepseek-v3", cluster="8xh200")\
        .rejections[0].engine_error  # fmt: skip
    deepep = f"{base} --all2all-backend deepep_low_latency"
    assert resolve(deepep, model="deepseek-v3", cluster="8xh200").valid
    kimi = VLLM.resolve(deepep.split(), model=load_model("kimi-k2.6"), cluster=load_cluster("8xh200"),
                        version="0.34.0")  # fmt: skip
    assert "dual batch overlap with multimodal models" in kimi.rejections[0].engine_error


def test_release_defaults_for_the_kv_cache():
    """0.33: utilization 0.92, 16-token blocks; 0.34: 1.0 with the extensible cache, 64-token blocks."""
    llama, h100 = load_model("llama-3.1-70b"), load_cluster("8xh100")
    old = VLLM.resolve("-tp 8".split(), model=llama, cluster=h100, version="0.33.0").layout.options
    new = VLLM.resolve("-tp 8".split(), model=llama, cluster=h100, version="0.34.0").layout.options
    assert (old.memory_fraction, old.page_size, old.kv_margin) == (0.92, 16, None)
    assert (new.memory_fraction, new.page_size, new.kv_margin) == (1.0, 64, (2**30, 0.75))


def test_the_vision_tower_follows_the_flags():
    """Kimi's MoonViT (16 heads) splits over tp 8 in vLLM's default 'weights' mode, is copied in 'data' mode, and
    is not built when its only modality (vision_chunk) is limited to 0 or with --language-model-only."""
    assert resolve("-tp 8").layout.vision_tp == 8
    assert resolve("-tp 8 --mm-encoder-tp-mode data").layout.vision_tp == 1
    assert resolve("-tp 8 --language-model-only").layout.vision_tp == 0
    assert resolve('-tp 8 --limit-mm-per-prompt {"vision_chunk":0}').layout.vision_tp == 0
    assert resolve('-tp 8 --limit-mm-per-prompt {"image":0}').layout.vision_tp == 8


@pytest.mark.parametrize("version", ["0.10.2", "0.11.0"])
def test_early_async_scheduling_refuses_pipeline_stages_and_drafts(version):
    """EngineArgs.create_engine_config in the 0.10.2 and 0.11.0 wheels: --async-scheduling with pp > 1 or with a
    speculative config is a ValueError; on its own (a single stage, no drafts) it starts and overlaps the GPU."""
    gpt_oss, h100 = load_model("gpt-oss-120b"), load_cluster("2xh100")
    staged = VLLM.resolve("-pp 2 --async-scheduling".split(), model=gpt_oss, cluster=h100, version=version)
    assert rules(staged) == ["async_scheduling_early"]
    assert "pipeline-parallel-size > 1" in staged.rejections[0].engine_error
    drafted = VLLM.resolve(["-tp", "2", "--async-scheduling", "--speculative-config",
                            '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'],
                           model=gpt_oss, cluster=h100, version=version)  # fmt: skip
    assert "async_scheduling_early" in rules(drafted)
    alone = VLLM.resolve("-tp 2 --async-scheduling".split(), model=gpt_oss, cluster=h100, version=version)
    assert alone.valid and alone.layout.options.overlap_schedule
    later = VLLM.resolve("-pp 2 --async-scheduling".split(), model=gpt_oss, cluster=h100, version="0.33.0")
    assert "async_scheduling_early" not in rules(later)


def test_gpt_oss_needs_a_kv_head_per_rank():
    """gpt-oss-120b has 8 KV heads and its attention splits them without replication: tp 16 builds 0 per rank and
    fails while the model is built (the conformance oracle sees vLLM raise it); tp 8 is fine, and other models
    replicate KV heads past their count (Llama-3.1-70B's 8 at tp 16)."""
    bad = resolve("-tp 16 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1", model="gpt-oss-120b", cluster="2x8xh100")
    assert rules(bad) == ["kv_heads_per_rank"] and bad.rejections[0].stage == "load"
    assert bad.rejections[0].engine_error == "ZeroDivisionError: integer modulo by zero"
    assert resolve("-tp 8", model="gpt-oss-120b", cluster="8xh100").valid
    llama = resolve("-tp 16 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1", model="llama-3.1-70b", cluster="2x8xh100")
    assert "kv_heads_per_rank" not in rules(llama)


@pytest.mark.parametrize(
    "flags, model, cluster, tokens",
    [
        # 8 H100 (SM90): 0.5 MiB over hidden 8192 × 2 bytes
        ("-tp 8", "llama-3.1-70b", "8xh100", 32),
        # 8 B200 (SM100): 1 MiB over hidden 7168 × 2 bytes
        ("-tp 8", "deepseek-r1", "8xb200", 73),
        # 4 H100: 2 MiB over hidden 4096 × 2 bytes
        ("-tp 4", "qwen3-235b-a22b", "8xh100", 256),
        ("-tp 8 --enforce-eager", "llama-3.1-70b", "8xh100", 0),  # no compilation, no fusion pass
        ("-tp 1", "llama-3.1-70b", "8xh100", 0),  # no all-reduce
        ("-tp 8", "kimi-k2.6", "8xrtx-pro-6000", 0),  # SM120: the pass is off
    ],
)
def test_allreduce_rms_fusion_up_to_its_size(flags, model, cluster, tokens):
    setup = VLLM.resolve(flags.split(), model=load_model(model), cluster=load_cluster(cluster), version="0.33.0")
    assert setup.layout.options.allreduce_norm_fusion_tokens == tokens


def test_allreduce_rms_fusion_is_read_from_033_on():
    older = VLLM.resolve("-tp 8".split(), model=load_model("llama-3.1-70b"), cluster=load_cluster("8xh100"),
                         version="0.11.0")  # fmt: skip
    assert older.layout.options.allreduce_norm_fusion_tokens == 0


@pytest.mark.parametrize(
    ("flags", "refused"),
    [
        ("m -tp 2 -dp 4 -ep -dcp 2", True),  # 32 heads a GPU: not the mixed-batch FP8 path
        ("m -tp 8 -dcp 2", False),  # 8 heads, 16 gathered: both pad to 64
        ("m -tp 8 -dcp 8", False),  # 64 gathered still pad to 64
        ("m -tp 4 -dp 2 -ep -dcp 4", False),  # 16 → 64
    ],
)
def test_flashmla_sparse_serves_dcp_only_on_its_mixed_fp8_path(flags, refused):
    """GLM-5.1 NVFP4 on H200: its FP8 cache (fp8_ds_mla) runs FlashMLA's sparse backend, whose DCP needs fewer
    than 32 heads a GPU and the same kernel padding for the local and gathered heads."""
    setup = resolve(flags, model="glm-5.1-nvfp4", cluster="8xh200")
    assert ("sparse_mla_dcp" in rules(setup)) is refused
    on_blackwell = resolve(flags, model="glm-5.1-nvfp4", cluster="8xb200")
    assert "sparse_mla_dcp" not in rules(on_blackwell)  # another backend there


def test_dotted_options_merge_into_the_json_of_their_root():
    """FlexibleArgumentParser takes -cc.pass_config.fuse_allreduce_rms=True as --compilation-config
    '{"pass_config": {"fuse_allreduce_rms": "True"}}' (vllm/utils/argparse_utils.py); -O… stays the level."""
    setup = resolve("-tp 8 -cc.pass_config.fuse_allreduce_rms=True -cc.mode 3")
    assert setup.valid
    argv = "-tp 8 -cc.pass_config.fuse_allreduce_rms=True -cc.mode 3".split()
    unread = unmodelled_flags(flag_table("vllm"), argv, parse_version("0.34.0", "vllm"))
    assert unread == ('--compilation-config {"pass_config": {"fuse_allreduce_rms": "True"}, "mode": 3}',)
    assert resolve("-tp 8 -O3").valid


def test_sparse_attention_on_sm12_has_no_dcp_and_no_bf16_cache():
    """vLLM's one sparse backend on SM 12.x (FLASHINFER_MLA_SPARSE_SM120) serves no DCP and caches FP8 only; a build
    whose own kernels do (waive) is resolved with the rule lifted and a note."""
    assert resolve("-tp 8", model="glm-5.1-nvfp4").valid
    dcp = resolve("-tp 8 -dcp 2", model="glm-5.1-nvfp4")
    assert rules(dcp) == ["sparse_mla_sm120"] and "head_size=576" in dcp.rejections[0].engine_error
    assert rules(resolve("-tp 8 --kv-cache-dtype bfloat16", model="glm-5.1-nvfp4")) == ["sparse_mla_sm120"]
    assert resolve("-tp 8 -dcp 2", model="glm-5.1-nvfp4", cluster="8xh200").valid  # FlashMLA sparse: SM 9.0
    argv = "-tp 8 -dcp 2".split()
    lifted = VLLM.resolve(argv, model=load_model("glm-5.1-nvfp4"), cluster=load_cluster("8xrtx-pro-6000"),
                          waive=frozenset({"sparse_mla_sm120"}))  # fmt: skip
    assert lifted.valid and lifted.layout.dcp == 2
    assert any(n.message.startswith("lifted for this build") for n in lifted.notes)


def test_mtp_drafts_with_the_checkpoints_own_layers_in_a_chain():
    """method mtp: the MTP layers of the checkpoint `model` names, not a second model; k drafts in a chain, k + 1
    tokens verified (config/speculative.py)."""
    spec = resolve(
        '-tp 8 --speculative-config {"method":"mtp","num_speculative_tokens":3,"model":"lukealonso/GLM-5.1-NVFP4"}',
        model="glm-5.1-nvfp4",
    ).layout.options.spec
    assert (spec.kind, spec.num_steps, spec.topk, spec.num_draft_tokens, spec.draft_model) == ("eagle", 3, 1, 4, None)


def test_fp8_moe_blocks_are_refined_where_a_shard_is_not_whole_blocks():
    """MiniMax-M2.5 FP8 at TP8: 1536 / 8 = 192 is not whole 128-wide blocks; gcd(128, 192, 3072) = 64 ≥ 32, so the
    scales are refined to 64 × 64 and it starts."""
    assert resolve("-tp 8", model="minimax-m2.5").valid
