"""calibrate --log: the machine's non-weight memory from a start-up log, checked against the engines' own sizing
rules worked by hand. The log lines follow the engines' format strings (sglang 0.5.23 model_runner.py,
mem_cache/memory_pool.py; vllm 0.33 v1/worker/gpu_model_runner.py, gpu_worker.py, v1/core/kv_cache_utils.py)."""

import json

import pytest
from typer.testing import CliRunner

from shardwise.cli import app
from shardwise.cost.memory import memory_ledger
from shardwise.engines.check import check_command
from shardwise.errors import SpecError
from shardwise.measure.memory_fit import fit_memory
from shardwise.measure.startup_log import read_startup_log
from shardwise.spec.cluster import load_cluster

GiB = 2**30
KIMI_TP8 = "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp-size 8 --mem-fraction-static 0.85"
LLAMA_TP8 = "vllm serve meta-llama/Llama-3.1-70B-Instruct -tp 8"


def sglang_log(free_gib: float, weights_gib: float, tokens: int) -> str:
    return (
        f"[2026-11-20 10:00:00 TP0] Load weight begin. avail mem={free_gib:.2f} GB\n"
        f"[2026-11-20 10:04:00 TP0] Load weight end. elapsed=240.00 s, type=KimiK25ForConditionalGeneration, "
        f"avail mem={free_gib - weights_gib:.2f} GB, mem usage={weights_gib:.2f} GB.\n"
        f"[2026-11-20 10:04:01 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, "
        f"KV size: {tokens * 70_272 / GiB:.2f} GB\n"
        "[2026-11-20 10:04:01 TP1] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1, KV size: 0.00 GB\n"
    )


def test_sglang_log_gives_the_cuda_stack_and_the_pool_follows(tmp_path):
    """SGLang measures the memory free before weights (available_before); its pool is then
    0.85 × available_before − weights (kv_cache_configurator._profile_available_bytes), so with the logged free
    memory the prediction must land on the logged #tokens."""
    cluster = load_cluster("8xrtx-pro-6000")
    checked = check_command(KIMI_TP8, cluster=cluster)
    weights = memory_ledger(checked.model, checked.setup.layout, cluster).per_gpu[0].weights_bytes
    free = 91.25  # GiB free before the weights: 95.59 GiB visible less 4.34 GiB of CUDA context and communicators
    tokens = int((0.85 * free * GiB - weights - 100 * 2**20) // 70_272)  # 100 MiB: SGLang's VLM cache
    path = tmp_path / "server.log"
    path.write_text(sglang_log(free, weights / GiB, tokens))
    log = read_startup_log(path)
    assert log.engine == "sglang" and log.kv_tokens == tokens
    fit = fit_memory(log, model=checked.model, setup=checked.setup, cluster=cluster)
    assert fit.calibration.constants["non_torch_bytes"] == pytest.approx(cluster.gpu.memory_bytes - free * GiB)
    assert fit.default_non_torch_bytes == pytest.approx(3.58 * GiB)  # runtime.yaml, before
    assert fit.fitted_kv_tokens == pytest.approx(tokens, abs=2)
    assert abs(fit.default_kv_tokens - tokens) > 5_000  # the default was off by the 0.76 GiB difference


def test_vllm_log_solves_the_pool_rule(tmp_path):
    """vLLM 0.33: KV = 0.92 × total − weights − non-torch − activation peak − graphs; given the weights and KV it
    printed, the fitted non-torch memory reproduces its KV tokens."""
    cluster = load_cluster("8xh100")
    checked = check_command(LLAMA_TP8, cluster=cluster)
    ledger = memory_ledger(checked.model, checked.setup.layout, cluster)
    row = ledger.per_gpu[0]
    non_torch = 4.1 * GiB
    kv = 0.92 * row.capacity_bytes - row.weights_bytes - non_torch - row.activation_bytes - row.cuda_graph_bytes
    tokens = int(kv // ledger.kv_bytes_per_token) // 16 * 16
    path = tmp_path / "vllm.log"
    path.write_text(
        f"(Worker_TP0 pid=11) INFO Model loading took {row.weights_bytes / GiB:.2f} GiB memory and 41.2 seconds\n"
        f"(Worker_TP0 pid=11) INFO Available KV cache memory: {kv / GiB:.2f} GiB\n"
        f"(EngineCore pid=10) INFO GPU KV cache size: {tokens:,} tokens, Maximum concurrency for 131,072 tokens "
        "per request: 2.10x\n"
    )
    fit = fit_memory(read_startup_log(path), model=checked.model, setup=checked.setup, cluster=cluster)
    assert fit.calibration.constants["non_torch_bytes"] == pytest.approx(non_torch, rel=2e-3)  # 2-decimal GiB
    assert fit.fitted_kv_tokens == pytest.approx(tokens, rel=2e-3)


def test_the_command_writes_a_profile_the_others_take(tmp_path):
    cluster = load_cluster("8xrtx-pro-6000")
    checked = check_command(KIMI_TP8, cluster=cluster)
    weights = memory_ledger(checked.model, checked.setup.layout, cluster).per_gpu[0].weights_bytes
    log = tmp_path / "server.log"
    log.write_text(sglang_log(91.25, weights / GiB, 150_000))
    profile = tmp_path / "box.yaml"
    runner = CliRunner()
    done = runner.invoke(app, ["calibrate", "--log", str(log), "--command", KIMI_TP8, "--output", str(profile),
                               "--json"])  # fmt: skip
    assert done.exit_code == 0, done.output
    payload = json.loads(done.stdout)
    assert payload["fitted_on"] == ["server.log"] and payload["kv_tokens"]["logged"] == 150_000
    checked = runner.invoke(app, ["check", "--json", "--profile", str(profile), "--", *KIMI_TP8.split()])
    assert json.loads(checked.stdout)["memory"]["per_gpu"][0]["runtime_bytes"] == pytest.approx(
        cluster.gpu.memory_bytes - 91.25 * GiB + 100 * 2**20
    )


def test_a_log_without_memory_lines_is_one_clear_error(tmp_path):
    path = tmp_path / "other.log"
    path.write_text("INFO: Started server process\n")
    with pytest.raises(SpecError, match="no memory lines of SGLang"):
        read_startup_log(path)
