"""Dollars and watts: each prediction's cost per million output tokens and tokens per second per kilowatt, computed
by hand from the catalog's price, TDP and host power; the min-cost and max-tokens-per-watt objectives; the smaller
parts of a cluster min-cost also prices; a cluster file's own price and power."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from shardwise.cli import app
from shardwise.decide.economics import Pricing, economics
from shardwise.decide.rank import Objective, rank
from shardwise.decide.theory import rented_parts, theorise
from shardwise.engines.base import get_engine
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


def _layout(gpus: str, flags: str):
    cluster = load_cluster(gpus)
    setup = get_engine("sglang").resolve(
        ["--model-path", "m", *flags.split()], model=load_model("llama-3.1-70b"), cluster=cluster
    )
    assert setup.layout is not None, setup.rejections
    return setup.layout


def test_cost_and_power_by_hand():
    """8 H100s at InferenceX's neocloud TCO ($1.69 per GPU-hour, data file); a token's 40 ms are 30 ms of kernels
    and 10 ms of host and pipeline wait: the GPUs draw 700 W for 3/4 of it, each host share 575 W."""
    cluster, layout = load_cluster("8xh100"), _layout("8xh100", "--tp 8")
    p = _prediction(4000.0, memory=20, compute=6, comm=3, launch=1, host=4, pipeline=6)
    e = economics(p, cluster, layout)
    assert e.gpu_utilisation == pytest.approx(0.75)
    assert e.gpu_power_w == pytest.approx(8 * 0.75 * 700)
    assert e.host_power_w == pytest.approx(8 * 575)
    assert e.power_w == pytest.approx(4200 + 4600)
    assert e.cost_per_hour_usd == pytest.approx(8 * 1.69)
    assert e.usd_per_million_output_tokens == pytest.approx(8 * 1.69 / (4000 * 3600) * 1e6)  # $0.939
    assert e.output_tok_s_per_kw == pytest.approx(4000 / 8.8)
    # an owned box: the user's rate, and the energy at an electricity price on top
    owned = economics(p, cluster, layout, Pricing(gpu_hour_usd=0.5, kwh_usd=0.2))
    assert owned.cost_per_hour_usd == pytest.approx(8 * 0.5 + 8.8 * 0.2)
    # a GPU without a published price has no cost until one is given
    workstations = load_cluster("8xrtx-pro-6000-workstation")
    assert economics(p, workstations, layout).usd_per_million_output_tokens is None


def test_a_pipeline_stage_waits_while_the_other_works():
    """TP4 PP2 with one request: the token's parts add both stages' legs, and each stage runs only its own half;
    with two or more requests in flight both stages work all the time."""
    cluster, layout = load_cluster("8xh100"), _layout("8xh100", "--tp 4 --pp-size 2")
    one = _prediction(100.0, memory=16, compute=4)
    one = replace(one, running=1)
    assert economics(one, cluster, layout).gpu_utilisation == pytest.approx(0.5)
    full = replace(one, running=8)
    assert economics(full, cluster, layout).gpu_utilisation == pytest.approx(1.0)
    # a speculative step's drafting is GPU work too
    drafted = _prediction(100.0, memory=10, draft=10, host=5)
    assert economics(drafted, cluster, _layout("8xh100", "--tp 8")).gpu_utilisation == pytest.approx(0.8)


def test_min_cost_needs_a_price_and_says_so():
    t = theorise(load_model("llama-3.1-8b"), load_cluster("2xrtx-pro-6000-workstation"), model_ref="llama-3.1-8b")
    with pytest.raises(SpecError, match="min-cost needs a price: no published price for rtx-pro-6000-workstation"):
        rank(t.result.candidates, Objective.MIN_COST)
    with pytest.raises(SpecError, match="at \\$0 per GPU-hour with no --kwh-usd"):
        rank(t.result.candidates, Objective.MIN_COST, pricing=Pricing(gpu_hour_usd=0.0))
    with pytest.raises(SpecError, match="--kwh-usd takes a price of zero or more"):
        Pricing(gpu_hour_usd=1.0, kwh_usd=-1.0)
    with pytest.raises(SpecError, match="give --gpu-hour-usd too"):
        Pricing(kwh_usd=0.1)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--kwh-usd", "0.1"], "--kwh-usd adds energy to your own hourly rate: give --gpu-hour-usd too"),
        (["--objective", "min-cost", "--gpu-hour-usd", "0"], "prices every setup at nothing"),
        (["--objective", "cheapest"], "unknown objective 'cheapest'; use max-throughput"),
    ],
)
def test_bad_prices_are_one_line(args, says):
    result = subprocess.run(
        [sys.executable, "-m", "shardwise", "theorise", *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("bad", ["0", ".inf", "cheap"])
def test_a_cluster_file_with_a_bad_price_is_one_line(tmp_path, bad):
    path = tmp_path / "box.yaml"
    path.write_text(f"gpu: h100-sxm\ngpus_per_node: 8\ngpu_hour_usd: {bad}\n")
    result = subprocess.run(
        [sys.executable, "-m", "shardwise", "theorise", "--gpus", str(path), "--model", "llama-3.1-8b"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and "gpu_hour_usd" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_an_owned_box_pays_its_rate_and_its_energy():
    result = runner.invoke(app, ["theorise", "--gpu-hour-usd", "0.5", "--kwh-usd", "0.2", "--json"])
    data = json.loads(result.stdout)
    assert data["pricing"] == {"gpu_hour_usd": 0.5, "kwh_usd": 0.2, "basis": "$0.50 per GPU-hour (given)"}
    for r in data["ranked"][:10]:
        at = next(p for p in r["predicted"] if p["concurrency"] == r["at_concurrency"])
        hourly = r["gpus"] * 0.5 + r["power_w"] / 1e3 * 0.2
        assert r["usd_per_million_output_tokens"] == pytest.approx(hourly / (at["output_tok_s"] * 3600) * 1e6, rel=1e-3)


def test_limits_hold_under_min_cost():
    t = theorise(
        load_model("llama-3.1-70b"), load_cluster("8xh100"), model_ref="llama-3.1-70b",
        objective=Objective.MIN_COST, tpot_s=0.03,
    )  # fmt: skip
    assert t.ranking.best.at.tpot_s <= 0.03
    assert all(s.at.tpot_s <= 0.03 for s in t.ranking.scores)


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
    """Each score is the setup's tok/s per kW worked out by hand (TDP 700 W for the busy share of a token's time,
    575 W of host per GPU) at its best load."""
    t = theorise(
        load_model("llama-3.1-70b"), load_cluster("8xh100"), model_ref="llama-3.1-70b",
        objective=Objective.MAX_TOKENS_PER_WATT,
    )  # fmt: skip

    def by_hand(p: Prediction, gpus: int, pp: int, replicas: int) -> float:
        parts = p.breakdown_s
        busy = sum(v for k, v in parts.items() if k not in ("host", "pipeline")) / sum(parts.values())
        busy *= min(pp, max(1, p.running // replicas)) / pp
        return p.output_tok_s / (gpus * (busy * 700 + 575) / 1e3)

    for s in t.ranking.scores[:20]:
        c = s.candidate
        best = max(by_hand(p, c.gpus, c.layout.pp, c.layout.replicas) for p in c.predictions)
        assert s.value == pytest.approx(best)


def test_the_parts_a_team_could_rent_instead(tmp_path):
    parts = rented_parts(load_cluster("4x8xh100"))
    assert [(p.nodes, p.gpus_per_node) for p in parts] == [(2, 8), (1, 8), (1, 4), (1, 2), (1, 1)]
    assert [p.name for p in parts] == ["2x8xh100-sxm", "8xh100-sxm", "4xh100-sxm", "2xh100-sxm", "1xh100-sxm"]
    assert parts[0].inter is not None and parts[1].inter is None  # a part within one node has no network
    path = tmp_path / "box.yaml"  # a two-socket PCIe box: half of it sits on one socket
    path.write_text("gpu: rtx-pro-6000-server\ngpus_per_node: 8\nintra_node: {link: pcie5-x16, numa_nodes: 2}\n")
    box = rented_parts(load_cluster(str(path)))
    assert [(p.num_gpus, p.intra.numa_nodes) for p in box] == [(4, 1), (2, 1), (1, 1)]


def test_a_cluster_file_prices_its_own_box(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("gpu: rtx-pro-6000-server\ngpus_per_node: 8\ngpu_hour_usd: 0.6\ngpu_power_w: 450\n")
    cluster = load_cluster(str(path))
    assert cluster.gpu.price_per_hour.usd == 0.6 and cluster.gpu.tdp.si("W") == 450
    p = _prediction(1000.0, memory=10)
    e = economics(p, cluster, _layout("8xh100", "--tp 8"))
    assert e.gpu_power_w == pytest.approx(8 * 450) and e.cost_per_hour_usd == pytest.approx(4.8)
    assert "cluster mine" in Pricing().basis(cluster)
