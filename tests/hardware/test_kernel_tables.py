"""The kernel-table adapter against the package's own rows, and what a step priced from it reports."""

import math

import pytest

from shardwise.engines.check import check_command
from shardwise.hardware import kernel_tables
from shardwise.hardware.kernel_tables import MoEShape, moe_curve
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
    kernel_tables._moe_rows.cache_clear()
    moe_curve.cache_clear()
    fresh = moe_curve("rtx-pro-6000-server", "sglang", "0.5.23", KIMI_EP8)
    assert list(tmp_path.rglob("*.npz"))
    kernel_tables._moe_rows.cache_clear()
    moe_curve.cache_clear()
    again = moe_curve("rtx-pro-6000-server", "sglang", "0.5.23", KIMI_EP8)
    assert fresh is not None and again is not None
    assert again.tokens.tolist() == fresh.tokens.tolist() and again.seconds.tolist() == fresh.seconds.tolist()
    kernel_tables._moe_rows.cache_clear()
    moe_curve.cache_clear()


def test_the_users_ep8_decode_step_prices_its_experts_from_the_table():
    """TP8 EP8 on 8× RTX PRO 6000 at 64 running requests: each of the 60 MoE layers takes the table's 64-token
    time, and the coverage says which share of the step that is."""
    cluster = load_cluster("8xrtx-pro-6000")
    command = ("python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp 8 --ep 8 "
               "--mem-fraction-static 0.85")  # fmt: skip
    checked = check_command(command, cluster=cluster)
    step = StepTimes(checked.model, checked.setup.layout, cluster).decode(64, 2048).step
    (experts,) = [op for op in step.ops if op.name == "routed experts"]
    assert experts.count == 60 and experts.time_s == pytest.approx(60 * ROWS_MS[64] / 1e3, rel=1e-4)
    coverage = step.coverage
    total = sum(op.time_s for op in step.ops if not op.hidden)
    assert coverage["measured_share"] == pytest.approx(experts.time_s / total)
    assert coverage["tables"] == [experts.measured] and coverage["extrapolated_share"] == 0.0
