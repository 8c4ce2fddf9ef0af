"""Per-GPU memory, KV capacity and start-up verdicts, against hand-computed sums and the engines' formulas."""

import pytest
from packaging.version import Version

from shardwise import load_cluster, load_model
from shardwise.cost.memory import kv_bytes_per_token, memory_ledger, stage_layers
from shardwise.cost.step import StepCostModel
from shardwise.engines.base import get_engine
from shardwise.engines.sglang_memory import auto_mem_fraction
from shardwise.ops.types import Phase

GB, GiB = 1e9, 2**30


def argv(engine: str, flags: str) -> list[str]:
    """Flags after the launcher, with the model where each engine wants it."""
    return (["--model-path", "some/model"] if engine == "sglang" else ["some/model"]) + flags.split()


def ledger(engine: str, flags: str, *, model="kimi-k2.6", cluster="8xrtx-pro-6000"):
    spec, box = load_model(model), load_cluster(cluster)
    setup = get_engine(engine).resolve(argv(engine, flags), model=spec, cluster=box)
    assert setup.layout is not None, setup.rejections
    return memory_ledger(spec, setup.layout, box), setup


# --- the user's case -----------------------------------------------------------------------------------


def test_kimi_tp8_loads_with_about_74_gb_per_gpu():
    memory, _ = ledger("sglang", "--tp 8 --mem-fraction-static 0.85")
    per_gpu = memory.per_gpu[0].weights_bytes
    # 594 GB / 8 = 74.3 GB sharded, plus what every GPU keeps whole: the MLA down-projections q_a and kv_a
    # (1.85 GB), the router (0.33 GB), the vision tower (0.94 GB) and norms
    assert 74 * GB < per_gpu < 78 * GB
    assert memory.weights_by_component_bytes["routed_experts"] == pytest.approx(570.76 * GB / 8, rel=1e-3)
    assert memory.weights_by_component_bytes["attn.kv_a"] == pytest.approx(61 * 576 * 7168 * 2)  # whole
    assert memory.verdict == "ok" and len(memory.per_gpu) == 8


def test_kimi_tp4_ep2_is_an_oom_at_load():
    memory, setup = ledger("sglang", "--tp-size 4 --ep-size 2")
    assert setup.gpus_used == 4
    assert memory.verdict == "oom"
    assert 145 * GB < memory.per_gpu[0].weights_bytes < 155 * GB  # ≈ 594 GB over 4 GPUs, against 96 GB cards
    assert "CUDA out of memory" in memory.engine_error and "GiB of weights" in memory.reason


def test_kimi_tp4_on_four_gpus_is_an_oom():
    memory, _ = ledger("sglang", "--tp 4", cluster="4xrtx-pro-6000")
    assert memory.verdict == "oom"


def test_vllm_tp8_loads_but_needs_a_shorter_max_model_len():
    memory, _ = ledger("vllm", "-tp 8")
    assert 74 * GB < memory.per_gpu[0].weights_bytes < 78 * GB
    # 262,144-token context × 70,272 B needs 17.2 GiB of KV on every GPU; less is left after 0.92 × 95.6 GiB
    assert memory.verdict == "no_kv_room" and "max seq len (262144)" in memory.engine_error
    short, _ = ledger("vllm", "-tp 8 --max-model-len 32768")
    assert short.verdict == "ok" and short.kv_tokens_per_rank > 32768


def test_deepseek_v3_fp8_fits_h200_not_h100():
    h200, _ = ledger("sglang", "--tp 8", model="deepseek-v3", cluster="8xh200")
    assert h200.verdict == "ok" and h200.kv_tokens_per_rank > 100_000
    h100, _ = ledger("sglang", "--tp 8", model="deepseek-v3", cluster="8xh100")
    assert h100.verdict in ("oom", "no_kv_room")
    assert h100.per_gpu[0].weights_bytes > 79 * GiB  # 673 GB / 8 plus the replicated parts, on 79.6 GiB cards


# --- SGLang's mem_fraction_static, against the worked examples of its formula --------------------------


@pytest.mark.parametrize(
    "cluster, gpu_mem_mib, attn_dp, version, reserved, fraction",
    [
        # 512 + 8192 × 1.5 + 8/8 × 1024 + 512 × 2 + 1536 (MLA prefill graph) = 16,384 MiB
        ("8xh200", 143_771, 1, "0.5.23", 16_384, 0.886),
        ("8xh200", 143_771, 8, "0.5.23", 34_816, 0.758),  # + 512 × 8 × 3 + 512 × 8 × 1.5 for attention DP
        ("8xh100", 81_559, 1, "0.5.23", 16_384, 0.799),
        ("8xb200", 183_359, 1, "0.5.23", 28_672, 0.844),  # chunk 16384 on ≥ 160 GiB GPUs
        ("8xb200", 183_359, 8, "0.5.23", 47_104, 0.743),
        ("8xh200", 143_771, 1, "0.5.9", 14_848, 0.897),  # no prefill-graph term in 0.5.9
        ("8xh200", 143_771, 8, "0.5.9", 33_280, 0.769),
        ("8xh100", 81_559, 1, "0.5.9", 14_848, 0.818),
    ],
)
def test_sglang_auto_mem_fraction(cluster, gpu_mem_mib, attn_dp, version, reserved, fraction):
    """The worked examples of SGLang's formula in shared/reference/frameworks.md §1.9 (DeepSeek-V3, tp 8)."""
    model = load_model("deepseek-v3")
    flags = "--tp 8" if attn_dp == 1 else f"--tp 8 --dp-size {attn_dp} --enable-dp-attention"
    setup = get_engine("sglang").resolve(
        argv("sglang", flags), model=model, cluster=load_cluster(cluster), version=version
    )
    got_fraction, got_reserved = auto_mem_fraction(
        setup.flags, model=model, gpu_mem_mib=gpu_mem_mib, version=Version(version)
    )
    assert (got_reserved, got_fraction) == (reserved, fraction)


def test_sglang_vlm_fraction_and_explicit_fraction():
    """Kimi K2.6 is multimodal: SGLang reloads its config with KimiK25VisionConfig, which reads num_hidden_layers
    and hidden_size (defaults 27 and 1152; the checkpoint names them vt_*), so adjust_mem_fraction_for_vlm scales
    by 0.95 × (1 − 0.1 × (27·1152² / (24·1024²) − 1)) = 0.9097, and TP8 at the default has no KV room."""
    memory, setup = ledger("sglang", "--tp 8")
    factor = 0.95 * (1 - 0.1 * (27 * 1152**2 / (24 * 1024**2) - 1))
    assert factor == pytest.approx(0.9097, abs=1e-4)
    assert setup.flags["mem_fraction_static"] == pytest.approx(round((97887 - 16384) / 97887, 3) * factor)
    assert memory.verdict == "no_kv_room" and "Loaded weights leave no GPU memory" in memory.engine_error
    _, given = ledger("sglang", "--tp 8 --mem-fraction-static 0.93")
    assert given.flags["mem_fraction_static"] == 0.93


def test_sglang_kv_pool_is_fraction_of_free_memory_minus_weights():
    memory, setup = ledger("sglang", "--tp 8 --mem-fraction-static 0.93")
    row = memory.per_gpu[0]
    runtime = row.runtime_bytes - 100 * 2**20  # the VLM embedding cache comes out of the KV budget
    expected = 0.93 * (row.capacity_bytes - runtime) - row.weights_bytes - 100 * 2**20
    assert row.kv_bytes == pytest.approx(expected)
    assert memory.kv_tokens_per_rank == int(expected // 70_272)


def test_sglang_no_kv_room_message():
    memory, _ = ledger("sglang", "--tp 8 --attn-dp-size 8 --ep 8")  # attention copied ×8: weights outgrow 0.61
    assert memory.verdict == "no_kv_room"
    assert memory.engine_error.startswith(
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static="
    )


def test_vllm_kv_budget_subtracts_activations_and_graphs():
    memory, setup = ledger("vllm", "-tp 8 --max-model-len 32768 --gpu-memory-utilization 0.9")
    row = memory.per_gpu[0]
    expected = (
        0.9 * row.capacity_bytes - row.weights_bytes - row.runtime_bytes - row.activation_bytes - (row.cuda_graph_bytes)
    )
    assert row.kv_bytes == pytest.approx(expected)
    assert memory.kv_tokens_per_rank == int(expected // 70_272) // 16 * 16  # whole blocks of 16 tokens


# --- KV bytes per token per GPU of every family -------------------------------------------------------


@pytest.mark.parametrize(
    "model, flags, per_gpu",
    [
        ("kimi-k2.6", "--tp 8", 70_272),  # MLA latent, replicated on every attention-TP rank
        ("deepseek-v3", "--tp 8", 70_272),
        ("llama-3.1-70b", "--tp 8", 327_680 // 8),  # 8 KV heads over 8 ranks: one each
        ("qwen3-235b-a22b", "--tp 8", 192_512 // 4),  # 4 KV heads over 8 ranks: one (replicated) each
        ("qwen3-30b-a3b", "--tp 2", 98_304 // 2),
        ("mixtral-8x7b", "--tp 4", 131_072 // 4),
        # 8 KV heads over 4 ranks: 18 full layers + 0.8 × 18 sliding (their own pool, 0.8 × as many tokens)
        ("gpt-oss-120b", "--tp 4", 16_588.8),  # (18 + 0.8 × 18) × 2048 / 4
        ("glm-4.5", "--tp 8", 376_832 // 8),
        ("minimax-m2", "--tp 8 --ep 8", 253_952 // 8),  # FP8 blocks: 1536 / 8 is no whole block without EP
        ("qwen3-next-80b-a3b", "--tp 2", 24_576 // 2),  # 12 full-attention layers; linear layers keep a state
    ],
)
def test_kv_bytes_per_token_per_gpu(model, flags, per_gpu):
    spec = load_model(model)
    cluster = "8xh200"
    setup = get_engine("sglang").resolve(argv("sglang", flags), model=spec, cluster=load_cluster(cluster))
    assert kv_bytes_per_token(spec, setup.layout, range(spec.num_layers)) == per_gpu


def test_decode_context_parallel_multiplies_capacity():
    plain, _ = ledger("sglang", "--tp 8 --mem-fraction-static 0.93")
    dcp, _ = ledger("sglang", "--tp 8 --dcp-size 8 --attention-backend flashinfer --mem-fraction-static 0.93")
    assert dcp.kv_tokens_per_rank == plain.kv_tokens_per_rank * 8


def test_attention_dp_pools_add_up():
    memory, _ = ledger("sglang", "--tp 8 --attn-dp-size 8 --ep 8 --mem-fraction-static 0.94")
    assert memory.ranks == 8 and memory.kv_tokens_total == memory.kv_tokens_per_rank * 8
    # the max concurrency counts whole requests per pool
    per_pool = memory.kv_tokens_per_rank // 2048
    assert memory.max_concurrency(isl=1024, osl=1024) == min(per_pool, memory.max_running_requests_per_rank) * 8


def test_pipeline_stage_layer_splits():
    # 61 layers over 8 stages: SGLang puts the 5 extra layers on the last stages, vLLM on those before the last
    assert [len(r) for r in stage_layers(61, 8, "last")] == [7, 7, 7, 8, 8, 8, 8, 8]
    assert [len(r) for r in stage_layers(61, 8, "before_last")] == [7, 7, 8, 8, 8, 8, 8, 7]
    assert [len(r) for r in stage_layers(61, 1, "last")] == [61]


def test_pp8_keeps_embeddings_first_and_lm_head_last():
    memory, _ = ledger("sglang", "--pp-size 8 --mem-fraction-static 0.95")
    by_stage = {row.stage: row.weights_bytes for row in memory.per_gpu}
    assert len(by_stage) == 8 and by_stage[7] > by_stage[3]  # 8 layers + the whole lm_head (tp 1)


def test_attention_dp_reserves_graph_padding_with_graphs_off():
    """SGLang sizes the decode graph's max batch (512 on an 80 GB GPU at tp ≥ 4) whether or not graphs run, and
    reserve_for_graph_mb adds max_bs × attn_dp × 3 MiB (× 1.5 more above 300) for attention DP: 18,432 MiB here
    (memory_hook.py; the real SGLang 0.5.23 resolves 0.605). gpt-oss-120b DP8 on 8× H100 keeps about 36.9 GiB of
    KV cache per GPU, not the 54 it would without that reserve."""
    memory, setup = ledger("sglang", "--tp-size 8 --attn-dp-size 8 --disable-cuda-graph", model="gpt-oss-120b",
                           cluster="8xh100")  # fmt: skip
    assert setup.flags["mem_fraction_static"] == pytest.approx(round((81559 - (13824 + 18432)) / 81559, 3))
    assert memory.per_gpu[0].kv_bytes / GiB == pytest.approx(36.9, rel=0.05)


def test_vllm_034_sizes_the_extensible_cache_after_capture():
    """v1/worker/extensible_kv_cache.py measure_kv_cache_bytes: min(budget − in use, free − max(1 GiB, 0.75 × peak))
    − peak, the budget 1.0 × the GPU; with 0.92 explicitly the budget binds instead."""
    llama, h100 = load_model("llama-3.1-70b"), load_cluster("8xh100")
    for flags, budget_binds in (("-tp 8", False), ("-tp 8 --gpu-memory-utilization 0.92", True)):
        setup = get_engine("vllm").resolve(["m", *flags.split()], model=llama, cluster=h100, version="0.34.0")
        row = memory_ledger(llama, setup.layout, h100).per_gpu[0]
        in_use = row.weights_bytes + row.runtime_bytes + row.cuda_graph_bytes
        margin = max(GiB, 0.75 * row.activation_bytes)
        free = row.capacity_bytes - in_use - margin
        budget = setup.layout.options.memory_fraction * row.capacity_bytes - in_use
        assert (budget < free) is budget_binds
        assert row.kv_bytes == pytest.approx(min(budget, free) - row.activation_bytes)


def test_the_raised_fraction_keeps_what_sglang_reserves():
    """The largest fraction theorise tries leaves each GPU its activation peak, graphs, the CUDA-stack uncertainty
    (1.79 GiB: one GPU's against several GPUs' measured stack) and attention DP's padding (512 × 8 × 4.5 MiB).
    SGLang's ×0.9097 for Kimi's vision tower is not taken: the engine applies it to its own default only."""
    memory, setup = ledger("sglang", "--tp 8 --attn-dp-size 8 --ep 8 --disable-cuda-graph")
    row = memory.per_gpu[0]
    rt = row.runtime_bytes - 100 * 2**20  # the VLM cache is inside the fraction
    outside = row.activation_bytes + row.cuda_graph_bytes + 1.79 * GiB + 512 * 8 * 4.5 * 2**20
    expected = 1 - outside / (row.capacity_bytes - rt)
    assert memory.largest_fraction == pytest.approx(expected, rel=1e-3)
    assert setup.layout.options.fraction_scale == pytest.approx(0.95 * (1 - 0.1 * (27 * 1152**2 / (24 * 1024**2) - 1)))


# --- sliding-window layers under vLLM's hybrid KV cache manager -----------------------------------------


def test_vllm_keeps_only_the_window_of_gpt_oss_sliding_layers():
    """gpt-oss-120b: 18 full and 18 sliding-window (128) layers, in two KV groups of 18 layers (vLLM's
    _get_kv_cache_groups_uniform_page_size); a pool token is one group's, 18 × 2,048 B = 36,864 B on one H100.
    vLLM's hybrid manager frees the blocks the window has passed, so the sliding group keeps ceil(127 / 16) + 1 = 9
    blocks of 16 tokens: 144. A request of 411 tokens takes 411 tokens of the full group and 144 of the sliding
    one: 555 pool tokens; one of 100 takes 100 of each."""
    memory, _ = ledger("vllm", "", model="gpt-oss-120b", cluster="1xh100")
    assert memory.kv_bytes_per_token == 18 * 2 * 8 * 64 * 2 == 36_864
    assert memory.kv_window_tokens == 144 and (memory.kv_full_groups, memory.kv_window_groups) == (1, 1)
    assert memory.request_tokens(411) == 411 + 144
    assert memory.request_tokens(100) == 200  # inside the window both groups keep every token
    # the pool holds 2 × 411 / 555 = 1.48 times as many such requests as it would keep whole (in both groups)
    usable = memory.kv_tokens_per_rank - 16  # less the null block
    assert memory.max_concurrency(isl=215, osl=196) == min(1024, usable // 555)
    assert memory.max_concurrency(isl=215, osl=196) > 1.4 * (usable // (2 * 411))


@pytest.mark.parametrize(
    "engine, flags, model",
    [
        ("vllm", "--disable-hybrid-kv-cache-manager", "gpt-oss-120b"),  # the user turns it off
        ("vllm", "", "llama-3.1-70b"),  # no sliding-window layers
        ("sglang", "--disable-hybrid-swa-memory", "gpt-oss-120b"),  # SGLang's window pool turned off
    ],
)
def test_every_token_is_kept_where_the_rule_does_not_apply(engine, flags, model):
    memory, _ = ledger(engine, flags, model=model, cluster="1xh100" if model == "gpt-oss-120b" else "8xh100")
    assert memory.kv_window_tokens is None and memory.request_tokens(411) == 411


def test_vllm_sliding_window_start_up_check_and_its_suggested_length():
    """At utilization 0.85 on one H100 the pool holds 38,144 tokens: too few for one 131,072-token request even
    with the sliding layers' window, and the length it suggests is the longest whose need fits (its sliding
    layers keep the window plus two chunks in flight: 1,033 blocks)."""
    memory, _ = ledger("vllm", "--gpu-memory-utilization 0.85", model="gpt-oss-120b", cluster="1xh100")
    assert memory.verdict == "no_kv_room" and "at most 59,760" in (memory.reason or "")
    fits, _ = ledger("vllm", "--gpu-memory-utilization 0.85 --max-model-len 59760", model="gpt-oss-120b",
                     cluster="1xh100")  # fmt: skip
    longer, _ = ledger("vllm", "--gpu-memory-utilization 0.85 --max-model-len 59792", model="gpt-oss-120b",
                       cluster="1xh100")  # fmt: skip
    assert fits.verdict == "ok" and longer.verdict == "no_kv_room"


def test_a_request_longer_than_the_pool_in_tokens_runs_when_its_window_fits():
    """gpt-oss-120b on one H100: the pool's 238,688 tokens of one KV group are 119,344 tokens of every layer, fewer
    than a request of 124,000 + 8 tokens; but it takes 124,008 tokens of the full group and 144 of the sliding one
    (124,152), which fit, so the simulation serves it."""
    from shardwise.serve.simulate import simulate
    from shardwise.serve.steps import StepTimes
    from shardwise.spec.workload import Lengths, WorkloadSpec

    memory, setup = ledger("vllm", "", model="gpt-oss-120b", cluster="1xh100")
    assert memory.kv_tokens_per_rank // 2 < 124_008 and memory.request_tokens(124_008) < memory.kv_tokens_per_rank
    steps = StepTimes(load_model("gpt-oss-120b"), setup.layout, load_cluster("1xh100"))
    workload = WorkloadSpec(input=Lengths.fixed(124_000), output=Lengths.fixed(8), num_requests=1, concurrency=1)
    result = simulate(steps, memory, workload)
    assert result.requests == 1 and result.retractions == 0


def test_a_gpu_left_without_room_for_activations_is_named_with_its_figures():
    """The fraction raised to 0.97 with a 32k prefill chunk starts, but leaves each GPU less than its activation peak
    and graphs need: the warning names the tightest GPU and what its row says is left."""
    memory, _ = ledger("sglang", "--tp 8 --ep 8 --mem-fraction-static 0.97 --chunked-prefill-size 32768")
    tight = min(memory.per_gpu, key=lambda row: row.free_bytes)
    need = tight.activation_bytes + tight.cuda_graph_bytes
    assert memory.verdict == "ok" and tight.free_bytes < 0
    said = " ".join(memory.warnings)
    assert f"GPU {tight.gpu}: activations at the prefill chunk (unchunked, the prefill budget) and CUDA graphs need " \
           f"about {need / GiB:.1f} GiB but {(need + tight.free_bytes) / GiB:.1f} GiB remain" in said  # fmt: skip
    assert len(memory.stages) == 1 and memory.stages[0].kv_bytes == memory.kv_pool_bytes


def test_each_pipeline_stage_has_its_row_with_its_own_weights():
    memory, _ = ledger("sglang", "--tp 4 --pp-size 2 --mem-fraction-static 0.85")
    assert [row.stage for row in memory.stages] == [0, 1]
    assert [row.gpu for row in memory.stages] == [memory.gpu_stages.index(0), memory.gpu_stages.index(1)]
    assert tuple(row.weights_bytes for row in memory.stages) == memory.stage_weights_bytes
    assert memory.stage_weights_bytes[0] != memory.stage_weights_bytes[1]  # the embedding and the head apart


def test_a_ledger_copied_with_other_figures_shows_them_in_its_rows():
    memory, _ = ledger("sglang", "--tp 8 --ep 8 --mem-fraction-static 0.85")
    assert memory.stages[0].kv_bytes == memory.kv_pool_bytes > 0
    emptied = memory.model_copy(update={"kv_pool_bytes": 0.0})
    assert emptied.stages[0].kv_bytes == 0.0 and all(row.kv_bytes == 0.0 for row in emptied.per_gpu)


# --- linear-attention states in a pool of their own (SGLang's mamba pool) -------------------------------


def _state_ledger(model: str, flags: str, version: str, tp: int = 8):
    spec, box = load_model(model), load_cluster("8xrtx-pro-6000")
    setup = get_engine("sglang").resolve(argv("sglang", f"--tp {tp} {flags}"), model=spec, cluster=box, version=version)
    assert setup.layout is not None, setup.rejections
    return memory_ledger(spec, setup.layout, box), setup.layout


def test_sglang_gives_qwen3_5_states_a_pool_that_caps_its_running_requests():
    """Qwen3.5 under TP8, SGLang 0.5.23: one request's state on a GPU is 45 linear layers × (the conv window, 3 ×
    (2·16·128 + 64·128) / 8 channels in BF16, + the recurrent state, 64 / 8 heads × 128 × 128 in FP32); K slots
    fill 0.9 / 1.9 of what the KV and state pools share, less the pool's padding slot; each running request holds 3
    + 2 slots (extra_buffer under the overlap scheduler)."""
    memory, layout = _state_ledger("qwen3.5-397b-a17b-nvfp4", "", "0.5.23")
    state = 45 * (3 * 12288 // 8 * 2 + 64 // 8 * 128 * 128 * 4)
    assert memory.state_bytes_per_request == pytest.approx(state)
    shared = memory.kv_pool_bytes + memory.state_pool_bytes
    slots = int((shared * 0.9 / 1.9 - state) // state)
    assert memory.state_slots_per_rank == slots and memory.state_pool_bytes == pytest.approx((slots + 1) * state)
    assert memory.max_running_requests_per_rank == slots // 5
    assert memory.max_concurrency(isl=1024, osl=1024) == slots // 5  # the states bind long before the KV pool
    assert layout.options.overlap_schedule
    # without the radix cache a request holds its own slot alone
    plain, _ = _state_ledger("qwen3.5-397b-a17b-nvfp4", "--disable-radix-cache", "0.5.23")
    assert plain.max_running_requests_per_rank == plain.state_slots_per_rank


def test_sglang_0_5_9_holds_three_slots_a_request_and_runs_hybrids_without_the_overlap_scheduler():
    memory, layout = _state_ledger("qwen3-next-80b-a3b", "", "0.5.9", tp=4)
    # Qwen3-Next names no mamba_ssm_dtype: SGLang keeps the recurrent state in FP32 all the same
    assert memory.state_bytes_per_request == pytest.approx(36 * (3 * 8192 // 4 * 2 + 32 // 4 * 128 * 128 * 4))
    shared = memory.kv_pool_bytes + memory.state_pool_bytes
    slots = int(shared * 0.9 / 1.9 // memory.state_bytes_per_request)  # no padding slot taken off before 0.5.17
    assert memory.state_slots_per_rank == slots and memory.max_running_requests_per_rank == slots // 3
    assert not layout.options.overlap_schedule  # no_buffer turns it off
    _, later = _state_ledger("qwen3-next-80b-a3b", "", "0.5.14", tp=4)
    assert later.options.overlap_schedule  # extra_buffer from 0.5.14


def test_a_model_without_linear_attention_has_no_state_pool():
    memory, setup = ledger("sglang", "--tp 8")
    assert setup.layout.options.state_pool is None and memory.state_slots_per_rank is None


def test_the_state_pool_flags_set_its_slots_and_share():
    given, _ = _state_ledger("qwen3.5-397b-a17b-nvfp4", "--max-mamba-cache-size 100", "0.5.23")
    assert given.state_slots_per_rank == 100 and given.max_running_requests_per_rank == 100 // 5
    half, _ = _state_ledger("qwen3.5-397b-a17b-nvfp4", "--mamba-full-memory-ratio 0.5", "0.5.23")
    shared = half.kv_pool_bytes + half.state_pool_bytes
    assert half.state_slots_per_rank == int((shared * 0.5 / 1.5 - half.state_bytes_per_request) //
                                            half.state_bytes_per_request)  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "model", "cluster", "cell"),
    [
        # FP8 latents with per-128 scales and a BF16 RoPE key, 656 B, on the SM 12.x and SM 9.0 FP8 backends
        ("sglang", "glm-5.1-nvfp4", "8xrtx-pro-6000", 78 * (512 + 4 * 4 + 64 * 2) + 78 * 132),
        ("vllm", "glm-5.1-nvfp4", "8xrtx-pro-6000", 78 * 656 + 78 * 132),
        ("vllm", "glm-5.1-nvfp4", "8xh200", 78 * 656 + 78 * 132),  # the checkpoint's FP8 cache
        # SGLang caches sparse attention in BF16 before SM 10 unless told otherwise
        ("sglang", "glm-5.1-nvfp4", "8xh200", 78 * 576 * 2 + 78 * 132),
        # and in plain FP8 (trtllm's 576 B) on SM 10.x, where vLLM's unset dtype is FP8 too
        ("sglang", "glm-5.1-nvfp4", "8xb200", 78 * 576 + 78 * 132),
        ("vllm", "glm-5.1", "8xb200", 78 * 576 + 78 * 132),
    ],
)
def test_sparse_attention_caches_as_each_engine_lays_it_out_per_gpu(engine, model, cluster, cell):
    memory, setup = ledger(engine, "--tp 8" if engine == "sglang" else "--tensor-parallel-size 8", model=model,
                           cluster=cluster)  # fmt: skip
    assert memory.kv_bytes_per_token == cell
    assert setup.layout.options.page_size == 64


def test_without_the_radix_cache_the_state_pool_holds_the_running_requests_it_allows():
    memory, _ = _state_ledger("qwen3.5-397b-a17b-nvfp4", "--disable-radix-cache --max-running-requests 64", "0.5.23")
    assert memory.state_slots_per_rank == 64
    assert memory.state_pool_bytes == pytest.approx(65 * memory.state_bytes_per_request)  # and its padding slot


def test_speculative_decoding_sizes_the_state_pool_with_its_draft_tokens_scratch():
    """NEXTN with 4 draft tokens under 0.5.23: K = (share − S · 5) / (S · (1 + 4 / 5)), and the scratch of
    min(48 running requests, K / 5) + 1 requests' 4 draft tokens comes off the KV budget too."""
    flags = "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
    memory, _ = _state_ledger("qwen3.5-397b-a17b-nvfp4", flags + "--speculative-num-draft-tokens 4", "0.5.23")
    state, slots = memory.state_bytes_per_request, memory.state_slots_per_rank
    assert memory.max_running_requests_per_rank == 48  # speculative decoding's default cap
    taken = (slots + 1) * state + (min(48, slots // 5) + 1) * 4 * state
    assert memory.state_pool_bytes == pytest.approx(taken)
    share = (memory.kv_pool_bytes + taken) * 0.9 / 1.9
    assert slots == int((share - state * 5) // (state * (1 + 4 / 5)))


def test_sglang_reads_the_recurrent_states_dtype_from_its_flag_then_the_config_then_fp32():
    bf16, _ = _state_ledger("qwen3.5-397b-a17b-nvfp4", "--mamba-ssm-dtype bfloat16", "0.5.23")
    assert bf16.state_bytes_per_request == pytest.approx(45 * (3 * 12288 // 8 * 2 + 64 // 8 * 128 * 128 * 2))
    # a decode step reads the state SGLang keeps: FP32 for Qwen3-Next, whose config names none
    spec, box = load_model("qwen3-next-80b-a3b"), load_cluster("8xrtx-pro-6000")
    setup = get_engine("sglang").resolve(argv("sglang", "--tp 4"), model=spec, cluster=box)
    ops = StepCostModel.of(spec, setup.layout, box).step_model.ops(phase=Phase.DECODE, requests=1, new_tokens=1,
                                                                 context_tokens=0)  # fmt: skip
    linear = next(o for o in ops if o.name == "linear attention")
    assert linear.bytes == pytest.approx(2 * (3 * 8192 * 2 + 32 * 128 * 128 * 4) / 4)  # read and written, a quarter


def test_the_radix_cache_strategy_and_linear_attention_backend_set_the_slots_a_request_holds():
    lazy, _ = _state_ledger("qwen3.5-397b-a17b-nvfp4", "--mamba-radix-cache-strategy extra_buffer_lazy", "0.5.23")
    assert lazy.max_running_requests_per_rank == lazy.state_slots_per_rank // 4
    other, layout = _state_ledger("qwen3.5-397b-a17b-nvfp4", "--linear-attn-backend flashinfer", "0.5.23")
    assert other.max_running_requests_per_rank == other.state_slots_per_rank // 3  # no extra buffer for it
    assert not layout.options.overlap_schedule


@pytest.mark.parametrize(
    ("version", "cluster", "cell"),
    [
        ("0.5.9", "8xb200", 78 * 656 + 78 * 132),  # flashmla_kv's scaled latents on every GPU
        ("0.5.14", "8xrtx-pro-6000", 78 * 576 + 78 * 132),  # trtllm from SM 10 on, SM 12 included
        ("0.5.17", "8xrtx-pro-6000", 78 * 656 + 78 * 132),  # GLM-5 on SM 12.x: flashinfer_sparse_mla
    ],
)
def test_sglangs_sparse_attention_layout_by_release(version, cluster, cell):
    spec, box = load_model("glm-5.1-nvfp4"), load_cluster(cluster)
    setup = get_engine("sglang").resolve(argv("sglang", "--tp 8"), model=spec, cluster=box, version=version)
    assert memory_ledger(spec, setup.layout, box).kv_bytes_per_token == cell


def test_glm_5_2s_reused_layers_keep_no_indexer_keys_from_0_5_18():
    spec, box = load_model("glm-5.2-nvfp4"), load_cluster("8xb200")
    cells = {}
    for version in ("0.5.17", "0.5.18"):
        setup = get_engine("sglang").resolve(argv("sglang", "--tp 8"), model=spec, cluster=box, version=version)
        cells[version] = memory_ledger(spec, setup.layout, box).kv_bytes_per_token
    assert cells == {"0.5.17": 78 * 576 + 78 * 132, "0.5.18": 78 * 576 + 21 * 132}


def test_sglang_0_5_9_runs_speculative_hybrids_without_the_radix_cache_a_slot_a_request():
    """0.5.9, NEXTN with 4 draft tokens and 64 running requests (the PCIe set's Qwen3.5 command): no_buffer turns the
    radix cache off under speculative decoding, so K is the 64 running requests, one slot each, and their 4 draft
    tokens' scratch states are taken off the KV budget first: 64 · S · (1 + 4)."""
    flags = "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
    memory, _ = _state_ledger(
        "qwen3.5-397b-a17b-nvfp4",
        flags + "--speculative-num-draft-tokens 4 --max-running-requests 64 --mem-fraction-static 0.97",
        "0.5.9",
        tp=4,
    )
    state = memory.state_bytes_per_request
    assert memory.state_slots_per_rank == 64 and memory.max_running_requests_per_rank == 64
    assert memory.state_pool_bytes == pytest.approx(64 * state * (1 + 4))


def test_under_pp_qwen3_5_holds_four_slots_a_request():
    """SGLang resolves the extra_buffer strategy before PP turns the overlap scheduler off, so a PP2 request holds 3
    slots + 1 tracking slot (the one for a scheduler without overlap)."""
    memory, layout = _state_ledger("qwen3.5-397b-a17b-nvfp4", "--pp-size 2", "0.5.23", tp=4)
    assert memory.max_running_requests_per_rank == memory.state_slots_per_rank // 4
    assert not layout.options.overlap_schedule


@pytest.mark.parametrize("flags", ["--mamba-full-memory-ratio 0", "--max-mamba-cache-size -5"])
def test_a_state_pool_that_holds_no_request_does_not_start(flags):
    memory, _ = _state_ledger("qwen3.5-397b-a17b-nvfp4", flags, "0.5.23")
    assert memory.verdict == "no_kv_room" and "state pool holds 0 slots" in memory.reason
