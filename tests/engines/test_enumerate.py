"""Enumeration: every valid layout once, none the engine would refuse, and launch commands that round-trip."""

import pytest

from shardwise import load_cluster, load_model
from shardwise.engines.base import get_engine
from shardwise.engines.check import check_command
from shardwise.engines.flags import command_text


@pytest.fixture(scope="module")
def kimi_sglang():
    return get_engine("sglang").enumerate(load_model("kimi-k2.6"), load_cluster("8xrtx-pro-6000"))


def test_users_case_includes_the_expected_families(kimi_sglang):
    layouts = [s.layout for s in kimi_sglang]
    tp8 = [lay for lay in layouts if lay.stage_gpus == 8 and lay.pp == 1 and lay.dcp == 1 and lay.dense_tp == 8]
    assert {lay.moe_ep for lay in tp8 if lay.attn_dp == 1} == {1, 2, 4, 8}
    assert {lay.moe_ep for lay in tp8 if lay.attn_dp == 8} == {1, 2, 4, 8}
    assert {(lay.pp, lay.stage_gpus) for lay in layouts if lay.pp > 1} >= {(2, 4), (4, 2), (8, 1)}
    assert all(s.gpus_used == 8 for s in kimi_sglang)


def test_no_duplicates(kimi_sglang):
    structures = [s.layout.structure() for s in kimi_sglang]
    assert len(structures) == len(set(structures))


@pytest.mark.parametrize(
    "engine, model, cluster",
    [
        ("sglang", "kimi-k2.6", "8xrtx-pro-6000"),
        ("vllm", "kimi-k2.6", "8xrtx-pro-6000"),
        ("sglang", "deepseek-v3", "2x8xh200"),
        ("vllm", "llama-3.1-70b", "8xh100"),
        ("sglang", "gpt-oss-120b", "4xh100"),
    ],
)
def test_every_layout_is_valid_and_round_trips(engine, model, cluster):
    eng, box, spec = get_engine(engine), load_cluster(cluster), load_model(model)
    found = eng.enumerate(spec, box)
    assert found
    for setup in found:
        command = eng.launch_command(setup, model_ref=f"{model}", remote_code=spec.remote_code)
        again = check_command(command_text(command), cluster=box).setup
        assert again.valid, (command_text(command), again.rejections)
        assert again.layout == setup.layout, command_text(command)


def test_old_sglang_spells_attention_dp_the_old_way():
    eng = get_engine("sglang")
    model, box = load_model("kimi-k2.6"), load_cluster("8xrtx-pro-6000")
    setup = next(s for s in eng.enumerate(model, box, version="0.5.21") if s.layout.attn_dp == 8)
    command = command_text(eng.launch_command(setup, model_ref="moonshotai/Kimi-K2.6"))
    assert "--dp-size 8 --enable-dp-attention" in command and "--attn-dp-size" not in command
    assert check_command(command, cluster=box, version="0.5.21").setup.layout == setup.layout
