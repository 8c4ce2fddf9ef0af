"""The command line as a user meets it: tables, --json, and one clear line for every bad input."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from shardwise.cli import app

runner = CliRunner()


def run_json(*args: str):
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_inspect_json_for_the_users_model():
    data = run_json("inspect", "kimi-k2.6")
    for key in ("total_params", "active_params", "weight_bytes", "kv_bytes_per_token", "components"):
        assert key in data
    assert abs(data["total_params"] / 1026.4e9 - 1) < 0.01
    assert abs(data["active_params"] / 31.7e9 - 1) < 0.01
    assert abs(data["weight_bytes"] / 594.2e9 - 1) < 0.01
    assert data["kv_bytes_per_token"] == 70272
    assert {"name", "params", "bytes"} <= set(data["components"][0])
    assert sum(c["bytes"] for c in data["components"]) == pytest.approx(data["weight_bytes"])


def test_inspect_defaults_to_kimi_and_prints_a_table():
    result = runner.invoke(app, ["inspect"])
    assert result.exit_code == 0
    assert "kimi-k2.6" in result.stdout and "routed_experts" in result.stdout and "int4-g32" in result.stdout


def test_inspect_what_if_flags():
    data = run_json("inspect", "kimi-k2.6", "--weight-dtype", "experts=fp8", "--kv-dtype", "fp8")
    assert data["kv_bytes_per_token"] == 35136
    experts = next(c for c in data["components"] if c["name"] == "routed_experts")
    assert experts["formats"] == ["fp8"]


def test_models_and_gpus_json():
    models = run_json("models")
    assert {m["model"] for m in models} >= {"kimi-k2.6", "gpt-oss-120b", "llama-3.1-70b"}
    gpus = run_json("gpus")
    rtx = next(g for g in gpus if g["name"] == "rtx-pro-6000-server")
    assert rtx["gpu_link"] == "none" and rtx["facts"]["memory_type"]["value"] == "GDDR7"
    assert rtx["mem_bandwidth_measured_bytes_per_s"] == pytest.approx(1.49e12)
    assert run_json("gpus", "h100")[0]["name"] == "h100-sxm"


def test_cluster_json():
    data = run_json("cluster", "8xrtx-pro-6000")
    assert data["num_gpus"] == 8 and data["measured_collectives"] == "rtx-pro-6000-pcie5"
    ar8 = [c for c in data["collectives"] if c["op"] == "all_reduce" and c["gpus"] == 8 and c["impl"] == "nccl"]
    assert ar8 and all(c["method"] == "measured" for c in ar8)


def test_the_cluster_table_has_one_row_per_implementation_with_a_time_per_size():
    """8× B200 measures NCCL and custom all-reduce: a custom row keeps its 64 MiB cell (NCCL's time: past 8 MiB
    the engines hand the message to NCCL) and says where its times come from, like the NCCL row beside it."""
    result = runner.invoke(app, ["cluster", "8xb200"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in result.output.splitlines() if "│ all_reduce" in line]
    assert [(r[0], r[1]) for r in rows] == [
        (label, n) for n in ("2", "4", "8") for label in ("all_reduce", "all_reduce (custom)")
    ]
    for row in rows:
        assert len(row) == 6 and all(c.endswith("µs") for c in row[2:5]) and row[5] == "measured", row
    nccl8, custom8 = rows[4], rows[5]
    assert custom8[4] == nccl8[4] and custom8[2] != nccl8[2]


def test_tables_render():
    for args in (["models"], ["gpus"], ["cluster", "2x8xh100"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output


def shardwise(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardwise", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args, message",
    [
        (["inspect", "no-such-model"], "unknown model"),
        (["inspect", "kimi-k2.6", "--weight-dtype", "fp3"], "unknown weight format"),
        (["gpus", "h1000"], "unknown GPU"),
        (["cluster", "8xwarp-drive"], "unknown GPU"),
        (["cluster", "eight h100s"], "cannot read cluster"),
        (["calibrate", "--constants", "request_cpu_s", "--output", "/no/such/folder/p.yaml"], "no folder /no/such"),
        (["cluster", "--sizes", "big"], "cannot read"),
        # refused before the minutes of predictions the record would hold
        (["validate", "--set", "all", "--record", "/no/such/folder/validated.csv"], "no folder /no/such/folder"),
    ],
)
def test_bad_input_is_one_line_exit_2_no_traceback(args, message):
    result = shardwise(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize(
    "args, message",
    [
        (["inspect", "--bogus"], "No such option: --bogus"),
        (["nosuchcommand"], "No such command"),
        (["check", "--isl", "0", "--", "vllm", "serve", "m"], "Invalid value for '--isl'"),
    ],
)
def test_usage_errors_are_one_line_too(args, message):
    result = shardwise(*args)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_help_exits_zero():
    result = shardwise("--help")
    assert result.returncode == 0 and "inspect" in result.stdout


def test_malformed_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 7168,')
    result = shardwise("inspect", str(path))
    assert result.returncode == 2 and "not valid JSON" in result.stderr and "Traceback" not in result.stderr


def test_debug_shows_the_traceback():
    result = shardwise("--debug", "inspect", "no-such-model")
    assert result.returncode != 0 and "Traceback" in result.stderr


LAUNCH = ["python", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2.6"]


def test_check_json_for_a_valid_and_an_invalid_command():
    ok = runner.invoke(
        app, ["check", "--json", "--", *LAUNCH, "--tp", "8", "--ep", "8", "--mem-fraction-static", "0.85"]
    )
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.stdout)
    assert data["verdict"] == "ok" and data["gpus_used"] == 8 and data["gpus_available"] == 8
    assert data["effective_flags"]["ep_size"] == 8 and data["reason"] is None
    assert data["layout"]["description"] == "TP8 EP8" and data["launch_command"].startswith("python -m sglang")
    bad = runner.invoke(app, ["check", "--json", "--", *LAUNCH, "--tp-size", "2", "--ep-size", "4"])
    assert bad.exit_code == 1
    data = json.loads(bad.stdout)
    assert data["verdict"] == "invalid" and "parallel topology is inconsistent" in data["engine_error"]
    assert {"verdict", "gpus_used", "gpus_available", "reason", "effective_flags"} <= set(data)


def test_check_takes_the_command_quoted_as_one_argument():
    """People paste the command in quotes: it is the same command."""
    words = [*LAUNCH, "--tp", "8", "--ep", "8", "--mem-fraction-static", "0.85"]
    assert check_json(" ".join(words)) == check_json("--", *words)


def test_check_tp4_ep2_is_an_oom_on_half_the_gpus():
    result = runner.invoke(app, ["check", "--", *LAUNCH, "--tp-size", "4", "--ep-size", "2"])
    assert result.exit_code == 1
    assert "uses 4 of 8 GPUs" in result.stdout and result.stdout.startswith("oom")
    data = json.loads(runner.invoke(app, ["check", "--json", "--", *LAUNCH, "--tp-size", "4", "--ep-size", "2"]).stdout)
    assert data["verdict"] == "oom" and data["gpus_used"] == 4
    gpu0 = data["memory"]["per_gpu"][0]
    assert {"gpu", "weights_bytes", "kv_bytes", "other_bytes", "free_bytes"} <= set(gpu0)
    assert gpu0["weights_bytes"] > gpu0["capacity_bytes"]


def test_check_memory_json_for_a_fitting_setup():
    args = [
        "check",
        "--json",
        "--isl",
        "2000",
        "--osl",
        "500",
        "--",
        *LAUNCH,
        "--tp",
        "8",
        "--mem-fraction-static",
        "0.93",
    ]
    data = json.loads(runner.invoke(app, args).stdout)
    memory = data["memory"]
    assert data["verdict"] == "ok" and memory["kv_tokens"] > 100_000
    assert memory["max_concurrency"] == memory["kv_tokens"] // 2500
    assert {"kv_tokens", "max_concurrency", "per_gpu"} <= set(memory)


def test_check_needs_a_command():
    result = shardwise("check")
    assert result.returncode == 2 and "give the launch command after --" in result.stderr


def test_layouts_json_lists_launch_commands():
    data = run_json("layouts", "--framework", "vllm", "--all")
    assert any(row["layout"]["description"] == "DP8 EP8" for row in data)
    assert all(row["launch_command"].startswith("vllm serve moonshotai/Kimi-K2.6") for row in data)
    fitting = run_json("layouts", "--framework", "vllm")
    assert fitting and all(row["verdict"] == "ok" for row in fitting) and len(fitting) < len(data)


def check_json(*args: str):
    """`shardwise check --json OPTIONS -- COMMAND`: --json must come before the launch command."""
    result = runner.invoke(app, ["check", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_check_predicts_serving_figures_at_each_concurrency():
    payload = check_json(
        "--concurrency", "1,8,64", "--isl", "1024", "--osl", "1024", "--",
        "python", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2.6", "--tp", "8", "--ep", "8",
        "--mem-fraction-static", "0.85", "--trust-remote-code", "--disable-cuda-graph",
    )  # fmt: skip
    predicted = payload["predicted"]
    assert [p["concurrency"] for p in predicted] == [1, 8, 64]
    for p in predicted:
        assert {"output_tok_s", "per_user_tok_s", "tpot_ms", "ttft_ms", "bound", "breakdown"} <= set(p)
        assert sum(p["breakdown"].values()) == pytest.approx(p["tpot_ms"], rel=1e-3)
    one, eight, many = predicted
    assert one["output_tok_s"] < eight["output_tok_s"] <= many["output_tok_s"]
    assert many["bound"] == "kv_capacity"  # 64 clients of 2k tokens do not fit in the KV pool at once


def test_check_shows_the_dcp_collectives_and_their_time():
    command = ["--", "python", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2.6", "--tp-size", "8",
               "--dcp-size", "4", "--attention-backend", "flashinfer", "--kv-cache-dtype", "fp8_e4m3",
               "--mem-fraction-static", "0.85"]  # fmt: skip
    payload = check_json("--concurrency", "1,64", *command)
    listed = {c["where"]: c for c in payload["layout"]["collectives"]}
    assert listed["DCP query gather"]["bytes_per_token"] == 32 * 576 * 2  # 8 heads per GPU × 4 ranks, latent + RoPE
    one, many = (p["collectives_ms"] for p in payload["predicted"])
    assert 0 < one["DCP query gather"] < many["DCP query gather"]  # 64 requests' queries take longer than one's
    assert many["DCP partial outputs and LSE exchange"] > 0
    result = runner.invoke(app, ["check", "--concurrency", "64", *command], env={"COLUMNS": "160"})
    assert result.exit_code == 0
    row = next(line for line in result.output.splitlines() if "DCP query gather" in line and "all_gather" not in line)
    assert f"{many['DCP query gather']:,.2f}" in row


def test_check_honours_cuda_graphs_in_the_command():
    base = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "moonshotai/Kimi-K2.6",
        "--tp",
        "8",
        "--mem-fraction-static",
        "0.85",
    ]
    graphs = check_json("--concurrency", "1", "--", *base)["predicted"][0]
    eager = check_json("--concurrency", "1", "--", *base, "--disable-cuda-graph")["predicted"][0]
    assert graphs["output_tok_s"] > eager["output_tok_s"]
    assert eager["breakdown"]["host"] > graphs["breakdown"]["host"]


def test_bad_concurrency_is_one_line():
    result = shardwise("check", "--concurrency", "1,x", "--", "python", "-m", "sglang.launch_server")
    assert result.returncode == 2
    assert "--concurrency takes positive whole numbers" in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_reports_the_error_per_metric():
    payload = run_json("validate")
    metrics = {(s["group"], s["metric"]): s for s in payload["summary"]}
    assert set(metrics) == {(g, m) for g in ("plain", "speculative") for m in ("output_tok_s", "tpot_ms", "ttft_ms")}
    # the mean TTFT of the rows that report it, measured and predicted
    gt38 = next(r for r in payload["rows"] if r["id"] == "GT38")
    assert gt38["measured"]["ttft_ms"] == 4613 and gt38["predicted"]["ttft_ms"] > 0
    spec_rows = [r for r in payload["rows"] if r["accept_length"]]
    assert {r["id"] for r in spec_rows} == {"GT21", "GT90", "GT91", "GT90-v2", "GT91-v2"}
    assert all(r["group"] == "speculative" for r in spec_rows)  # all five from modelled releases
    assert metrics[("speculative", "output_tok_s")]["rows"] == len(spec_rows)
    measured = [r for r in payload["rows"] if not r["accept_length"] and r["measured"]["output_tok_s"]]
    # the headline is every row's: SGLang 0.4 rows count in it, and the breakdown shows them apart
    assert metrics[("plain", "output_tok_s")]["rows"] == len(measured)
    releases = {s["group"]: s for s in payload["breakdown"] if s["metric"] == "output_tok_s"}
    older = [r for r in measured if r["workload"]["engine_version"] in ("0.4.1.post2", "0.4.10.post1")]
    assert len(older) == 7 and all(r["group"] == "plain" for r in older)
    assert releases["release: sglang 0.4.1.post2"]["rows"] + releases["release: sglang 0.4.10.post1"]["rows"] == 7
    assert all(r["predicted"]["output_tok_s"] for r in payload["rows"])  # every bundled row is covered


def test_validate_names_what_could_explain_each_row_beyond_the_stated_accuracy():
    rows = {r["id"]: r for r in run_json("validate")["rows"]}
    for r in rows.values():  # a row within the stated accuracy names nothing; one beyond names at least one cause
        assert bool(r["beyond_stated_accuracy"]) == bool(r["mechanisms"]) or not r["mechanisms"], r["id"]
    tp8 = rows["user-TP8"]
    assert tp8["beyond_stated_accuracy"] == ["output_tok_s"]
    names = [m["name"] for m in tp8["mechanisms"]]
    assert "P2P off" in names and "CUDA graphs off" in names
    p2p = next(m for m in tp8["mechanisms"] if m["name"] == "P2P off")
    assert p2p["predicted"]["output_tok_s"] < rows["user-TP8"]["predicted"]["output_tok_s"]
    assert set(p2p["siblings_error"]) == {"user-PP8", "user-EP8", "user-TP8-peak", "user-PP8-peak", "user-EP8-peak"}
    assert rows["user-EP8"]["beyond_stated_accuracy"] == [] and rows["user-EP8"]["mechanisms"] == []
    assert [m["name"] for m in rows["GT23"]["mechanisms"]][0] == "older release"


def simulate_json(*args: str):
    result = runner.invoke(app, ["simulate", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


KIMI_EP8 = [
    "python",
    "-m",
    "sglang.launch_server",
    "--model-path",
    "moonshotai/Kimi-K2.6",
    "--tp",
    "8",
    "--ep",
    "8",
    "--mem-fraction-static",
    "0.85",
]


def test_simulate_reports_the_benchmark_metrics_per_load():
    payload = simulate_json("--concurrency", "1,16", "--request-rate", "0.5", "--num-prompts", "40", "--", *KIMI_EP8)
    assert payload["layout"] == "TP8 EP8" and payload["accept_length"] is None
    loads = [(r["concurrency"], r["request_rate"]) for r in payload["results"]]
    assert loads == [(1, None), (16, None), (None, 0.5)]
    one = payload["results"][0]
    for metric in ("ttft", "tpot", "itl", "e2el"):  # the names vllm bench serve saves
        assert {f"{s}_{metric}_ms" for s in ("mean", "median", "p90", "p99")} <= set(one)
    assert one["completed"] == 40 and one["output_throughput"] > 0
    assert one["request_throughput"] == pytest.approx(40 / one["duration"], rel=1e-3)
    assert payload["results"][1]["output_throughput"] > 3 * one["output_throughput"]  # batching pays, to the KV bound


def test_simulate_speculative_decoding_with_an_acceptance_rate():
    payload = simulate_json(
        "--concurrency", "1", "--num-prompts", "4", "--accept-rate", "0.5", "--", *KIMI_EP8,
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "z-lab/Kimi-K2.6-DFlash",
    )  # fmt: skip
    assert payload["accept_length"] == pytest.approx(2 - 0.5**7)  # 1 + 1/2 + … + 1/2^7: block 8, 7 drafted
    assert payload["results"][0]["tokens_per_step"] == pytest.approx(2 - 0.5**7, abs=1e-4)
    one = payload["results"][0]
    assert one["speedup"] == pytest.approx(one["output_throughput"] / one["plain_output_throughput"], rel=1e-3)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--", *KIMI_EP8], "give --concurrency"),
        (["--concurrency", "4"], "give the launch command after --"),
        (["--request-rate", "0", "--", *KIMI_EP8], "--request-rate takes positive numbers"),
        (["--concurrency", "1", "--accept-length", "2", "--", *KIMI_EP8], "need a launch command with speculative"),
        (["--concurrency", "1", "--", *KIMI_EP8, "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
          "z-lab/Kimi-K2.6-DFlash"], "needs its acceptance"),
        (["--concurrency", "1", "--lengths", "nosuchset", "--", *KIMI_EP8], "unknown length set"),
        (["--concurrency", "1", "--isl", "100000", "--", *KIMI_EP8], "does not fit one rank's KV pool"),
        (["--concurrency", "1", "--", *KIMI_EP8[:-4], "--tp", "2", "--ep", "4"], "would not start"),
    ],
)  # fmt: skip
def test_simulate_bad_input_is_one_line(args, message):
    result = shardwise("simulate", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_theorise_json_names_the_best_and_the_excluded():
    payload = run_json("theorise", "--concurrency", "1,64,512")
    assert payload["model"] == "kimi-k2.6" and payload["cluster"] == "8xrtx-pro-6000"
    best = payload["best"]
    assert {"launch", "layout", "predicted", "bound"} <= set(best) and best["rank"] == 1
    assert payload["ranked"][0] == best
    bought = {" ".join(g["flags"]): g for g in payload["what_each_flag_buys"]}
    # the best TP EP setup (the family the user's EP8 run validates here) and what its expert split buys
    assert best["confidence"]["family"] == "sglang TP EP" and best["confidence"]["validated_on"] == "this GPU"
    (ep,) = [flag for flag in bought if flag.startswith("--ep-size")]  # EP4×TP2 and EP2×TP4 tie: either may win
    assert ep in " ".join(best["launch"]) and bought[ep]["gain"] > 0 and bought["FP8 KV cache"]["gain"] > 0
    assert payload["measured_alternative"] is None  # the best itself was measured here
    assert payload["unvalidated_over"] == payload["ranked"][1]["engine"] + " " + payload["ranked"][1]["layout"] + (
        ", " + payload["ranked"][1]["variant"] if payload["ranked"][1]["variant"] else ""
    )
    assert all("confidence" in p for p in best["predicted"])
    for g in bought.values():  # the gain is the best's figure over the setup's without the flags
        if g["gain"] is not None:
            assert best["score"] == pytest.approx(g["without_tok_s"] * (1 + g["gain"]), rel=1e-3)
            assert g["tie"] == (g["gain"] <= 0.14)
    reasons = {" ".join(e["launch"]): e for e in payload["excluded"]}
    tp2_ep4 = next(e for cmd, e in reasons.items() if "--tp-size 2 --ep-size 4 " in cmd + " ")
    assert tp2_ep4["verdict"] == "invalid" and "parallel topology is inconsistent" in tp2_ep4["engine_error"]


def test_theorise_writes_markdown_and_html(tmp_path):
    md, page = tmp_path / "theory.md", tmp_path / "theory.html"
    result = runner.invoke(app, ["theorise", "--concurrency", "1,64", "--markdown", str(md), "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert "Best for max-throughput" in result.stdout
    assert md.read_text().startswith("# shardwise theory: kimi-k2.6") and "## Excluded" in md.read_text()
    assert page.read_text().count("<svg") == 3
    assert oct(page.stat().st_mode & 0o777) != oct(0o600)  # an ordinary file, not a private temporary one


@pytest.mark.parametrize(
    "args, message",
    [
        (["--objective", "fastest"], "unknown objective"),
        (["--objective", "max-throughput-under-slo"], "needs a limit"),
        (["--framework", "tgi"], "unknown engine"),
        (["--workload", "alpaca"], "unknown length set"),
        (["--html", "/no/such/folder/x.html"], "cannot write"),
    ],
)
def test_theorise_bad_input_is_one_line(args, message):
    result = shardwise("theorise", "--concurrency", "1", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_validate_a_results_file_with_its_launch_command(tmp_path):
    record = {"tool": "shardwise bench", "max_concurrency": 1, "request_rate": None, "num_prompts": 4,
              "completed": 4, "total_input_tokens": 4096, "total_output_tokens": 4096, "output_throughput": 65.3,
              "mean_tpot_ms": 15.0, "mean_ttft_ms": 300.0}  # fmt: skip
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(record) + "\n")
    command = (
        "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp 8 --ep 8 "
        "--mem-fraction-static 0.85 --disable-cuda-graph"
    )
    result = runner.invoke(app, ["validate", str(path), "--json", "--gpus", "8xrtx-pro-6000", "--command", command])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["rows"]
    assert row["predicted"]["output_tok_s"] == pytest.approx(65.4, abs=0.5)


def test_check_prices_speculative_decoding_only_with_its_acceptance():
    dflash = [
        *KIMI_EP8,
        "--speculative-algorithm",
        "DFLASH",
        "--speculative-draft-model-path",
        "z-lab/Kimi-K2.6-DFlash",
    ]
    without = check_json("--concurrency", "1", "--", *dflash)
    assert without["predicted"] is None and "needs its acceptance" in without["prediction_note"]
    priced = check_json("--concurrency", "1", "--accept-length", "3", "--", *dflash)
    (one,) = priced["predicted"]
    assert one["breakdown"]["draft"] > 0  # the drafter's forward is part of every step
    assert one["per_user_tok_s"] > 0


def test_calibrate_writes_a_profile_that_the_other_commands_take(tmp_path):
    profile = tmp_path / "box.yaml"
    fitted = run_json("calibrate", "--constants", "scheduler_step_cpu_s", "--holdout", "user-TP8", "--output",
                      str(profile))  # fmt: skip
    assert fitted["fitted_on"] == ["user-PP8", "user-EP8"] and profile.exists()
    pp8 = ["python", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2.6", "--pp-size", "8",
           "--mem-fraction-static", "0.85", "--disable-cuda-graph"]  # fmt: skip
    default = check_json("--concurrency", "1", "--", *pp8)["predicted"][0]["output_tok_s"]
    calibrated = check_json("--concurrency", "1", "--profile", str(profile), "--", *pp8)["predicted"][0]
    assert abs(calibrated["output_tok_s"] - 36.9) < abs(default - 36.9)  # the fitted run is now closer
    assert run_json("theorise", "--concurrency", "1", "--profile", str(profile))["best"]


def test_calibrate_and_profile_bad_input_is_one_line(tmp_path):
    other = tmp_path / "h100.yaml"
    other.write_text("gpu: h100-sxm\nconstants: {eager_kernel_cpu_s: 1.0e-5}\nfitted_on: [x]\n")
    cases = [
        (["calibrate", "--holdout", "nope"], "--holdout names no measurement"),
        (["calibrate", "--constants", "fudge"], "unknown constants"),
        (["theorise", "--concurrency", "1", "--profile", str(other)], "fitted on h100-sxm, not on"),
    ]
    for args, message in cases:
        result = shardwise(*args, "--output", str(tmp_path / "p.yaml")) if args[0] == "calibrate" else shardwise(*args)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr


def test_kimi_tp8_needs_a_raised_memory_fraction():
    """At SGLang's default (0.758 for this checkpoint on 96 GB cards) the weights leave no KV room, as SGLang says
    when it sizes the pool; at 0.85 it starts."""
    command = ["--", "python", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2.6", "--tp-size", "8"]
    default = runner.invoke(app, ["check", "--model", "kimi-k2.6", "--gpus", "8xrtx-pro-6000", "--json", *command])
    assert default.exit_code == 1
    data = json.loads(default.stdout)
    assert data["verdict"] == "no_kv_room"
    assert data["engine_error"].startswith(
        "ValueError: Loaded weights leave no GPU memory for the KV cache under "
        "--mem-fraction-static=0.75781"  # 0.833 × 0.9097, printed unrounded as SGLang prints it
    )
    assert "Raise --mem-fraction-static above 0.781" in data["engine_error"]
    raised = runner.invoke(app, ["check", "--model", "kimi-k2.6", "--gpus", "8xrtx-pro-6000", "--json", *command,
                                 "--mem-fraction-static", "0.85"])  # fmt: skip
    assert raised.exit_code == 0 and json.loads(raised.stdout)["verdict"] == "ok"


def test_check_decode_only_prices_no_prefill():
    """--decode-only: the prompts are cached, so at one client the output rate is one token per decode cycle
    (1 / TPOT), but for the cycle the overlap schedule runs after each request's last token (256 tokens in 257
    cycles), and no part of a token's time is prefill; without it the 8k prefill shows in both."""
    args = ["--isl", "8192", "--osl", "256", "--concurrency", "1,32", "--json", "--", *LAUNCH, "--tp", "8",
            "--ep", "8", "--mem-fraction-static", "0.85"]  # fmt: skip
    only = json.loads(runner.invoke(app, ["check", "--decode-only", *args]).stdout)
    full = json.loads(runner.invoke(app, ["check", *args]).stdout)
    assert only["decode_only"] is True and full["decode_only"] is False
    one, full_one = only["predicted"][0], full["predicted"][0]
    assert one["output_tok_s"] == pytest.approx(1e3 / one["tpot_ms"] * 256 / 257, rel=1e-3)
    assert one["breakdown"].get("prefill", 0.0) == 0.0
    assert full_one["output_tok_s"] < 0.8 * one["output_tok_s"] and full_one["ttft_ms"] > 50 * one["ttft_ms"]


def test_check_simulates_a_benchmark_run_as_validate_does():
    """One workload spec: check with GT32's benchmark options (vllm bench serve, ShareGPT, 1000 prompts at
    rate inf) and its release predicts what validate predicts for that bundled row."""
    from shardwise.measure.reference import check_row, load_rows

    (row,) = [r for r in load_rows() if r.id == "GT32"]
    args = ["check", "--json", "--request-rate", "inf", "--lengths", "sharegpt", "--num-prompts", "1000",
            "--model", row.model, "--gpus", row.gpus, "--engine-version", str(row.engine_version), "--",
            *row.command.split()]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (simulated,) = data["simulated"]
    assert data["predicted"] is None and simulated["completed"] == 1000
    assert simulated["output_throughput"] == pytest.approx(check_row(row).value("output_tok_s"), abs=0.006)  # 2 dp
