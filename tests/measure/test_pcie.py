"""The PCIe RTX PRO 6000 set, replayed: every row is a decode-only cell predicted as the benchmark ran it, a KV
capacity compared with its start-up log, or listed with why not; the errors over the predicted cells are guarded
per GPU count and per model, build by build."""

import csv
import importlib.util
import statistics
from pathlib import Path

import pytest

from shardwise.engines.check import check_command
from shardwise.measure.pcie import bundled_path, read_set
from shardwise.measure.reference import breakdown, check_row, split_of
from shardwise.serve.steps import StepTimes
from shardwise.spec.cluster import load_cluster

SET = read_set()
ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("pcie_launches", ROOT / "scripts" / "pcie_launches.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def checked():
    return [check_row(r) for r in SET.rows]


def _median_abs(errors):
    return statistics.median(abs(e) for e in errors)


def test_every_row_is_predicted_compared_or_says_why_not():
    with bundled_path().open(newline="") as f:
        points = list(csv.DictReader(f))
    compared = {c.id for c in SET.capacities}
    accounted = {r.id for r in SET.rows} | {s.id for s in SET.skipped}
    assert len(SET.rows) + len(SET.skipped) == len(accounted)  # none twice
    unaccounted = {p["id"] for p in points} - accounted
    # a capacity row is compared, not predicted; every other row is one or the other
    assert unaccounted <= compared and all(p["kind"] == "kv_capacity" for p in points if p["id"] in unaccounted)
    assert all(s.reason for s in SET.skipped)


def test_the_bundled_file_is_what_the_script_writes_from_the_reference_set(tmp_path):
    source = ROOT.parent / "shared" / "reference" / "pcie-rtx-pro-6000" / "other-models.csv"
    if not source.exists():
        pytest.skip("the reference set is not beside this checkout")
    out = tmp_path / "pcie.csv"
    _script().convert(source, out)
    assert out.read_text() == bundled_path().read_text()


def test_a_launch_logged_as_vllm_non_default_arguments_becomes_its_command():
    """vLLM logs the options it was given as JSON: each key is its flag, a nested compilation key vLLM's dotted
    form, and the custom image's own kernels are taken out and listed."""
    text = (
        'vllm serve (via x) non-default args: {"model":"lukealonso/GLM-5.1-NVFP4-MTP","host":"0.0.0.0",'
        '"tensor_parallel_size":8,"gpu_memory_utilization":0.865,"enable_prefix_caching":true,'
        '"attention_backend":"B12X_MLA_SPARSE","speculative_config":{"method":"mtp","num_speculative_tokens":3},'
        '"compilation_config.pass_config":{"fuse_allreduce_rms":true}}; DCP_SIZE=2 (decode_context_parallel); '
        "env NCCL_P2P_LEVEL=SYS VLLM_ENABLE_PCIE_ALLREDUCE=1"
    )
    command, dropped, problem = _script().command_of({"launch_command": text}, "lukealonso/GLM-5.1-NVFP4-MTP")
    assert problem == "" and dropped == "--attention-backend B12X_MLA_SPARSE"
    assert command == (
        "NCCL_P2P_LEVEL=SYS VLLM_ENABLE_PCIE_ALLREDUCE=1 vllm serve lukealonso/GLM-5.1-NVFP4-MTP "
        "--tensor-parallel-size 8 --gpu-memory-utilization 0.865 --enable-prefix-caching --speculative-config "
        '\'{"method":"mtp","num_speculative_tokens":3}\' -cc.pass_config.fuse_allreduce_rms=True '
        "--decode-context-parallel-size 2"
    )


def test_a_launcher_row_becomes_the_options_its_variables_name_or_says_what_it_lacks():
    script = _script()
    text = (
        "serve-gilded-gnosis.sh helper (B12X sparse MLA/MoE, FP8 KV); MODEL=lukealonso/GLM-5.2-NVFP4 TP=8 DCP=2 "
        "MTP=0 MAX_NUM_SEQS=32 GRAPH=128 MAX_BATCHED_TOKENS=8192 MAX_MODEL_LEN=131072 GMU 0.90"
    )
    command, _, problem = script.command_of({"launch_command": text}, "lukealonso/GLM-5.2-NVFP4")
    assert problem == ""
    assert command == (
        "vllm serve lukealonso/GLM-5.2-NVFP4 --tensor-parallel-size 8 --decode-context-parallel-size 2 "
        "--max-num-seqs 32 --max-num-batched-tokens 8192 --max-model-len 131072 --gpu-memory-utilization 0.90 "
        "--max-cudagraph-capture-size 128 --kv-cache-dtype fp8 --enable-prefix-caching --enable-chunked-prefill"
    )
    _, _, problem = script.command_of({"launch_command": text.replace(" GMU 0.90", "")}, "lukealonso/GLM-5.2-NVFP4")
    assert "memory fraction" in problem


def test_a_short_sglang_form_and_prose():
    script = _script()
    text = "sglang 0.5.9 TP4: --mem-fraction-static 0.97 --speculative-algorithm NEXTN steps=4 topk=1 draft=3"
    command, _, problem = script.command_of({"launch_command": text}, "nvidia/Qwen3.5-397B-A17B-NVFP4")
    assert problem == "" and command == (
        "python3 -m sglang.launch_server --model-path nvidia/Qwen3.5-397B-A17B-NVFP4 --tp 4 --mem-fraction-static "
        "0.97 --speculative-algorithm NEXTN --speculative-num-steps 4 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 3"
    )
    _, _, problem = script.command_of({"launch_command": "FP8, 4× GPUs (SGLang)"}, "MiniMaxAI/MiniMax-M2.5")
    assert problem == "the launch is described, not given as a command"


def test_long_labels_before_the_generator_fix_hold_the_tokens_the_readme_gives():
    """Before 2026-05-07 the labels 16k … 128k held about 10.5k … 82.8k tokens; the notes' own size wins."""
    script = _script()
    row = {"source": "x", "engine": "sglang 0.5.9", "benchmark": "decode-only (llm_decode_bench.py, 2026-03-14)"}
    assert script.prompt_tokens({**row, "notes": "", "context_tokens": "131072"}) == "82800"
    late = {**row, "benchmark": "decode-only (2026-05-15)", "notes": "", "context_tokens": "131072"}
    assert script.prompt_tokens(late) == "131072"
    assert script.prompt_tokens({**late, "notes": "actual prompt tokens avg 128965"}) == "128965"


def test_a_cell_is_replayed_as_streams_decoding_from_a_cached_prompt():
    """other-00013: GLM-5.1 NVFP4, TP8, one stream from a 71-token prompt, 2048 tokens a stream: one request, no
    prefill, decoding at the prompt plus half its output; the rate is one token per decode cycle."""
    (row,) = [r for r in SET.rows if r.id == "other-00013"]
    spec = row.workload_spec()
    assert (row.benchmark, row.isl, row.osl, row.concurrency) == ("decode_only", 71, 2048, 1)
    assert spec.decode_only and (spec.num_requests, spec.concurrency) == (1, 1)
    c = check_row(row)
    cluster = load_cluster(row.gpus)
    setup = check_command(row.command, cluster=cluster, model=row.model, version=row.engine_version)
    cycle_s, _ = StepTimes(setup.model, setup.setup.layout, cluster).cycle(1, 71 + 1024)
    assert c.value("output_tok_s") == pytest.approx(1 / cycle_s, rel=0.02)


def test_a_speculative_cell_keeps_its_measured_acceptance():
    """other-00001: MTP with 3 draft tokens at a draft acceptance rate of 0.5766: τ = 1 + 3 × 0.5766."""
    (row,) = [r for r in SET.rows if r.id == "other-00001"]
    assert row.accept_length == pytest.approx(1 + 3 * 0.5766)


def test_the_held_out_builds_are_those_the_rule_gives(checked):
    """splits.yaml's rule for the set, remade from the predicted rows: each model's builds, sorted, every second
    one held out."""
    builds: dict[str, set[str]] = {}
    for c in checked:
        builds.setdefault(c.row.model, set()).add(Path(c.row.split_key).name)
    ruled = {b for each in builds.values() for b in sorted(each)[1::2]}
    assert {Path(c.row.split_key).name for c in checked if split_of(c.row) == "held-out"} == ruled


def test_every_cell_is_predicted(checked):
    assert [(c.row.id, c.problem) for c in checked if c.problem] == []


def test_decode_on_eight_gpus_is_within_15_percent_median(checked):
    """The issue's bar over every 8-GPU cell not flagged: 12.7 % over 231 cells (GLM-5, GLM-5.1, GLM-5.2)."""
    errors = [c.error("output_tok_s") for c in checked if c.row.gpus.startswith("8x")]
    assert len(errors) == 231 and _median_abs(errors) <= 0.15


@pytest.mark.xfail(
    strict=True,
    reason="issue goal not met: 15.4 % over 207 cells. SGLang 0.5.9's triton attention backend (the vLLM-vs-SGLang "
    "page) falls from 74 to 35 tok/s at one stream between 0 and 82.8k tokens where the prediction holds ~96: +36 % "
    "over its 29 cells; the other three builds are at 13-15 %",
)
def test_decode_on_four_gpus_is_within_15_percent_median(checked):
    errors = [c.error("output_tok_s") for c in checked if c.row.gpus.startswith("4x")]
    assert _median_abs(errors) <= 0.15


@pytest.mark.xfail(
    strict=True,
    reason="issue goal not met: GLM-5.2 on the Gilded Gnosis v20 image is 35 % under (4 cells, 68-88 tok/s at one "
    "stream against 44-53): the image's own MoE, attention and all-reduce kernels and its online MXFP8 dense "
    "weights are not priced; the other models are at 12-15 %",
)
def test_the_worst_model_is_within_30_percent_median(checked):
    by: dict[str, list[float]] = {}
    for c in checked:
        by.setdefault(c.row.model, []).append(c.error("output_tok_s"))
    worst = max(by, key=lambda m: _median_abs(by[m]))
    assert _median_abs(by[worst]) <= 0.30, worst


def test_the_breakdown_names_each_build(checked):
    groups = {s.group for s in breakdown(checked) if s.metric == "output_tok_s"}
    assert "build: 4 GPUs, sglang 0.5.9 (qwen3.5-397b-a17b-nvfp4)" in groups
    assert "model: glm-5.2-nvfp4" in groups


def test_kv_pools_match_the_start_up_logs_of_builds_that_run_upstream_memory_accounting():
    """The GLM-5.1 build of 2026-05-09 (five DCP sizes, MTP on and off) and GLM-5.2's v20 builds log the pool the
    ledger gives within 5 % (vLLM's block pool, FP8 latents with the indexer's keys, DCP sharding both)."""
    within = {c.id: c.error for c in SET.capacities if c.error is not None and abs(c.error) <= 0.05}
    assert {"other-00351", "other-00356", "other-00361", "other-00371", "other-00381", "other-01349"} <= set(within)


@pytest.mark.xfail(
    strict=True,
    reason="issue goal not met: 12 of 26 pools within 5 %. The ledger is 15-23 % above the GLM-5.1 canonical-rebase "
    "build's logs at every DCP size (the 2026-05-09 build with the same options: within 1 %), 26 % above SGLang's "
    "GLM-5 dense-MLA fork and 18 % below its NSA build, 8-9 % above GLM-5.2's v20 build at DCP 2-8",
)
def test_every_kv_pool_is_within_5_percent():
    errors = [c.error for c in SET.capacities if c.error is not None]
    assert all(abs(e) <= 0.05 for e in errors)
