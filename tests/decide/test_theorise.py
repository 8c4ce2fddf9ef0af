"""theorise on the user's case, checked against the engine, the physics floor and its own definitions."""

import gc
import json
import weakref

import pytest

from shardwise.cost.memory import memory_ledger
from shardwise.decide.ceiling import ceiling
from shardwise.decide.rank import Objective, flag_gains, knee, option_gains, pareto, rank, winners_by_concurrency
from shardwise.decide.search import search
from shardwise.decide.theory import no_cycle_collection, theorise, would_fit
from shardwise.decide.whatif import what_ifs
from shardwise.engines.check import check_command
from shardwise.errors import SpecError
from shardwise.report.theory import narrative
from shardwise.serve.accuracy import stated_median
from shardwise.spec.catalog import load_model
from shardwise.spec.cluster import load_cluster
from shardwise.spec.weights import weight_ledger

CLIENTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


@pytest.fixture(scope="module")
def user_case():
    cluster = load_cluster("8xrtx-pro-6000")
    model = load_model("kimi-k2.6")
    return theorise(model, cluster, model_ref="kimi-k2.6", engines=["sglang"], isl=1024, osl=1024)  # fmt: skip


@pytest.fixture(scope="module")
def by_prediction(user_case):
    """The user's case ranked by its predictions alone (no family's confidence): its best is the top prediction, a
    DCP setup with attention DP and PP, whose mechanisms the flag and what-if tests exercise."""
    return rank(user_case.result.candidates, Objective.MAX_THROUGHPUT)


def test_the_winner_has_a_binding_constraint_and_a_command_that_starts(user_case):
    best = user_case.best
    assert best is not None and user_case.explanation is not None
    assert user_case.explanation.bound in {"kv_capacity", "memory", "compute", "comm", "launch", "host", "prefill"}
    checked = check_command(list(best.launch), cluster=user_case.result.case.cluster)
    assert checked.setup.valid and checked.setup.gpus_used == 8
    assert memory_ledger(checked.model, checked.setup.layout, user_case.result.case.cluster).verdict == "ok"
    assert user_case.verify[0] == best.launch


def _best_or_its_default_twin(ranking, top_value):
    """The ranking's first is the top prediction (to the four digits a report shows), or a setup whose family was
    measured on these GPUs with a smaller error and which the top beats by no more than its own uncertainty, or,
    within the tie band, the same layout with fewer options; the rest follow in the order of their shown figures."""
    best, over = ranking.best, ranking.preferred_over
    passed = ranking.unvalidated_over
    if passed is not None:
        assert passed.value == pytest.approx(top_value, rel=5e-4)
        mine, theirs = ranking.confidence(best), ranking.confidence(passed)
        assert mine.basis == "this GPU" and mine.uncertainty < theirs.uncertainty
        assert passed.value <= best.value * (1 + theirs.uncertainty)
        top_value = (over or best).value
    if over is None:
        assert best.value == pytest.approx(top_value, rel=5e-4)
    else:
        assert over.value == pytest.approx(top_value, rel=5e-4) and top_value <= best.value * (1 + ranking.band)
        assert set(best.candidate.options) < set(over.candidate.options)
        assert best.candidate.layout.structure() == over.candidate.layout.structure()
    values = [float(f"{s.value:.4g}") for s in ranking.scores if s is not best and s is not passed]
    assert values == sorted(values, reverse=True)


def test_the_ranking_is_the_best_peak(user_case, by_prediction):
    peaks = [c.peak.output_tok_s for c in user_case.result.candidates]
    _best_or_its_default_twin(user_case.ranking, max(peaks))
    _best_or_its_default_twin(by_prediction, max(peaks))


def _confidences(measured, top_uncertainty, measured_uncertainty=0.1):
    """A confidence per score: `measured` (a score) validated on this GPU at ±`measured_uncertainty`, every other
    setup extrapolated at ±`top_uncertainty`."""
    from shardwise.serve.accuracy import Confidence

    def of(score):
        here = score.candidate is measured.candidate
        return Confidence(
            family="measured" if here else "extrapolated",
            regime="C > 64",
            basis="this GPU" if here else "none",
            rows=1 if here else 0,
            scope="",
            median_error={"output_tok_s": measured_uncertainty if here else None},
            uncertainty=measured_uncertainty if here else top_uncertainty,
        )

    return of


def test_a_measured_family_wins_within_the_tops_uncertainty_and_not_beyond(user_case, by_prediction):
    """The rule, on the user's candidates with made-up confidences: a setup measured on these GPUs comes first where
    the top prediction's gain over it is within the top's uncertainty; beyond it the top stays first and the measured
    one is named as the fallback."""
    top = by_prediction.scores[0]
    # the first setup the top beats by more than the measured one's own ±10 %
    measured = next(s for s in by_prediction.scores if top.value > 1.3 * s.value)
    gain = top.value / measured.value - 1
    within = rank(
        user_case.result.candidates, Objective.MAX_THROUGHPUT, confidence_of=_confidences(measured, 1.01 * gain)
    )
    beyond = rank(
        user_case.result.candidates,
        Objective.MAX_THROUGHPUT,
        confidence_of=_confidences(measured, 0.99 * gain),
    )
    # first: the measured setup (or its twin with the engine's defaults, where the two tie)
    assert within.best.candidate.layout.structure() == measured.candidate.layout.structure()
    assert within.unvalidated_over.candidate is top.candidate and within.measured_alternative is None
    assert beyond.unvalidated_over is None and beyond.measured_alternative.candidate is measured.candidate
    assert beyond.best.candidate.layout.structure() == top.candidate.layout.structure()
    # a measured family that errs more than the top may be off by is no fallback: the top stays, no one is named
    erring = rank(
        user_case.result.candidates,
        Objective.MAX_THROUGHPUT,
        confidence_of=_confidences(measured, 1.01 * gain, measured_uncertainty=2 * gain),
    )
    assert erring.unvalidated_over is None and erring.measured_alternative is None


def test_an_extrapolated_family_wins_only_beyond_its_uncertainty(user_case, by_prediction):
    """On the user's box the top prediction (attention DP, EP, PP and DCP over PCIe) belongs to a family no run
    measured on RTX PRO 6000: its uncertainty is the 90th percentile of every validated row's error. Its predicted gain
    over the best TP EP setup (the family the user's EP8 run validates here) exceeds that, so it is recommended, and
    the report names the measured TP EP setup as the fallback to measure against."""
    ranking = user_case.ranking
    best, alt = ranking.best, ranking.measured_alternative
    assert ranking.unvalidated_over is None
    assert best.value == pytest.approx(by_prediction.best.value, rel=5e-4)
    mine, theirs = ranking.confidence(best), ranking.confidence(alt)
    assert mine.basis == "none" and theirs.basis == "this GPU" and theirs.family == "sglang TP EP"
    assert best.value > alt.value * (1 + mine.uncertainty)
    assert "that one is the measured fallback" in " ".join(narrative(user_case))


def test_a_tie_goes_to_the_engine_defaults(user_case):
    # on the user's case CUDA graphs off and on predict the same at 512 clients: graphs stay on (the default)
    ranking = user_case.ranking
    # the stated median error of output tok/s, over every validated row (test_accuracy works it out by hand)
    assert ranking.band == stated_median("plain", "output_tok_s") and 0.1 < ranking.band < 0.2
    assert "CUDA graphs off" not in ranking.best.candidate.options
    gains = {g.option: g for g in option_gains(ranking)}
    assert set(gains) == set(ranking.best.candidate.options)
    for g in gains.values():  # each option's twin without it, where that serves, is slower
        assert g.without is None or g.without.value < ranking.best.value


def test_each_layout_flag_says_what_it_buys(by_prediction):
    """A layout flag of the recommended command is priced against the searched setup whose command leaves it out
    (with a flag that needs it: DCP's attention backend), keeps every other layout flag and has the same kinds of
    options (a raised memory fraction being that layout's own largest)."""
    best = by_prediction.best.candidate
    variants = {"disable_cuda_graph", "kv_cache_dtype", "mem_fraction_static"}
    gains = {f.flags: f for f in flag_gains(by_prediction)}
    dcp = gains[("--dcp-size 2", "--attention-backend flashinfer")]
    twin = dcp.without.candidate
    assert {k: v for k, v in twin.setup.given.items() if k not in variants} == {
        k: v for k, v in best.setup.given.items() if k not in variants | {"dcp_size", "attention_backend"}
    }
    assert twin.option_kinds == best.option_kinds
    # DCP splits each attention-DP group's latents over its ranks: at the same memory fraction the twin holds half
    # the requests at once
    assert twin.layout.options.memory_fraction == best.layout.options.memory_fraction  # both raised to 0.90
    cap = twin.memory.max_concurrency(isl=1024, osl=1024)
    assert best.memory.max_concurrency(isl=1024, osl=1024) == pytest.approx(2 * cap, rel=0.02)
    assert dcp.gain(by_prediction.best.value) > 0
    for f in gains.values():
        kept = {k: v for k, v in f.without.candidate.setup.given.items() if k not in variants}
        ours = {k: v for k, v in best.setup.given.items() if k not in variants}
        assert kept.items() < ours.items() and len(ours) - len(kept) == len(f.flags)
        assert f.without.candidate.option_kinds == best.option_kinds


def test_the_users_failed_setups_are_excluded_for_their_true_reasons(user_case):
    by_flags = {" ".join(e.launch[5:]).replace(" --trust-remote-code", ""): e for e in user_case.result.excluded}
    tp4_ep2 = by_flags["--tp-size 4 --ep-size 2"]
    assert tp4_ep2.verdict == "oom" and tp4_ep2.hand_tried
    assert "starts on 4 of the 8 GPUs" in tp4_ep2.reason and "140.7 GiB of weights" in tp4_ep2.reason
    tp2_ep4 = by_flags["--tp-size 2 --ep-size 4"]
    assert tp2_ep4.verdict == "invalid"
    assert "moe_tp_size = tp 2 // ep 4 // moe_dp 1 = 0" in tp2_ep4.reason
    assert "parallel topology is inconsistent" in (tp2_ep4.engine_error or "")  # 0.5.23; 0.5.20 and older:
    assert "ZeroDivisionError" in tp2_ep4.reason  # what the user saw


def test_the_ceiling_is_above_every_prediction(user_case):
    assert user_case.ceiling is not None
    assert all(c.peak.output_tok_s < user_case.ceiling.output_tok_s for c in user_case.result.candidates)


def test_ceiling_by_hand_for_a_dense_model():
    """Llama-3.1-8B on one H100: at batch 1 a step reads every weight once plus one request's KV, at the
    measured bandwidth; the ceiling is the best batch the memory allows, which is at least that."""
    model, cluster = load_model("llama-3.1-8b"), load_cluster("1xh100")
    ce = ceiling(model, cluster, isl=1024, osl=1024)
    bandwidth = cluster.gpu.mem_bandwidth_measured_bytes_per_s or cluster.gpu.mem_bandwidth_bytes_per_s
    one = (weight_ledger(model).total_bytes + 1536 * model.kv_bytes_per_token) / bandwidth
    assert ce is not None and ce.output_tok_s >= 1 / one
    assert ce.batch == ce.max_batch  # a dense model on one GPU stays memory-bound up to its KV limit
    assert ce.output_tok_s == pytest.approx(ce.batch / ce.step_s)


def test_winners_and_frontier_follow_their_definitions(user_case):
    candidates = user_case.result.candidates
    for n, w in enumerate(winners_by_concurrency(candidates)):
        assert w.prediction.output_tok_s == max(c.predictions[n].output_tok_s for c in candidates)
    front = pareto(candidates)
    for q in front:  # nothing beats a frontier point on both axes
        assert not any(
            p.per_user_tok_s > q.per_user_tok_s and p.output_tok_s / c.gpus > q.tok_s_per_gpu
            for c in candidates
            for p in c.predictions
        )


def test_objectives(user_case):
    candidates = user_case.result.candidates
    fastest = rank(candidates, Objective.MIN_LATENCY)
    _best_or_its_default_twin(fastest, max(c.predictions[0].per_user_tok_s for c in candidates))
    slo = rank(candidates, Objective.UNDER_SLO, tpot_s=0.05)
    assert slo.best.at.tpot_s <= 0.05
    assert slo.best.value <= user_case.ranking.best.value
    with pytest.raises(SpecError, match="needs a limit"):
        rank(candidates, Objective.UNDER_SLO)


def test_what_ifs_are_priced(user_case, by_prediction):
    labels = {w.label: w for w in what_ifs(user_case.result, by_prediction)}
    nvlink = next(w for label, w in labels.items() if label.startswith("NVLink"))
    assert nvlink.gain > 1  # removing the PCIe all-reduce cost can only help
    assert any(label.startswith("twice the GPUs") for label in labels)
    assert "DFlash drafting" in labels and labels["DFlash drafting"].gain is None  # needs --accept-length
    # two-batch overlap runs each MoE layer once per half of the batch, reading the experts twice, and without an
    # all-to-all backend hides none of Kimi's collectives: it can only lose
    tbo = labels["two-batch overlap"]
    assert tbo.output_tok_s is not None and tbo.gain < 1.0
    assert "need NVLink" in labels["DeepEP all-to-all"].note and labels["DeepEP all-to-all"].gain is None
    assert labels["DeepEP all-to-all, two-batch overlap"].note == "refused, as above"


def test_when_nothing_fits_it_says_what_would():
    model, cluster = load_model("kimi-k2.6"), load_cluster("1xh100")
    t = theorise(model, cluster, model_ref="kimi-k2.6", engines=["sglang"], isl=1024, osl=1024, concurrency=[1])
    assert t.best is None and t.would_fit
    # 595 GB of weights over 76 GiB (81.6 GB) per H100 after the CUDA stack: 7.3 GPUs, so 8 hold the bytes
    assert "try 8 h100-sxm GPUs (--gpus 8xh100-sxm)" in would_fit(model, cluster, isl=1024, osl=1024)[0]
    # on 8 the bytes fit but the engine's reserves do not (theorise finds no setup there): twice as many
    eight = theorise(model, load_cluster("8xh100"), model_ref="kimi-k2.6", engines=["sglang"], isl=1024, osl=1024,
                     concurrency=[1])  # fmt: skip
    assert eight.best is None and "--gpus 2x8xh100-sxm" in eight.would_fit[0]


def test_a_request_too_long_for_every_pool_is_said_to_be_the_problem():
    """Within the model's context (Kimi: 262,144 tokens) the pool decides; beyond it, the context does."""
    model, cluster = load_model("kimi-k2.6"), load_cluster("8xrtx-pro-6000")
    t = theorise(model, cluster, model_ref="kimi-k2.6", engines=["sglang"], isl=2_000_000, osl=1024,
                 concurrency=[1])  # fmt: skip
    assert t.best is None
    assert "longer than the 262,144 tokens of kimi-k2.6's context" in t.would_fit[0]
    small = load_cluster("1xl4")
    t = theorise(load_model("llama-3.1-8b"), small, model_ref="llama-3.1-8b", engines=["sglang"], isl=120_000,
                 osl=1024, concurrency=[1])  # fmt: skip
    assert t.best is None and "none holds one request of 120,000 + 1,024 tokens" in t.would_fit[0]


def test_a_benchmark_workload_simulates_the_best_setups_as_the_tool_sends_it():
    """--lengths sharegpt --num-prompts 200: the five best setups of the screen, each simulated as 200 ShareGPT
    prompts sent at once (the tools' default rate), ranked again by what the benchmark would report."""
    from typer.testing import CliRunner

    from shardwise.cli import app

    result = CliRunner().invoke(app, ["theorise", "--lengths", "sharegpt", "--num-prompts", "200", "--json"])
    assert result.exit_code == 0, result.output
    bench = json.loads(result.stdout)["benchmark"]
    assert [w["num_prompts"] for w in bench["workloads"]] == [200] and bench["workloads"][0]["request_rate"] is None
    ranked = bench["ranked"]
    assert 1 <= len(ranked) <= 5
    assert sorted({r["screen_rank"] for r in ranked}) == sorted(r["screen_rank"] for r in ranked)  # distinct
    values = [r["output_tok_s"] for r in ranked]
    assert values == sorted(values, reverse=True)
    for r in ranked:
        (run,) = r["results"]
        assert run["load"] == "200 at once" and run["tpot_ms_mean"] > 0 and run["ttft_s_mean"] > 0
    # the commands that check it start the benchmark's best and send what the benchmark sent
    *launches, bench, simulate = json.loads(result.stdout)["verify"]
    assert launches[0] == ranked[0]["launch"]
    assert bench[:3] == ["python", "-m", "sglang.bench_serving"] and "sharegpt" in bench and "200" in bench
    assert "--max-concurrency" not in bench and "--request-rate" not in bench  # the tool's default: all at once
    assert simulate[:2] == ["shardwise", "simulate"] and simulate[simulate.index("--lengths") + 1] == "sharegpt"
    assert simulate[simulate.index("--request-rate") + 1] == "inf"


def test_the_search_goes_on_until_every_kv_pool_binds(user_case):
    levels = user_case.result.concurrency
    assert list(levels[: len(CLIENTS)]) == CLIENTS  # the screen's levels, then doublings
    assert all(b == 2 * a for a, b in zip(levels[len(CLIENTS) - 1 :], levels[len(CLIENTS) :], strict=False))
    caps = [c.memory.max_concurrency(isl=1024, osl=1024) for c in user_case.result.candidates]
    assert levels[-1] >= max(caps) > levels[-2]  # the last level is the first past the largest pool
    for c in user_case.result.candidates:  # past its pool a setup runs no more at once: its throughput is flat
        at_cap = [p.output_tok_s for p in c.predictions if p.running >= c.memory.max_concurrency(isl=1024, osl=1024)]
        assert not at_cap or max(at_cap) == pytest.approx(c.peak.output_tok_s)
    best = user_case.best
    k, top = knee(best), best.peak.output_tok_s
    assert k.output_tok_s >= 0.95 * top
    assert all(p.output_tok_s < 0.95 * top for p in best.predictions if p.concurrency < k.concurrency)


def test_the_package_answers_the_users_question_with_its_defaults(user_case):
    import shardwise

    theory = shardwise.theorise()  # the command's defaults: the user's case
    assert isinstance(theory, shardwise.Theory)
    assert theory.best.name == user_case.best.name and theory.best.launch == user_case.best.launch
    line = str(theory.best)
    assert line.startswith(theory.best.name) and " ".join(theory.best.launch) in line
    assert f"{theory.best.peak.output_tok_s:,.0f} output tok/s at {theory.best.peak.concurrency} clients" in line


def test_vllm_layouts_whose_pool_is_shorter_than_the_context_are_searched_with_a_shorter_one():
    """vLLM refuses to start when its KV pool cannot hold one request of the model's whole context (262,144 tokens
    for Kimi K2.6); the search lowers --max-model-len to the smallest power of two that holds the workload's
    requests (1024 + 1024: 2,048), never below them, and the command it prints starts."""
    model, cluster = load_model("kimi-k2.6"), load_cluster("8xrtx-pro-6000")
    t = theorise(model, cluster, model_ref="kimi-k2.6", engines=["vllm"], isl=1024, osl=1024, concurrency=[1, 64])
    shorter = [c for c in t.result.candidates if "max model len 2,048" in c.options]
    assert shorter
    for c in shorter[:3]:
        assert c.layout.options.max_model_len == 2048 and "--max-model-len" in c.launch
        checked = check_command(list(c.launch), cluster=cluster)
        assert checked.setup.valid
        assert memory_ledger(checked.model, checked.setup.layout, cluster).verdict == "ok"
        default = {k: v for k, v in c.setup.given.items() if k != "max_model_len"}
        assert not any(o.setup.given == default for o in t.result.candidates)  # it did not start at its default


def test_what_a_search_lets_go_comes_back_as_it_was_priced(user_case):
    """A search keeps of each setup only its options, layout and figures: its engine setup and memory ledger are made
    again when a report asks. They must be those the search priced: the same layout, and a KV pool that caps the
    running requests where the predictions were capped (the last level is beyond every pool). Setups that differ
    only in their memory fraction share their predictions wherever they run as many requests."""
    result = user_case.result
    isl, osl = result.case.isl, result.case.osl
    assert result.concurrency[-1] > max(c.memory.max_concurrency(isl=isl, osl=osl) for c in result.candidates)
    for c in result.candidates:
        assert c.setup.valid and c.setup.layout == c.layout and c.setup.given == c.given
        assert c.predictions[-1].running == c.memory.max_concurrency(isl=isl, osl=osl)


def test_a_search_makes_no_reference_cycles():
    """`theorise` pauses Python's cycle collector while it searches (`no_cycle_collection`): a search must then free
    all it lets go by reference counts alone. A second search of both engines (the first loads the tables) leaves
    nothing for the collector; a step that held its cost model, say, would leave a cycle for every step priced."""
    model, cluster = load_model("kimi-k2.6"), load_cluster("8xrtx-pro-6000")

    def searched() -> int:
        result = search(model, cluster, model_ref="kimi-k2.6", engines=["sglang", "vllm"], isl=1024, osl=1024,
                        concurrency=CLIENTS, saturate=True)  # fmt: skip
        best = max(result.candidates, key=lambda c: c.peak.output_tok_s)
        assert best.priced()[-1].decode is not None and best.memory.verdict == "ok"  # what a report makes again
        return len(result.candidates)

    with no_cycle_collection():
        searched()
        gc.collect()
        setups = searched()
        left = gc.collect()
    assert setups > 500
    assert left < setups / 10


def test_the_paused_collector_resumes_and_collects_what_was_made_while_paused():
    """`no_cycle_collection` resumes a running collector on the way out (also when the body raises), leaves a paused
    one paused, and a cycle made while paused is still collected after: counted old, not frozen for good."""

    class Node:
        pass

    assert gc.isenabled()
    with pytest.raises(RuntimeError), no_cycle_collection():
        assert not gc.isenabled()
        raise RuntimeError("the body fails")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with no_cycle_collection():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle, then let go
        made = weakref.ref(a)
        del a, b
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert made() is not None  # nothing collected it while paused
    gc.collect()
    assert made() is None
    gc.disable()
    try:
        with no_cycle_collection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
