"""The sweep through a real Slurm: a one-node cluster on this machine (scripts/slurm-one-node.sh, which CI runs),
each setup a batch job running the stand-in engine. Three setups with one failing, the failure read from its job's
log; a job that dies without a record; a sweep stopped with Ctrl-C leaves no job behind and resumes; one killed
outright is followed again, not submitted twice. Skipped where Slurm is not running, unless SHARDWISE_REQUIRE_SLURM
is set (CI), which makes that a failure."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardwise.measure.slurm import sweep_slurm
from shardwise.measure.sweep import SweepPlan, load_records
from shardwise.spec.cluster import load_cluster

STANDIN = f"{sys.executable} {Path(__file__).parent / 'standin_engine.py'}"
KIMI = "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 "
FRACTION = " --mem-fraction-static 0.85"
THREE = (KIMI + "--tp-size 8 --ep-size 8" + FRACTION, KIMI + "--tp-size 4 --ep-size 2", KIMI + "--tp-size 8" + FRACTION)


def _slurm_up() -> bool:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return False
    done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    return done.returncode == 0 and any(s in done.stdout for s in ("idle", "mixed", "allocated"))


@pytest.fixture(autouse=True)
def slurm():
    if not _slurm_up():
        if os.environ.get("SHARDWISE_REQUIRE_SLURM"):
            pytest.fail("SHARDWISE_REQUIRE_SLURM is set but no Slurm node is up: run scripts/slurm-one-node.sh")
        pytest.skip("no Slurm here (scripts/slurm-one-node.sh starts a one-node cluster)")


def plan(folder: Path, commands: tuple[str, ...] = THREE, launcher: str = STANDIN, prompts: int = 4) -> SweepPlan:
    return SweepPlan(
        commands=commands, cluster=load_cluster("8xrtx-pro-6000"), concurrency=(1, 4), isl=16, osl=8,
        num_prompts=prompts, folder=folder, launcher=launcher, health_timeout_s=60, force=True,
        cluster_ref="8xrtx-pro-6000",
    )  # fmt: skip


def _listed(jobs: list[str]) -> list[str]:
    """Those of `jobs` Slurm still lists."""
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30).stdout.split()
    return [j for j in jobs if j in out]


def _jobs(folder: Path) -> list[str]:
    path = folder / "jobs.json"
    return list(json.loads(path.read_text()).values()) if path.exists() else []


def test_three_setups_one_failing_diagnosed_from_its_job_log(tmp_path):
    records = sweep_slurm(plan(tmp_path), poll_s=0.3)
    assert [r["status"] for r in records] == ["measured", "failed", "measured"]
    failed = records[1]
    assert failed["reason"] == "oom" and "CUDA out of memory" in failed["detail"]
    assert failed["log"] == str((tmp_path / "job-1.log").resolve())  # the engine wrote into the job's own log
    assert "CUDA out of memory" in (tmp_path / "job-1.log").read_text()
    assert records[0]["levels"][1]["completed"] == 4 and records[0]["measured_output_tok_s"] > 0
    jobs = _jobs(tmp_path)
    assert len(set(jobs)) == 3 and all(r["job"] in jobs for r in records)  # each record names the job that ran it
    assert load_records(tmp_path / "results.jsonl") == {r["command"]: r for r in records}
    assert _listed(jobs) == []


def test_a_job_that_ends_without_a_record_is_diagnosed_from_its_log(tmp_path):
    """A launcher that does not exist: the job's worker fails before any engine starts, and says why in the log."""
    records = sweep_slurm(plan(tmp_path, THREE[:1], launcher="/nonexistent/engine"), poll_s=0.3)
    assert records[0]["status"] == "failed"
    assert records[0]["reason"] == "invalid"
    assert records[0]["detail"].startswith("FileNotFoundError") and "/nonexistent/engine" in records[0]["detail"]


def _start(folder: Path, prompts: int) -> subprocess.Popen:
    args = [sys.executable, "-m", "shardwise", "sweep", "--scheduler", "slurm", "--poll", "0.3", "--dir", str(folder),
            "--launcher", STANDIN, "--force", "--concurrency", "1,4", "--isl", "16", "--osl", "8",
            "--num-prompts", str(prompts), "--json"]  # fmt: skip
    for command in THREE:
        args += ["--command", command]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(condition, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_ctrl_c_cancels_every_job_and_the_sweep_resumes(tmp_path):
    run = _start(tmp_path, prompts=40)
    _wait_for(lambda: len(load_records(tmp_path / "results.jsonl")) >= 1 and _listed(_jobs(tmp_path)))
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 130, err
    assert "the sweep's Slurm jobs are cancelled" in err
    assert _listed(_jobs(tmp_path)) == []  # nothing it submitted is queued or running
    first = load_records(tmp_path / "results.jsonl")
    assert 1 <= len(first) < 3
    again = _start(tmp_path, prompts=40)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    results = load_records(tmp_path / "results.jsonl")
    assert len(results) == 3 and [r["status"] for r in json.loads(out)["results"]] == ["measured", "failed", "measured"]
    for command, record in first.items():  # finished setups are kept, not run again
        assert results[command] == record
    assert _listed(_jobs(tmp_path)) == []


def test_a_killed_sweep_follows_its_running_job_instead_of_submitting_it_again(tmp_path):
    run = _start(tmp_path, prompts=40)
    _wait_for(lambda: bool(_listed(_jobs(tmp_path))))
    before = json.loads((tmp_path / "jobs.json").read_text())
    os.killpg(run.pid, signal.SIGKILL)  # no chance to cancel: its jobs run on
    run.wait()
    assert _listed(list(before.values()))
    records = sweep_slurm(plan(tmp_path, prompts=40), poll_s=0.3)
    after = json.loads((tmp_path / "jobs.json").read_text())
    for command, job in before.items():  # each job that was there is the one that ran it
        assert after[command] == job
        assert next(r for r in records if r["command"] == command)["job"] == job
    assert [r["status"] for r in records] == ["measured", "failed", "measured"]
