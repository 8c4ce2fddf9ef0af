"""Results files of the engines' benchmark tools, read into measured levels and predicted."""

import json

import pytest

from shardwise.errors import SpecError
from shardwise.measure.importers import read_results
from shardwise.measure.reference import check_row, rank_agreement, rows_from_results

SGLANG_LINE = {  # the keys python -m sglang.bench_serving --output-file writes (one JSON line per run)
    "backend": "sglang", "dataset_name": "random", "request_rate": float("inf"), "max_concurrency": 8,
    "random_input_len": 1024, "random_output_len": 1024, "completed": 80, "total_input_tokens": 81920,
    "total_output_tokens": 81920, "duration": 300.0, "request_throughput": 0.27, "output_throughput": 273.1,
    "mean_e2e_latency_ms": 29000.0, "mean_ttft_ms": 400.0, "median_ttft_ms": 380.0, "mean_tpot_ms": 27.9,
}  # fmt: skip
VLLM_RESULT = {  # the keys vllm bench serve --save-result writes (one JSON object per file)
    "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": 100, "request_rate": 4.0,
    "max_concurrency": None, "completed": 100, "total_input_tokens": 51200, "total_output_tokens": 12800,
    "output_throughput": 510.0, "mean_ttft_ms": 35.0, "mean_tpot_ms": 7.5, "mean_e2el_ms": 990.0,
    "input_lens": [512] * 100, "output_lens": [128] * 100,
}  # fmt: skip


def test_sglang_lines(tmp_path):
    path = tmp_path / "sglang.jsonl"
    path.write_text(json.dumps(SGLANG_LINE) + "\n" + json.dumps({**SGLANG_LINE, "max_concurrency": 32}) + "\n")
    levels = read_results(path)
    assert [lv.concurrency for lv in levels] == [8, 32]
    first = levels[0]
    assert (first.tool, first.isl, first.osl, first.request_rate) == ("sglang.bench_serving", 1024, 1024, None)
    assert (first.output_tok_s, first.tpot_ms, first.ttft_ms) == (273.1, 27.9, 400.0)


def test_a_vllm_result_and_its_prediction_by_simulation(tmp_path):
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(VLLM_RESULT))
    (level,) = read_results(path)
    assert (level.tool, level.isl, level.osl, level.request_rate, level.concurrency) == ("vllm bench serve", 512,
                                                                                         128, 4.0, None)  # fmt: skip
    (row,) = rows_from_results([level], command="vllm serve meta-llama/Llama-3.1-8B-Instruct", gpus="1xh100",
                               model=None)  # fmt: skip
    checked = check_row(row)
    assert checked.simulated is not None and checked.row.load_text() == "4/s"  # an open loop, simulated at its rate
    # 4 requests/s of 128 tokens on a GPU that serves far more: the output rate follows the arrivals
    assert checked.value("output_tok_s") == pytest.approx(4 * 128, rel=0.25)


def test_records_without_a_command_need_one(tmp_path):
    path = tmp_path / "sglang.jsonl"
    path.write_text(json.dumps(SGLANG_LINE) + "\n")
    with pytest.raises(SpecError, match="does not record its launch command"):
        rows_from_results(read_results(path), command=None, gpus=None, model=None)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"hello": 1}\n', "no results of a known tool"),
        ("not json at all\n", "line 1 is not JSON"),
        (json.dumps({**SGLANG_LINE, "total_input_tokens": 0, "random_input_len": 0}), "no input or output token"),
    ],
)
def test_unknown_or_broken_files_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        read_results(path)


def test_rank_agreement_counts_pairs_in_the_measured_order(tmp_path):
    """Two setups of Kimi measured at one request, the user's EP8 (65.3 tok/s) and PP8 (36.9): one workload, one
    pair, and the prediction orders it as measured (65.4 against 29.5)."""
    base = {**SGLANG_LINE, "max_concurrency": 1, "mean_tpot_ms": None}
    cmd = "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --disable-cuda-graph "
    rows = []
    for flags, tok_s in (
        ("--tp-size 8 --ep-size 8 --mem-fraction-static 0.85", 65.3),
        ("--pp-size 8 --mem-fraction-static 0.85", 36.9),
    ):
        path = tmp_path / f"{len(rows)}.jsonl"
        path.write_text(json.dumps({**base, "output_throughput": tok_s}) + "\n")
        rows += rows_from_results(read_results(path), command=cmd + flags, gpus="8xrtx-pro-6000", model=None)
    ranks = rank_agreement([check_row(r) for r in rows])
    assert (ranks.groups, ranks.pairs, ranks.concordant) == (1, 1, 1)
