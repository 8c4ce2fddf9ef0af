"""Dollars and watts: each prediction's cost per million output tokens and tokens per second per kilowatt, computed
by hand from the catalog's price, TDP and host power; the min-cost and max-tokens-per-watt objectives; the smaller
parts of a cluster min-cost also prices; a cluster file's own price and power."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from shardwise.cli import app
from shardwise.decide.economics import Pricing, economics
from shardwise.decide.rank import Objective, rank
from shardwise.decide.theory import rented_parts, theorise
from shardwise.errors import SpecError
from shardwise.serve.steady import Prediction
from shardwise.spec.catalog import load_model
from shardwise.spec.cluster import load_cluster

runner = CliRunner()


def _prediction(tok_s: float, **parts_ms: float) -> Prediction:
    breakdown = {k: v / 1e3 for k, v in parts_ms.items()}
    tpot = sum(breakdown.values())
    return Prediction(
        concurrency=64,
        running=64,
        output_tok_s=tok_s,
        per_user_tok_s=1 / tpot,
        tpot_s=tpot,
        ttft_s=0.1,
        bound="memory",
        decode=None,
        cycle_s=tpot,
        prefill_per_token_s=breakdown.get("prefill", 0.0),
        breakdown_s=breakdown,
    )


def test_cost_and_power_by_hand():
    """8 H100s at InferenceX's neocloud TCO ($1.69 per GPU-hour, data file); a token's 40 ms are 30 ms of kernels
    and 10 ms of host and pipeline wait: the GPUs draw 700 W for 3/4 of it, each host share 575 W."""
    cluster = load_cluster("8xh100")
    p = _prediction(4000.0, memory=20, compute=6, comm=3, launch=1, host=4, pipeline=6)
    e = economics(p, cluster, 8)
    assert e.gpu_utilisation == pytest.approx(0.75)
    assert e.gpu_power_w == pytest.approx(8 * 0.75 * 700)
    assert e.host_power_w == pytest.approx(8 * 575)
    assert e.power_w == pytest.approx(4200 + 4600)
    assert e.cost_per_hour_usd == pytest.approx(8 * 1.69)
    assert e.usd_per_million_output_tokens == pytest.approx(8 * 1.69 / (4000 * 3600) * 1e6)  # $0.939
    assert e.output_tok_s_per_kw == pytest.approx(4000 / 8.8)
    # an owned box: the user's rate, and the energy at an electricity price on top
    owned = economics(p, cluster, 8, Pricing(gpu_hour_usd=0.5, kwh_usd=0.2))
    assert owned.cost_per_hour_usd == pytest.approx(8 * 0.5 + 8.8 * 0.2)
    # a GPU without a published price has no cost until one is given
    assert economics(p, load_cluster("8xrtx-4090"), 8).usd_per_million_output_tokens is None


def test_min_cost_needs_a_price_and_says_so():
    t = theorise(load_model("llama-3.1-8b"), load_cluster("2xrtx-4090"), model_ref="llama-3.1-8b")
    with pytest.raises(SpecError, match="min-cost needs a price: no published price for rtx-4090: give --gpu-hour-usd"):
        rank(t.result.candidates, Objective.MIN_COST)
    with pytest.raises(SpecError, match="--kwh-usd takes a price of zero or more"):
        Pricing(kwh_usd=-1.0)


def test_theorise_json_prices_every_ranked_setup():
    result = runner.invoke(app, ["theorise", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    rate = data["pricing"]["gpu_hour_usd"]
    assert rate == 1.57  # the RTX PRO 6000's published on-demand price (data file)
    for r in data["ranked"]:
        at = next(p for p in r["predicted"] if p["concurrency"] == r["at_concurrency"])
        assert r["usd_per_million_output_tokens"] == pytest.approx(
            r["gpus"] * rate / (at["output_tok_s"] * 3600) * 1e6, rel=1e-3
        )
        assert r["output_tok_s_per_kw"] == pytest.approx(at["output_tok_s"] / (r["power_w"] / 1e3), rel=1e-3)
        assert all("usd_per_million_output_tokens" in p for p in r["predicted"])


def test_min_cost_rents_fewer_gpus_where_they_cost_less_per_token_and_says_why():
    """Llama-3.1-70B on 8 H100s: the most tokens come from every GPU, but one 4-GPU copy makes them as cheaply,
    within the model's error: min-cost rents 4 and says that the faster setup is no cheaper per token."""
    model, cluster = load_model("llama-3.1-70b"), load_cluster("8xh100")
    fastest = theorise(model, cluster, model_ref="llama-3.1-70b")
    cheapest = theorise(model, cluster, model_ref="llama-3.1-70b", objective=Objective.MIN_COST)
    assert fastest.ranking.best.candidate.gpus == 8
    assert cheapest.ranking.best.candidate.gpus < 8
    assert cheapest.ranking.best.candidate.name != fastest.ranking.best.candidate.name
    win, whole = cheapest.economics_of(cheapest.ranking.best), fastest.economics_of(fastest.ranking.best)
    assert win.usd_per_million_output_tokens < whole.usd_per_million_output_tokens
    # the score is tokens per dollar: the ranking's figure and the report's agree
    assert cheapest.ranking.best.value == pytest.approx(1e6 / win.usd_per_million_output_tokens)
    result = runner.invoke(
        app, ["theorise", "--gpus", "8xh100", "--model", "llama-3.1-70b", "--objective", "min-cost", "--json"]
    )
    narrative = " ".join(json.loads(result.stdout)["narrative"])
    assert f"on {cheapest.ranking.best.candidate.gpus} of the 8 GPUs" in narrative
    assert "no cheaper per token than renting" in narrative


def test_max_tokens_per_watt_ranks_by_the_estimate():
    t = theorise(
        load_model("llama-3.1-70b"), load_cluster("8xh100"), model_ref="llama-3.1-70b",
        objective=Objective.MAX_TOKENS_PER_WATT,
    )  # fmt: skip
    for s in t.ranking.scores[:20]:
        assert s.value == pytest.approx(t.economics_of(s).output_tok_s_per_kw)
        # its load is the one that makes the most tokens per kW among the setup's own
        best = max(
            economics(p, load_cluster("8xh100"), s.candidate.gpus).output_tok_s_per_kw for p in s.candidate.predictions
        )
        assert s.value == pytest.approx(best)


def test_the_parts_a_team_could_rent_instead():
    parts = rented_parts(load_cluster("2x8xh100"))
    assert [(p.nodes, p.gpus_per_node) for p in parts] == [(1, 8), (1, 4), (1, 2), (1, 1)]
    assert parts[0].inter is None and parts[0].gpu.name == "h100-sxm"
    box = rented_parts(load_cluster("8xrtx-pro-6000"))
    assert [p.num_gpus for p in box] == [4, 2, 1]


def test_a_cluster_file_prices_its_own_box(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("gpu: rtx-pro-6000-server\ngpus_per_node: 8\ngpu_hour_usd: 0.6\ngpu_power_w: 450\n")
    cluster = load_cluster(str(path))
    assert cluster.gpu.price_per_hour.usd == 0.6 and cluster.gpu.tdp.si("W") == 450
    p = _prediction(1000.0, memory=10)
    e = economics(p, cluster, 8)
    assert e.gpu_power_w == pytest.approx(8 * 450) and e.cost_per_hour_usd == pytest.approx(4.8)
    assert "cluster mine" in Pricing().basis(cluster)
