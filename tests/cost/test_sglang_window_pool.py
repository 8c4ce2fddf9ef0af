"""SGLang's hybrid sliding-window memory, its running-request slots under DCP and its free-memory readings, against
hand-computed sums and SGLang 0.5.23's formulas (model_executor/pool_configurator.py HybridSWAPoolConfigurator,
mem_cache/kv_cache_configurator.py resolve_max_num_reqs, utils/common.py get_available_gpu_memory)."""

import pytest

from shardwise import load_cluster, load_model
from shardwise.cost.memory import _free_share_pool, memory_ledger
from shardwise.engines.base import get_engine

GPT_OSS_LAYER_BYTES_TP8 = 256  # bytes per layer per token on each GPU: 8 KV heads over 8 ranks, 1 × (64 + 64) × 2 B


def ledger(flags: str, *, model="gpt-oss-120b", cluster="8xh100"):
    spec, box = load_model(model), load_cluster(cluster)
    setup = get_engine("sglang").resolve(["--model-path", "m", *flags.split()], model=spec, cluster=box)
    assert setup.layout is not None, setup.rejections
    return memory_ledger(spec, setup.layout, box), setup


# --- the two pools ----------------------------------------------------------------------------------------


def test_gpt_oss_tp8_pool_token_brings_its_share_of_the_window_pool():
    """gpt-oss-120b has 18 full and 18 sliding-window layers. A token of the full layers' pool costs 18 × 256 B
    and brings 0.8 tokens of the window pool, 0.8 × 18 × 256 B: 4,608 + 3,686.4 = 8,294.4 B per GPU, not the
    36 × 256 = 9,216 of one pool. The pool of each GPU holds ⌊pool bytes / 8,294.4⌋ full-layer tokens and
    ⌊0.8 × that⌋ window tokens."""
    memory, setup = ledger("--tp-size 8")
    assert setup.layout.options.window_pool.full_tokens_ratio == 0.8
    assert memory.kv_bytes_per_token == pytest.approx(18 * GPT_OSS_LAYER_BYTES_TP8 + 0.8 * 18 * GPT_OSS_LAYER_BYTES_TP8)
    assert memory.kv_bytes_per_token == pytest.approx(8_294.4)
    assert memory.kv_tokens_per_rank == int(memory.kv_pool_bytes // 8_294.4)
    assert memory.kv_window_pool_tokens_per_rank == int(memory.kv_tokens_per_rank * 0.8)
    one_pool, _ = ledger("--tp-size 8 --disable-hybrid-swa-memory")
    assert 1.10 < memory.kv_tokens_per_rank / one_pool.kv_tokens_per_rank < 1.12  # 9,216 / 8,294.4 = 1.111


@pytest.mark.parametrize(
    "flags, cell, window_pool",
    [
        ("--swa-full-tokens-ratio 0.5", 18 * 256 + 0.5 * 18 * 256, True),  # 6,912 B
        ("--swa-full-tokens-ratio 1", 36 * 256, True),  # the window pool as large as the full one
        ("--disable-hybrid-swa-memory", 36 * 256, False),  # one pool: every layer keeps every token
    ],
)
def test_the_commands_flags_size_the_pools(flags, cell, window_pool):
    memory, _ = ledger(f"--tp-size 8 {flags}")
    assert memory.kv_bytes_per_token == pytest.approx(cell)
    assert (memory.kv_window_pool_tokens_per_rank is not None) is window_pool
    assert (memory.kv_window_tokens is not None) is window_pool


def test_each_stage_splits_its_own_layers():
    """PP2 at TP4: each stage holds 9 full and 9 sliding layers of 2 KV heads (512 B per layer per token), so a
    token costs 9 × 512 + 0.3 × 9 × 512 = 5,990.4 B on every GPU."""
    memory, _ = ledger("--tp-size 4 --pp-size 2 --swa-full-tokens-ratio 0.3")
    assert memory.kv_bytes_per_token == pytest.approx(5_990.4)


@pytest.mark.parametrize(
    "flags, kept",
    [
        ("", 127 + 128 + 1 + 1),  # window 128 − 1, eviction interval, a page, one decode token
        ("--page-size 64", 127 + 128 + 64 + 64),
    ],
)
def test_a_request_keeps_its_window_and_what_passes_before_it_is_freed(flags, kept):
    """SGLang's gpt-oss attends to sliding_window − 1 = 127 tokens (models/gpt_oss.py), frees what left the window
    once 128 more have (SGLANG_SWA_EVICTION_INTERVAL), and reserves a page and a decode step's allocation on top
    (compute_swa_request_cap)."""
    memory, setup = ledger(f"--tp-size 8 {flags}")
    assert setup.layout.options.window_pool.window_tokens == 127
    assert memory.kv_window_tokens == kept


# --- what a request asks of them ---------------------------------------------------------------------------


def test_short_requests_are_bound_by_the_window_pool_and_long_ones_by_the_full_pool():
    """A pool of 1,000 full-layer tokens and 800 window tokens; a request keeps at most 257 window tokens. One of
    200 tokens fills 200 / 800 of the window pool (250 full-pool tokens' worth), more than 200 / 1,000 of the full
    one: 4 fit, not 5. One of 300 keeps 257 window tokens (321.25); one of 2,048 is bound by the full pool."""
    memory, _ = ledger("--tp-size 8")
    pools = memory.model_copy(update={"kv_tokens_per_rank": 1_000, "kv_window_pool_tokens_per_rank": 800})
    assert pools.request_tokens(200) == 250
    assert pools.request_tokens(300) == pytest.approx(257 * 1.25)
    assert pools.request_tokens(2_048) == 2_048
    assert pools.max_concurrency(isl=100, osl=100) == 4  # 800 // 200
    assert pools.max_concurrency(isl=300, osl=200) == 2  # 1,000 // 500; the window pool would take 3 (800 // 257)


def test_concurrency_is_the_binding_pools_count():
    """On one H100 the ledger's pools: requests of 200 tokens are as many as the window pool holds, of 2,048 as
    many as the full pool holds."""
    memory, _ = ledger("", cluster="1xh100")
    full, window = memory.kv_tokens_per_rank, memory.kv_window_pool_tokens_per_rank
    assert memory.max_concurrency(isl=100, osl=100) == min(window // 200, full // 200, 2048)
    assert memory.max_concurrency(isl=100, osl=100) == window // 200
    assert memory.max_concurrency(isl=1024, osl=1024) == full // 2048


def test_a_window_pool_smaller_than_one_window_is_refused_as_sglang_refuses_it():
    """validate_swa_pool_size: the window pool must hold more than the window (127) and a page."""
    memory, _ = ledger("--tp-size 8 --swa-full-tokens-ratio 0.00001")
    assert memory.kv_window_pool_tokens_per_rank <= 128
    assert memory.verdict == "no_kv_room"
    assert memory.engine_error.startswith(
        f"ValueError: SWA pool ({memory.kv_window_pool_tokens_per_rank} tokens) cannot hold even one request"
    )


# --- running-request slots come from the pool's rows ------------------------------------------------------------


def test_dcp_slots_come_from_each_ranks_rows_not_the_interleaved_tokens():
    """resolve_max_num_reqs is given max_total_num_tokens, the rows of one rank's pool. Kimi K2.6 (context 262,144)
    at TP8 DCP8 on 8× H200: each rank's rows / 262,144 × 512 ≈ 1,185, raised to 2,048; the 8 × as many tokens the
    interleaving serves would have given 4,096."""
    memory, setup = ledger("--tp-size 8 --dcp-size 8 --attention-backend flashinfer", model="kimi-k2.6",
                           cluster="8xh200")  # fmt: skip
    rows = memory.kv_tokens_per_rank // setup.layout.dcp
    assert int(rows / 262_144 * 512) < 2048 < int(memory.kv_tokens_per_rank / 262_144 * 512)
    assert memory.max_running_requests_per_rank == 2048


# --- free memory as SGLang reads it ----------------------------------------------------------------------------


def test_free_memory_is_read_through_float32_with_more_than_one_gpu():
    """Before the weights load 2^36 + 5,000 B are free; the weights take 2^35 + 100. Through a float32 (24 bits)
    the first reads 2^36 + 8,192 (steps of 8,192 between 2^36 and 2^37), the second, 2^35 + 4,900, reads
    2^35 + 4,096 (steps of 4,096). Pool at fraction 0.9: (2^35 + 4,096) − 0.1 × (2^36 + 8,192) =
    27,487,793,971.2 → 27,487,793,971 B; one GPU reads them exactly: 27,487,795,094.4 → 27,487,795,094 B."""
    free, weights = 2**36 + 5_000, 2**35 + 100
    assert _free_share_pool(0.9, free_before=free, weights=weights, world=8) == 27_487_793_971
    assert _free_share_pool(0.9, free_before=free, weights=weights, world=1) == 27_487_795_094
