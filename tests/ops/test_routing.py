"""Expert routing statistics against hand-computed values."""

import math

import pytest

from shardwise.ops.routing import busiest_rank, expected_max_binomial


def test_one_token_touches_exactly_top_k_experts():
    load = busiest_rank(tokens=1, num_experts=384, top_k=8, ranks=1)
    assert load.distinct_experts == pytest.approx(8.0)
    assert load.assignments == pytest.approx(8.0)


def test_distinct_experts_follow_the_occupancy_formula():
    # 384 · (1 − (1 − 8/384)^23) = 147.39
    load = busiest_rank(tokens=23, num_experts=384, top_k=8, ranks=1)
    assert load.distinct_experts == pytest.approx(384 * (1 - (1 - 8 / 384) ** 23))
    assert load.distinct_experts == pytest.approx(147.39, abs=0.01)


def test_busiest_rank_is_above_the_mean_and_eplb_brings_it_to_the_mean():
    uneven = busiest_rank(tokens=1, num_experts=384, top_k=8, ranks=8)
    assert uneven.mean_assignments == pytest.approx(1.0)
    assert 2.0 < uneven.assignments < 3.0  # max of 8 Binomial(8, 1/8): about 2.4
    even = busiest_rank(tokens=1, num_experts=384, top_k=8, ranks=8, balanced=True)
    assert even.assignments == pytest.approx(1.0)


def test_expected_max_of_two_coin_flips():
    # max of two Bernoulli(1/2) is 1 unless both are 0: 1 − 1/4
    assert expected_max_binomial(1, 0.5, 2) == pytest.approx(0.75)


def test_normal_approximation_meets_the_exact_sum():
    exact = expected_max_binomial(2048, 0.125, 8)
    approx = expected_max_binomial(2049, 0.125, 8)
    assert approx == pytest.approx(exact, rel=2e-3)
    # mean + σ · E[max of 8 standard normals] (1.4236)
    assert exact == pytest.approx(256 + math.sqrt(2048 * 0.125 * 0.875) * 1.4236, rel=5e-3)
