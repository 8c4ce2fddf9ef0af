"""The InferenceX points, replayed: every SGLang / vLLM point is either a row predicted as its script launched it
and its client sent it, or listed with why not; the errors over every predicted row are guarded per metric and per
group, so that none rises unseen."""

import csv
import io
import re
import statistics
from pathlib import Path

import pytest
from packaging.version import Version

from shardwise.engines.flags import flag_table, split_command, unmodelled_flags
from shardwise.errors import SpecError
from shardwise.measure.gaps import explain
from shardwise.measure.inferencex import bundled_path, client_mismatch, read_points, release_of
from shardwise.measure.reference import breakdown, check_row, headline, load_rows, split_of, validated_csv
from shardwise.report.validation import _cold_lines
from shardwise.serve.accuracy import validated_path
from shardwise.serve.steps import StepTimes
from shardwise.spec.catalog import load_model

POINTS = read_points()


def test_every_engine_point_is_a_row_or_says_why_not():
    with bundled_path().open(newline="") as f:
        ids = [p["id"] for p in csv.DictReader(f)]
    assert sorted([r.id for r in POINTS.rows] + [s.id for s in POINTS.skipped]) == sorted(ids)
    assert all(s.reason for s in POINTS.skipped)


def test_every_official_point_has_the_command_its_script_ran():
    """scripts/inferencex_launches.py ran each script with the CI matrix's values: all 775 official points have a
    launch command (the experimental sbatch scripts of MiniMax-M2.5 and Qwen3.5 stop before they launch)."""
    with bundled_path().open(newline="") as f:
        official = [p for p in csv.DictReader(f) if p["provenance"] == "official_ci_api"]
    assert len(official) == 775
    assert [p["id"] for p in official if not p["command"]] == []


def test_a_point_is_replayed_as_its_client_sent_it():
    """ixapp-dsr1-0904: DeepSeek-R1-0528 FP8 on 8×MI355X, SGLang 0.5.8, 1k in / 8k out at concurrency 4: 40
    prompts, lengths uniform in [819, 1024] and [6553, 8192], all sent at once under 4 clients; latencies are
    medians."""
    (row,) = [r for r in POINTS.rows if r.id == "ixapp-dsr1-0904"]
    spec = row.workload_spec()
    assert (row.model, row.gpus, row.engine_version, row.latency) == ("deepseek-r1", "8xmi355x", "0.5.8", "median")
    assert (spec.input.low, spec.input.high, spec.output.low, spec.output.high) == (819, 1024, 6553, 8192)
    assert (spec.num_requests, spec.concurrency, spec.request_rate) == (40, 4, float("inf"))
    assert "SGLANG_USE_AITER=1" in row.not_modelled


def test_runs_whose_client_tokenizer_broke_are_replayed_with_the_prompts_the_engine_received():
    """The client ran in the engine's image: SGLang 0.5.10.post1 and 0.5.11 carry transformers 5, under which it
    sent DeepSeek-R1 prompts the engine counted about five times longer, until InferenceX fixed it (runs from
    2026-05-16). They are replayed uniform with the measured mean and spread: 8k prompts (4.602 ± 0.739 × 8192
    tokens) as 3.322 … 5.882 × 8192 = 27,213 … 48,185. 0.5.9 (transformers 4.57.1) and the 0.5.12 runs (all after
    the fix) are replayed as sent."""
    scaled = [r for r in POINTS.rows if r.assumed]
    assert {r.engine_version for r in scaled} == {"0.5.10.post1", "0.5.11"}
    assert len(scaled) == len([r for r in POINTS.rows if r.engine_version in ("0.5.10.post1", "0.5.11")]) == 29
    (b300,) = [r for r in POINTS.rows if r.id == "ixapp-dsr1-0424"]  # B300 TP4 EP4, 8k in, 2026-04-17
    spec = b300.workload_spec().input
    assert (spec.low, spec.high) == (27213, 48185) and "27213..48185" in b300.assumed
    (b200,) = [r for r in POINTS.rows if r.id == "ixapp-dsr1-1740"]  # B200 TP8, 1k in, attempt 2 on 2026-05-15
    assert b200.workload_spec().input.mean == pytest.approx(4.597 * 1024, rel=0.01)
    assert all(r.isl in (1024, 8192) for r in POINTS.rows if r.engine_version in ("0.5.9", "0.5.12"))


def test_the_client_mismatch_applies_by_release_date_engine_and_checkpoint():
    mismatch = client_mismatch()
    point = {
        "framework": "sglang",
        "checkpoint": "nvidia/DeepSeek-R1-0528-FP4-V2",
        "framework_version": "lmsysorg/sglang:v0.5.12-cu130",
        "date": "2026-05-15",
        "isl": "2048",
    }
    longest, ratio = mismatch.lengths(point)  # the nearest measured length, 1k: 4.597 ± 0.81 per token meant
    assert (longest * (1 + ratio) / 2) / 2048 == pytest.approx(4.597, abs=0.001)
    assert (longest * (1 - ratio) / 2) / 2048 == pytest.approx(3**0.5 * 0.81, abs=0.001)
    assert mismatch.lengths(point | {"date": "2026-05-16"}) is None  # the fixed client
    assert mismatch.lengths(point | {"framework_version": "lmsysorg/sglang:v0.5.9-cu130"}) is None  # transformers 4
    assert mismatch.lengths(point | {"framework_version": "lmsysorg/sglang:dev-cu13"}) is None  # release unknown
    assert mismatch.lengths(point | {"framework": "vllm"}) is None
    assert mismatch.lengths(point | {"checkpoint": "zai-org/GLM-5-FP8"}) is None
    assert mismatch.lengths({k: v for k, v in point.items() if k != "date"}) is None


def test_a_run_without_warm_up_waits_for_its_cold_start_as_measured():
    """ixapp-dsr1-1451 (B200 NVFP4 TP8 EP8, SGLang 0.5.5, 8k in / 1k out, 4 clients, 40 prompts, no warm-up
    requests): its 99th-percentile TTFT is 73.5 s against a median of 225 ms, and it measured 240 tok/s where its
    own median latencies give 4 clients about 470. Its first four requests waited for the engine's first-use
    compilation: the replay holds the first step back by the time that p99 exceeds the warm simulation's, so the
    run lasts that much longer. Only where the wait is unambiguous: longer than one of the run's requests took from
    send to last token (0.225 s + 1023 × 8.3 ms at most), which no warm run's first token waits; most runs without
    warm-up show no such wait, their p99 being their ordinary tail. A warmed run (ixapp-dsr1-1642, 2 × 1 warm-up
    requests) waits for none, nor does a run whose p99 does not fall in its first wave."""
    (row,) = [r for r in POINTS.rows if r.id == "ixapp-dsr1-1451"]
    assert row.cold and row.p99_ttft_ms == 73476.19
    cold, warm = check_row(row), check_row(row.model_copy(update={"cold": False}))
    assert warm.cold_start_s == 0.0
    assert cold.cold_start_s == pytest.approx(73.47619 - warm.simulated.ttft_s.p99, rel=1e-9)
    # the cold run lasts that much longer, less what its wait saves: the first wave's text prompts all reach the
    # scheduler while it waits, where a warm engine takes the first alone and the rest after it
    saved = warm.simulated.duration_s + cold.cold_start_s - cold.simulated.duration_s
    steps = StepTimes(load_model(row.model), warm.layout_spec, warm.cluster)
    assert 0 < saved < steps.prefill_s(1, row.isl, 0)
    assert cold.simulated.ttft_s.p99 == pytest.approx(73.47619, rel=0.01)
    # TPOT as it was, but for that first wave prefilled together (its requests then run in step: 5 parts in 10^6)
    assert cold.simulated.tpot_s.p50 == pytest.approx(warm.simulated.tpot_s.p50, rel=1e-4)
    assert abs(cold.error("output_tok_s")) < 0.05 < 0.5 < warm.error("output_tok_s")
    (warmed,) = [r for r in POINTS.rows if r.id == "ixapp-dsr1-1642"]
    assert not warmed.cold and check_row(warmed).cold_start_s == 0.0
    # numpy's p99 of 400 TTFTs interpolates between the 396th and 397th: one of them is not the first wave's
    few = row.model_copy(update={"num_prompts": 400})
    assert check_row(few).cold_start_s == 0.0
    # the same recipe at 1k in, 4 clients: p99 901 ms, shorter than one request (7.4 s): its tail, not a cold start
    (tail,) = [r for r in POINTS.rows if r.id == "ixapp-dsr1-0680"]
    assert tail.cold and tail.p99_ttft_ms == 901.354 and check_row(tail).cold_start_s == 0.0
    cold_rows = [r for r in POINTS.rows if r.cold]
    assert len(cold_rows) > 400 and sum(r.p99_ttft_ms > r.ttft_ms + (r.osl - 1) * r.tpot_ms for r in cold_rows) < 100


def test_a_cell_that_is_not_a_number_is_one_clear_error(tmp_path):
    with bundled_path().open(newline="") as f:
        reader = csv.DictReader(f)
        point = next(p for p in reader if p["id"] == "ixapp-dsr1-1451")
        fields = reader.fieldnames
    bad = tmp_path / "points.csv"
    with bad.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerow({**point, "p99_ttft_ms": "abc"})
    with pytest.raises(SpecError, match="point ixapp-dsr1-1451: could not convert string to float: 'abc'"):
        read_points(bad)


def test_release_is_read_from_the_image_tag():
    assert release_of("lmsysorg/sglang:v0.5.12-cu130") == "0.5.12"
    assert release_of("lmsysorg/sglang:v0.5.5.post3-rocm700-mi35x") == "0.5.5.post3"
    assert release_of("rocm/7.0:rocm7.0_ubuntu_22.04_sgl-dev-v0.5.2-rocm7.0-mi30x-20250915") == "0.5.2"
    assert release_of("vllm/vllm-openai:nightly (unpinned, ~2026-02-13)") is None


def test_flags_the_model_does_not_read_are_listed_not_dropped():
    launch = split_command(
        "python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-R1-0528 --host 0.0.0.0 --port 8888 "
        "--trust-remote-code --tp 8 --num-continuous-decode-steps 4 --disable-radix-cache"
    )
    listed = unmodelled_flags(flag_table("sglang"), launch.argv, Version("0.5.23"))
    # parsed and read nowhere (sglang 0.5.2-0.5.23): listed, and said so; the prefix cache off is modelled (its
    # admission of the requests that run to their length, SchedulerPolicy.admits_to_length)
    assert listed == ("--num-continuous-decode-steps 4 (the engine never reads it)",)


def test_a_file_that_is_not_of_the_form_is_one_clear_error(tmp_path):
    bad = tmp_path / "points.csv"
    bad.write_text("id,model\nx,y\n")
    with pytest.raises(SpecError, match="not an InferenceX points file"):
        read_points(bad)


@pytest.fixture(scope="module")
def checked():
    return [check_row(row) for row in POINTS.rows]


# Median absolute error over every predicted point, and per group, as the README states them (validate --set
# inferencex). A change that makes any of them worse by more than five points fails; one that makes them better
# should lower the figure here and in the README.
STATED = {
    "all": {"output_tok_s": 0.14, "tpot_ms": 0.13, "ttft_ms": 0.19},
    "split: training": {"output_tok_s": 0.14, "tpot_ms": 0.13, "ttft_ms": 0.16},
    "split: held-out": {"output_tok_s": 0.14, "tpot_ms": 0.12, "ttft_ms": 0.23},
    "GPU: b200": {"output_tok_s": 0.08, "tpot_ms": 0.08, "ttft_ms": 0.16},
    "GPU: b300": {"output_tok_s": 0.08, "tpot_ms": 0.09, "ttft_ms": 0.12},
    "GPU: mi300x": {"output_tok_s": 0.42, "tpot_ms": 0.28, "ttft_ms": 0.34},
    "GPU: mi325x": {"output_tok_s": 0.43, "tpot_ms": 0.29, "ttft_ms": 0.10},
    "GPU: mi355x": {"output_tok_s": 0.18, "tpot_ms": 0.21, "ttft_ms": 0.21},
    "kernel tables: most": {"output_tok_s": 0.08, "tpot_ms": 0.08, "ttft_ms": 0.15},
    "kernel tables: part": {"output_tok_s": 0.30, "tpot_ms": 0.22, "ttft_ms": 0.24},
    "kernel tables: none": {"output_tok_s": 0.23, "tpot_ms": 0.28, "ttft_ms": 0.26},
    "family: sglang TP": {"output_tok_s": 0.19, "tpot_ms": 0.19, "ttft_ms": 0.25},
    "family: sglang TP EP": {"output_tok_s": 0.07, "tpot_ms": 0.08, "ttft_ms": 0.11},
}
SLACK = 0.05


def test_every_predicted_point_has_a_prediction(checked):
    assert len(checked) == len(POINTS.rows) >= 700
    assert [c.row.id for c in checked if c.simulated is None] == []


@pytest.mark.parametrize("group", sorted(STATED))
def test_median_errors_stay_within_five_points_of_the_stated_figures(checked, group):
    found = headline(checked) if group == "all" else [s for s in breakdown(checked) if s.group == group]
    medians = {s.metric: s.median_ape for s in found}
    for metric, stated in STATED[group].items():
        assert medians[metric] <= stated + SLACK, f"{group} {metric}: {medians[metric]:.0%} against {stated:.0%}"


def test_the_headline_is_the_median_over_every_row(checked):
    (tok,) = [s for s in headline(checked) if s.metric == "output_tok_s"]
    errors = [abs(c.error("output_tok_s")) for c in checked]
    assert tok.rows == len(checked) and tok.median_ape == pytest.approx(statistics.median(errors))


def test_the_held_out_recipes_are_those_the_rule_gives(checked):
    """splits.yaml's rule, remade from the predicted points: each GPU's recipes with a predicted point, sorted,
    every second one held out. A recipe that gains or loses its predictions changes the list (and the file is
    made again), so neither split can come to lack a GPU the other holds."""
    recipes: dict[str, set[str]] = {}
    for c in checked:
        recipes.setdefault(c.row.gpus.split("x", 1)[1], set()).add(Path(c.row.split_key).name)
    ruled = {recipe for each in recipes.values() for recipe in sorted(each)[1::2]}
    held = {Path(c.row.split_key).name for c in checked if split_of(c.row) == "held-out"}
    assert held == ruled
    for gpu, each in recipes.items():  # every GPU of two recipes or more is in both splits
        splits = {split_of(c.row) for c in checked if c.row.gpus.endswith("x" + gpu)}
        assert len(each) < 2 or splits == {"training", "held-out"}, gpu


@pytest.mark.parametrize(
    "metric",
    [
        "output_tok_s",
        "tpot_ms",
        pytest.param(
            "ttft_ms",
            marks=pytest.mark.xfail(
                strict=True,
                reason="issue goal not met: held-out 22.6 %, training 16.4 %. The measured eager prefill (SGL12160) "
                "took both down (from 35.7 % and 33.6 %) and no choice was made on either split; what is left sits in "
                "MI355X's 0.5.2 recipes at 8k and its 0.5.6-0.5.7 ones at 1k, all held out, and FP8 on Blackwell at 8k",
            ),
        ),
    ],
)
def test_the_held_out_split_is_within_five_points_of_the_training_split(checked, metric):
    """What a choice made on the training rows does elsewhere: each metric's median error on the held-out points
    stays within five points of the training points'."""
    medians = {(s.group, s.metric): s.median_ape for s in breakdown(checked) if s.group.startswith("split:")}
    training, held = medians["split: training", metric], medians["split: held-out", metric]
    assert abs(held - training) <= 0.05, f"{metric}: held-out {held:.1%}, training {training:.1%}"


def test_validate_says_how_many_predictions_hold_a_measured_cold_start(checked):
    waits = [c.cold_start_s for c in checked if c.cold_start_s]
    assert len(waits) == 82 and all(c.row.cold for c in checked if c.cold_start_s)
    (line,) = _cold_lines(checked)
    assert line.plain.startswith("82 runs without warm-up requests waited for the engine's first-use compilation (")
    assert f"{min(waits):,.0f}–{max(waits):,.0f} s" in line.plain


def test_each_point_beyond_the_stated_accuracy_names_only_what_its_measurement_says(checked):
    """validate prices no mechanism again for hundreds of points: a point names what its source left open (the
    prompts a broken client sent), time its run spent without output, and the very same command run on another
    release at the same GPUs and load, which the model prices alike and matches, measured more than a day's spread
    apart. The runs without warm-up requests that lost a minute or more to their cold start have that wait in their
    prediction, and it accounts for their idle time (ixapp-dsr1-0682 waited 73 s); one run is left, MI355X on SGLang
    0.5.2 on a day its steps took 31 ms where the same recipe took 18.5 ms on the next three, idle for 55 s of which
    its p99 TTFT shows 3. MI300X TP8 at 4 clients, 1k in and out, took 24.4 ms per token on 0.5.9 (ixapp-dsr1-0105)
    and 14.6 on 0.5.12 (ixapp-dsr1-1632) with the same command, which the model prices alike and matches."""
    said = {c.row.id: explain(c, checked, priced=False) for c in checked}
    names = {i: [m.name for m in found] for i, found in said.items()}
    idle = sorted(i for i, found in names.items() if "time without output" in found)
    assert idle == ["ixapp-dsr1-0488"]
    (lost,) = [c for c in checked if c.row.id == "ixapp-dsr1-0682"]
    assert lost.row.cold and lost.cold_start_s > 70 and abs(lost.error("output_tok_s")) < 0.1
    assert {n for found in names.values() for n in found} == {"time without output", "assumption", "another release"}
    (older,) = said["ixapp-dsr1-0105"]
    assert older.name == "another release"
    assert "0.5.12, on the same GPUs at the same load, measured 14.6 ms per token (ixapp-dsr1-1632;" in older.why
    assert "on 0.5.9 24.4 ms (predicted 14.3)" in older.why
    by_id = {c.row.id: c for c in checked}
    for i, found in said.items():  # each names the same command on another release, measured far apart
        for m in found:
            if m.name == "another release":
                (other,) = re.findall(r"\((ixapp-dsr1-\d+);", m.why)
                mine, theirs = by_id[i], by_id[other]
                assert mine.row.command == theirs.row.command and mine.row.engine_version != theirs.row.engine_version
                assert max(mine.row.tpot_ms, theirs.row.tpot_ms) > 1.3 * min(mine.row.tpot_ms, theirs.row.tpot_ms)
    assert all(("assumption" in names[c.row.id]) <= bool(c.row.assumed) for c in checked)
    assert "assumption" in names["ixapp-dsr1-1851"]  # B300 TP4, 8k in at 32 clients: tok/s still 49 % off
    assert sum("another release" in found for found in names.values()) == OTHER_RELEASE_POINTS


OTHER_RELEASE_POINTS = 14  # as the README states them


def test_the_bundled_family_errors_are_those_validate_finds_now(checked):
    """data/measurements/validated.csv (what every prediction's confidence reads) is `validate --set all --record`
    at this head: each predicted row with its family, load, GPU and errors. A change that moves any error must
    record them again (the README says how)."""
    rows = list(csv.DictReader(io.StringIO(validated_csv(checked + [check_row(row) for row in load_rows()]))))
    with validated_path().open(newline="") as f:
        kept = list(csv.DictReader(f))
    assert [r["id"] for r in rows] == [r["id"] for r in kept]
    for now, then in zip(rows, kept, strict=True):
        assert [now[k] for k in ("engine", "family", "regime", "gpu")] == [
            then[k] for k in ("engine", "family", "regime", "gpu")
        ]
        for metric in ("output_tok_s", "tpot_ms", "ttft_ms"):
            assert (now[metric] == "") == (then[metric] == ""), (now["id"], metric)
            if now[metric]:
                assert float(now[metric]) == pytest.approx(float(then[metric]), abs=2e-3), (now["id"], metric)
