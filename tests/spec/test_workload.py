"""Request lengths and arrivals as the benchmark tools draw them."""

import math

import numpy as np
import pytest

from shardwise.errors import SpecError
from shardwise.serve.requests import draw
from shardwise.spec.workload import LengthFilter, Lengths, WorkloadSpec, dataset, read_pairs


def test_random_ranges_as_each_tool_defines_them():
    # sglang.bench_serving: randint(max(int(len × ratio), 1), len + 1); vllm bench serve: len × [1 − r, 1 + r]
    assert Lengths.sglang_random(1024, 0.5) == Lengths(low=512, high=1024)
    assert Lengths.sglang_random(1024, 0.0) == Lengths(low=1, high=1024)
    assert Lengths.vllm_random(1024, 0.5) == Lengths(low=512, high=1536)
    assert Lengths.vllm_random(1024, 0.0) == Lengths.fixed(1024)


def test_draws_are_reproducible_and_in_range():
    w = WorkloadSpec(input=Lengths(low=10, high=20), output=Lengths.fixed(5), num_requests=2000, concurrency=4)
    a, b = draw(w), draw(w)
    assert np.array_equal(a.input_tokens, b.input_tokens)
    assert a.input_tokens.min() == 10 and a.input_tokens.max() == 20
    assert set(a.output_tokens) == {5} and not a.send_s.any()


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_gaps_average_one_over_the_rate(burstiness):
    w = WorkloadSpec(input=Lengths.fixed(1), output=Lengths.fixed(1), num_requests=20000, request_rate=5.0,
                     burstiness=burstiness)  # fmt: skip
    gaps = np.diff(draw(w).send_s)
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)  # gamma: cv = 1/√shape


def test_no_cap_at_rate_inf_is_a_burst_sent_at_once():
    w = WorkloadSpec(input=Lengths.fixed(8), output=Lengths.fixed(8), num_requests=5)
    assert w.concurrency is None and draw(w).send_s.tolist() == [0.0] * 5


def test_pairs_from_a_jsonl_file(tmp_path):
    path = tmp_path / "lengths.jsonl"
    path.write_text('{"input_tokens": 100, "output_tokens": 20}\n\n{"input_tokens": 7, "output_tokens": 3}\n')
    pairs = read_pairs(path)
    assert pairs == ((100, 20), (7, 3))
    w = WorkloadSpec(input=Lengths.fixed(1), output=Lengths.fixed(1), pairs=pairs, num_requests=3, concurrency=1)
    assert list(draw(w).input_tokens) == [100, 7, 100]


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"input_tokens": 100}\n', "line 1: expected a JSON object"),
        ("not json\n", "line 1: expected a JSON object"),
        ('{"input_tokens": 0, "output_tokens": 3}\n', "at least 1"),
        ("\n", "holds no requests"),
    ],
)
def test_a_bad_lengths_file_is_one_clear_error(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        read_pairs(path)


def test_the_bundled_sharegpt_set_agrees_with_the_published_runs():
    """Published mean tokens per request of ShareGPT runs: 229.7 / 203.1 (vLLM PR #18566, 1000 prompts),
    216 / 197 (gpustack, 1000), 229 / 196 (sglang PR #2643, 5000). The whole filtered set and a 1000-prompt
    sample must land among them, within a sample's spread (about ±6 % for the input mean at 1000)."""
    sharegpt = dataset("sharegpt")
    mean_in, mean_out = sharegpt.means
    assert 210 <= mean_in <= 235 and 190 <= mean_out <= 210
    sample = np.array(sharegpt.sample(1000, seed=0))
    assert 200 <= sample[:, 0].mean() <= 245 and 180 <= sample[:, 1].mean() <= 215
    with pytest.raises(SpecError, match="unknown length set"):
        dataset("alpaca")


def test_sampling_keeps_what_the_tools_filter_keeps_and_repeats_with_its_seed():
    sharegpt = dataset("sharegpt")
    sample = np.array(sharegpt.sample(5000, seed=1))
    assert sample[:, 0].min() >= 4 and sample[:, 1].min() >= 4
    assert sample[:, 0].max() <= 1024 and (sample.sum(axis=1)).max() <= 2048
    assert sharegpt.sample(50, seed=1) == sharegpt.sample(50, seed=1) != sharegpt.sample(50, seed=2)
    # the table holds long records the filter drops: the sample is not the table's head either
    assert sharegpt.table[:, 0].max() > 1024 and sharegpt.sample(5, seed=1) != tuple(map(tuple, sharegpt.kept[:5]))


def test_a_length_filter_keeps_pairs_as_vllm_is_valid_sequence_does():
    rule = LengthFilter(min_input=4, min_output=4, max_input=1024, max_total=2048)
    inputs, outputs = np.array([3, 4, 1024, 1025, 1000, 1000]), np.array([10, 4, 10, 10, 1048, 1049])
    assert rule.keeps(inputs, outputs).tolist() == [False, True, True, False, True, False]
