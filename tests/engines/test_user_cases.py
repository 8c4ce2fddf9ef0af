"""The user's five hand-tried SGLang setups of Kimi K2.6 on 8× RTX PRO 6000, classified as SGLang behaved."""

import pytest

from shardwise import load_cluster
from shardwise.engines.check import check_command

LAUNCH = "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --trust-remote-code "


@pytest.fixture(scope="module")
def box():
    return load_cluster("8xrtx-pro-6000")


@pytest.mark.parametrize(
    "flags, description, gpus",
    [
        ("--tp 8", "TP8", 8),
        ("--pp-size 8", "PP8", 8),  # tp 1 per stage, 8 stages
        ("--tp-size 8 --ep-size 8", "TP8 EP8", 8),
        ("--tp 8 --ep 8", "TP8 EP8", 8),  # --tp by argparse prefix, --ep a real alias
    ],
)
def test_setups_that_ran(box, flags, description, gpus):
    checked = check_command(LAUNCH + flags, cluster=box)
    assert checked.model.name == "kimi-k2.6"  # found from --model-path
    setup = checked.setup
    assert setup.valid and setup.layout is not None
    assert setup.layout.describe() == description and setup.gpus_used == gpus
    assert not [n for n in setup.notes if n.kind == "warning"]


def test_tp4_ep2_is_a_valid_structure_on_4_of_8_gpus(box):
    setup = check_command(LAUNCH + "--tp-size 4 --ep-size 2", cluster=box).setup
    assert setup.valid  # its OOM is a memory matter, not a structural one
    assert setup.gpus_used == 4 and setup.gpus_available == 8
    assert setup.layout.attn_tp == 4 and setup.layout.moe_ep == 2 and setup.layout.moe_tp == 2
    warning = next(n for n in setup.notes if n.kind == "warning")
    assert "uses 4 of 8 GPUs" in warning.message


def test_tp2_ep4_is_a_zero_division(box):
    """The user's ZeroDivisionError: moe_tp_size = 2 // 4 = 0. From 0.5.21 SGLang checks the topology it publishes
    before it spawns anything and refuses it there (the conformance suite's oracle sees it at that stage); 0.5.20
    divides by it while placing the ranks."""
    setup = check_command(LAUNCH + "--tp-size 2 --ep-size 4", cluster=box).setup
    assert not setup.valid
    rejection = setup.rejections[0]
    assert rejection.rule == "moe_tp_zero" and rejection.stage == "arguments"
    assert "moe_tp_size = tp 2 // ep 4 // moe_dp 1 = 0" in rejection.reason and "ZeroDivisionError" in rejection.reason
    assert "only 2 GPUs" in rejection.reason and "--tp-size 8 --ep-size 4" in rejection.reason
    assert rejection.engine_error.startswith("ValueError: parallel topology is inconsistent (set by override_perm")
    assert "2 != 4 * 1 * 0 (= 0)" in rejection.engine_error and "_validate_parallel" in rejection.source
    older = check_command(LAUNCH + "--tp-size 2 --ep-size 4", cluster=box, version="0.5.20").setup.rejections[0]
    assert older.engine_error.startswith("ZeroDivisionError") and "derive_spawn_ranks" in older.source


def test_older_sglang_fails_in_the_launcher(box):
    setup = check_command(LAUNCH + "--tp-size 2 --ep-size 4", cluster=box, version="0.5.9").setup
    assert setup.rejections[0].engine_error.startswith("ZeroDivisionError")
    assert "entrypoints/engine.py" in setup.rejections[0].source


def test_pp_abbreviation_is_ambiguous_in_current_sglang(box):
    # 0.5.23 has --pp-size, --pp-max-micro-batch-size and --pp-async-batch-depth: '--pp' matches all three
    setup = check_command(LAUNCH + "--pp 8", cluster=box).setup
    assert [r.rule for r in setup.rejections] == ["arguments"]
    assert "ambiguous option: --pp could match --pp-size" in setup.rejections[0].engine_error
