"""The sweep through a Slurm cluster: each setup one batch job, which checks, starts, benchmarks and stops it on the
node Slurm gives it (the local sweep's `run_one`, its engine writing into the job's own log), and leaves its record
beside the job's log; this side submits the jobs, follows them with squeue, and collects each record into the same
results file as the local sweep. A job that ends without a record (killed, cancelled, out of time) is recorded as
failed, with the reason read from its log. Run again, it skips every setup with a record and follows the jobs it
submitted before that are still queued or running, rather than submitting them twice; interrupted (Ctrl-C, SIGTERM),
it cancels the jobs it submitted and waits until Slurm no longer lists them.

Commands used: sbatch --parsable, squeue -h -j, scancel (Slurm 22.05 and later)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardwise import jsontext
from shardwise.errors import SpecError
from shardwise.measure.sweep import SweepPlan, diagnose, open_results, run_one, terminate_as_interrupt
from shardwise.spec.cluster import load_cluster

# A job's states once it has ended (squeue(1) JOB STATE CODES); any other state it is listed in is still its own
ENDED = (
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
)
CANCEL_WAIT_S = 60.0  # how long to wait for Slurm to stop listing cancelled jobs


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a job on another node may read it at any moment."""
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text, encoding="utf-8")
    os.replace(temp, path)


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SpecError(f"{argv[0]} not found: --scheduler slurm needs Slurm's commands on this machine") from None
    if done.returncode != 0:
        raise SpecError(f"{' '.join(argv[:2])} failed: {(done.stderr or done.stdout).strip()[:300]}")
    return done.stdout


def _state(job: str) -> str | None:
    """The job's state until it has ended, then None: not listed, listed in an end state (squeue -j lists an ended
    job for a while), or unknown to Slurm. A squeue that fails otherwise (the controller busy) says nothing: the job
    is taken as still there, and asked about again."""
    done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return None if "invalid job id" in done.stderr.lower() else "UNKNOWN"
    state = done.stdout.strip()
    return None if not state or state in ENDED else state


def _plan_file(plan: SweepPlan) -> Path:
    return plan.folder / "plan.json"


def _write_plan(plan: SweepPlan) -> None:
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name not in ("cluster", "folder")}
    _write(_plan_file(plan), json.dumps({**fields, "folder": str(plan.folder)}, indent=1) + "\n")


def _read_plan(folder: Path) -> SweepPlan:
    raw = json.loads((folder / "plan.json").read_text(encoding="utf-8"))
    raw["commands"], raw["concurrency"] = tuple(raw["commands"]), tuple(raw["concurrency"])
    return SweepPlan(**{**raw, "folder": Path(raw["folder"]), "cluster": load_cluster(raw["cluster_ref"])})


def _record_path(folder: Path, index: int) -> Path:
    return folder / f"record-{index}.json"


def _job_log(folder: Path, index: int) -> Path:
    return folder / f"job-{index}.log"


def submit(plan: SweepPlan, index: int, options: tuple[str, ...]) -> str:
    """Submit setup `index` as one batch job; its id."""
    script = plan.folder / f"job-{index}.sh"
    worker = shlex.join([sys.executable, "-m", "shardwise.measure.slurm", str(plan.folder.resolve()), str(index)])
    _write(script, f"#!/bin/bash\n# shardwise sweep: setup {index} of {plan.folder}\nexec {worker}\n")
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name=shardwise-sweep-{index}",
        f"--output={_job_log(plan.folder, index).resolve()}",
        "--nodes=1",
        "--ntasks=1",
        "--exclusive",  # one engine per node: two would fight over its GPUs
        *options,
        str(script.resolve()),
    ]
    return _run(argv).strip().split(";")[0]


def cancel(jobs: list[str]) -> None:
    """Cancel `jobs` and wait until Slurm no longer lists any of them."""
    if not jobs:
        return
    subprocess.run(["scancel", *jobs], capture_output=True, timeout=60)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline and any(_state(j) for j in jobs):
        time.sleep(0.5)


def sweep_slurm(
    plan: SweepPlan,
    *,
    options: tuple[str, ...] = (),
    poll_s: float = 5.0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every command of the plan that has no record yet as a Slurm job (`options` passed to sbatch); return all
    records, old and new, in plan order."""
    if plan.cluster_ref is None:
        raise SpecError("a Slurm sweep needs the cluster by name or file, as --gpus gives it")
    results, done = open_results(plan)
    jobs_file = plan.folder / "jobs.json"
    jobs: dict[str, str] = json.loads(jobs_file.read_text()) if jobs_file.exists() else {}
    _write_plan(plan)
    active: dict[int, str] = {}
    with terminate_as_interrupt():
        try:
            for index, command in enumerate(plan.commands):
                if command in done:
                    continue
                known = jobs.get(command)
                if known is not None and (_state(known) or _record_path(plan.folder, index).exists()):
                    active[index] = known  # submitted before and still there (or finished): follow it
                    continue
                _record_path(plan.folder, index).unlink(missing_ok=True)
                if progress:
                    progress(command)
                jobs[command] = active[index] = submit(plan, index, options)
                _write(jobs_file, json.dumps(jobs, indent=1) + "\n")
            while active:
                for index, job in list(active.items()):
                    record = _collected(plan, index, job)
                    if record is None:
                        continue
                    jsontext.append_line(results, record)
                    done[record["command"]] = record
                    del active[index]
                if active:
                    time.sleep(poll_s)
        except KeyboardInterrupt:
            cancel(list(active.values()))
            raise
    return [done[c] for c in plan.commands if c in done]


def _collected(plan: SweepPlan, index: int, job: str) -> dict[str, Any] | None:
    """The job's record once Slurm no longer lists it (its worker writes the record just before it exits: a sweep
    that returned earlier would leave the job completing): the record it wrote, or a failure read from its log;
    None while it runs."""
    if _state(job) is not None:
        return None
    path = _record_path(plan.folder, index)
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    log = _job_log(plan.folder, index)
    text = log.read_text(errors="replace") if log.exists() else ""
    reason, detail = diagnose(text, None)
    return {
        "command": plan.commands[index],
        "status": "failed",
        "reason": reason,
        "detail": detail,
        "log": str(log),
        "job": job,
    }


def job_main(folder: Path, index: int) -> None:
    """What one job runs on its node: the setup's check, start, benchmark and stop, its engine writing into the
    job's log; the record left beside it."""
    plan = _read_plan(folder)
    record = run_one(plan, plan.commands[index], index, log_path=_job_log(folder, index))
    record["job"] = os.environ.get("SLURM_JOB_ID")
    _write(_record_path(folder, index), json.dumps(record) + "\n")


if __name__ == "__main__":
    job_main(Path(sys.argv[1]), int(sys.argv[2]))
