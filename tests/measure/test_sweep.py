"""The sweep loop on a CPU: a stand-in engine that serves, runs out of memory or crashes as SGLang does."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from shardwise.measure.sweep import SweepPlan, diagnose, load_records, sweep
from shardwise.spec.cluster import load_cluster

STANDIN = f"{sys.executable} {Path(__file__).parent / 'standin_engine.py'}"
KIMI = "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 "
FRACTION = " --mem-fraction-static 0.85"  # at SGLang's default no Kimi layout has KV room on these cards
FOUR = [KIMI + "--tp-size 8 --ep-size 8" + FRACTION, KIMI + "--tp-size 4 --ep-size 2", KIMI + "--tp-size 2 --ep-size 4",
        KIMI + "--tp-size 8" + FRACTION]  # fmt: skip


def plan(folder: Path, force: bool = True) -> SweepPlan:
    return SweepPlan(
        commands=tuple(FOUR), cluster=load_cluster("8xrtx-pro-6000"), concurrency=(1, 4), isl=16, osl=8,
        num_prompts=4, folder=folder, launcher=STANDIN, health_timeout_s=60, force=force,
    )  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _tagged(tag: str) -> list[str]:
    """Live processes that inherited this test's environment tag (only the engines it started, and theirs)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"SHARDWISE_TEST_TAG={tag}".encode() in environ.split(b"\0") and _alive(int(pid)):
            found.append(pid)
    return found


def test_two_measured_two_failed_with_their_reasons_and_no_orphans(tmp_path, monkeypatch):
    """When the sweep returns, no engine it started (nor anything those started) is alive: each is stopped and
    waited for. The engines carry an environment tag, so other processes on the machine do not count."""
    monkeypatch.setenv("SHARDWISE_TEST_TAG", str(tmp_path))
    records = sweep(plan(tmp_path))
    by = {r["command"].split("Kimi-K2.6 ")[1]: r for r in records}
    assert [r["status"] for r in records] == ["measured", "failed", "failed", "measured"]
    assert by["--tp-size 4 --ep-size 2"]["reason"] == "oom"
    assert "CUDA out of memory" in by["--tp-size 4 --ep-size 2"]["detail"]
    assert by["--tp-size 2 --ep-size 4"]["reason"] == "invalid"
    assert by["--tp-size 2 --ep-size 4"]["detail"].startswith("ZeroDivisionError")
    measured = by["--tp-size 8 --ep-size 8" + FRACTION]
    assert measured["levels"][1]["completed"] == 4 and measured["measured_output_tok_s"] > 0
    assert measured["predicted_output_tok_s"] > 0  # what shardwise predicted sits beside it
    assert _tagged(str(tmp_path)) == []


def test_a_refused_setup_is_skipped_unless_forced(tmp_path):
    records = sweep(SweepPlan(**{**plan(tmp_path).__dict__, "commands": (FOUR[2],), "force": False}))
    assert records[0]["status"] == "skipped" and "moe_tp_size" in records[0]["reason"]


def test_a_killed_sweep_resumes_without_rerunning(tmp_path):
    here, folder = str(Path(__file__).parent), str(tmp_path)
    script = (
        f"import sys; from pathlib import Path; sys.path.insert(0, {here!r}); "
        f"from test_sweep import plan; from shardwise.measure.sweep import sweep; sweep(plan(Path({folder!r})))"
    )
    run = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    results = tmp_path / "results.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(load_records(results)) < 1:
        time.sleep(0.1)
    os.killpg(run.pid, signal.SIGKILL)  # the sweep and the engine it was running die at once
    run.wait()
    first = load_records(results)
    assert 1 <= len(first) < 4
    records = sweep(plan(tmp_path))
    assert len(records) == 4
    for command, record in first.items():  # finished setups are kept as they were, not run again
        assert load_records(results)[command] == record
    logs = sorted(p.name for p in tmp_path.glob("engine-*.log"))
    assert len(logs) == 4  # one engine start per setup over both runs


def test_diagnosis_reads_the_engines_own_words():
    assert diagnose("...\nRuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", 1)[0] == (
        "no_kv_room"
    )
    assert diagnose("ValueError: No available memory for the cache blocks. Try increasing", 1)[0] == "no_kv_room"
    assert diagnose("AssertionError: tp_size must be divisible", 1) == (
        "invalid",
        "AssertionError: tp_size must be divisible",
    )
    assert diagnose("Segmentation fault", 139) == ("crashed", "Segmentation fault")


def test_the_command_prints_the_re_ranked_setups(tmp_path):
    args = [sys.executable, "-m", "shardwise", "sweep", "--dir", str(tmp_path), "--launcher", STANDIN, "--force",
            "--concurrency", "1,4", "--isl", "16", "--osl", "8", "--num-prompts", "4", "--json"]  # fmt: skip
    for command in FOUR:
        args += ["--command", command]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    ranked = payload["ranked"]
    assert [r["status"] for r in ranked] == ["measured", "measured", "failed", "failed"]
    assert ranked[0]["measured_output_tok_s"] >= ranked[1]["measured_output_tok_s"]  # by what was measured
    assert {r["reason"] for r in ranked[2:]} == {"oom", "invalid"}
    calibration = payload["calibration"]
    assert len(calibration["fitted_on"]) == 4  # two measured setups × two levels
    for r in ranked[:2]:  # recalibrated predictions move toward what was measured
        measured = r["measured_output_tok_s"]
        assert abs(r["calibrated_output_tok_s"] - measured) < abs(r["predicted_output_tok_s"] - measured)
