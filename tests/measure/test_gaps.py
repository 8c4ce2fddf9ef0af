"""Rows far from their prediction name the mechanisms that could explain them, priced where the model can."""

from dataclasses import replace

import pytest

from shardwise.hardware.load import overheads
from shardwise.measure.gaps import _time_without_output, beyond, explain
from shardwise.measure.inferencex import read_points
from shardwise.measure.reference import METRICS, check_row, group_of_row, load_rows
from shardwise.serve.accuracy import stated_median


@pytest.fixture(scope="module")
def user_rows():
    return [check_row(row) for row in load_rows() if row.id.startswith("user-")]


def test_the_user_tp8_run_is_a_gap_with_priced_candidate_causes(user_rows):
    """TP8 at one request measured 26.3 tok/s, predicted 65.3 (as fast as EP8, which measured 65.3). Two
    mechanisms put the prediction near the measurement, and each would also slow the same box's EP8 run far
    below what it measured: the TP8 run differed from the EP8 run in something its flags do not say."""
    by = {c.row.id: c for c in user_rows}
    tp8 = by["user-TP8"]
    assert beyond(tp8) == ["output_tok_s"]
    mechanisms = {m.name: m for m in explain(tp8, user_rows)}
    assert {"P2P off", "CUDA graphs off", "assumption"} <= set(mechanisms)

    p2p = mechanisms["P2P off"]
    assert p2p.predicted is not None
    assert 26.3 < p2p.predicted["output_tok_s"] < 35  # 29.5: 24 ms of host-memory collectives per token
    assert p2p.siblings["user-EP8"] < -0.4

    graphs = mechanisms["CUDA graphs off"]
    # host-bound eager step: the launch cost that gives 26.3 tok/s is 8 µs × 65.2 / 26.3 = 19.8 µs (65.2 tok/s at 8 µs:
    # a request's 1,024 tokens take 1,025 steps, the overlap schedule running one after its last token)
    assert "19.8 µs per launch" in graphs.why
    assert graphs.predicted["output_tok_s"] == pytest.approx(26.3, rel=0.05)
    assert graphs.siblings["user-EP8"] < -0.4


def test_a_row_within_the_stated_accuracy_names_nothing(user_rows):
    ep8 = next(c for c in user_rows if c.row.id == "user-EP8")
    assert abs(ep8.error("output_tok_s")) < stated_median("plain", "output_tok_s")
    assert beyond(ep8) == [] and explain(ep8, user_rows) == []


def test_a_row_from_an_older_release_counts_like_the_rest_and_names_its_release():
    row = next(r for r in load_rows() if r.id == "GT23-bs1")  # SGLang 0.4.1.post2
    c = check_row(row)
    assert group_of_row(c) == "plain"
    (release,) = [m for m in explain(c, [c]) if m.name == "older release"]
    assert "sglang 0.4.1.post2" in release.why and "0.5.0" in release.why


def test_the_attention_dp_rows_name_the_per_step_exchange_of_their_ranks():
    """DeepSeek-V3 with eight attention-DP ranks on MI300X (SGLang 0.5.7, 100 clients): measured three times
    slower than predicted; its ranks' per-step batch exchange is named, and no table covers the GPU."""
    row = next(r for r in load_rows() if r.id == "GT22")
    c = check_row(row)
    names = [m.name for m in explain(c, [c])]
    assert "attention DP" in names and "roofline only" in names


def test_host_work_per_request_is_priced_and_checked_on_the_same_sources_rows():
    """gpt-oss-120b TP2 on 2× H100 (vLLM 0.10.2, 1000 ShareGPT prompts at once): TPOT 34 % and TTFT 60 % under the
    prediction. A per-request host time on the doubling grid (about 100 µs per running request per step) brings
    TPOT within a few percent and TTFT a little closer, at tok/s 12 % low; the same change puts the same source's
    PP2 run on that box 28 % low."""
    rows = [check_row(r) for r in load_rows() if r.id in ("GT38", "GT40")]
    gt38 = next(c for c in rows if c.row.id == "GT38")
    (host,) = [m for m in explain(gt38, rows) if m.name == "host work per request"]
    assert "about 100 µs of host time per running request per step" in host.why
    assert host.predicted is not None
    errors = {m: (host.predicted[m] - getattr(gt38.row, m)) / getattr(gt38.row, m) for m in METRICS}
    assert abs(errors["tpot_ms"]) < 0.05 and -0.2 < errors["output_tok_s"] < -0.05
    assert abs(errors["ttft_ms"]) < abs(gt38.error("ttft_ms"))
    assert set(host.siblings) == {"GT40"} and -0.35 < host.siblings["GT40"] < -0.2


def test_host_work_fits_the_decode_metrics_but_not_a_late_first_token():
    """Qwen3-235B-FP8 TP8 EP8 on 8× H100 (vLLM 0.11): tok/s 25 % over, TPOT 45 % and TTFT 65 % under. Host work per
    decode step is fitted to tok/s and TPOT: about 100 µs per running request brings them to −16 % and −12 %, and
    leaves the first tokens about 60 % early; prefill steps about three times their priced time bring all three
    closest, TTFT within a few percent."""
    rows = [check_row(r) for r in load_rows() if r.id in ("GT32", "GT33", "GT34")]
    gt34 = next(c for c in rows if c.row.id == "GT34")
    found = {m.name: m for m in explain(gt34, rows)}
    host, prefill = found["host work per request"], found["prefill under load"]
    assert "about 100 µs" in host.why and host.predicted is not None
    errors = {m: (host.predicted[m] - getattr(gt34.row, m)) / getattr(gt34.row, m) for m in METRICS}
    assert abs(errors["output_tok_s"]) < 0.2 and abs(errors["tpot_ms"]) < 0.2 and errors["ttft_ms"] < -0.5
    assert "about 3× their priced time" in prefill.why and prefill.predicted is not None
    assert abs(prefill.predicted["ttft_ms"] - gt34.row.ttft_ms) / gt34.row.ttft_ms < 0.1  # type: ignore[operator]


def test_a_burst_whose_first_tokens_come_late_says_how_much_slower_its_prefill_would_be():
    """gpt-oss-120b TP2 on 2× H100 (vLLM 0.10.2, async scheduling, 1000 ShareGPT prompts at once): TTFT 60 % and
    TPOT 34 % under the measurement. Prefill steps twice their priced time put tok/s and TPOT within a few percent
    and TTFT within 30 %, and keep the same source's PP2 run on that box within a few percent: the gap sits in
    the burst's prefill, whatever slows it."""
    rows = [check_row(r) for r in load_rows() if r.id in ("GT38", "GT40")]
    gt38 = next(c for c in rows if c.row.id == "GT38")
    # TTFT is beyond the stated accuracy; TPOT a third under the measurement (beyond it too)
    assert "ttft_ms" in beyond(gt38) and gt38.error("tpot_ms") < -0.3
    (prefill,) = [m for m in explain(gt38, rows) if m.name == "prefill under load"]
    assert "about 2× their priced time" in prefill.why and prefill.predicted is not None
    for metric, within in (("output_tok_s", 0.05), ("tpot_ms", 0.05), ("ttft_ms", 0.3)):
        measured = getattr(gt38.row, metric)
        assert abs(prefill.predicted[metric] - measured) / measured < within
    assert set(prefill.siblings) == {"GT40"} and abs(prefill.siblings["GT40"]) < 0.05


def test_a_run_whose_own_latencies_outpace_its_throughput_says_it_held_time_without_output():
    """InferenceX B200 TP4 EP4, 128 clients, 1k in / 1k out, 2025-12-08, no warm-up requests: medians of 651 ms
    TTFT and 27.1 ms TPOT give 128 × 921.5 / (0.651 + 920.5 × 0.0271) ≈ 4,600 tok/s by Little's law, and it measured
    3,527: about 1280 × 921.5 × (1/3,527 − 1/4,600) ≈ 78 s of the run passed without tokens. Its first requests
    waited 75 s (its p99 TTFT) for the engine's first-use compilation, which the replay holds (73 s beyond the warm
    simulation's p99): what is left, 5 s, is no gap. Without that wait the mechanism names the 78 s. The same recipe
    on 2026-03-25, after warm-up requests, agrees with its latencies and names nothing of the kind. MI355X FP8 on
    SGLang 0.5.2, 4 clients, 2025-12-12 (its steps 31 ms, 18.5 ms on the next three days): idle for 55 s, and its
    p99 TTFT (3.2 s) is shorter than one of its requests (28 s): no cold start shows."""
    points = {r.id: r for r in read_points().rows}
    cold, warm, slow = (check_row(points[i]) for i in ("ixapp-dsr1-0682", "ixapp-dsr1-0139", "ixapp-dsr1-0488"))
    assert 72 < cold.cold_start_s < 74 and _time_without_output(cold) is None
    idle = _time_without_output(replace(cold, row=cold.row.model_copy(update={"cold_start_s": 0.0})))
    assert "about 4,604 tok/s" in idle.why and "measured 3,527" in idle.why and "about 78 s" in idle.why
    assert _time_without_output(warm) is None
    (held,) = [m for m in explain(slow, [slow]) if m.name == "time without output"]
    assert "about 55 s" in held.why and "cold start" not in held.why


def test_a_late_first_token_at_one_client_names_the_host_time_before_it():
    """InferenceX B200 TP8 FP8, SGLang 0.5.12, one client, 1k in: 157 ms to the first token against 85 ms predicted
    (its eager prefill, host-bound at 1,622 kernels of 47.4 µs, 77 ms, where its GPU work is 44 ms; after the 8.5 ms
    step the overlap schedule runs after the request before it), TPOT within the stated accuracy. About 50 ms of host
    time before the scheduler sees each request, inside which that step runs (and after the front end's 3 ms of
    tokenising, which that step hid), puts TTFT at 130 ms, the rest as it was (TPOT 18 % off); the same recipe on
    B300 measured 71 ms."""
    row = {r.id: r for r in read_points().rows}["ixapp-dsr1-1642"]
    c = check_row(row)
    prefill_ms = 1622 * overheads().eager_prefill_kernel_s("sglang", "deepseek") * 1e3
    assert c.value("ttft_ms") == pytest.approx(prefill_ms + 8.5, abs=0.5)
    (host,) = [m for m in explain(c, [c]) if m.name == "host time before the first token"]
    assert "about 50 ms" in host.why and host.predicted is not None
    tokenize_ms = 921.5 * overheads().tokenize_cpu_per_random_token.si("s") * 1e3  # its prompts' mean length
    assert host.predicted["ttft_ms"] == pytest.approx(prefill_ms + 50 + tokenize_ms, abs=0.5)
    assert host.predicted["tpot_ms"] == pytest.approx(c.value("tpot_ms"), rel=1e-6)
