"""The same theorise works for every bundled model on the clusters people ask about: it names a winner whose
launch command the engine accepts, or says what would serve the model."""

import json

import pytest
from typer.testing import CliRunner

from shardwise.cli import app
from shardwise.decide.theory import theorise
from shardwise.engines.check import check_command
from shardwise.report.theory import theory_payload
from shardwise.spec.catalog import catalog, load_model
from shardwise.spec.cluster import load_cluster

CLUSTERS = ["8xh100", "8xh200", "8xb200", "8xrtx-pro-6000", "2x8xh100"]


@pytest.mark.parametrize("gpus", CLUSTERS)
def test_every_model_gets_an_answer(gpus):
    cluster = load_cluster(gpus)
    for name in catalog():
        model = load_model(name)
        t = theorise(model, cluster, model_ref=name, engines=["sglang"], isl=1024, osl=1024, concurrency=[1, 64])
        payload = theory_payload(t, top=3)
        if t.best is None:
            assert t.would_fit and payload["would_fit"], f"{name} on {gpus}: no winner and no advice"
            continue
        checked = check_command(list(t.best.launch), cluster=cluster)
        assert checked.setup.valid, f"{name} on {gpus}: {t.best.name} would not start"
        assert payload["best"]["launch"] == list(t.best.launch)
        assert t.explanation is not None and t.explanation.bound
        if t.ceiling is not None:  # the speed of light bounds every setup that starts
            assert all(c.peak.output_tok_s < t.ceiling.output_tok_s for c in t.result.candidates), name


@pytest.mark.parametrize(
    ("name", "gpus"),
    [
        ("llama-3.1-8b", "1xh100"),
        ("qwen3-30b-a3b", "1xh100"),
        ("gpt-oss-120b", "1xh100"),
        ("qwen3-235b-a22b", "8xh100"),
    ],  # fmt: skip
)
def test_no_setup_beats_the_speed_of_light_at_saturation(name, gpus):
    """Both engines, every option (FP8 KV, the window vLLM keeps of sliding layers), every load up to the pools."""
    t = theorise(name, gpus, engines=["sglang", "vllm"])
    assert t.ceiling is not None
    worst = max(t.result.candidates, key=lambda c: c.peak.output_tok_s)
    assert worst.peak.output_tok_s < t.ceiling.output_tok_s, worst.name


def test_the_command_on_two_infiniband_nodes():
    result = CliRunner().invoke(
        app, ["theorise", "--json", "--gpus", "2x8xh100", "--model", "qwen3-235b-a22b-fp8", "--concurrency", "1,64"]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["cluster"] == "2x8xh100" and payload["best"]["gpus"] == 16
