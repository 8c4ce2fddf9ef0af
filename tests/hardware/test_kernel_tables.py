"""The kernel-table adapter against the package's own rows, and what a step priced from it reports."""

import math

import pytest

from shardwise.engines.check import check_command
from shardwise.hardware import kernel_tables
from shardwise.hardware.kernel_tables import (
    GQADecodeShape,
    MLADecodeShape,
    MLAPrefillShape,
    MoEShape,
    gemm_grid,
    gqa_decode_grid,
    mla_decode_grid,
    mla_prefill_grid,
    moe_curve,
)
from shardwise.ops.build import StepModel
from shardwise.ops.types import Phase
from shardwise.serve.steps import StepTimes
from shardwise.spec.cluster import load_cluster

KIMI_EP8 = MoEShape(weight_format="int4-g32", hidden=7168, inter=2048, topk=8, experts=384, moe_tp=1, moe_ep=8)
# rtx_pro_6000_server/moe/sglang/0.5.14/moe_perf.parquet, int4_wo, sglang_marlin_moe, 7168/2048, top-8 of 384,
# moe_tp 1, moe_ep 8, power_law_1.01: latency in ms at 1, 4, 64 and 256 tokens
ROWS_MS = {1: 0.027962, 4: 0.040307, 64: 0.674484, 256: 0.806581}


def test_the_kimi_moe_curve_is_the_packages_rows():
    curve = moe_curve("rtx-pro-6000-server", "sglang", "0.5.23", KIMI_EP8)
    assert curve is not None and curve.release == "0.5.14" and "sglang_marlin_moe" in curve.source
    for tokens, ms in ROWS_MS.items():
        seconds, beyond = curve.time_s(tokens)
        assert seconds == pytest.approx(ms / 1e3, rel=1e-4) and not beyond


def test_between_rows_log_log_beyond_them_linear_and_flagged():
    curve = moe_curve("rtx-pro-6000-server", "sglang", "0.5.23", KIMI_EP8)
    assert curve is not None
    (i,) = [k for k, t in enumerate(curve.tokens) if t == 64]
    t0, t1, s0, s1 = curve.tokens[i], curve.tokens[i + 1], curve.seconds[i], curve.seconds[i + 1]
    mid = math.sqrt(t0 * t1)  # halfway in log tokens: the geometric mean of the two times
    assert curve.time_s(mid) == (pytest.approx(math.sqrt(s0 * s1), rel=1e-9), False)
    last = curve.tokens[-1]
    seconds, beyond = curve.time_s(2 * last)
    assert beyond and seconds == pytest.approx(2 * curve.seconds[-1])


def test_no_table_no_curve():
    assert moe_curve("mi300x", "sglang", "0.5.23", KIMI_EP8) is None  # no AMD system in the package
    odd = MoEShape(weight_format="int4-g32", hidden=7168, inter=2048, topk=8, experts=384, moe_tp=1, moe_ep=3)
    assert moe_curve("rtx-pro-6000-server", "sglang", "0.5.23", odd) is None  # EP3 was never measured


def test_a_cached_row_set_reads_back_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDWISE_CACHE", str(tmp_path))
    kernel_tables._rows.cache_clear()
    moe_curve.cache_clear()
    fresh = moe_curve("rtx-pro-6000-server", "sglang", "0.5.23", KIMI_EP8)
    assert list(tmp_path.rglob("*.npz"))
    kernel_tables._rows.cache_clear()
    moe_curve.cache_clear()
    again = moe_curve("rtx-pro-6000-server", "sglang", "0.5.23", KIMI_EP8)
    assert fresh is not None and again is not None
    assert again.tokens.tolist() == fresh.tokens.tolist() and again.seconds.tolist() == fresh.seconds.tolist()
    kernel_tables._rows.cache_clear()
    moe_curve.cache_clear()


def test_the_users_ep8_decode_step_prices_its_experts_from_the_table():
    """TP8 EP8 on 8× RTX PRO 6000 at 64 running requests: each of the 60 MoE layers takes the table's 64-token
    time, attention its MLA decode time, and the coverage says which share of the step those are."""
    cluster = load_cluster("8xrtx-pro-6000")
    command = ("python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp 8 --ep 8 "
               "--mem-fraction-static 0.85")  # fmt: skip
    checked = check_command(command, cluster=cluster)
    step = StepTimes(checked.model, checked.setup.layout, cluster).decode(64, 2048).step
    (experts,) = [op for op in step.ops if op.name == "routed experts"]
    assert experts.count == 60 and experts.time_s == pytest.approx(60 * ROWS_MS[64] / 1e3, rel=1e-4)
    attention = [op for op in step.ops if op.name == "attention"]  # the dense layer's and the 60 MoE layers'
    assert sum(op.count for op in attention) == 61
    assert all(op.measured and "generation_mla_perf" in op.measured for op in attention)  # bf16 KV: in the table
    coverage = step.coverage
    total = sum(op.time_s for op in step.ops if not op.hidden)
    # the bf16 projections run as measured GEMMs (q_a and kv_a as one), except kv_b: absorbed into batched GEMMs
    gemms = {op.name: op for op in step.ops if op.op_class.value == "gemm"}
    for name in ("attn.q_a", "attn.kv_a", "attn.q_b", "attn.o"):
        assert gemms[name].measured and "gemm_perf" in gemms[name].measured
    assert gemms["attn.kv_b"].measured is None
    measured = experts.time_s + sum(op.time_s for op in attention)
    measured += sum(op.time_s for op in step.ops if op.op_class.value == "gemm" and op.measured)
    assert coverage["measured_share"] == pytest.approx(measured / total)
    assert coverage["tables"] == sorted({experts.measured, attention[0].measured, gemms["attn.o"].measured})
    assert coverage["extrapolated_share"] == 0.0
    # SGLang 0.5.23 is modelled; the tables were measured on 0.5.14: all the measured share is another release's
    assert step.release == "0.5.23" and experts.measured_release == "0.5.14"
    assert coverage["other_release_share"] == pytest.approx(coverage["measured_share"])


# rtx_pro_6000_server/mla/sglang/0.5.14/generation_mla_perf.parquet, triton, bf16 KV, 8 local heads (Kimi at
# attention TP8), KV length 4096 (step 4095): latency in ms at batch 1, 4, 64 and 256
MLA_ROWS_MS = {1: 0.044803, 4: 0.041270, 64: 0.247818, 256: 0.910170}


def test_the_mla_decode_grid_is_the_packages_rows_and_fp8_kv_has_none_on_this_gpu():
    grid = mla_decode_grid("rtx-pro-6000-server", "sglang", "0.5.23", MLADecodeShape(heads=8, kv_bytes=2))
    assert grid is not None and grid.release == "0.5.14" and "generation_mla_perf (triton)" in grid.source
    for batch, ms in MLA_ROWS_MS.items():
        found = grid.time_s(batch, 4096)
        assert found is not None and found[0] == pytest.approx(ms / 1e3, rel=1e-4) and not found[1]
    # halfway between two measured batches in log batch (8 and 16), at a measured length: the geometric mean
    (i,) = [k for k, b in enumerate(grid.axes[0]) if b == 8]
    (j,) = [k for k, n in enumerate(grid.axes[1]) if n == 4096]
    expected = math.sqrt(grid.seconds[i, j] * grid.seconds[i + 1, j])
    assert grid.time_s(math.sqrt(8 * 16), 4096) == (pytest.approx(expected, rel=1e-9), False)
    assert grid.time_s(512, 4096) == (pytest.approx(2 * MLA_ROWS_MS[256] / 1e3, rel=1e-4), True)
    assert mla_decode_grid("rtx-pro-6000-server", "sglang", "0.5.23", MLADecodeShape(heads=8, kv_bytes=1)) is None


# b200_sxm/mla/sglang/0.5.14/context_mla_perf.parquet, trtllm_mla, fp8 KV, bf16 queries, 16 local heads (DeepSeek-R1
# at attention TP8), one prompt: latency in ms at prompt lengths 1024, 8192 and 32768
MLA_PREFILL_ROWS_MS = {1024: 0.037054, 8192: 0.306045, 32768: 3.064842}


def test_the_mla_prefill_grid_is_the_packages_rows_and_a_later_chunk_is_the_prompt_of_its_pairs():
    shape = MLAPrefillShape(heads=16, kv_bytes=1)
    grid = mla_prefill_grid("b200", "sglang", "0.5.12", shape)
    assert grid is not None and grid.release == "0.5.14" and "context_mla_perf (trtllm_mla)" in grid.source
    for length, ms in MLA_PREFILL_ROWS_MS.items():
        assert grid.time_s(1, length) == (pytest.approx(ms / 1e3, rel=1e-4), False)
    # past the longest prompt measured, its pairs and its time grow as its length squared: flagged
    assert grid.time_s(1, 65536) == (pytest.approx(4 * MLA_PREFILL_ROWS_MS[32768] / 1e3, rel=1e-4), True)
    # a whole 8k prompt's attention on B200 at TP8 is that row, once per layer. A later chunk of 2048 tokens after
    # 6144 cached attends to 2048 × (6144 + 1024) pairs, a whole prompt's of sqrt(2048 × (2 × 6144 + 2048)) =
    # 5418.7 tokens: the rows at 4096 and 6144 blended log-log, flagged; one token after 30,000 cached is a
    # prompt of 245 tokens' pairs, not a full-rate 30k prompt's
    command = ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-R1-0528 --tp 8 "
               "--kv-cache-dtype fp8_e4m3 --attention-backend trtllm_mla --trust-remote-code")  # fmt: skip
    cluster = load_cluster("8xb200")
    checked = check_command(command, cluster=cluster, version="0.5.12")
    steps = StepTimes(checked.model, checked.setup.layout, cluster)

    def attention(new: int, cached: int) -> list:  # in the 3 dense layers and the 58 MoE layers
        step = steps.target.step(phase=Phase.PREFILL, requests=1, new_tokens=new, context_tokens=cached)
        ops = [o for o in step.ops if o.name == "attention"]
        assert sum(o.count for o in ops) == 61 and all(o.measured for o in ops)
        return ops

    whole = attention(8192, 0)
    assert sum(o.time_s for o in whole) == pytest.approx(61 * MLA_PREFILL_ROWS_MS[8192] / 1e3, rel=1e-3)
    assert not any(o.extrapolated for o in whole)
    chunk = attention(2048, 6144)
    at_4096, at_6144 = 0.119282, 0.202634  # the rows at 16 heads, one prompt (ms)
    f = math.log(math.sqrt(2048 * (2 * 6144 + 2048)) / 4096) / math.log(6144 / 4096)
    blended = math.exp((1 - f) * math.log(at_4096) + f * math.log(at_6144))
    assert sum(o.time_s for o in chunk) == pytest.approx(61 * blended / 1e3, rel=1e-3)
    assert all(o.extrapolated for o in chunk)
    one = sum(o.time_s for o in attention(1, 30000))
    assert one < 61 * 0.05e-3  # the rows near 256 tokens: under 0.03 ms a layer
    assert mla_prefill_grid("b200", "sglang", "0.5.12", MLAPrefillShape(heads=16, kv_bytes=4)) is None
    # on H200 the collector timed its flash_attention backend in the absorbed form SGLang does not run for a whole
    # prompt: no table prices it
    assert mla_prefill_grid("h200-sxm", "sglang", "0.5.12", shape) is None


def test_a_users_own_table_is_read_before_the_packages_and_says_so(tmp_path, monkeypatch):
    """$SHARDWISE_KERNEL_TABLES: a folder laid out as the package's data. A row set the user measured for the
    Kimi EP8 expert shape prices it (their machine, their release); shapes it does not hold fall back to the
    package's tables."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "rtx_pro_6000_server" / "moe" / "sglang" / "0.5.20"
    folder.mkdir(parents=True)
    tokens = [1, 16, 256]
    table = pa.table({
        "kernel_source": ["my_marlin"] * 3, "num_tokens": tokens, "inter_size": [2048] * 3, "topk": [8] * 3,
        "moe_tp_size": [1] * 3, "moe_ep_size": [8] * 3, "distribution": ["power_law_1.01"] * 3,
        "latency": [0.05, 0.2, 1.0], "moe_dtype": ["int4_wo"] * 3, "hidden_size": [7168] * 3,
        "num_experts": [384] * 3,
    })  # fmt: skip
    pq.write_table(table, folder / "moe_perf.parquet")
    monkeypatch.setenv("SHARDWISE_KERNEL_TABLES", str(tmp_path))
    monkeypatch.setenv("SHARDWISE_CACHE", str(tmp_path / "cache"))
    kernel_tables._rows.cache_clear()
    moe_curve.cache_clear()
    try:
        mine = moe_curve("rtx-pro-6000-server", "sglang", "0.5.23", KIMI_EP8)
        assert mine is not None and mine.release == "0.5.20"
        assert mine.source == f"user tables {tmp_path} rtx_pro_6000_server sglang 0.5.20 moe_perf (my_marlin)"
        assert mine.time_s(16) == (pytest.approx(0.2e-3), False)
        assert not (tmp_path / "cache").exists()  # a user's table is read afresh, never cached
        other = MoEShape(weight_format="int4-g32", hidden=7168, inter=2048, topk=8, experts=384, moe_tp=8, moe_ep=1)
        theirs = moe_curve("rtx-pro-6000-server", "sglang", "0.5.23", other)
        assert theirs is not None and theirs.source.startswith("aiconfigurator-core 0.12.0 ")
    finally:
        kernel_tables._rows.cache_clear()
        moe_curve.cache_clear()


def test_a_user_file_that_is_no_table_is_one_clear_error(tmp_path, monkeypatch):
    from shardwise.errors import DataError

    folder = tmp_path / "rtx_pro_6000_server" / "moe" / "sglang" / "0.5.20"
    folder.mkdir(parents=True)
    (folder / "moe_perf.parquet").write_text("not parquet")
    monkeypatch.setenv("SHARDWISE_KERNEL_TABLES", str(tmp_path))
    kernel_tables._rows.cache_clear()
    moe_curve.cache_clear()
    try:
        with pytest.raises(DataError, match="not a kernel table shardwise can read .* it needs the columns"):
            moe_curve("rtx-pro-6000-server", "sglang", "0.5.23", KIMI_EP8)
    finally:
        kernel_tables._rows.cache_clear()
        moe_curve.cache_clear()


# h100_sxm/gemm/sglang/0.5.14/gemm_perf.parquet, bfloat16 (sglang_torch_linear): latency in ms
GEMM_ROWS_MS = {(64, 1024, 4096): 0.00933067, (128, 1024, 4096): 0.00893867, (64, 1536, 4096): 0.00965244,
                (128, 1536, 4096): 0.00960711, (32768, 65536, 51200): 318.53363037}  # fmt: skip


def test_the_gemm_grid_is_the_packages_rows_between_them_log_linear_beyond_them_in_proportion():
    grid = gemm_grid("h100-sxm", "sglang", "0.5.23", "bf16")
    assert grid is not None and grid.release == "0.5.14" and "gemm_perf (sglang_torch_linear)" in grid.source
    for (m, n, k), ms in GEMM_ROWS_MS.items():
        assert grid.time_s(m, n, k) == (pytest.approx(ms / 1e3, rel=1e-6), False)
    # halfway in log n between two rows at m 64, k 4096: their geometric mean
    expected = math.sqrt(GEMM_ROWS_MS[(64, 1024, 4096)] * GEMM_ROWS_MS[(64, 1536, 4096)]) / 1e3
    assert grid.time_s(64, math.sqrt(1024 * 1536), 4096) == (pytest.approx(expected, rel=1e-9), False)
    # a vocabulary wider than the widest measured n: in proportion to it, flagged
    seconds, beyond = grid.time_s(32768, 131072, 51200)
    assert beyond and seconds == pytest.approx(2 * GEMM_ROWS_MS[(32768, 65536, 51200)] / 1e3, rel=1e-6)


def test_vllms_block_fp8_gemm_rows_are_not_kernel_times_and_price_nothing():
    """Its rows take 55 µs and more at every small shape, where SGLang's time the same GEMMs at a few µs."""
    assert gemm_grid("h100-sxm", "vllm", "0.11.0", "fp8-block") is None
    assert gemm_grid("h100-sxm", "sglang", "0.5.23", "fp8-block") is not None
    assert gemm_grid("h100-sxm", "vllm", "0.11.0", "int4-g128") is None  # weight-only formats: not in the tables


# h100_sxm/attention/vllm/0.24.0/generation_attention_perf.parquet, vllm_flash_attn_fa3, bf16 KV, 8 query heads,
# 1 KV head, head dim 128 (Qwen3-235B at TP8): latency in ms at (batch, KV length = step + 1)
GQA_ROWS_MS = {(256, 512): 0.043024, (256, 1024): 0.06458133, (1024, 1024): 0.19593066, (512, 2048): 0.19890666}


def test_the_gqa_decode_grid_is_the_packages_rows_and_long_lengths_at_large_batches_scale_from_smaller_ones():
    grid = gqa_decode_grid("h100-sxm", "vllm", "0.11.0", GQADecodeShape(heads=8, kv_heads=1, head_dim=128, kv_bytes=2))
    assert grid is not None and grid.release == "0.24.0" and "(vllm_flash_attn_fa3)" in grid.source
    for (batch, length), ms in GQA_ROWS_MS.items():
        assert grid.time_s(batch, length) == (pytest.approx(ms / 1e3, rel=1e-6), False)
    # batch 1024 was measured up to 1,024 cached tokens only: at 2,048, twice the batch-512 time, flagged
    assert grid.time_s(1024, 2048) == (pytest.approx(2 * GQA_ROWS_MS[(512, 2048)] / 1e3, rel=1e-6), True)


def test_a_sliding_window_grid_stays_flat_past_the_longest_length_measured():
    """gpt-oss's 128-token window at TP1: batch 64 was measured up to 8,192 cached tokens; longer requests read
    the same window, so they take that time, not one scaled from smaller batches measured further out."""
    shape = GQADecodeShape(heads=64, kv_heads=8, head_dim=64, kv_bytes=2, window=128)
    grid = gqa_decode_grid("h100-sxm", "vllm", "0.10.2", shape)
    assert grid is not None and grid.axes[1][-1] == 65536
    longest = grid.time_s(64, 8192)
    assert longest is not None and not longest[1]
    assert grid.time_s(64, 32768) == (pytest.approx(longest[0]), False)
    assert grid.time_s(64, 131072) == (pytest.approx(longest[0]), True)
    full = gqa_decode_grid("h100-sxm", "vllm", "0.10.2", GQADecodeShape(heads=64, kv_heads=8, head_dim=64, kv_bytes=2))
    windowed, unwindowed = grid.time_s(64, 4096), full.time_s(64, 4096) if full else None
    assert windowed is not None and unwindowed is not None and unwindowed[0] > 2 * windowed[0]


def test_a_batch_measured_only_short_of_its_window_is_not_taken_as_flat():
    """An 8,192-token window, 40 query and 8 KV heads of 128: batch 1024 was measured up to 1,024 tokens only,
    short of the window, so at 65,536 tokens (which read the whole window) it scales from a smaller batch measured
    past the window, flagged, and costs more than batch 128 does there."""
    shape = GQADecodeShape(heads=40, kv_heads=8, head_dim=128, kv_bytes=2, window=8192)
    grid = gqa_decode_grid("h100-sxm", "vllm", "0.11.0", shape)
    assert grid is not None
    big, small = grid.time_s(1024, 65536), grid.time_s(128, 65536)
    assert big is not None and small is not None and big[1] and big[0] > small[0]


def test_a_table_priced_mlp_adds_its_untimed_activation_kernel():
    """Qwen3-8B's dense MLP on one B200 at 32 requests: the fused gate-up GEMM and the down GEMM from the table,
    each matrix its share, plus the least GPU time of the activation kernel between them, which no table times."""
    from shardwise.hardware.load import overheads

    cluster = load_cluster("1xb200")
    checked = check_command("python -m sglang.launch_server --model-path Qwen/Qwen3-8B", cluster=cluster)
    step = StepTimes(checked.model, checked.setup.layout, cluster).decode(32, 512).step
    (mlp,) = [op for op in step.ops if op.name == "dense_mlp"]
    listed = StepModel(checked.model, checked.setup.layout, cluster).ops(
        phase=Phase.DECODE, requests=32, new_tokens=1, context_tokens=512
    )
    (op,) = [o for o in listed if o.name == "dense_mlp" and o.stage == 0]
    shapes = op.gemms
    assert sum(g.share for g in shapes) == pytest.approx(2.0)  # gate and up as one GEMM, then down
    grid = gemm_grid("b200", "sglang", "0.5.23", "bf16")
    assert grid is not None
    gemm_s = sum(grid.time_s(32, g.n, g.k)[0] * g.share for g in shapes)  # type: ignore[index]
    per_layer = gemm_s + overheads().kernel_gpu.si("s")
    assert mlp.time_s == pytest.approx(mlp.count * per_layer, rel=1e-9)


# aiter v0.1.7.post1 aiter/configs/a8w8_blockscale_tuned_gemm.csv, cu_num 304 (MI300X, MI325X): DeepSeek's o_proj at
# TP8 (N 7168, K 2048) and q_b (N 3072, K 1536), the tuner's `us` at M tokens
AITER_MI300X_US = {(16, 7168, 2048): 8.4152, (64, 7168, 2048): 11.4514, (1024, 7168, 2048): 58.8708,
                   (16, 3072, 1536): 6.3665}  # fmt: skip
MI300X_TP8 = "python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-R1-0528 --tp 8 --trust-remote-code"


def test_the_shipped_amd_gemm_grid_is_aiters_tuned_rows_for_the_releases_that_run_them():
    """SGLang runs aiter's CK block-FP8 GEMM through 0.5.5.post3 and aiter's Triton kernel from 0.5.6, which no table
    times; MI325X has MI300X's 304 CUs, by which aiter keys its kernels."""
    for gpu in ("mi300x", "mi325x"):
        grid = gemm_grid(gpu, "sglang", "0.5.2", "fp8-block")
        assert (
            grid is not None and "aiter v0.1.7.post1" in grid.source and "aiter_ck_gemm_a8w8_blockscale" in grid.source
        )
        for (m, n, k), us in AITER_MI300X_US.items():
            assert grid.time_s(m, n, k) == (pytest.approx(us / 1e6, rel=1e-9), False)
        # fewer tokens than its least measured M: the 16-token time (tiles of 16 rows), flagged
        assert grid.time_s(4, 7168, 2048) == (pytest.approx(8.4152e-6, rel=1e-9), True)
    assert "(mi300x's, the same kernels) mi325x" in gemm_grid("mi325x", "sglang", "0.5.2", "fp8-block").source
    assert gemm_grid("mi300x", "sglang", "0.5.5.post3", "fp8-block").release == "0.5.5.post3"
    assert gemm_grid("mi300x", "sglang", "0.5.6", "fp8-block") is None  # aiter's Triton GEMM: untimed
    assert gemm_grid("mi300x", "sglang", "0.4.10.post1", "fp8-block") is None  # before the releases read
    assert gemm_grid("mi300x", "sglang", "0.5.2", "bf16") is None  # only block-FP8 rows
    assert gemm_grid("mi355x", "sglang", "0.5.2", "fp8-block") is None  # its rows are left out


def test_the_shipped_tables_serve_only_their_engines_releases_and_alias_only_there(tmp_path, monkeypatch):
    """The shipped folder serves SGLang's releases 0.5.2 to 0.5.5.post3 alone, whatever engines' folders it held; a
    user's own folder serves every release, and reads MI325X's tables as MI325X's (the alias is the shipped
    folder's)."""
    (shipped,) = [r for r in kernel_tables._roots() if r.releases is not None]
    assert shipped.serves("sglang", "0.5.2") and shipped.serves("sglang", "0.5.5.post3")
    assert not shipped.serves("sglang", "0.5.6") and not shipped.serves("sglang", "0.5.1")
    assert not shipped.serves("vllm", "0.11.0") and not shipped.serves("trtllm", "1.0.0")
    assert shipped.system("mi325x") == "mi300x" and shipped.system("mi300x") == "mi300x"
    monkeypatch.setenv(kernel_tables.USER_TABLES, str(tmp_path))
    (user,) = [r for r in kernel_tables._roots() if r.label.startswith("user tables")]
    assert user.serves("vllm", "0.11.0") and user.system("mi325x") == "mi325x"


def test_an_amd_decode_step_prices_its_block_fp8_projections_from_aiters_table_on_the_releases_that_run_them():
    cluster = load_cluster("8xmi300x")
    checked = check_command(MI300X_TP8, cluster=cluster, version="0.5.2")
    step = StepTimes(checked.model, checked.setup.layout, cluster).decode(16, 2048).step
    o_proj = {op.name: op for op in step.ops if op.op_class.value == "gemm"}["attn.o"]
    assert o_proj.measured and "aiter v0.1.7.post1" in o_proj.measured
    assert o_proj.time_s == pytest.approx(o_proj.count * AITER_MI300X_US[(16, 7168, 2048)] / 1e6, rel=1e-6)
    later = check_command(MI300X_TP8, cluster=cluster, version="0.5.9")
    step = StepTimes(later.model, later.setup.layout, cluster).decode(16, 2048).step
    assert all(op.measured is None for op in step.ops if op.op_class.value == "gemm")
