"""The serving simulation against the analytic model, queueing laws and hand-worked cases."""

import math
from dataclasses import replace

import numpy as np
import pytest

from shardwise.cost.book import PriceBook
from shardwise.cost.memory import memory_ledger
from shardwise.engines.check import check_command
from shardwise.errors import SpecError
from shardwise.hardware.calibration import Calibration
from shardwise.serve.requests import draw
from shardwise.serve.simulate import Simulation, Stats, _Run, simulate
from shardwise.serve.steady import Predictor
from shardwise.serve.steps import StepTimes
from shardwise.spec.cluster import load_cluster
from shardwise.spec.workload import Lengths, WorkloadSpec

KIMI_EP8 = (
    "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp 8 --ep 8 --mem-fraction-static 0.85 "
    "--disable-cuda-graph"
)
LLAMA_VLLM = "vllm serve meta-llama/Llama-3.1-8B-Instruct"


def _setup(command: str, gpus: str, *, text_prompts: bool = True, version: str | None = None):
    cluster = load_cluster(gpus)
    checked = check_command(command, cluster=cluster, version=version)
    layout = checked.setup.layout
    memory = memory_ledger(checked.model, layout, cluster)
    assert memory.verdict == "ok"
    steps = StepTimes(checked.model, layout, cluster, text_prompts=text_prompts)
    return steps, memory, Predictor(steps, memory)


@pytest.fixture(scope="module")
def kimi():
    return _setup(KIMI_EP8, "8xrtx-pro-6000")


@pytest.fixture(scope="module")
def kimi_share():
    """SGLang 0.5.21: the last release that holds back only a decaying share of the running requests' output for
    requests that run to their length (from 0.5.22 it holds all of it): it admits past the pool, then evicts."""
    return _setup(KIMI_EP8, "8xrtx-pro-6000", version="0.5.21")


@pytest.fixture(scope="module")
def kimi_ids():
    """The same, its clients sending token ids: the requests of a burst reach the scheduler at once."""
    return _setup(KIMI_EP8, "8xrtx-pro-6000", text_prompts=False)


def closed(c: int, n: int, isl: int = 1024, osl: int = 1024) -> WorkloadSpec:
    return WorkloadSpec(input=Lengths.fixed(isl), output=Lengths.fixed(osl), num_requests=n, concurrency=c)


def _each(steps: StepTimes, memory, workload: WorkloadSpec) -> _Run:
    """A finished run, for each request's own times (as `simulate` runs it)."""
    front_end = not (workload.offline or workload.decode_only)
    per_token_s = steps.tokenize_s_per_token(prose=bool(workload.pairs)) if front_end else 0.0
    run = _Run(Simulation(steps, memory), draw(workload), workload.concurrency, None, decode_only=workload.decode_only,
               offline=workload.offline, cold_start_s=workload.cold_start_s,
               tokenize_s_per_token=per_token_s)  # fmt: skip
    run.loop()
    return run


@pytest.mark.parametrize("which", ["kimi", "llama"])
def test_one_client_agrees_with_the_analytic_model(which, kimi):
    """At one request nothing queues and nothing batches: each request is one prefill, then osl − 1 decode
    cycles. The simulation and the closed form must give the same figures; TTFT the steady state's, which the
    median is (the first request does not wait for the step its predecessor leaves running)."""
    steps, memory, predictor = kimi if which == "kimi" else _setup(LLAMA_VLLM, "1xh100")
    result = simulate(steps, memory, closed(1, 20))
    p = predictor.predict(concurrency=1, isl=1024, osl=1024)
    assert result.output_tok_s == pytest.approx(p.output_tok_s, rel=0.01)
    assert result.tpot_s.mean == pytest.approx(p.tpot_s, rel=0.01)
    assert result.ttft_s.p50 == pytest.approx(p.ttft_s, rel=0.01)
    assert result.retractions == 0 and result.peak_running == 1


def test_one_client_by_hand(kimi):
    """e2e = prefill + (osl − 1) cycles, with the cycle at each step's own context (linear in context, so
    the mean over the steps is the cycle at the mean context). The overlap schedule formed one more step of the
    last request before it handed out its last token: that step runs, and the next request waits for it. The front
    end's tokenising of a prompt comes before the first request's prefill, and within that step for the others."""
    steps, memory, _ = kimi
    assert steps.layout.options.overlap_schedule
    run = _each(steps, memory, closed(1, 3, isl=512, osl=256))
    prefill = steps.prefill_s(1, 512, 0)
    cycles = sum(steps.decode_s(1, 513 + k) for k in range(255))
    left_running = steps.decode_s(1, 512 + 256)  # a decode step of the finished request at its last context
    tokenize = 512 * steps.tokenize_s_per_token(prose=False)  # lengths drawn: a prompt decoded from random token ids
    assert 0 < tokenize < left_running
    ttft, e2e = run.first - run.arrive, run.finish - run.arrive
    assert ttft == pytest.approx([tokenize + prefill, prefill + left_running, prefill + left_running], rel=1e-6)
    assert e2e == pytest.approx(ttft + cycles, rel=2e-3)


def test_the_front_end_tokenises_prompts_one_after_another_by_hand(kimi, kimi_ids):
    """SGLang's tokenizer manager encodes each text prompt, one after another, before the scheduler sees it
    (overheads.yaml: tokenize_cpu_per_random_token for prompts decoded from random token ids,
    tokenize_cpu_per_prose_token for prose). Two clients' prompts sent at once reach the scheduler one tokenising
    apart: idle, it prefills the first alone, and the step it formed then (the first's decode, overlapping the GPU)
    runs before the second's prefill. Sent as token ids they come together and share one prefill. One rank serves
    both, so the first runs only that step ahead: its client's next prompt comes within the step the engine leaves
    running after the second finishes, and the rounds after the first are whole waves again, as the closed form
    prices them. A lone prompt of prose (a dataset's pairs) waits its own, shorter, tokenising."""
    steps, memory, predictor = kimi
    tokenize = 512 * steps.tokenize_s_per_token(prose=False)
    alone, after_first = steps.prefill_s(1, 512, 0), steps.decode_s(1, 513)
    text = _each(steps, memory, closed(2, 6, isl=512, osl=64))
    ttft = text.first - text.arrive
    assert ttft[:2] == pytest.approx([tokenize + alone, tokenize + alone + after_first + alone], rel=1e-6)
    left_running, _ = steps.cycle(2, 512 + 64)  # the step formed with the finished round, at its last context
    assert 2 * tokenize < left_running
    together = steps.prefill_s(2, 1024, 0)
    assert ttft[4:] == pytest.approx([left_running + together] * 2, rel=1e-6)
    assert predictor.predict(concurrency=2, isl=512, osl=64).ttft_s == pytest.approx(left_running + together, rel=1e-6)
    ids_steps, _, _ = kimi_ids
    ids = _each(ids_steps, memory, closed(2, 2, isl=512, osl=64))
    assert ids.first - ids.arrive == pytest.approx([together] * 2, rel=1e-6)
    pairs = WorkloadSpec(input=Lengths.fixed(1), output=Lengths.fixed(1), num_requests=1, pairs=((300, 8),))
    prose = simulate(steps, memory, pairs)
    assert steps.tokenize_s_per_token(prose=True) < steps.tokenize_s_per_token(prose=False)
    assert prose.ttft_s.p50 == pytest.approx(300 * steps.tokenize_s_per_token(prose=True) + steps.prefill_s(1, 300, 0))


def test_a_cold_start_holds_back_the_first_wave_by_hand(kimi_ids):
    """An engine that spends S seconds on its first request before it steps: the clients' first requests, sent at
    once (as token ids: text prompts would reach a warm engine one by one, and a cold one's wait would gather them),
    wait S more for their first token; from there the run is the warm one S later (every later request, each
    TPOT, as they were), so the run lasts S longer and its throughput is its tokens over that. With a host time before
    the scheduler sees a request, the wait starts when the first one reaches it: the shift is S all the same."""
    steps, memory, _ = kimi_ids
    warm_w = closed(2, 6, isl=512, osl=64)
    cold_w = warm_w.model_copy(update={"cold_start_s": 30.0})
    warm, cold = _each(steps, memory, warm_w), _each(steps, memory, cold_w)
    assert cold.arrive == pytest.approx(list(warm.arrive[:2]) + list(warm.arrive[2:] + 30.0), rel=1e-12)
    assert cold.first - cold.arrive == pytest.approx(warm.first - warm.arrive + [30.0, 30.0, 0, 0, 0, 0], rel=1e-9)
    assert cold.finish - cold.first == pytest.approx(warm.finish - warm.first, rel=1e-9)
    w, c = simulate(steps, memory, warm_w), simulate(steps, memory, cold_w)
    assert c.duration_s == pytest.approx(w.duration_s + 30.0, rel=1e-9)
    assert c.output_tok_s == pytest.approx(6 * 64 / (w.duration_s + 30.0), rel=1e-9)
    # the wait starts when the first request reaches the scheduler: a host time before it delays it as much
    cluster = steps.target.cluster.calibrated(
        Calibration(gpu=steps.target.cluster.gpu.name, constants={"first_token_host_s": 0.1}, fitted_on=())
    )
    checked = check_command(KIMI_EP8, cluster=cluster)
    slow = StepTimes(checked.model, checked.setup.layout, cluster, text_prompts=False)
    warm, cold = _each(slow, memory, warm_w), _each(slow, memory, cold_w)
    assert cold.first - cold.arrive == pytest.approx(warm.first - warm.arrive + [30.0, 30.0, 0, 0, 0, 0], rel=1e-9)


def test_host_time_before_the_first_token_by_hand(kimi):
    """A calibrated first_token_host_s delays each request's arrival at the scheduler: at one client its TTFT is the
    prefill and that much (longer than the step the engine left running, which it hides) and its TPOT as it was;
    the closed form agrees, its throughput the client's, osl tokens per request time."""
    steps, memory, _ = kimi
    host = 0.1
    calibrated = steps.target.cluster.calibrated(
        Calibration(gpu=steps.target.cluster.gpu.name, constants={"first_token_host_s": host}, fitted_on=())
    )
    checked = check_command(KIMI_EP8, cluster=calibrated)
    slow = StepTimes(checked.model, checked.setup.layout, calibrated)
    before, after = (_each(s, memory, closed(1, 3, isl=512, osl=256)) for s in (steps, slow))
    # the step the engine left running after a request (test_one_client_by_hand) ends before the next arrives
    prefill = steps.prefill_s(1, 512, 0)
    tokenize = 512 * steps.tokenize_s_per_token(prose=False)  # the front end's, before the host time's trip
    assert after.first - after.arrive == pytest.approx([prefill + tokenize + host] * 3, rel=1e-9)
    assert (after.finish - after.first) == pytest.approx(before.finish - before.first, rel=1e-9)  # TPOT as it was
    in_process = _each(slow, memory, closed(1, 3, isl=512, osl=256).model_copy(update={"offline": True}))
    # in process, no front end: neither the host time nor the tokenising (hidden for all but the first before)
    skipped = [tokenize, 0.0, 0.0]
    assert in_process.first - in_process.arrive == pytest.approx(before.first - before.arrive - skipped, rel=1e-9)
    p = Predictor(slow, memory).predict(concurrency=1, isl=512, osl=256)
    assert p.ttft_s == pytest.approx(prefill + tokenize + host, rel=0.01)
    assert p.output_tok_s == pytest.approx(256 / np.mean(after.finish - after.arrive), rel=0.01)
    # past the KV pool (46 requests) the host time hides in the queue: the engine stays as full, the figures as they
    # were; below it every client's request takes 0.1 s longer than it took to be read (a wave of 8 waits out the
    # step the engine left running)
    fast, held = Predictor(steps, memory), Predictor(slow, memory)
    queued, alone = (p.predict(concurrency=256, isl=1024, osl=1024) for p in (fast, held))
    assert (alone.output_tok_s, alone.ttft_s) == (queued.output_tok_s, queued.ttft_s)
    light, heavy = (p.predict(concurrency=8, isl=1024, osl=1024) for p in (fast, held))
    left_running, _ = steps.cycle(8, 1024 + 1024)  # the step formed with the finished wave, at its last context
    tokenize = 1024 * steps.tokenize_s_per_token(
        prose=False
    )  # the first prompt's, hidden in that step without the host time
    assert tokenize < left_running
    assert heavy.ttft_s == pytest.approx(light.ttft_s - left_running + host + tokenize)
    assert heavy.output_tok_s < light.output_tok_s


def test_a_busy_vllm_reads_a_closed_loops_next_request_two_steps_on_by_hand():
    """vLLM's async scheduling (its default from 0.14) forms each batch while the step before it runs
    (v1/engine/core.py step_with_batch_queue). Two clients send A (400 tokens out) and B (92 out); B's client sends
    C on B's last token, which the read right after that token misses, and the batch formed at the next read runs
    after the step in flight: C's prefill (mixed with A's decode) starts two steps of A alone after B's last token.
    With a host time before the scheduler sees C, the first read after C comes: 1.5 steps → 3, 2.5 → 4. The closed
    form's wait for requests out of step moves alike. At one client vLLM schedules no step for a request whose step
    in flight reaches its max_tokens (v1/core/sched/scheduler.py): the next request is prefilled at once."""
    steps, memory, predictor = _setup(LLAMA_VLLM, "1xh100")
    assert steps.layout.options.overlap_schedule and not steps.layout.options.scheduler.runs_finished_step
    w = WorkloadSpec(input=Lengths.fixed(1), output=Lengths.fixed(1), num_requests=3, concurrency=2,
                     pairs=((100, 400), (100, 92), (100, 50)))  # fmt: skip
    a_alone = steps.decode_s(1, 100 + 92 + 1)
    mixed = steps.prefill_s(1, 100, 0) + steps.decode_s(1, 100 + 92 + 3)  # C's prefill beside A's decode
    ttft = {}
    for host in (0.0, 1.5 * a_alone, 2.5 * a_alone):
        cluster = steps.target.cluster.calibrated(
            Calibration(gpu=steps.target.cluster.gpu.name, constants={"first_token_host_s": host}, fitted_on=())
        )
        checked = check_command(LLAMA_VLLM, cluster=cluster)
        run = _each(StepTimes(checked.model, checked.setup.layout, cluster), memory, w)
        ttft[host] = run.first[2] - run.arrive[2]
    assert list(ttft.values()) == pytest.approx([2 * a_alone + mixed, 3 * a_alone + mixed, 4 * a_alone + mixed],
                                                rel=2e-3)  # fmt: skip
    one = _each(steps, memory, closed(1, 3, isl=512, osl=256))
    tokenize = 512 * steps.tokenize_s_per_token(
        prose=False
    )  # nothing runs meanwhile to hide the front end's tokenising
    assert one.first - one.arrive == pytest.approx([tokenize + steps.prefill_s(1, 512, 0)] * 3, rel=1e-6)
    # the closed form at 8 clients (mixed batches: requests out of step): a host time of 1.5 and 2.5 of its steps
    # adds one and two steps to TTFT
    cycle, _ = steps.cycle(8, 1024 + 512)
    base = predictor.predict(concurrency=8, isl=1024, osl=1024).ttft_s
    for host, more in ((1.5 * cycle, 1), (2.5 * cycle, 2)):
        cluster = steps.target.cluster.calibrated(
            Calibration(gpu=steps.target.cluster.gpu.name, constants={"first_token_host_s": host}, fitted_on=())
        )
        checked = check_command(LLAMA_VLLM, cluster=cluster)
        held = Predictor(StepTimes(checked.model, checked.setup.layout, cluster), memory)
        assert held.predict(concurrency=8, isl=1024, osl=1024).ttft_s == pytest.approx(base + more * cycle)


def test_decode_only_runs_no_prefill_by_hand(kimi):
    """Prompts already cached: the first token comes from the first decode step at context isl, each of the
    osl tokens from a cycle; the steady state agrees: running / cycle, TPOT = cycle."""
    steps, memory, predictor = kimi
    w = WorkloadSpec(input=Lengths.fixed(8192), output=Lengths.fixed(256), num_requests=3, concurrency=1,
                     decode_only=True)  # fmt: skip
    run = _each(steps, memory, w)
    cycles = [steps.decode_s(1, 8192 + k) for k in range(256)]
    left_running = steps.decode_s(1, 8192 + 256)  # the step the engine left running (test_one_client_by_hand)
    ttft = run.first - run.arrive
    assert ttft == pytest.approx([cycles[0], left_running + cycles[0], left_running + cycles[0]], rel=2e-3)
    assert run.finish - run.arrive == pytest.approx(ttft - cycles[0] + sum(cycles), rel=2e-3)
    result = run.result(w, 1)
    assert result.output_tok_s == pytest.approx(768 / (sum(cycles) * 3 + 2 * left_running), rel=2e-3)
    steady = predictor.predict(concurrency=8, isl=8192, osl=256, decode_only=True)
    cycle = steps.decode(8, 8192 + 128).cycle_s
    # streams of one length end together and wait out the step the engine formed with them, at their last context
    last, _ = steps.cycle(8, 8192 + 256)
    assert steady.tpot_s == pytest.approx(cycle)
    assert steady.output_tok_s == pytest.approx(8 * 256 / (256 * cycle + last))
    assert steady.breakdown_s["prefill"] == 0.0


def test_a_burst_lasts_as_long_as_its_longest_request(kimi_ids):
    """Two requests sent at once (as token ids: they reach the scheduler together), prefilled in one step (SGLang
    prefills first), then decoded together: with outputs of 2 and 200 tokens the run lasts the prefill, 1 cycle at
    two requests and 198 at one; the same 400 tokens as 200 + 200 take 199 cycles at two. Throughput is the tokens
    over that time, so a long tail halves it: what fixed mean lengths hide in a ShareGPT burst."""
    steps, memory, _ = kimi_ids
    burst = dict(input=Lengths.fixed(1), output=Lengths.fixed(1), num_requests=2)
    tail = simulate(steps, memory, WorkloadSpec(**burst, pairs=((100, 2), (100, 200))))
    even = simulate(steps, memory, WorkloadSpec(**burst, pairs=((100, 200), (100, 200))))
    prefill = steps.prefill_s(2, 200, 0)
    tail_s = prefill + steps.decode_s(2, 101) + sum(steps.decode_s(1, 102 + k) for k in range(198))
    even_s = prefill + sum(steps.decode_s(2, 101 + k) for k in range(199))
    assert tail.duration_s == pytest.approx(tail_s, rel=2e-3)
    assert even.duration_s == pytest.approx(even_s, rel=2e-3)
    assert tail.output_tok_s == pytest.approx(202 / tail_s, rel=2e-3)
    assert tail.output_tok_s < 0.6 * even.output_tok_s


def test_kv_capacity_makes_a_plateau_and_a_queue(kimi_share):
    """EP8 at --mem-fraction-static 0.85 with CUDA graphs off holds 46 requests of 1024 + 1024 tokens. Beyond
    that, throughput stays flat,
    time to first token grows with the queue, and Little's law holds: requests per second = C / mean e2e."""
    steps, memory, _ = kimi_share
    cap = memory.max_concurrency(isl=1024, osl=1024)
    assert cap == 46
    runs = {c: simulate(steps, memory, closed(c, 4 * c)) for c in (8, 64, 128, 256)}
    plateau = runs[64].output_tok_s
    for c in (128, 256):
        assert runs[c].output_tok_s == pytest.approx(plateau, rel=0.10)
    assert runs[8].output_tok_s < 0.75 * plateau  # below the KV bound, more clients still pay
    assert runs[256].ttft_s.mean > 2 * runs[128].ttft_s.mean > 4 * runs[64].ttft_s.mean
    for c, r in runs.items():
        assert r.request_per_s == pytest.approx(c / r.e2e_s.mean, rel=0.25)  # ramp-up and drain blur it
        assert r.mean_running <= cap * 1.3  # SGLang admits past the strict bound, then evicts
    assert runs[8].retractions == 0 and runs[256].retractions > 0


def test_requests_that_run_to_their_length_are_never_evicted_once_the_engine_holds_their_whole_output():
    """EP8 at 256 clients, far past the 46 requests its pool holds to their length from their start. Holding back
    a decaying share of the running requests' output, SGLang 0.5.21 admits past that, then evicts. From 0.5.22 it
    holds the whole of it for requests that ignore EOS (each of these does): no more than 46 run, and none is
    evicted. With the prefix cache off it admits one only if the pool holds every request to its length as they
    end, which counts what each has already written: a 47th fits beside requests part way through, and again none
    is evicted."""
    runs = {}
    for flags, version in (("", "0.5.21"), ("", "0.5.22"), ("--disable-radix-cache", "0.5.21")):
        steps, memory, _ = _setup(f"{KIMI_EP8} {flags}", "8xrtx-pro-6000", version=version)
        runs[flags, version] = simulate(steps, memory, closed(256, 512))
    cap = memory.max_concurrency(isl=1024, osl=1024)
    share, whole, to_length = runs.values()
    assert share.retractions > 0 and share.peak_running > cap + 5
    assert whole.retractions == 0 and whole.peak_running == cap
    assert to_length.retractions == 0 and cap <= to_length.peak_running <= cap + 1


def _admission_state(flags: str, version: str, running_osl: float):
    """Two running requests of 20 prompt tokens with 10 output tokens each (30 held apiece) and a third of 10
    prompt tokens and 20 output tokens waiting, in a pool of 200 tokens, the decaying share at its floor (0.098)."""
    _, _, run = _prefill_run(flags, version, 16, requests=3)
    run.sim.pool = 200
    run.isl = np.array([20, 20, 10])
    run.osl = np.array([running_osl, running_osl, 20.0])
    run.gen = np.array([10.0, 10.0, 0.0])
    run.need = run.isl.astype(float)
    run.done_prefill = np.array([20.0, 20.0, 0.0])
    run.ratio = 0.098
    rank = run.ranks[0]
    rank.running, rank.held = [0, 1], 60.0
    return run, rank


@pytest.mark.parametrize(
    ("flags", "version", "running_osl", "fresh", "admitted"),
    [
        # the decaying share: 10 + 20 = 30 tokens needed, 200 - 60 - 0.098 × (100 + 100) = 120.4 free of it
        ("", "0.5.21", 110.0, [], True),
        # ... but two admitted earlier in the same prefill batch are held back whole: 200 - 60 - 200 < 30
        ("", "0.5.21", 110.0, [0, 1], False),
        # the whole remaining output held: 200 - 60 - 200 < 30
        ("", "0.5.22", 110.0, [], False),
        # prefix cache off: the prompt fits (10 <= 120.4), and with it 130 tokens are free; by tokens left the new
        # request (20, holding 10) ends first, needing 3 × 20 = 60 < 130 - 3; then the two running ones (100 left
        # each) need 2 × 100 = 200 against 130 + 10 freed: refused
        ("--disable-radix-cache", "0.5.12", 110.0, [], False),
        # ... with 50 left each: 60 < 127, then 2 × 50 = 100 < 140 - 2, then 50 < 170 - 1: admitted
        ("--disable-radix-cache", "0.5.12", 60.0, [], True),
    ],
)
def test_sglang_admission_by_hand(flags, version, running_osl, fresh, admitted):
    """SGLang's PrefillAdder (schedule_policy.py): add_one_req holds back the running requests' remaining output at
    the decaying share (0.5.21) or, for requests that ignore EOS, whole (0.5.22 on,
    _get_running_request_total_token_offset); add_one_req_ignore_eos, with the prefix cache off, walks the requests
    by the tokens each has left; a request admitted earlier in the same prefill batch is held back whole
    (_update_prefill_budget)."""
    run, rank = _admission_state(flags, version, running_osl)
    assert run._admissible(rank, 2, fresh, []) is admitted


def test_the_pool_is_never_overfilled(kimi_share):
    """KV held per rank, kept up to date at every change, matches a recount and never exceeds the pool."""
    steps, memory, _ = kimi_share
    sim = Simulation(steps, memory)
    workload = WorkloadSpec(
        input=Lengths.sglang_random(2048, 0.2), output=Lengths.sglang_random(1024, 0.2), num_requests=300,
        concurrency=60,
    )  # fmt: skip
    run = _Run(sim, draw(workload), 60, None)
    span = run._span
    worst = []

    def checked_span():
        span()
        for rank in run.ranks:
            ids = rank.running + ([rank.chunked] if rank.chunked is not None else [])
            recount = float(run._kv(ids).sum()) if ids else 0.0
            assert rank.held == pytest.approx(recount, abs=1e-6)
            worst.append(rank.held)

    run._span = checked_span
    run.loop()
    assert max(worst) <= sim.pool
    assert run.completed == 300 and run.retractions > 0


def test_open_loop_at_low_rate_sees_a_lone_request(kimi):
    """At one request in ten minutes (each takes 4 s) a typical request is alone: its TTFT is the front end's
    tokenising of its prompt and one prefill, its TPOT one batch-1 cycle (a Poisson gap is sometimes short, so the
    tails may see a neighbour)."""
    steps, memory, _ = kimi
    workload = WorkloadSpec(input=Lengths.fixed(1024), output=Lengths.fixed(256), num_requests=10, request_rate=1 / 600)
    result = simulate(steps, memory, workload)
    tokenize = 1024 * steps.tokenize_s_per_token(prose=False)  # lengths drawn: a prompt decoded from random token ids
    assert result.ttft_s.p50 == pytest.approx(tokenize + steps.prefill_s(1, 1024, 0), rel=1e-6)
    assert result.tpot_s.p50 == pytest.approx(steps.decode_s(1, 1024 + 128), rel=0.01)


def test_prefill_stalls_decode_in_sglang_but_not_in_a_mixed_batch():
    """SGLang runs a new request's prefill alone, so running requests see a long gap (ITL tail); vLLM puts
    the prefill chunk beside their decode tokens, so each of their steps is only a little longer."""
    results = {}
    for name, command in (
        ("sglang", "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct"),
        ("vllm", LLAMA_VLLM),
    ):
        steps, memory, _ = _setup(command, "1xh100")
        workload = WorkloadSpec(input=Lengths.fixed(4096), output=Lengths.fixed(256), num_requests=64, request_rate=4)
        results[name] = simulate(steps, memory, workload)
    assert results["sglang"].itl_s.p99 > results["vllm"].itl_s.p99


def test_a_request_larger_than_the_pool_is_a_clear_error(kimi):
    steps, memory, _ = kimi
    with pytest.raises(SpecError, match="does not fit one rank's KV pool"):
        simulate(steps, memory, closed(1, 2, isl=100_000, osl=1024))


def test_weighted_percentiles_by_hand():
    stats = Stats.of(np.array([1.0, 2.0, 10.0]), np.array([1.0, 8.0, 1.0]))
    assert stats.mean == pytest.approx((1 + 16 + 10) / 10)
    assert (stats.p50, stats.p90, stats.p99) == (2.0, 2.0, 10.0)
    assert math.isnan(Stats.of(np.array([])).mean)


def test_attention_dp_ranks_take_turns_and_step_together():
    """DeepSeek-V3 with attention DP over 8 ranks: 8 clients land one on each rank (round robin), every step
    carries one token per rank, so each request sees the step of a batch of 8 spread over 8 ranks."""
    steps, memory, _ = _setup(
        "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --dp 8 --enable-dp-attention "
        "--trust-remote-code",
        "8xh200",
    )
    assert memory.ranks == 8
    result = simulate(steps, memory, closed(8, 16, isl=1024, osl=512))
    assert result.peak_running == 1  # per rank
    assert result.tpot_s.mean == pytest.approx(steps.decode_s(8, 1024 + 256), rel=0.01)


def test_replicas_behind_a_router_add_up():
    """Two independent copies of Llama-3.1-8B (SGLang --dp 2 without attention DP) serve two clients as fast as
    one copy serves one, twice over."""
    one = simulate(*_setup("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct",
                           "1xh100")[:2], closed(1, 10))  # fmt: skip
    two_steps, two_memory, _ = _setup(
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --dp 2", "2xh100"
    )
    assert two_steps.layout.replicas == 2
    two = simulate(two_steps, two_memory, closed(2, 20))
    assert two.output_tok_s == pytest.approx(2 * one.output_tok_s, rel=0.01)
    assert two.tpot_s.mean == pytest.approx(one.tpot_s.mean, rel=0.01)


def test_setups_differing_only_in_memory_share_their_predictions_where_they_run_as_many_requests():
    """A search predicts each layout with its memory fraction raised too: the steps cost the same, so up to the
    smaller KV pool the two predictions are one; beyond it the larger pool runs more requests and predicts apart,
    each as it would alone."""
    cluster = load_cluster("8xrtx-pro-6000")
    low, high = (check_command(KIMI_EP8.replace("0.85", f), cluster=cluster) for f in ("0.85", "0.9"))
    steps, shared = StepTimes(low.model, low.setup.layout, cluster), {}
    memories = [memory_ledger(c.model, c.setup.layout, cluster) for c in (low, high)]
    small, large = (m.max_concurrency(isl=1024, osl=1024) for m in memories)
    assert small < large
    levels = [1, 2 * small]
    a, b = (Predictor(steps, m, shared=shared).figures(levels, isl=1024, osl=1024) for m in memories)
    assert a[0] is b[0]
    assert (a[1].running, b[1].running) == (small, min(large, 2 * small)) and a[1] is not b[1]
    for c, m, figures in ((low, memories[0], a), (high, memories[1], b)):
        alone = Predictor(StepTimes(c.model, c.setup.layout, cluster), m).sweep(levels, isl=1024, osl=1024)
        assert [replace(p, decode=None) for p in alone] == list(figures)


def test_cuda_graph_twins_share_a_cycle_only_where_neither_graphs_the_step():
    """A search prices each layout with CUDA graphs on and off: the ops cost the same, so where the step is not
    graphed (beyond --cuda-graph-max-bs) the two cycles are one, and below it the graphed one is faster; each is
    the cycle its step gives (`decode`), as it would be priced alone."""
    cluster = load_cluster("8xrtx-pro-6000")
    on = check_command(KIMI_EP8.replace(" --disable-cuda-graph", ""), cluster=cluster)
    off = check_command(KIMI_EP8, cluster=cluster)
    graph_max = on.setup.layout.options.cuda_graph_max_bs
    assert graph_max and off.setup.layout.options.cuda_graph is False
    book = PriceBook()  # one model and one book, as a search has
    graphed, eager = (StepTimes(on.model, c.setup.layout, cluster, book=book) for c in (on, off))
    beyond = 2 * graph_max
    assert graphed.cycle(beyond, 1536) is eager.cycle(beyond, 1536)
    assert graphed.cycle(1, 1536)[0] < eager.cycle(1, 1536)[0]
    for steps, c in ((graphed, on), (eager, off)):
        alone = StepTimes(c.model, c.setup.layout, cluster)  # a book of its own
        for running in (1, beyond):
            cycle_s, parts = steps.cycle(running, 1536)
            decode = alone.decode(running, 1536)
            assert (cycle_s, parts) == (decode.cycle_s, decode.parts_s) == (decode.step.time_s, decode.step.parts_s)


def test_loads_beyond_the_pool_share_their_figures_but_not_their_breakdown(kimi):
    """Every load beyond the KV pool runs as many requests: the same throughput and TPOT, a TTFT that grows with the
    queue; each prediction keeps its own breakdown (changing one changes no other)."""
    _, memory, predictor = kimi
    cap = memory.max_concurrency(isl=1024, osl=1024)
    a, b = predictor.sweep([2 * cap, 4 * cap], isl=1024, osl=1024)
    assert (a.running, a.output_tok_s, a.tpot_s) == (b.running, b.output_tok_s, b.tpot_s) == (cap, a.output_tok_s,
                                                                                                a.tpot_s)  # fmt: skip
    assert b.ttft_s > a.ttft_s and a.bound == b.bound == "kv_capacity"
    assert a.breakdown_s == b.breakdown_s and a.breakdown_s is not b.breakdown_s


def test_a_request_sent_between_reads_waits_for_the_next_by_hand():
    """SGLang --scheduler-recv-interval 10 reads new requests every 10 decode steps (and at once after a prefill).
    Two clients send A (400 tokens out) and B (92 out), prefilled together; B's last token comes from decode step
    91, so its client's next request C is read at step 100: it waits 9 steps of A alone, then its own prefill.
    Read every step, C still misses the read that formed step 92 (it came before B's token reached the client)
    and, as the overlap schedule forms step 93 while step 92 runs, waits two steps of A (one without the overlap
    schedule: scheduler.py event_loop_overlap launches a batch before it hands out the last one's tokens)."""
    w = WorkloadSpec(input=Lengths.fixed(1), output=Lengths.fixed(1), num_requests=3, concurrency=2,
                     pairs=((100, 400), (100, 92), (100, 50)))  # fmt: skip
    waits = {}
    for flags in ("--scheduler-recv-interval 1", "--scheduler-recv-interval 10", "--disable-overlap-schedule"):
        steps, memory, _ = _setup(f"{KIMI_EP8} {flags}", "8xrtx-pro-6000")
        run = _Run(Simulation(steps, memory), draw(w), 2, None)
        run.loop()
        waits[flags] = run.first[2] - run.arrive[2]
    assert steps.layout.options.overlap_schedule is False
    overlapped, _, _ = _setup(f"{KIMI_EP8} --scheduler-recv-interval 10", "8xrtx-pro-6000")
    assert overlapped.layout.options.scheduler.poll_decode_steps == 10 and overlapped.layout.options.overlap_schedule
    prefill = overlapped.prefill_s(1, 100, 0)
    a_alone = overlapped.decode_s(1, 100 + 92 + 1)
    assert waits["--scheduler-recv-interval 1"] == pytest.approx(prefill + 2 * a_alone, rel=2e-3)
    assert waits["--disable-overlap-schedule"] == pytest.approx(
        steps.prefill_s(1, 100, 0) + steps.decode_s(1, 100 + 92 + 1), rel=2e-3
    )
    assert waits["--scheduler-recv-interval 10"] == pytest.approx(
        prefill + 9 * overlapped.decode_s(1, 100 + 92 + 4), rel=2e-3
    )


LLAMA_SGLANG = "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(
    ("flags", "version", "isl", "batches"),
    [
        # 8,192-token chunks, the 16,384-token budget: the second prompt fits what is left of it, so the chunk cuts it
        ("--chunked-prefill-size 8192", "0.5.12", 6000, [[6000, 2192], [3808, 4384], [1616, 6000]]),
        # a budget below the chunk: before 0.5.13 a prompt joins only whole under what is left (6,000 >= 2,192: waits);
        # from 0.5.13 it joins while any is left, the chunk alone cutting it
        ("--chunked-prefill-size 16384 --max-prefill-tokens 8192", "0.5.12", 6000, [[6000]] * 4),
        ("--chunked-prefill-size 16384 --max-prefill-tokens 8192", "0.5.13", 6000, [[6000, 6000]] * 2),
        # the prefix cache off: requests that run to their length go through add_one_req_ignore_eos, no whole test
        (
            "--chunked-prefill-size 16384 --max-prefill-tokens 8192 --disable-radix-cache",
            "0.5.12",
            6000,
            [[6000, 6000]] * 2,
        ),
        # unchunked: whole prompts under the budget (the third, 6,000 >= 4,384 left, waits; 8,192 >= 8,192 too) ...
        ("--chunked-prefill-size -1", "0.5.13", 6000, [[6000, 6000]] * 2),
        ("--chunked-prefill-size -1", "0.5.13", 8192, [[8192]] * 4),
        # ... and the first whole whatever the budget
        ("--chunked-prefill-size -1 --max-prefill-tokens 4096", "0.5.13", 6000, [[6000]] * 4),
        # a resumed chunk spends the budget: 0.5.14 still lets the next request in, cut to the rest of the chunk;
        # 0.5.23 asks the budget before the first waiting request too
        (
            "--chunked-prefill-size 16384 --max-prefill-tokens 4096",
            "0.5.14",
            30000,
            [[16384], [13616, 2768], [16384], [10848, 5536], [16384], [8080, 8304], [16384], [5312]],
        ),
        ("--chunked-prefill-size 16384 --max-prefill-tokens 4096", "0.5.23", 30000, [[16384], [13616]] * 4),
    ],
)
def test_sglang_prefill_batches_by_hand(flags, version, isl, batches):
    """Four prompts waiting at once, batched as SGLang's PrefillAdder does (schedule_policy.py budget_state,
    add_one_req, add_one_req_ignore_eos; scheduler.py get_new_batch_prefill): the chunk cuts the last prompt to fit,
    --max-prefill-tokens closes the batch once spent and, before 0.5.13 or unchunked, lets a later prompt in only
    whole under what is left. The closed form takes as many whole prompts per batch as the first batch holds (one,
    where the chunk cuts the first)."""
    steps, memory, run = _prefill_run(flags, version, isl)
    rank = run.ranks[0]
    rank.waiting.extend(range(4))
    made = []
    while rank.waiting or rank.chunked is not None:
        made.append([take for _, take in run._prefill_batch(rank)])
    assert made == batches
    assert Predictor(steps, memory)._per_batch(isl) == max(1, sum(take == isl for take in batches[0]))


def test_mixed_decode_rows_spend_sglangs_prefill_budget():
    """--enable-mixed-chunk: the running requests' decode tokens come out of the chunk and the prefill budget both
    (PrefillAdder num_mixed_decode_tokens), so beside 2 running requests a second 4,095-token prompt no longer fits
    what is left of 8,192 whole (4,095 >= 8,190 - 4,095) and waits; alone it would have joined."""
    flags = "--enable-mixed-chunk --chunked-prefill-size 8192 --max-prefill-tokens 8192"
    _, _, run = _prefill_run(flags, "0.5.12", 4095, requests=6)
    rank = run.ranks[0]
    rank.running.extend([4, 5])
    rank.waiting.extend(range(4))
    assert [take for _, take in run._prefill_batch(rank)] == [4095]
    rank.running.clear()
    assert [take for _, take in run._prefill_batch(rank)] == [4095, 4095]


def _prefill_run(flags: str, version: str, isl: int, *, requests: int = 4):
    cluster = load_cluster("1xh100")
    checked = check_command(f"{LLAMA_SGLANG} {flags}", cluster=cluster, version=version)
    layout = checked.setup.layout
    memory = memory_ledger(checked.model, layout, cluster)
    steps = StepTimes(checked.model, layout, cluster)
    workload = WorkloadSpec(input=Lengths.fixed(isl), output=Lengths.fixed(16), num_requests=requests, offline=True)
    return steps, memory, _Run(Simulation(steps, memory), draw(workload), None, None, offline=True)


def test_a_spent_prefill_budget_at_start_is_refused_by_check_where_the_engine_admits_nothing():
    """SGLang 0.5.23 asks the prefill budget before the first waiting request: with --max-prefill-tokens 0 it starts
    and never admits one, which check says (a run-time refusal, no engine error) before anything is priced; 0.5.22
    admits the first and serves one request a batch."""
    cluster = load_cluster("1xh100")
    for budget in ("0", "-3"):
        setup = check_command(f"{LLAMA_SGLANG} --max-prefill-tokens {budget}", cluster=cluster, version="0.5.23").setup
        (refusal,) = setup.rejections
        assert (refusal.rule, refusal.stage, refusal.engine_error) == ("prefill_budget", "run", None)
        assert refusal.reason.startswith(f"--max-prefill-tokens {budget}: sglang 0.5.23 asks this budget")
    assert not check_command(
        f"{LLAMA_SGLANG} --max-prefill-tokens 1", cluster=cluster, version="0.5.23"
    ).setup.rejections
    steps, memory, run = _prefill_run("--max-prefill-tokens 0", "0.5.22", 1024)
    run.ranks[0].waiting.extend(range(4))
    assert [take for _, take in run._prefill_batch(run.ranks[0])] == [1024]
    assert Predictor(steps, memory)._per_batch(1024) == 1
