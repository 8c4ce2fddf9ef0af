"""The confidence a prediction carries: the validated rows of its family, looked for on this GPU first, and the
uncertainty a ranking allows it, checked against the bundled rows by hand."""

import statistics

import pytest

from shardwise.serve.accuracy import confidence, validated_rows

USER_GPU = "rtx-pro-6000-server"


def _abs_tok(rows):
    return [abs(r.errors["output_tok_s"]) for r in rows if r.errors["output_tok_s"] is not None]


@pytest.fixture(scope="module")
def population():
    values = sorted(_abs_tok(validated_rows()))
    return statistics.median(values), statistics.quantiles(values, n=10, method="inclusive")[-1]


def test_a_family_measured_here_at_another_load_uses_that_row(population):
    """The user's PP8 runs (one request, and its peak, predicted at 256 clients) are the only PP rows on RTX PRO
    6000: a PP prediction at 32 clients there carries their median error, and at least the median over every row."""
    pp8 = [r for r in validated_rows() if r.id in ("user-PP8", "user-PP8-peak")]
    assert sorted(r.regime for r in pp8) == ["C 1-8", "C > 64"]
    c = confidence("sglang", "PP", "C 9-64", USER_GPU)
    assert (c.basis, c.rows, c.scope) == ("this GPU", 2, f"2 rows on {USER_GPU} at other loads")
    median = statistics.median(abs(r.errors["output_tok_s"]) for r in pp8)
    assert c.median_error["output_tok_s"] == pytest.approx(median)
    assert c.uncertainty == pytest.approx(max(median, population[0]))


def test_this_gpu_at_this_load_comes_first(population):
    rows = [
        r for r in validated_rows() if (r.engine, r.family, r.gpu, r.regime) == ("sglang", "TP EP", "b200", "C 9-64")
    ]
    c = confidence("sglang", "TP EP", "C 9-64", "b200")
    assert c.basis == "this GPU" and c.rows == len(rows) > 5
    assert c.median_error["output_tok_s"] == pytest.approx(statistics.median(_abs_tok(rows)))
    assert c.uncertainty == pytest.approx(max(statistics.median(_abs_tok(rows)), population[0]))


def test_a_family_measured_only_elsewhere_is_an_extrapolation(population):
    """SGLang TP EP was measured on B200, B300 and MI355X, never on H200: there its uncertainty is at least the 90th
    percentile of every row, whatever its error elsewhere."""
    rows = [r for r in validated_rows() if (r.engine, r.family, r.regime) == ("sglang", "TP EP", "C 9-64")]
    c = confidence("sglang", "TP EP", "C 9-64", "h200")
    assert c.basis == "other GPUs" and c.rows == len(rows)
    assert c.uncertainty == pytest.approx(max(statistics.median(_abs_tok(rows)), population[1]))


def test_a_family_no_run_measured_has_the_population_tail(population):
    c = confidence("sglang", "attention-DP TP EP PP DCP", "C > 64", USER_GPU)
    assert (c.basis, c.rows) == ("none", 0) and c.uncertainty == pytest.approx(population[1])
    assert population[1] > population[0]
