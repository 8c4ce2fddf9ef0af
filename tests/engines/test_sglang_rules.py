"""Each SGLang rule, on each side of its line."""

import pytest

from shardwise import load_cluster, load_model
from shardwise.engines.base import get_engine

SGLANG = get_engine("sglang")


def resolve(flags: str, *, model="kimi-k2.6", cluster="8xrtx-pro-6000", version=None, env=None):
    argv = ["--model-path", "some/model", *flags.split()]
    return SGLANG.resolve(argv, model=load_model(model), cluster=load_cluster(cluster), version=version, env=env)


def rules(setup):
    return [r.rule for r in setup.rejections]


@pytest.mark.parametrize(
    "ok, bad, rule",
    [
        ("--tp 8 --attn-dp-size 4", "--tp 8 --attn-dp-size 3", "attn_dp_divides_tp"),
        ("--tp 8 --ep 8", "--tp 4 --ep 8", "moe_tp_zero"),
        # 384 experts + redundant slots must split evenly over EP 8
        (
            "--tp 8 --ep 8 --ep-num-redundant-experts 8",
            "--tp 8 --ep 8 --ep-num-redundant-experts 3",
            "experts_split_evenly",
        ),
        ("--tp 8 --dp-size 1 --attn-dp-size 8", "--tp 4 --dp-size 2 --attn-dp-size 2", "replicas_with_attn_dp"),
        ("--tp 8 --attn-dp-size 8", "--tp 8 --attn-dp-size 8 --attn-cp-size 2", "attn_cp_divides_tp"),
        ("--tp 8 --moe-dense-tp-size 1", "--tp 8 --moe-dense-tp-size 2", "moe_dense_tp"),
        ("--tp 8 --dcp-size 8 --attention-backend flashinfer", "--tp 4 --dcp-size 8", "dcp_divides_tp"),
        ("--tp 8 --dcp-size 8 --attention-backend flashinfer", "--tp 8 --dcp-size 8", "dcp_attention_backend"),
        (
            "--tp 8 --dcp-size 8 --attention-backend flashinfer",
            "--tp 8 --dcp-size 8 --attention-backend flashinfer --speculative-algorithm EAGLE",
            "dcp_attention_backend",
        ),
        (
            "--tp 8 --ep 8 --moe-a2a-backend deepep --deepep-mode low_latency",
            "--tp 8 --ep 8 --moe-a2a-backend deepep",
            "deepep_needs_nvlink",
        ),
        ("--tp 8 --ep 8 --enable-eplb", "--tp 8 --enable-eplb", "eplb_needs_ep"),
        ("--tp 8 --attn-dp-size 8 --enable-two-batch-overlap", "--tp 8 --enable-two-batch-overlap", "tbo_needs_a2a"),
        (
            "--tp 8 --chunked-prefill-size 8192 --page-size 64",
            "--tp 8 --chunked-prefill-size 8100 --page-size 64",
            "chunk_page",
        ),
        ("--tp 8", "--tp 16", "not_enough_gpus"),
        (
            "--tp 8 --pp-size 1 --speculative-algorithm EAGLE3 --speculative-draft-model-path d",
            "--tp 4 --pp-size 2 --speculative-algorithm EAGLE3 --speculative-draft-model-path d",
            "pp_with_spec",
        ),
        (
            "--tp 8 --speculative-algorithm EAGLE3 --speculative-draft-model-path some/draft",
            "--tp 8 --speculative-algorithm EAGLE3",
            "mtp_needs_draft",
        ),
        ("--tp 8 --moe-dp-size 2 --ep 4 --attn-cp-size 2", "--tp 8 --moe-dp-size 2 --ep 2 --attn-cp-size 2", "moe_dp"),
        ("--tp 8 --moe-dp-size 2 --ep 4 --attn-cp-size 2", "--tp 8 --moe-dp-size 2 --ep 4", "moe_dp"),
        ("--tp 8", "--tp 8 --language-model-only", "language_model_only"),
        (
            "--tp 8 --dcp-size 2 --attention-backend flashinfer",
            "--tp 8 --dcp-size 2 --attention-backend flashinfer --enable-prefill-cp",
            "dcp_with_prefill_cp",
        ),
        (
            "--tp 8 --ep 8 --moe-a2a-backend deepep --deepep-mode low_latency --enable-two-batch-overlap",
            "--tp 8 --ep 8 --moe-a2a-backend deepep_v2 --deepep-mode low_latency --enable-two-batch-overlap",
            "tbo_deepep_v2",
        ),
        (
            "--tp 8 --attn-dp-size 8 --moe-a2a-backend flashinfer_megamoe",
            "--tp 8 --moe-a2a-backend flashinfer_megamoe",
            "megamoe_needs_full_dp",
        ),
        (
            "--tp 8 --speculative-algorithm STANDALONE --speculative-draft-model-path d",
            "--tp 8 --attn-dp-size 8 --speculative-algorithm STANDALONE --speculative-draft-model-path d",
            "standalone_with_attn_dp",
        ),
        (
            "--tp 8 --attn-dp-size 8 --enable-dp-lm-head --speculative-algorithm DFLASH"
            " --speculative-draft-model-path d",
            "--tp 8 --attn-dp-size 8 --speculative-algorithm DFLASH --speculative-draft-model-path d",
            "dflash_needs_dp_lm_head",
        ),
    ],
)
def test_rule_both_sides(ok, bad, rule):
    assert resolve(ok).valid, rules(resolve(ok))
    assert rule in rules(resolve(bad))


@pytest.mark.parametrize("model", ["llama-3.1-70b", "mixtral-8x7b"])
def test_attention_dp_on_a_model_without_its_path(model):
    """SGLang's LlamaAttention and MixtralAttention split heads over the whole TP group (models/llama.py,
    models/mixtral.py): attention DP is not refused at start-up but cannot serve, so shardwise refuses it."""
    bad = resolve("--tp 8 --attn-dp-size 8", model=model, cluster="8xh100")
    assert rules(bad) == ["attention_dp_unsupported"] and bad.rejections[0].engine_error is None
    assert "models/" in bad.rejections[0].source
    assert resolve("--tp 8 --attn-dp-size 8", model="qwen3-235b-a22b", cluster="8xh100").valid


def test_dp_lm_head_without_attention_dp_is_turned_off_not_refused():
    """SGLang's _data_parallelism_defaults resets it when there is one DP rank (arg_groups/overrides.py)."""
    setup = resolve("--tp 8 --enable-dp-lm-head")
    assert setup.valid and setup.flags["enable_dp_lm_head"] is False
    assert any("--enable-dp-lm-head is turned off" in n.message for n in setup.notes)
    assert resolve("--tp 8 --attn-dp-size 8 --enable-dp-lm-head").flags["enable_dp_lm_head"] is True
    replicas = resolve("--tp 4 --dp-size 2 --enable-dp-lm-head")  # two DP ranks, no attention DP: kept, refused
    assert rules(replicas) == ["dp_lm_head_needs_attn_dp"]


def test_ep_not_dividing_tp_is_a_topology_error():
    # 8 = 3 × 1 × 2 fails the publish-time check (384 experts would split over 3 just fine)
    setup = resolve("--tp 8 --ep 3")
    assert rules(setup) == ["ep_divides_tp"]
    assert "8 != 3 * 1 * 2" in setup.rejections[0].engine_error
    assert resolve("--tp 8 --ep 4").valid
    # the topology check runs before the model loads, block-quantized checkpoint or not; 0.5.20 has none, and
    # refuses a block-quantized checkpoint's split while loading it
    fp8 = resolve("--tp 8 --ep 3", model="kimi-k2-instruct")
    assert fp8.rejections[0].stage == "arguments" and "8 != 3 * 1 * 2" in fp8.rejections[0].engine_error
    older = resolve("--tp 8 --ep 3", model="kimi-k2-instruct", version="0.5.20").rejections[0]
    assert older.stage == "load" and older.engine_error == "ValueError: tp_size 8 must be divisible by ep_size 3"


def test_heads_split_over_attention_tp():
    # Kimi has 64 heads: attention TP 16 is fine on 16 GPUs, 3 is not
    assert "heads_split" in rules(resolve("--tp 6", cluster="6xrtx-pro-6000"))
    assert resolve("--tp 16", cluster="2x8xrtx-pro-6000").valid is False  # needs --nnodes 2
    assert resolve("--tp 16 --nnodes 2 --dist-init-addr 10.0.0.1:5000", cluster="2x8xrtx-pro-6000").valid


def test_gqa_kv_heads_replicate_or_split():
    assert resolve("--tp 8", model="llama-3.1-70b").valid  # 8 KV heads split 8 ways
    assert resolve(
        "--tp 16 --nnodes 2 --dist-init-addr 10.0.0.1:5000", model="llama-3.1-70b", cluster="2x8xh100"
    ).valid  # replicated ×2
    assert resolve("--tp 8", model="qwen3-next-80b-a3b").valid  # 2 KV heads replicated ×4
    # 8 KV heads cannot be shared out over 6 ranks (and 64 query heads do not split 6 ways either)
    assert {"heads_split"} <= set(rules(resolve("--tp 6", model="llama-3.1-70b", cluster="6xh100")))


def test_kv_heads_that_neither_split_nor_replicate(odd_kv_model):
    assert rules(resolve("--tp 6", model=odd_kv_model, cluster="6xh100")) == ["kv_heads_split"]
    assert resolve("--tp 4", model=odd_kv_model, cluster="4xh100").valid


def test_tp_above_expert_count(write_config):
    # DeepSeek-style MoE refuses more TP ranks than routed experts
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 16,
        "vocab_size": 1000,
        "intermediate_size": 2048,
        "kv_lora_rank": 64,
        "q_lora_rank": None,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 512,
    }
    model = str(write_config(cfg))
    assert resolve("--tp 4", model=model, cluster="8xh100").valid
    assert "tp_exceeds_experts" in rules(resolve("--tp 8", model=model))


def test_fp8_block_alignment():
    # DeepSeek-V3 FP8: the dense MLP (18432 = 144 × 128) splits over 16 but not over 32 ranks
    assert resolve("--tp 16 --nnodes 2 --dist-init-addr 10.0.0.1:5000", model="deepseek-v3", cluster="2x8xh200").valid
    setup = resolve(
        "--tp 32 --nnodes 4 --dist-init-addr 10.0.0.1:5000 --moe-dense-tp-size 1",
        model="deepseek-v3",
        cluster="4x8xh200",
    )
    # moe_intermediate 2048 / 32 = 64: not a whole 128-wide block
    assert "moe_tp_width" in rules(setup)
    assert "weight_block_size_n" in setup.rejections[0].engine_error
    assert "moe_tp_width" not in rules(
        resolve(
            "--tp 32 --ep 32 --nnodes 4 --dist-init-addr 10.0.0.1:5000 --moe-dense-tp-size 1",
            model="deepseek-v3",
            cluster="4x8xh200",
        )
    )
    # TP-split shared experts (2048 / 32 = 64) and dense MLP (18432 / 32 = 576) are not whole blocks either
    wide = resolve("--tp 32 --ep 32 --nnodes 4 --dist-init-addr 10.0.0.1:5000", model="deepseek-v3", cluster="4x8xh200")
    assert rules(wide) == ["partition_block"] and "shared experts: 2048 / 32" in wide.rejections[0].reason
    dense = resolve(
        "--tp 32 --ep 32 --nnodes 4 --dist-init-addr 10.0.0.1:5000 --moe-a2a-backend deepep",
        model="deepseek-v3",
        cluster="4x8xh200",
    )
    assert rules(dense) == ["partition_block"] and "dense MLP" in dense.rejections[0].reason
    assert resolve(
        "--tp 32 --ep 32 --nnodes 4 --dist-init-addr 10.0.0.1:5000 --moe-a2a-backend deepep --moe-dense-tp-size 1",
        model="deepseek-v3",
        cluster="4x8xh200",
    ).valid


def test_multi_node_rules():
    assert resolve(
        "--tp 4 --pp-size 3 --nnodes 3 --dist-init-addr 10.0.0.1:5000", model="llama-3.1-70b", cluster="3x4xh100"
    ).valid
    assert "multi_node_split" in rules(resolve("--tp 4 --nnodes 3 --dist-init-addr 10.0.0.1:5000", cluster="3x4xh100"))
    assert resolve("--tp 8 --dp-size 2", model="llama-3.1-8b", cluster="16xh100").valid
    assert "multi_node_replicas" in rules(
        resolve(
            "--tp 8 --dp-size 2 --nnodes 2 --dist-init-addr 10.0.0.1:5000", model="llama-3.1-8b", cluster="2x8xh100"
        )
    )


def test_cuda_visible_devices_limits_the_gpus():
    setup = resolve("--tp 8", env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert "not_enough_gpus" in rules(setup) and setup.gpus_available == 4


def test_model_path_is_required():
    setup = SGLANG.resolve(["--tp", "8"], model=load_model("kimi-k2.6"), cluster=load_cluster("8xrtx-pro-6000"))
    assert "the following arguments are required: --model-path/--model" in setup.rejections[0].engine_error


def test_unknown_and_ambiguous_flags_are_the_parsers_errors():
    setup = resolve("--tp 8 --no-such-flag 3")
    assert rules(setup) == ["arguments"] and "unrecognized arguments" in setup.rejections[0].engine_error
    # 0.5.20+ has both --cuda-graph-max-bs-decode and -prefill: the old flag is an ambiguous prefix
    setup = resolve("--tp 8 --cuda-graph-max-bs 64")
    assert rules(setup) == ["arguments"] and "ambiguous option" in setup.rejections[0].engine_error
    older = resolve("--tp 8 --cuda-graph-max-bs 64", version="0.5.9")
    assert older.valid and older.flags["cuda_graph_max_bs"] == 64


def test_attention_dp_spellings_by_version():
    new = resolve("--tp 8 --attn-dp-size 8")
    old = resolve("--tp 8 --dp-size 8 --enable-dp-attention")
    assert new.layout == old.layout and new.layout.attn_dp == 8 and new.layout.replicas == 1
    assert any(n.kind == "deprecated" for n in old.notes)
    assert rules(resolve("--tp 8 --attn-dp-size 8", version="0.5.21")) == ["arguments"]  # flag added in 0.5.22
    legacy = resolve("--tp 8 --dp-size 8 --enable-dp-attention", version="0.5.21")
    assert legacy.layout.attn_dp == 8 and not any(n.kind == "deprecated" for n in legacy.notes)


def test_silent_rewrites_are_shown():
    deepep = resolve("--tp 8 --ep 2 --moe-a2a-backend deepep --deepep-mode normal", cluster="8xh100")
    assert deepep.flags["ep_size"] == 8 and not deepep.flags["cuda_graph"]
    messages = " ".join(n.message for n in deepep.notes)
    assert "sets ep 2 to the tensor parallel size 8" in messages and "turns CUDA graphs off" in messages
    assert deepep.layout.moe_comm == "all2all" and deepep.layout.shared_tp == 1
    dp = resolve("--tp 8 --attn-dp-size 8")
    assert dp.flags["chunked_prefill_size"] == 8192 // 8  # 96 GB tier default, divided per rank
    eagle = resolve("--tp 8 --speculative-algorithm NEXTN", model="deepseek-v3", cluster="8xh200")
    assert eagle.flags["speculative_algorithm"] == "EAGLE" and eagle.flags["max_running_requests"] == 48


EAGLE_CHAIN = "--tp 8 --speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1"
EAGLE_TREE = "--tp 8 --speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4"
EAGLE3 = "--tp 8 --speculative-algorithm EAGLE3 --speculative-draft-model-path d"
STANDALONE = "--tp 8 --speculative-algorithm STANDALONE --speculative-draft-model-path d"
DFLASH = "--tp 8 --speculative-algorithm DFLASH --speculative-draft-model-path d"


@pytest.mark.parametrize(
    "version, env, flags, overlap",
    [
        ("0.5.2", {"SGLANG_ENABLE_SPEC_V2": "1"}, EAGLE_CHAIN, False),  # no spec v2 yet
        ("0.5.5", None, EAGLE_CHAIN, False),  # the variable off by default
        ("0.5.5", {"SGLANG_ENABLE_SPEC_V2": "1"}, EAGLE_CHAIN, True),
        ("0.5.5", {"SGLANG_ENABLE_SPEC_V2": "1"}, EAGLE_CHAIN + " --disable-overlap-schedule", True),  # forced on
        ("0.5.9", {"SGLANG_ENABLE_SPEC_V2": "true"}, EAGLE_CHAIN, True),
        ("0.5.9", {"SGLANG_ENABLE_SPEC_V2": "maybe"}, EAGLE_CHAIN, False),  # unreadable: the default (off)
        ("0.5.12", None, EAGLE_CHAIN, True),  # on by default
        ("0.5.12", {"SGLANG_ENABLE_SPEC_V2": "0"}, EAGLE_CHAIN, False),
        ("0.5.12", None, EAGLE_TREE, False),  # spec v2 drafts chains only
        ("0.5.13", None, EAGLE_TREE, True),
        ("0.5.13", None, "--tp 8 --speculative-algorithm NGRAM --speculative-num-draft-tokens 4", False),
        ("0.5.23", {"SGLANG_ENABLE_SPEC_V2": "0"}, EAGLE_TREE, True),  # the variable is gone
        ("0.5.23", None, EAGLE_CHAIN + " --disable-overlap-schedule", False),
        ("0.5.5", {"SGLANG_ENABLE_SPEC_V2": "1"}, EAGLE3 + " --disable-overlap-schedule", False),  # not forced
        ("0.5.5", {"SGLANG_ENABLE_SPEC_V2": "1"}, EAGLE3, True),  # kept as the command has it
        ("0.5.7", {"SGLANG_ENABLE_SPEC_V2": "1"}, STANDALONE, False),  # STANDALONE joins spec v2 in 0.5.8
        ("0.5.8", {"SGLANG_ENABLE_SPEC_V2": "1"}, STANDALONE, True),
        ("0.5.13", None, DFLASH, False),  # DFLASH has no spec v2 before 0.5.14
        ("0.5.14", None, DFLASH, True),
    ],
)
def test_speculative_decoding_keeps_the_overlap_scheduler_as_each_release_does(version, env, flags, overlap):
    """sglang server_args.py _handle_speculative_decoding (0.5.5-0.5.12), arg_groups/speculative_hook.py
    _handle_eagle_family (0.5.13 on); 0.5.23 is checked against the engine itself (tests/conformance)."""
    setup = resolve(flags, model="deepseek-v3", cluster="8xh200", version=version, env=env)
    assert setup.valid and setup.layout.options.overlap_schedule is overlap
    # off by hand from 0.5.14 is spec v2's synchronous path (the spec v1 worker is gone); off otherwise, spec v1
    spec = "spec v2" if overlap else "spec v2's synchronous path" if version == "0.5.23" else "spec v1"
    assert any(
        f"runs {'under' if overlap else 'without'} the overlap scheduler ({spec}" in n.message for n in setup.notes
    )


@pytest.mark.parametrize(
    "flags", [EAGLE_CHAIN, DFLASH, "--tp 8 --speculative-algorithm NGRAM --speculative-num-draft-tokens 4"]
)
def test_every_speculative_algorithm_caps_the_running_requests(flags):
    """_handle_eagle_family, _handle_dflash and _handle_ngram each set 48 where the command sets none (0.5.23; NGRAM
    and DFLASH were left uncapped before)."""
    assert resolve(flags, model="deepseek-v3", cluster="8xh200").flags["max_running_requests"] == 48
    given = resolve(flags + " --max-running-requests 64", model="deepseek-v3", cluster="8xh200")
    assert given.flags["max_running_requests"] == 64


def test_spec_v2_refuses_a_draft_tree_from_0_5_7_to_0_5_10():
    env = {"SGLANG_ENABLE_SPEC_V2": "1"}
    assert rules(resolve(EAGLE_TREE, model="deepseek-v3", cluster="8xh200", version="0.5.9", env=env)) == [
        "spec_v2_topk"
    ]
    assert resolve(EAGLE_TREE, model="deepseek-v3", cluster="8xh200", version="0.5.9").valid  # spec v1 takes trees
    assert resolve(EAGLE_TREE, model="deepseek-v3", cluster="8xh200", version="0.5.5", env=env).valid


def test_draft_steps_without_a_top_k_are_refused():
    """The engine's TypeError (its paged-tree check compares top-k, unset, with 1), in every release (0.5.2 and
    0.5.12 read in server_args.py; 0.5.23 raises it itself, tests/conformance)."""
    steps = "--tp 8 --speculative-algorithm EAGLE --speculative-num-steps 2"
    for version in ("0.5.2", "0.5.12", None):
        bad = resolve(steps, model="deepseek-v3", cluster="8xh200", version=version)
        assert rules(bad) == ["eagle_steps_without_topk"] and bad.rejections[0].stage == "arguments"
    assert resolve(EAGLE_CHAIN, model="deepseek-v3", cluster="8xh200").valid
    assert resolve("--tp 8 --speculative-algorithm EAGLE", model="deepseek-v3", cluster="8xh200").valid  # none given


def test_gpu_tier_defaults():
    # 96 GB RTX PRO 6000 (97,887 MiB): the < 160 GiB tier, tp ≥ 4 → decode graphs up to 512, chunk 8192
    f = resolve("--tp 8").flags
    assert f["cuda_graph_max_bs"] == 512 and f["chunked_prefill_size"] == 8192
    assert resolve("--tp 2 --dp-size 4", model="llama-3.1-8b").flags["cuda_graph_max_bs"] == 256
    assert resolve("--tp 8", cluster="8xb200").flags["chunked_prefill_size"] == 16384
    assert resolve("--tp 4", model="llama-3.1-8b", cluster="4x4090").flags["cuda_graph_max_bs"] == 160


def test_versions_outside_the_checked_range_are_flagged():
    assert not [n for n in resolve("--tp 8").notes if "outside the releases" in n.message]
    old = resolve("--tp 8", version="0.4.10")
    assert any("outside the releases these rules were read from (0.5.9 to 0.5.23)" in n.message for n in old.notes)


@pytest.mark.parametrize("cluster", ["8xrtx-pro-6000", "8xh100", "8xb200", "2x8xh100"])
def test_every_emitted_dcp_layout_has_a_backend_with_the_dcp_path(cluster):
    """forward_mla.py merges DCP partial outputs by their LSE: every DCP command shardwise emits runs an MLA decode
    backend that returns it (flashinfer added where the platform's default does not: triton on SM120, fa3 on
    Hopper; SM100's defaults have the path)."""
    from shardwise.engines.flags import flag_table
    from shardwise.engines.sglang_support import mla_decode_backend

    model, box = load_model("kimi-k2.6"), load_cluster(cluster)
    dcp = [s for s in SGLANG.enumerate(model, box) if s.flags["dcp_size"] > 1]
    assert dcp
    capability = box.gpu.compute_capability.value
    assert all(
        mla_decode_backend(s.flags, model, capability, s.flags["tp_size"]) in flag_table("sglang").mla_dcp_backends
        for s in dcp
    )
    added = {s.given.get("attention_backend") for s in dcp}
    assert added == ({None} if capability.startswith("10.") else {"flashinfer"})


def test_multi_node_commands_one_per_node():
    """Every node runs the same command with its own --node-rank and node 0's address (dist_init_addr)."""
    model, box = load_model("deepseek-v3"), load_cluster("2x8xh100")
    setup = next(s for s in SGLANG.enumerate(model, box) if s.layout.describe() == "TP16")
    commands = SGLANG.launch_commands(setup, model_ref="deepseek-ai/DeepSeek-V3")
    assert [c[c.index("--node-rank") + 1] for c in commands] == ["0", "1"]
    for command in commands:
        address = command[command.index("--dist-init-addr") + 1]
        assert address.startswith("${HEAD_IP:?") and address.endswith(":${HEAD_PORT:-50000}")
        assert SGLANG.resolve(command[3:], model=model, cluster=box).valid  # check takes each node's command


@pytest.mark.parametrize(
    "flags, model, cluster, version, fused",
    [
        # on by itself for DeepSeek-V3's architecture on SM100 from 0.5.4, on SM90 too from 0.5.9
        ("--tp 8", "deepseek-r1", "8xb200", "0.5.23", True),
        ("--tp 8", "deepseek-r1", "8xb200", "0.5.5", True),
        ("--tp 8", "deepseek-r1", "8xb200", "0.5.3", False),
        ("--tp 8", "deepseek-r1", "8xh200", "0.5.5", False),
        ("--tp 8", "deepseek-r1", "8xh200", "0.5.9", True),
        ("--tp 8 --enable-flashinfer-allreduce-fusion", "deepseek-r1", "8xh200", "0.5.5", True),
        ("--tp 8 --attn-dp-size 8", "deepseek-r1", "8xb200", "0.5.23", False),  # attention DP: never
        ("--tp 8 --enforce-disable-flashinfer-allreduce-fusion", "deepseek-r1", "8xb200", "0.5.23", False),
        ("--tp 8 --enable-deterministic-inference", "deepseek-r1", "8xb200", "0.5.23", False),
        ("--tp 8 --enable-deterministic-inference", "deepseek-r1", "8xb200", "0.5.9", True),  # not before 0.5.12
        # Kimi K2.6's checkpoint names its multimodal wrapper, which the list has; SM90 runs it too
        ("--tp 8", "kimi-k2.6", "8xh200", "0.5.23", True),
        # an architecture no list has fuses only when asked, and before 0.5.23 not at all (no LayerCommunicator)
        ("--tp 8", "llama-3.1-70b", "8xh100", "0.5.23", False),
        ("--tp 8 --enable-flashinfer-allreduce-fusion", "llama-3.1-70b", "8xh100", "0.5.23", True),
        ("--tp 8 --enable-flashinfer-allreduce-fusion", "llama-3.1-70b", "8xh100", "0.5.12", False),
        ("--tp 1 --enable-flashinfer-allreduce-fusion", "llama-3.1-70b", "8xh100", "0.5.23", False),  # no all-reduce
    ],
)
def test_allreduce_norm_fusion_where_sglang_runs_it(flags, model, cluster, version, fused):
    setup = resolve(flags, model=model, cluster=cluster, version=version)
    assert setup.valid
    assert setup.layout.options.allreduce_norm_fusion_tokens == (2048 if fused else 0)
    auto = fused and "--enable-flashinfer-allreduce-fusion" not in flags
    assert any("fused with the residual add and RMSNorm" in n.message for n in setup.notes) == auto


def test_allreduce_fusion_off_sm90_and_sm100_does_not_start():
    """0.5.23 resolves the fusion backend before CUDA graph capture and raises off SM90 / SM100 (RTX PRO 6000 is
    SM120); one GPU has no fusion group, and 0.5.12 never resolves it (the flag is a no-op there)."""
    flag = "--enable-flashinfer-allreduce-fusion"
    assert rules(resolve(f"--tp 8 {flag}", version="0.5.23")) == ["allreduce_fusion_platform"]
    assert rules(resolve("--tp 8 --flashinfer-allreduce-fusion-backend auto", version="0.5.23")) == [
        "allreduce_fusion_platform"
    ]
    assert "allreduce_fusion_platform" not in rules(resolve(f"--tp 1 {flag}", version="0.5.23"))
    assert "allreduce_fusion_platform" not in rules(resolve(f"--tp 8 {flag}", version="0.5.12"))
    assert resolve(f"--tp 8 {flag}", version="0.5.12").layout.options.allreduce_norm_fusion_tokens == 0


@pytest.mark.parametrize(
    "flags, cluster, version, tokens",
    [
        # on by default from 0.5.10 on CUDA, up to 2048 prompt tokens for an MLA model (server_args.py, 0.5.10-0.5.13)
        ("--tp 8", "8xh200", "0.5.12", 2048),
        ("--tp 8 --piecewise-cuda-graph-max-tokens 4096", "8xh200", "0.5.12", 4096),
        ("--tp 8 --disable-piecewise-cuda-graph", "8xh200", "0.5.12", 0),
        ("--tp 8 --disable-piecewise-cuda-graph --enforce-piecewise-cuda-graph", "8xh200", "0.5.12", 2048),
        ("--tp 8 --disable-cuda-graph", "8xh200", "0.5.12", 2048),  # decode graphs only
        ("--tp 8 --enable-symm-mem", "8xh200", "0.5.12", 0),
        ("--tp 8 --enable-symm-mem --enforce-piecewise-cuda-graph", "8xh200", "0.5.12", 2048),
        ("--tp 8 --dp-size 8 --enable-dp-attention", "8xh200", "0.5.12", 0),
        ("--tp 8 --enable-torch-compile", "8xh200", "0.5.12", 0),
        ("--tp 8", "8xmi300x", "0.5.12", 0),  # HIP: off
        # SM100: DeepSeek-V3's own MoE runner, flashinfer_trtllm, turns it off through 0.5.12
        ("--tp 8", "8xb200", "0.5.12", 0),
        ("--tp 8 --enforce-piecewise-cuda-graph", "8xb200", "0.5.12", 2048),
        ("--tp 8", "8xb200", "0.5.13", 2048),
        # asked for before 0.5.10: 4096 tokens through 0.5.6, 2048 for MLA from 0.5.8
        ("--tp 8", "8xh200", "0.5.9", 0),
        ("--tp 8 --enable-piecewise-cuda-graph", "8xh200", "0.5.5", 4096),
        ("--tp 8 --enable-piecewise-cuda-graph", "8xh200", "0.5.9", 2048),
        # 0.5.14: one prefill backend, tc_piecewise by default, with 0.5.13's checks but not its SM100 MoE-runner one;
        # --disable-cuda-graph now turns both phases off, and a backend the command chooses skips every check
        ("--tp 8", "8xh200", "0.5.14", 2048),
        ("--tp 8", "8xb200", "0.5.14", 2048),
        ("--tp 8 --disable-cuda-graph", "8xh200", "0.5.14", 0),
        ("--tp 8 --disable-cuda-graph --cuda-graph-backend-prefill tc_piecewise", "8xh200", "0.5.14", 2048),
        ("--tp 8 --enable-symm-mem", "8xh200", "0.5.14", 0),
        ("--tp 8 --enable-symm-mem --enforce-piecewise-cuda-graph", "8xh200", "0.5.14", 2048),
        ("--tp 8 --disable-prefill-cuda-graph", "8xh200", "0.5.14", 0),
        ("--tp 8", "8xmi300x", "0.5.14", 0),
        # an EAGLE-style target prefills eagerly under a piecewise graph (0.5.12 on, enforced or not), from 0.5.14
        # under any backend but breakable (tc_piecewise alone from 0.5.19)
        ("--tp 8 --speculative-algorithm EAGLE", "8xh200", "0.5.12", 0),
        ("--tp 8 --speculative-algorithm EAGLE --enforce-piecewise-cuda-graph", "8xh200", "0.5.13", 0),
        ("--tp 8 --speculative-algorithm EAGLE", "8xh200", "0.5.14", 0),
        ("--tp 8 --speculative-algorithm EAGLE --cuda-graph-backend-prefill full", "8xh200", "0.5.16", 0),
        ("--tp 8 --speculative-algorithm EAGLE --cuda-graph-backend-prefill full", "8xh200", "0.5.19", 2048),
        ("--tp 8 --speculative-algorithm EAGLE --cuda-graph-backend-prefill tc_piecewise", "8xh200", "0.5.20", 0),
        ("--tp 8 --speculative-algorithm EAGLE", "8xh200", "0.5.20", 2048),
        # the piecewise aliases write --cuda-graph-backend-prefill's field, above --disable-prefill-cuda-graph
        ("--tp 8 --disable-prefill-cuda-graph --enforce-piecewise-cuda-graph", "8xh200", "0.5.14", 2048),
        # prefill context parallelism of an MLA model runs no prefill graph; a chosen breakable graph in a pipeline
        # holds 8192 tokens at most from 0.5.19; an unchunked prefill has no graph size to take
        ("--tp 8 --enable-prefill-cp", "8xh200", "0.5.18", 0),
        ("--tp 8 --chunked-prefill-size -1", "8xh200", "0.5.23", 0),
        ("--tp 8 --prefill-attention-backend fa3", "8xb200", "0.5.20", 2048),
        # 0.5.15-0.5.17: the breakable default turns off for MLA models; chosen, it runs
        ("--tp 8", "8xh200", "0.5.15", 0),
        ("--tp 8", "8xh200", "0.5.17", 0),
        ("--tp 8 --cuda-graph-backend-prefill breakable", "8xh200", "0.5.16", 2048),
        ("--tp 8 --enable-breakable-cuda-graph", "8xh200", "0.5.16", 2048),
        # 0.5.18 on: MLA keeps it, at 2048 tokens (the attention-DP rank's chunk at most), but DeepSeek-V3 on
        # trtllm_mla (SM100's own choice for it) has none; symmetric memory is no longer checked; PP turns it off
        ("--tp 8", "8xh200", "0.5.18", 2048),
        ("--tp 8 --enable-symm-mem", "8xh200", "0.5.18", 2048),
        ("--tp 8", "8xb200", "0.5.18", 0),
        ("--tp 8 --attention-backend flashinfer", "8xb200", "0.5.20", 2048),
        ("--tp 8 --dp-size 8 --enable-dp-attention --chunked-prefill-size 8192", "8xh200", "0.5.18", 1024),
        ("--tp 8 --pp-size 2", "16xh200", "0.5.18", 0),
        ("--tp 8 --pp-size 2", "16xh200", "0.5.20", 0),
        ("--tp 8 --cuda-graph-max-bs-prefill 1024", "8xh200", "0.5.20", 1024),
        ("--tp 8", "8xmi300x", "0.5.22", 0),
        # 0.5.23's breakable graph, up to the chunked prefill size (8192 at most for MLA); off for DeepSeek-V3 on
        # trtllm_mla attention, which SM100 picks for it by itself
        ("--tp 8", "8xh200", "0.5.23", 8192),
        ("--tp 8 --chunked-prefill-size 4096", "8xh200", "0.5.23", 4096),
        ("--tp 8", "8xb200", "0.5.23", 0),
        ("--tp 8 --attention-backend flashinfer", "8xb200", "0.5.23", 8192),
        ("--tp 8 --pp-size 2", "16xh200", "0.5.23", 0),
        ("--tp 8 --disable-prefill-cuda-graph", "8xh200", "0.5.23", 0),
        ("--tp 8 --cuda-graph-backend-decode disabled", "8xh200", "0.5.23", 8192),  # the decode phase alone
        ("--tp 8 --disable-cuda-graph", "8xh200", "0.5.23", 0),
    ],
)
def test_the_prefill_steps_sglang_runs_under_a_cuda_graph(flags, cluster, version, tokens):
    setup = resolve(flags, model="deepseek-r1", cluster=cluster, version=version)
    assert setup.valid, setup.rejections
    assert setup.layout.options.prefill_graph_tokens == tokens


def test_kimi_k2_6s_breakable_prefill_graph_is_not_deepseek_v3s():
    """SGLang matches the checkpoint's first architecture: Kimi K2.6's is its multimodal wrapper, so the trtllm_mla
    rule of DeepSeek-V3 leaves its prefill graph on (0.5.23)."""
    setup = resolve("--tp 8", model="kimi-k2.6", cluster="8xb200", version="0.5.23")
    assert setup.layout.options.prefill_cuda_graph and setup.layout.options.prefill_graph_tokens == 8192


def test_a_pipelines_chosen_prefill_graph_holds_8192_tokens_at_most():
    """arg_groups/memory_hook.py (0.5.19 on): a pipeline's breakable graph runs only when chosen, up to 8192."""
    flags = "--tp 8 --pp-size 2 --cuda-graph-backend-prefill breakable --chunked-prefill-size 16384"
    setup = resolve(flags, model="qwen3-8b", cluster="16xh200", version="0.5.20")
    assert setup.layout.options.prefill_graph_tokens == 8192
    assert (
        resolve(flags, model="qwen3-8b", cluster="16xh200", version="0.5.18").layout.options.prefill_graph_tokens
        == 16384
    )


def test_kimi_k2_6_with_dcp_has_no_tc_piecewise_prefill_graph():
    """0.5.16-0.5.17 hand Kimi K2.6 tc_piecewise, whose checks include DCP from 0.5.16."""
    setup = resolve(
        "--tp 8 --dcp-size 8 --attention-backend flashinfer", model="kimi-k2.6", cluster="8xh200", version="0.5.16"
    )
    assert setup.valid, setup.rejections
    assert setup.layout.options.prefill_graph_tokens == 0


@pytest.mark.parametrize("version, tokens", [("0.5.14", 0), ("0.5.15", 0), ("0.5.16", 2048), ("0.5.18", 2048)])
def test_kimi_k2_6s_prefill_graph_by_release(version, tokens):
    """Kimi K2.6 is multimodal (its wrapper architecture): 0.5.14's tc_piecewise and 0.5.15's breakable graph skip
    it, 0.5.16-0.5.17 hand its language model tc_piecewise (validated for it), and from 0.5.18 the breakable graph
    serves it (both lists name it; breakable wins), 2048 tokens of an MLA model."""
    setup = resolve("--tp 8", model="kimi-k2.6", cluster="8xh200", version=version)
    assert setup.layout.options.prefill_graph_tokens == tokens


@pytest.mark.parametrize(
    "flags, version, graphed",
    [
        ("--tp 8", "0.5.23", True),
        ("--tp 8 --disable-decode-cuda-graph", "0.5.23", False),
        ("--tp 8 --disable-decode-cuda-graph", "0.5.14", False),
        ("--tp 8 --cuda-graph-backend-decode disabled", "0.5.18", False),
        ("--tp 8 --disable-cuda-graph --cuda-graph-backend-decode full", "0.5.23", True),  # the chosen backend wins
        ("--tp 8 --disable-prefill-cuda-graph", "0.5.23", True),  # prefill alone
    ],
)
def test_the_decode_graph_switches_by_precedence(flags, version, graphed):
    """server_args.py _parse_cuda_graph_config (0.5.14 on): --cuda-graph-backend-decode, then
    --disable-decode-cuda-graph, then --disable-cuda-graph, which sets both phases."""
    setup = resolve(flags, model="deepseek-r1", cluster="8xh200", version=version)
    assert setup.valid, setup.rejections
    assert setup.layout.options.cuda_graph is graphed


def test_the_prefill_backends_each_release_takes():
    """The parser's choices (Backend.ALL: tc_piecewise gone from 0.5.22) and 0.5.14's refusal of a full prefill graph,
    which its parser still offers."""
    assert resolve("--tp 8 --cuda-graph-backend-prefill tc_piecewise", version="0.5.21").valid
    late = resolve("--tp 8 --cuda-graph-backend-prefill tc_piecewise", version="0.5.22")
    assert not late.valid and "invalid choice" in late.rejections[0].reason
    assert rules(resolve("--tp 8 --cuda-graph-backend-prefill full", version="0.5.14")) == ["prefill_graph_backend"]
    assert resolve("--tp 8 --cuda-graph-backend-prefill full", version="0.5.15").valid
    assert not resolve("--tp 8 --cuda-graph-backend-prefill breakable", version="0.5.13").valid  # no such flag


def test_the_piecewise_flags_exist_in_the_releases_that_parse_them():
    assert resolve(
        "--tp 8 --disable-piecewise-cuda-graph", model="deepseek-r1", cluster="8xb200", version="0.5.19"
    ).valid
    late = resolve("--tp 8 --disable-piecewise-cuda-graph", model="deepseek-r1", cluster="8xb200", version="0.5.23")
    early = resolve("--tp 8 --enable-piecewise-cuda-graph", model="deepseek-r1", cluster="8xb200", version="0.5.3")
    assert not late.valid and not early.valid


def test_eagle_without_its_shape_drafts_the_engines_choice():
    """NEXTN (EAGLE) with none of steps, top-k and draft tokens: SGLang chooses 3 steps, top-1, 4 draft tokens for
    DeepSeek-style models (server_args.py auto_choose_speculative_params; speculative_hook.py from 0.5.13)."""
    setup = resolve("--tp 8 --speculative-algorithm NEXTN")
    f = setup.flags
    assert (f["speculative_num_steps"], f["speculative_eagle_topk"], f["speculative_num_draft_tokens"]) == (3, 1, 4)
    assert any("drafts 3 steps" in n.message for n in setup.notes)
