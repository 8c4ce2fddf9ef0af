"""Every command's --json is JSON, for every engine and every kind of payload.

A payload that carries a NumPy value (a bool from a comparison of NumPy floats, an integer from an array) is not
JSON-serializable: `json.dumps` raises after the command has done its work. Here each command that takes --json
renders a payload of each kind it has (a setup that starts, one the engine refuses, one that does not load, one with
no KV room; a ranking, nothing that fits, a simulated benchmark; a file of either engine's results) for SGLang, vLLM
and both, and what it prints must parse as strict JSON (no NaN or Infinity, which JSON does not have). `layouts`
runs on every bundled model. The bundled `validate` payload is rendered by tests/cli/test_cli.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from shardwise.cli import app
from shardwise.jsontext import dumps, line
from shardwise.spec.catalog import catalog

runner = CliRunner()

SGLANG_EP8 = "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp 8 --ep 8 --trust-remote-code"
VLLM_QWEN = "vllm serve Qwen/Qwen3-235B-A22B-FP8 -tp 8 --enable-expert-parallel"
ENGINES = ("sglang", "vllm", "all")

CASES = {
    # theorise: the default case with each engine, another model and cluster, SLOs, nothing that fits, a benchmark
    **{f"theorise-{e}": ["theorise", "--framework", e] for e in ENGINES},
    "theorise-deepseek-8xh200-all": ["theorise", "--model", "deepseek-v3", "--gpus", "8xh200", "--framework", "all",
                                     "--concurrency", "1,64,512"],
    "theorise-slo": ["theorise", "--model", "llama-3.1-70b", "--gpus", "8xh100", "--framework", "all",
                     "--objective", "max-throughput-under-slo", "--tpot-ms", "30", "--concurrency", "1,32"],
    "theorise-nothing-fits": ["theorise", "--gpus", "1xl4"],
    "theorise-benchmark": ["theorise", "--model", "llama-3.1-8b", "--gpus", "1xh100", "--framework", "all",
                           "--concurrency", "1,16", "--lengths", "sharegpt", "--num-prompts", "50"],
    # check: each verdict, each engine, predictions in closed form and simulated, several nodes, drafting
    "check-ok": ["check", "--concurrency", "1,8", "--", *SGLANG_EP8.split(), "--mem-fraction-static", "0.85"],
    "check-no-kv-room": ["check", "--", *SGLANG_EP8.split()],
    "check-invalid": ["check", "--", *SGLANG_EP8.replace("--tp 8 --ep 8", "--tp-size 2 --ep-size 4").split()],
    "check-oom": ["check", "--", *SGLANG_EP8.replace("--tp 8 --ep 8", "--tp-size 4 --ep-size 2").split()],
    "check-vllm": ["check", "--gpus", "8xh100", "--concurrency", "1,64", "--", *VLLM_QWEN.split()],
    "check-vllm-simulated": ["check", "--gpus", "8xh100", "--request-rate", "4", "--num-prompts", "40", "--",
                             *VLLM_QWEN.split()],
    "check-two-nodes": ["check", "--gpus", "2x8xh100", "--", "python", "-m", "sglang.launch_server", "--model-path",
                        "deepseek-ai/DeepSeek-V3", "--tp", "16", "--nnodes", "2", "--node-rank", "0",
                        "--dist-init-addr", "10.0.0.1:50000"],
    "check-speculative": ["check", "--accept-length", "3", "--concurrency", "1,8", "--",
                          *SGLANG_EP8.split(), "--mem-fraction-static", "0.85", "--speculative-algorithm", "EAGLE"],
    # simulate: both engines, closed and open loops
    "simulate-sglang": ["simulate", "--concurrency", "1,8", "--num-prompts", "16", "--",
                        *SGLANG_EP8.split(), "--mem-fraction-static", "0.85"],
    "simulate-vllm": ["simulate", "--gpus", "8xh100", "--request-rate", "2", "--num-prompts", "20", "--",
                      *VLLM_QWEN.split()],
    # layouts of the default case with each engine (every bundled model follows below)
    **{f"layouts-{e}": ["layouts", "--framework", e] for e in ENGINES},
    "layouts-all-flag": ["layouts", "--all", "--gpus", "8xh100", "--model", "gpt-oss-120b", "--framework", "all"],
    # the descriptions
    "inspect": ["inspect", "kimi-k2.6"],
    "models": ["models"],
    "gpus": ["gpus"],
    "cluster": ["cluster", "2x8xh100"],
}  # fmt: skip


def _strict(text: str):
    """Parse as JSON does: NaN and Infinity are not JSON (Python's json reads them by default)."""

    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _render(args: list[str]) -> object:
    where = args.index("--") if "--" in args else len(args)
    result = runner.invoke(app, [*args[:where], "--json", *args[where:]])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code in (0, 1), result.output  # check says 1 for a command that would not start
    return _strict(result.stdout)


@pytest.mark.parametrize("args", CASES.values(), ids=CASES.keys())
def test_every_payload_kind_is_json(args):
    assert _render(args)


@pytest.mark.parametrize("engine", ENGINES)
def test_layouts_of_every_bundled_model_are_json(engine):
    for name in sorted(catalog()):
        payload = _render(["layouts", "--model", name, "--gpus", "8xh100", "--framework", engine])
        assert isinstance(payload, (list, dict)), name


@pytest.mark.parametrize("engine, record", [
    ("sglang", {"backend": "sglang", "mean_e2e_latency_ms": 15600.0, "max_concurrency": 1, "request_rate": "inf",
                "num_prompts": 4, "completed": 4, "total_input_tokens": 4096, "total_output_tokens": 4096,
                "output_throughput": 65.3, "mean_tpot_ms": 15.0, "mean_ttft_ms": 300.0}),
    ("vllm", {"backend": "vllm", "model_id": "Qwen/Qwen3-235B-A22B-FP8", "mean_e2el_ms": 21000.0,
              "max_concurrency": 8, "request_rate": "inf", "num_prompts": 32, "completed": 32,
              "total_input_tokens": 32768, "total_output_tokens": 32768, "output_throughput": 900.0,
              "mean_tpot_ms": 20.0, "mean_ttft_ms": 500.0}),
])  # fmt: skip
def test_validate_of_either_engines_results_is_json(tmp_path, engine, record):
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(record) + "\n")
    command = SGLANG_EP8 + " --mem-fraction-static 0.85" if engine == "sglang" else VLLM_QWEN
    gpus = "8xrtx-pro-6000" if engine == "sglang" else "8xh100"
    payload = _render(["validate", str(path), "--gpus", gpus, "--command", command])
    assert payload["rows"]


def test_numpy_values_become_json_values():
    payload = {"tie": np.bool_(True), "n": np.int64(3), "x": np.float32(0.5), "inf": np.float64("inf"),
               "nan": float("nan"), "a": np.array([1, 2]), "t": (np.int32(1), 2.0)}  # fmt: skip
    want = {"tie": True, "n": 3, "x": 0.5, "inf": None, "nan": None, "a": [1, 2], "t": [1, 2.0]}
    assert _strict(dumps(payload)) == want
    assert _strict(line(payload)) == want and "\n" not in line(payload)
    assert type(_strict(dumps(payload))["tie"]) is bool
