"""The user's measured case: Kimi K2.6 on 8× RTX PRO 6000 (PCIe only), SGLang, CUDA graphs off.

Measured (../seed/user-case.md): TP8 26.3 tok/s at one request and ≈808 at peak; PP8 36.9 and ≈396;
EP8 (--tp 8 --ep 8) 65.3 and ≈961. Predicted with the bundled constants, nothing fitted to these numbers,
for 1024 in / 1024 out; "peak" is the best output throughput over 1…512 clients. The user's flags beyond
the layout are not recorded. With CUDA graphs off, SGLang's default memory fraction for this checkpoint (0.781:
the ×0.9097 vision-tower factor) leaves TP8 and EP8 0.02 GiB short of KV room, inside the ±1.8 GiB uncertainty
of the CUDA-stack estimate, and PP8 further short; the tests take --mem-fraction-static 0.85 for all three.

Run with `pytest -rP tests/serve/test_user_case.py` to see the six pairs.
"""

import pytest

from shardwise.cost.memory import memory_ledger
from shardwise.engines.check import check_command
from shardwise.serve.steady import Predictor
from shardwise.serve.steps import StepTimes
from shardwise.spec.cluster import load_cluster

SGLANG = "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --trust-remote-code --disable-cuda-graph "
SETUPS = {
    "TP8": ("--tp-size 8 --mem-fraction-static 0.85", 26.3, 808.0),
    "PP8": ("--pp-size 8 --mem-fraction-static 0.85", 36.9, 396.0),
    "EP8": ("--tp-size 8 --ep-size 8 --mem-fraction-static 0.85", 65.3, 961.0),
}
CLIENTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


@pytest.fixture(scope="module")
def predicted() -> dict[str, tuple[float, float]]:
    cluster = load_cluster("8xrtx-pro-6000")
    out = {}
    for name, (flags, _, _) in SETUPS.items():
        checked = check_command(SGLANG + flags, cluster=cluster)
        layout = checked.setup.layout
        memory = memory_ledger(checked.model, layout, cluster)
        assert memory.verdict == "ok", f"{name}: {memory.reason}"
        sweep = Predictor(StepTimes(checked.model, layout, cluster), memory).sweep(CLIENTS, isl=1024, osl=1024)
        out[name] = (sweep[0].output_tok_s, max(p.output_tok_s for p in sweep))
    return out


def test_print_the_six_pairs(predicted):
    print("\nsetup  C=1 measured  predicted   peak measured  predicted")
    for name, (_, one, peak) in SETUPS.items():
        p_one, p_peak = predicted[name]
        print(f"{name:5s}  {one:12.1f}  {p_one:9.1f}   {peak:13.0f}  {p_peak:9.0f}")
    assert set(predicted) == set(SETUPS)


KNOWN_GAP = (
    "TP8 at one request: the model has TP8 and EP8 issue the same kernels and all-reduces, and TP8 read fewer "
    "expert bytes, so it predicts TP8 as fast as EP8 (~65 tok/s); the user measured 26.3. What costs TP8 the "
    "extra ~23 ms per step is not in any source at hand (see the README)"
)


@pytest.mark.parametrize(
    "name, which",
    [
        pytest.param("TP8", 0, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GAP)),
        ("TP8", 1),
        ("PP8", 0),
        ("PP8", 1),
        ("EP8", 0),
        ("EP8", 1),
    ],
)
def test_each_figure_is_within_a_factor_of_two(predicted, name, which):
    measured = SETUPS[name][1 + which]
    assert 0.5 <= predicted[name][which] / measured <= 2.0


@pytest.mark.xfail(strict=True, reason=KNOWN_GAP)
def test_order_at_one_request_is_ep8_pp8_tp8(predicted):
    assert predicted["EP8"][0] > predicted["PP8"][0] > predicted["TP8"][0]


@pytest.mark.xfail(
    strict=True,
    reason="at peak the model has EP8's busiest rank read more expert bytes than TP8's even split, and PP8's "
    "eight micro-batches keep every stage busy; measured, EP8 > TP8 > PP8",
)
def test_order_at_peak_is_ep8_tp8_pp8(predicted):
    assert predicted["EP8"][1] > predicted["TP8"][1] > predicted["PP8"][1]


def test_ep8_beats_pp8_at_one_request(predicted):
    # the part of the measured order the model does reproduce: EP8's sharded weights beat PP8's sequential stages
    assert predicted["EP8"][0] > 1.5 * predicted["PP8"][0]
