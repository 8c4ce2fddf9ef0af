"""`shardwise layouts` where nothing fits at the engine's defaults: on the user's case (Kimi K2.6 on 8× RTX PRO 6000,
SGLang) no layout has KV room at SGLang's default --mem-fraction-static for this multimodal checkpoint, so the list
shows the layouts that fit at the highest fraction SGLang's rules allow, as theorise raises it, each with a launch
command that starts; where nothing fits even so, one line says what would."""

import json
import shlex

import pytest
from typer.testing import CliRunner

from shardwise.cli import app
from shardwise.cost.memory import memory_ledger
from shardwise.decide.search import Variant, search
from shardwise.engines.check import check_command
from shardwise.report.setups import verdict
from shardwise.spec.catalog import load_model
from shardwise.spec.cluster import load_cluster

runner = CliRunner()


def _run(*args: str, columns: int = 80) -> str:
    result = runner.invoke(app, ["layouts", *args], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def raised():
    return json.loads(_run("--json"))


def test_the_default_case_lists_the_layouts_that_fit_at_a_raised_fraction(raised):
    text = _run(columns=250)  # the header on one line
    assert "none fits at the engine's default --mem-fraction-static" in text
    assert f"{len(raised)} fit at the highest fraction the engine's rules allow" in text
    assert raised and {row["verdict"] for row in raised} == {"ok"}
    for row in raised:
        assert row["memory_fraction"] > row["default_memory_fraction"]
        flags = shlex.split(row["launch_command"])
        assert flags[flags.index("--mem-fraction-static") + 1] == f"{row['memory_fraction']:g}"
    header = next(line for line in text.splitlines() if "┃" in line)
    column = [cell.strip() for cell in header.split("┃")].index("memory fraction")
    rows = [cells for cells in (line.split("│") for line in text.splitlines() if "│" in line) if cells[1].strip()]
    assert [row[column].strip() for row in rows] == [f"{row['memory_fraction']:.2f}" for row in raised]


def test_the_raised_fractions_are_the_ones_theorise_searches(raised):
    model, cluster = load_model("kimi-k2.6"), load_cluster("8xrtx-pro-6000")
    result = search(model, cluster, model_ref="kimi-k2.6", engines=["sglang"], isl=1024, osl=1024, concurrency=(1,))
    alone = [c for c in result.candidates if c.variant == Variant(memory_fraction=c.variant.memory_fraction)]
    searched = {c.layout.describe(): c.variant.label for c in alone if c.variant.memory_fraction is not None}
    listed = {row["layout"]["description"]: f"memory fraction {row['memory_fraction']:.2f}" for row in raised}
    assert listed == searched


def test_every_listed_launch_command_starts(raised):
    assert raised
    cluster = load_cluster("8xrtx-pro-6000")
    for row in raised:
        checked = check_command(row["launch_command"], cluster=cluster)
        assert checked.setup.layout is not None, row["launch_command"]
        memory = memory_ledger(checked.model, checked.setup.layout, cluster)
        assert verdict(checked.setup, memory) == "ok", row["launch_command"]
        assert checked.setup.layout.describe() == row["layout"]["description"]


def test_layouts_that_fit_at_the_defaults_are_listed_at_the_defaults():
    for args in (["--framework", "vllm"], ["--model", "deepseek-v3", "--gpus", "8xh200"]):
        rows = json.loads(_run(*args, "--json"))
        assert rows and all(row["memory_fraction"] == row["default_memory_fraction"] for row in rows)
        assert "--mem-fraction-static" not in " ".join(row["launch_command"] for row in rows)
        assert "memory fraction" not in " ".join(_run(*args).split())


def test_framework_all_decides_for_each_engine():
    rows = json.loads(_run("--framework", "all", "--json"))
    raised = {row["engine"] for row in rows if row["memory_fraction"] != row["default_memory_fraction"]}
    assert raised == {"sglang"} and {row["engine"] for row in rows} == {"sglang", "vllm"}


def test_when_nothing_fits_one_line_says_what_would():
    every = json.loads(_run("--gpus", "4xrtx-pro-6000", "--all", "--json"))
    assert every and all(row["verdict"] != "ok" for row in every)
    assert json.loads(_run("--gpus", "4xrtx-pro-6000", "--json")) == []
    text = _run("--gpus", "4xrtx-pro-6000")
    line = " ".join(text.split())
    assert "┃" not in text  # no empty table
    assert line.startswith(f"none of the {len(every)} sglang layouts of kimi-k2.6 on 4xrtx-pro-6000")
    assert "fits in memory, even at the highest --mem-fraction-static the engine's rules allow" in line
    assert "try 8 rtx-pro-6000-server GPUs (--gpus 8xrtx-pro-6000-server)" in line  # theorise's "what would"
    assert "┃" in _run("--gpus", "4xrtx-pro-6000", "--all")
