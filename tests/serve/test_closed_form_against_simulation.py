"""The closed form (serve/steady.py) against the simulation (serve/simulate.py) of the same closed loop: same
setup, same step times, 1024 in / 1024 out. SGLang prefills first and alone, so identical requests sent as token
ids move in waves; the closed form prices the waves, and TTFT agrees with the simulation's mean over the rounds
after the first (the steady state: only the first round finds the engine idle, without the step it leaves running
after a round). Sent as text, a round's prompts reach the scheduler one tokenising apart and the first is prefilled
alone. On one rank that serves every request the rounds after the first are whole waves again where the prompts'
tokenising fits in the step the engine leaves running, and the two agree as closely; across attention-DP ranks
or pipeline stages the split stays, the request ahead further ahead each round in the simulation, and the two
agree as theorise's levels do, within 15 %."""

import numpy as np
import pytest

from shardwise import theorise
from shardwise.cost.memory import memory_ledger
from shardwise.engines.check import check_command
from shardwise.serve.requests import draw
from shardwise.serve.simulate import Simulation, _Run, simulate
from shardwise.serve.steady import Predictor
from shardwise.serve.steps import StepTimes
from shardwise.spec.catalog import load_model
from shardwise.spec.cluster import load_cluster
from shardwise.spec.workload import Lengths, WorkloadSpec

# the winners theorise recommends on the user's case and on DeepSeek-V3 over 8x H200
KIMI = ("python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp-size 4 --pp-size 2 --attn-dp-size 2 "
        "--ep-size 2 --moe-dense-tp-size 1 --dcp-size 2 --attention-backend flashinfer --kv-cache-dtype fp8_e4m3 "
        "--mem-fraction-static 0.9 --trust-remote-code")  # fmt: skip
TP_EP = ("python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp-size 8 --ep-size 4 "
         "--kv-cache-dtype fp8_e4m3 --mem-fraction-static 0.95 --trust-remote-code")  # fmt: skip
DSV3 = ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp-size 8 --attn-dp-size 4 "
        "--dcp-size 2 --attention-backend flashinfer --kv-cache-dtype fp8_e4m3 --trust-remote-code")  # fmt: skip


@pytest.mark.parametrize(
    ("command", "gpus", "levels"),
    [(KIMI, "8xrtx-pro-6000", (1, 8, 64, 512)), (DSV3, "8xh200", (1, 16, 256, 1024))],
)
def test_ttft_and_tpot_of_waves_agree_with_the_simulation(command, gpus, levels):
    cluster = load_cluster(gpus)
    checked = check_command(command, cluster=cluster)
    layout = checked.setup.layout
    memory = memory_ledger(checked.model, layout, cluster)
    # prompts as token ids: the clients' requests of a round reach the scheduler at once, as one wave
    predictor = Predictor(StepTimes(checked.model, layout, cluster, text_prompts=False), memory)
    steps = StepTimes(checked.model, layout, cluster, text_prompts=False)
    assert max(levels) <= memory.max_concurrency(isl=1024, osl=1024)  # every client is admitted: waves
    for c in levels:
        closed = predictor.predict(concurrency=c, isl=1024, osl=1024)
        workload = WorkloadSpec(input=Lengths.fixed(1024), output=Lengths.fixed(1024), num_requests=4 * c,
                                concurrency=c)  # fmt: skip
        each = _Run(Simulation(steps, memory), draw(workload), c, None)
        each.loop()
        run = each.result(workload, 1)
        assert closed.ttft_s == pytest.approx(np.mean((each.first - each.arrive)[c:]), rel=0.02), c
        assert closed.tpot_s == pytest.approx(run.tpot_s.mean, rel=0.02), c
        assert closed.output_tok_s == pytest.approx(run.output_tok_s, rel=0.02), c
    if max(levels) > 1:  # a wave's first tokens wait for the batches ahead of them: TTFT grows with the load
        assert closed.ttft_s > 5 * predictor.predict(concurrency=1, isl=1024, osl=1024).ttft_s


@pytest.mark.parametrize(
    ("command", "gpus", "isl", "levels"),
    [
        (
            "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --ep 8",
            "8xh200",
            256,
            (2, 4, 16),
        ),
        ("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct --tp 4", "4xh100", 512, (2, 4)),
    ],
)
def test_text_prompts_on_one_rank_come_back_as_waves(command, gpus, isl, levels):
    """Sent as text, on one rank: the first round splits, the rounds after it are whole waves again (the prompts'
    tokenising fits in the step the engine leaves running), and the closed form agrees with them."""
    cluster = load_cluster(gpus)
    checked = check_command(command, cluster=cluster)
    layout = checked.setup.layout
    memory = memory_ledger(checked.model, layout, cluster)
    steps = StepTimes(checked.model, layout, cluster)
    predictor = Predictor(steps, memory)
    for c in levels:
        assert c * isl * steps.tokenize_s_per_token(prose=False) < steps.cycle(c, isl + 256)[0]
        closed = predictor.predict(concurrency=c, isl=isl, osl=256)
        workload = WorkloadSpec(input=Lengths.fixed(isl), output=Lengths.fixed(256), num_requests=4 * c,
                                concurrency=c)  # fmt: skip
        each = _Run(Simulation(steps, memory), draw(workload), c, None,
                    tokenize_s_per_token=steps.tokenize_s_per_token(prose=False))  # fmt: skip
        each.loop()
        run = each.result(workload, 1)
        assert closed.ttft_s == pytest.approx(np.mean((each.first - each.arrive)[2 * c :]), rel=0.02), c
        assert closed.tpot_s == pytest.approx(np.mean(((each.finish - each.first) / 255)[2 * c :]), rel=0.02), c
        assert closed.output_tok_s == pytest.approx(run.output_tok_s, rel=0.02), c


def _steady_ttft_agrees(model: str, gpus: str, layout, memory, predictions) -> None:
    """Each prediction's TTFT (past the KV pool too) is within 15 % of the simulation's steady-state mean. Up to the
    pool, every round of the closed loop is alike; past it, the first round is a start-up burst (every client at
    once, over-admitted, then retracted), so the steady state is the mean over requests 4C to 8C: the simulation is
    deterministic, so that is 2 x mean(8C) - mean(4C)."""
    steps = StepTimes(load_model(model), layout, load_cluster(gpus))
    cap = memory.max_concurrency(isl=1024, osl=1024)
    assert max(p.concurrency for p in predictions) > cap  # past the pool

    def ttft(c: int, n: int) -> float:
        workload = WorkloadSpec(input=Lengths.fixed(1024), output=Lengths.fixed(1024), num_requests=n, concurrency=c)
        return simulate(steps, memory, workload).ttft_s.mean

    for p in predictions:
        c = p.concurrency
        steady = ttft(c, 2 * c) if c <= cap else 2 * ttft(c, 8 * c) - ttft(c, 4 * c)
        assert p.ttft_s == pytest.approx(steady, rel=0.15), c


@pytest.mark.parametrize(
    ("model", "gpus"),
    [
        pytest.param(
            "kimi-k2.6",
            "8xrtx-pro-6000",
            marks=pytest.mark.xfail(
                strict=True,
                raises=AssertionError,
                reason="the top setup is a PP2 pipeline: SGLang admits for one micro-batch at a time, against that "
                "micro-batch's running requests alone, so past the KV pool it admits beyond it and retracts, as an "
                "optimistic reserve does (2048 clients: the simulation's steady TTFT 414 s, the closed form's 344 s); "
                "the closed form's split of the queue's wait past the pool under such an admission is the defect, as "
                "in test_ttft_just_past_the_kv_pool_agrees_with_the_simulation at 0.5.21",
            ),
        ),
        ("deepseek-v3", "8xh200"),
    ],
)
def test_theorise_ttft_agrees_with_the_simulation_at_every_load(model, gpus):
    """The top setup's TTFT at every level theorise reports, past the KV pool too."""
    best = theorise(model, gpus).best
    _steady_ttft_agrees(model, gpus, best.layout, best.memory, best.predictions)


@pytest.mark.parametrize(
    "version",
    [
        pytest.param(
            "0.5.21",
            marks=pytest.mark.xfail(
                strict=True,
                raises=AssertionError,
                reason="just past the KV pool (256 clients, 231 fit) SGLang before 0.5.22 admits optimistically and "
                "retracts: the simulation puts part of the queue's wait between tokens where the closed form puts all "
                "of it before the first token; throughput agrees. The closed form's split of the wait past the pool "
                "under an optimistic admission is the defect",
            ),
        ),
        "0.5.22",  # holds each running request's whole output: no retraction, and the closed form agrees
        "0.5.21 --disable-radix-cache",  # the prefix cache off: walks every request to its length, likewise
    ],
)
def test_ttft_just_past_the_kv_pool_agrees_with_the_simulation(version):
    """The user's box's best TP EP setup (the measured fallback theorise names), whose pool holds 231 requests."""
    cluster = load_cluster("8xrtx-pro-6000")
    version, *flags = version.split()
    checked = check_command(" ".join([TP_EP, *flags]), cluster=cluster, version=version)
    layout = checked.setup.layout
    memory = memory_ledger(checked.model, layout, cluster)
    predictor = Predictor(StepTimes(checked.model, layout, cluster), memory)
    predictions = [predictor.predict(concurrency=c, isl=1024, osl=1024) for c in (1, 8, 64, 128, 256)]
    _steady_ttft_agrees("kimi-k2.6", "8xrtx-pro-6000", layout, memory, predictions)
