"""vLLM's KV pool as its own code sizes it (conformance/vllm_oracle.py runs vLLM 0.33 / 0.34's sizing on shardwise's
memory figures): whole granules per KV tensor (0.34), the null block, each pipeline stage's own pool, the KV groups
of sliding-window models, and the profile run running out of memory. Figures quoted as "vLLM's" are what the
oracle's run of vLLM reported for the same memory figures."""

from shardwise import load_cluster, load_model
from shardwise.cost.kv_blocks import kv_groups, stage_blocks
from shardwise.cost.memory import memory_ledger
from shardwise.engines.base import get_engine

MiB = 2**20


def vllm(model: str, cluster: str, flags: str, version: str):
    spec, box = load_model(model), load_cluster(cluster)
    setup = get_engine("vllm").resolve(["m", *flags.split()], model=spec, cluster=box, version=version)
    assert setup.layout is not None, setup.rejections
    return memory_ledger(spec, setup.layout, box), setup.layout


# --- 0.34 maps each KV tensor in whole 2 MiB granules ----------------------------------------------------------


def test_each_tensor_holds_the_blocks_of_its_whole_granules():
    """3 tensors of 4,096 B per token, blocks of 16 tokens (a stride of 64 KiB per tensor), a pool of 61 MiB: whole
    blocks would be 61 MiB / (16 × 12,288 B) = 325.3 → 325; each tensor gets ⌊61 / 6⌋ = 10 granules of 2 MiB,
    20 MiB / 64 KiB = 320 blocks."""
    pool = 61 * MiB
    assert stage_blocks(pool, cell_bytes=3 * 4096, tensors=3, page=16, granule_bytes=None) == 325
    assert stage_blocks(pool, cell_bytes=3 * 4096, tensors=3, page=16, granule_bytes=2 * MiB) == 320
    assert stage_blocks(0.0, cell_bytes=3 * 4096, tensors=3, page=16, granule_bytes=2 * MiB) == 0


def test_kimi_tp8_pool_in_034_is_rounded_to_granules():
    """`vllm serve moonshotai/Kimi-K2.6 -tp 8` (0.34): a pool of 19,572,103,282 B over 61 MLA layers of
    64 × 1,152 B = 73,728 B per block each. Whole blocks: 19,572,103,282 / (61 × 73,728) = 4,351.8 → 4,351
    (278,464 tokens); in granules: ⌊19,572,103,282 / (61 × 2 MiB)⌋ = 152 each, 152 × 2 MiB / 73,728 = 4,323.6 →
    4,323 blocks: 276,672 tokens, vLLM's own count."""
    memory, layout = vllm("kimi-k2.6", "8xrtx-pro-6000", "-tp 8", "0.34.0")
    assert layout.options.kv_granule_bytes == 2 * MiB
    assert int(memory.kv_pool_bytes) == 19_572_103_282
    assert int(memory.kv_pool_bytes // (61 * 73_728)) == 4_351
    assert int(memory.kv_pool_bytes // (61 * 2 * MiB)) == 152
    assert memory.kv_tokens_per_rank == 4_323 * 64 == 276_672


def test_033_and_a_fixed_034_cache_use_the_pool_whole():
    """Granules belong to 0.34's extensible cache; 0.33, or 0.34 with --no-enable-extensible-kv-cache, count
    whole blocks of the pool."""
    for flags, version in (("-tp 8 --max-model-len 32768", "0.33.0"), ("-tp 8 --no-enable-extensible-kv-cache",
                                                                          "0.34.0")):  # fmt: skip
        memory, layout = vllm("kimi-k2.6", "8xrtx-pro-6000", flags, version)
        assert layout.options.kv_granule_bytes is None
        page = layout.options.page_size
        assert memory.kv_tokens_per_rank == int(memory.kv_pool_bytes // 70_272) // page * page


# --- the null block ----------------------------------------------------------------------------------------------


def test_the_null_block_is_not_handed_out_and_decides_the_fit():
    """`-tp 8 --enable-expert-parallel --enforce-eager` (0.34): ⌊18,475,292,786 / (61 × 2 MiB)⌋ = 144 granules,
    144 × 2 MiB / 73,728 = 4,096 blocks = 262,144 tokens, exactly one 262,144-token request; but BlockPool holds
    block 0 back, so (4,096 − 1) × 64 = 262,080 tokens serve, and vLLM refuses (kv_cache_planning.py
    shrink_kv_cache_configs), with 262,080 as the longest length that fits."""
    memory, _ = vllm("kimi-k2.6", "8xrtx-pro-6000", "-tp 8 --enable-expert-parallel --enforce-eager", "0.34.0")
    assert int(memory.kv_pool_bytes // (61 * 2 * MiB)) == 144
    assert memory.kv_tokens_per_rank == 262_144 and memory.kv_held_back_tokens_per_rank == 64
    assert memory.kv_usable_tokens_per_rank == 262_080
    assert memory.verdict == "no_kv_room" and "at most 262,080" in memory.reason
    assert memory.engine_error.startswith("ValueError: To serve at least one request with the model's max seq len")
    fits, _ = vllm("kimi-k2.6", "8xrtx-pro-6000",
                   "-tp 8 --enable-expert-parallel --enforce-eager --max-model-len 262080", "0.34.0")  # fmt: skip
    assert fits.verdict == "ok"


def test_the_null_block_under_pipeline_stages():
    """`-pp 2 -dp 4 --enable-expert-parallel --enforce-eager --max-model-len 2048` (0.34, stages of 31 and 30
    layers): 28 blocks of 64 tokens (vLLM's count), 27 of them for requests: 1,728 < 2,048."""
    flags = "-pp 2 -dp 4 --enable-expert-parallel --enforce-eager --max-model-len 2048"
    memory, _ = vllm("kimi-k2.6", "8xrtx-pro-6000", flags, "0.34.0")
    assert memory.kv_tokens_per_rank == 28 * 64 and memory.kv_usable_tokens_per_rank == 1_728
    assert memory.verdict == "no_kv_room" and "at most 1,728" in memory.reason


def test_concurrency_counts_the_blocks_requests_can_take():
    memory, _ = vllm("kimi-k2.6", "8xrtx-pro-6000", "-tp 8", "0.34.0")
    assert memory.max_concurrency(isl=1024, osl=1024) == (276_672 - 64) // 2048  # 135


# --- each pipeline stage sizes its own pool ----------------------------------------------------------------------


def test_each_stage_sizes_blocks_from_its_own_pool():
    """gpt-oss-120b `-pp 8 -dp 2` on 2×8 H100 (0.33, 0.92 × 85,520,809,984 B): the first and last stages (4
    layers: 2 tensors, 65,536 B a block) keep 67,151,607,823 B, the 5-layer middle ones (3 tensors, 98,304 B a
    block) 67,408,896,399 B. Blocks: ⌊67,151,607,823 / 65,536⌋ = 1,024,652 and ⌊67,408,896,399 / 98,304⌋ =
    685,718, the fewest: vLLM's 685,718 blocks, 10,971,488 tokens. The least pool with the costliest block would
    give ⌊67,151,607,823 / 98,304⌋ = 683,101."""
    flags = "-pp 8 -dp 2 --nnodes 2 --master-addr 10.0.0.1"
    memory, layout = vllm("gpt-oss-120b", "2x8xh100", flags, "0.33.0")
    assert layout.options.kv_pool_per_stage
    in_use = [memory.runtime_bytes + memory.activation_bytes + memory.cuda_graph_bytes + w
              for w in memory.stage_weights_bytes]  # fmt: skip
    pools = [0.92 * memory.capacity_bytes - used for used in in_use]
    assert [int(pools[s]) for s in (0, 3, 7)] == [67_151_613_583, 67_408_896_399, 67_151_607_823]
    assert int(pools[3] // 98_304) == 685_718 < int(pools[7] // 65_536) == 1_024_652
    assert memory.kv_tokens_per_rank == 685_718 * 16 == 10_971_488
    assert int(memory.kv_pool_bytes) == 67_151_607_823  # the least stage budget (each stage's own sizes its blocks)


# --- vLLM's KV groups for sliding-window layers ------------------------------------------------------------------


def test_kv_groups_follow_vllm():
    """kv_cache_planning.py _get_kv_cache_groups_uniform_page_size: groups of one size, the fewest layers of any
    type, or the most where that is under 1.5 × the fewest; of n groups of a type the i-th takes its layers i::n."""
    gpt_oss = ("sliding", "full") * 18  # 18 + 18: one group of each
    assert kv_groups(gpt_oss) == (("sliding", tuple(range(0, 36, 2))), ("full", tuple(range(1, 36, 2))))
    five_to_one = (("sliding",) * 5 + ("full",)) * 4  # 20 sliding, 4 full: groups of 4, the sliding ones in 5
    sliding = [i for i in range(24) if i % 6 != 5]
    assert kv_groups(five_to_one) == (*(("sliding", tuple(sliding[i::5])) for i in range(5)), ("full", (5, 11, 17, 23)))
    padded = ("sliding",) * 12 + ("full",) * 13  # vLLM's own example: 13 < 1.5 × 12, one group of 13 each
    assert kv_groups(padded) == (("sliding", tuple(range(12))), ("full", tuple(range(12, 25))))


def test_gpt_oss_pp8_charges_each_group_at_the_stage_largest_group():
    """`vllm serve openai/gpt-oss-120b -pp 8` (0.33): stages of 4, 4, 4, 5, 5, 5, 5, 4 layers; a 5-layer stage has 3
    layers of one group and 2 of the other, so its tensors are 3 and a block costs 3 × 16 × 2,048 = 98,304 B. The
    binding stage's pool, 63,385,559,439 B, holds 644,791 blocks: 10,316,656 tokens (vLLM's count). A request
    of 131,072 tokens takes 131,072 of the full group and 144 of the sliding one: ⌊(10,316,656 − 16) / 131,216⌋ =
    78 at once (charging 2/5 of a 5-layer token would give 117; vLLM's own figure, 50.3, reserves the window
    and 9 chunks of 8,192 in flight for the sliding group, what a long prefill may hold)."""
    memory, _ = vllm("gpt-oss-120b", "8xh100", "-pp 8", "0.33.0")
    assert memory.kv_bytes_per_token == 3 * 2048 == 6_144
    assert int(memory.kv_pool_bytes) == 63_385_559_439 and int(memory.kv_pool_bytes // 98_304) == 644_791
    assert memory.kv_tokens_per_rank == 644_791 * 16 == 10_316_656
    assert memory.request_tokens(131_072) == 131_072 + 144
    assert memory.max_concurrency(isl=130_048, osl=1_024) == 78


def test_the_start_up_check_counts_a_chunk_in_flight_per_stage():
    """The sliding group of one max_model_len request needs the window and the chunks in flight: one per stage and
    one more with async scheduling (0.34 config/vllm.py max_concurrent_batches), 8,192 tokens each. gpt-oss-120b
    at -pp 2 with --max-model-len 32768: the full group 32,768 / 64 = 512 blocks, the sliding one
    ⌈(127 + 3 × 8,192) / 64⌉ + 1 = 387, (512 + 387) × 64 = 57,536 tokens. A pool of 848 blocks (54,272 tokens,
    54,208 for requests) is too short, though two chunks in flight would need only (512 + 260) × 64 = 49,408."""
    flags = "-pp 2 --gpu-memory-utilization 0.47 --max-model-len 32768"
    memory, _ = vllm("gpt-oss-120b", "8xh100", flags, "0.34.0")
    assert memory.kv_tokens_per_rank == 848 * 64 and memory.kv_usable_tokens_per_rank == 54_208
    assert memory.verdict == "no_kv_room" and "needs (57,536)" in memory.reason


# --- the profile run's activation peak ---------------------------------------------------------------------------


def test_an_activation_peak_beyond_the_gpu_fails_the_profile_run():
    """`vllm serve moonshotai/Kimi-K2.6 -dp 8` (TP 1 per rank): 95,731,811,808 B of weights + 3,843,995,730 B of
    CUDA stack = 99,575,807,538 B load on the 102,641,958,912 B GPU, but the profile run's 8,192-token chunk peaks at
    9,462,349,824 B more (109,038,157,362 B): the torch allocator fails while profiling, before any KV sizing."""
    memory, _ = vllm("kimi-k2.6", "8xrtx-pro-6000", "-dp 8", "0.33.0")
    loaded = memory.stage_weights_bytes[0] + memory.runtime_bytes
    assert loaded < memory.capacity_bytes < loaded + memory.activation_bytes
    assert memory.verdict == "oom"
    assert memory.engine_error == "torch.OutOfMemoryError: CUDA out of memory (while profiling the activation peak)"
    assert "activation peak of the profile run" in memory.reason


# --- the refusal as vLLM words it --------------------------------------------------------------------------------


def test_the_refusal_is_the_first_worker_s_and_reads_the_memory_found_before_the_pool_is_sized():
    """vLLM checks each worker in rank order (stage 0 first) and words the first that fails, in GiB rounded as
    Python prints them; 0.34's extensible cache is checked against the memory its profile found, before CUDA graphs
    and the margin take their share of the pool. The engine's words, from the oracle's run of vLLM on shardwise's
    figures: stage 0 of Kimi -tp 2 -pp 4 on 8× H100 has room, too little (while a later stage has none at all)."""
    staged, _ = vllm("kimi-k2.6", "8xh100", "-tp 2 -pp 4", "0.33.0")
    assert staged.verdict == "no_kv_room"
    assert staged.engine_error == (
        "ValueError: To serve at least one request with the model's max seq len (262144), (4.22 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (1.25 GiB)."
    )
    extensible, _ = vllm("kimi-k2.6", "8xh100", "-tp 8", "0.34.0")
    assert extensible.engine_error == (
        "ValueError: To serve at least one request with the model's max seq len (262144), (17.16 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (3.52 GiB)."
    )
    whole, _ = vllm("llama-3.1-70b", "8xh100", "-tp 2", "0.34.0")
    assert "(20.0 GiB KV cache is needed" in (whole.engine_error or "")  # vLLM's format_gib: round(x, 2), not "20.00"


def test_indexer_caches_are_mapped_in_granules_of_their_own():
    """vLLM 0.34 maps each KV tensor in 2 MiB granules, the sparse-attention indexer's caches (layers of their own,
    with a narrower stride) too. 100 MiB for two attention tensors of 1,000 B a token and two indexer caches of 100
    B, in 64-token blocks: B blocks take 2·⌈64,000 B / 2 MiB⌉ + 2·⌈6,400 B / 2 MiB⌉ granules, at most 50: 720 blocks
    (22 + 3 granules each pair; 721 needs 23), where the bytes alone would hold 744."""
    cell = 2 * 1000 + 2 * 100
    assert stage_blocks(100 * MiB, cell_bytes=cell, tensors=2, page=64, granule_bytes=2 * MiB, index=(2, 100.0)) == 720
    assert stage_blocks(100 * MiB, cell_bytes=cell, tensors=2, page=64, granule_bytes=None, index=(2, 100.0)) == 744
