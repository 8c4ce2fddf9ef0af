"""Request lengths and arrivals as the benchmark tools draw them."""

import math

import numpy as np
import pytest
from pydantic import ValidationError

from shardwise.errors import SpecError
from shardwise.serve.requests import draw
from shardwise.spec.workload import Lengths, WorkloadSpec, bundled_lengths, read_pairs


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


def test_a_workload_needs_a_bound_on_its_load():
    with pytest.raises(ValidationError, match="concurrency"):
        WorkloadSpec(input=Lengths.fixed(1), output=Lengths.fixed(1), num_requests=1)


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


def test_the_bundled_sharegpt_set_has_its_published_means():
    inputs, outputs, source = bundled_lengths("sharegpt")
    assert (inputs.mean, outputs.mean) == (216, 197) and "GT32" in source
    with pytest.raises(SpecError, match="unknown length set"):
        bundled_lengths("alpaca")
