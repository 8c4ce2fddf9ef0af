"""Launch, benchmark and record setups on this machine, one after another, as a person would by hand.

For each launch command: check it (a setup the engine would refuse or that does not fit is skipped unless
forced), start the engine in its own process group with its output in a log file, wait for /health, run the
benchmark levels, stop the whole group (SIGTERM, then SIGKILL), and append one record to the sweep's
results file. A run that fails is recorded with its reason, read from the engine's log and exit status:
CUDA out of memory, no room for the KV cache, an invalid configuration (the exception the engine raised), a
start-up that timed out, or a crash during the benchmark. A sweep started again skips every setup that
already has a record, so nothing finished is run twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from shardwise import jsontext
from shardwise.cost.memory import memory_ledger
from shardwise.engines.check import check_command
from shardwise.engines.flags import split_command
from shardwise.errors import BenchError, SpecError
from shardwise.hardware.calibration import Calibration
from shardwise.measure.bench import Target, run_level
from shardwise.measure.calibrate import calibrate
from shardwise.measure.reference import ReferenceRow
from shardwise.serve.steady import Predictor
from shardwise.serve.steps import StepTimes
from shardwise.spec.cluster import ClusterSpec

FAILURES = (  # (reason, pattern in the engine's log), first match wins
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError", re.I)),
    # SGLang: "Not enough memory. Please try to increase --mem-fraction-static"; vLLM: "No available memory for
    # the cache blocks"
    ("no_kv_room", re.compile(r"Not enough memory\. Please try|No available memory for the cache blocks", re.I)),
    ("invalid", re.compile(r"^\w*(Error|Exception)\b.*$", re.M)),  # the exception the engine raised at start-up
)
STOP_GRACE_S = 10.0  # seconds between SIGTERM and SIGKILL of the engine's process group


@dataclass(frozen=True, kw_only=True)
class SweepPlan:
    commands: tuple[str, ...]
    cluster: ClusterSpec
    concurrency: tuple[int, ...]
    isl: int
    osl: int
    num_prompts: int
    folder: Path
    launcher: str | None = None  # replaces the engine's launcher (a stand-in engine, a container wrapper)
    health_timeout_s: float = 1800.0
    force: bool = False
    cluster_ref: str | None = None  # how the cluster was named (a job on another node loads it again)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _argv(plan: SweepPlan, command: str, port: int) -> list[str]:
    tokens = shlex.split(command)
    if plan.launcher:
        tokens = [*shlex.split(plan.launcher), *split_command(command).argv]
    return [*tokens, "--port", str(port)]


def diagnose(log: str, returncode: int | None) -> tuple[str, str]:
    """(reason, the line that says so) from an engine's log."""
    for reason, pattern in FAILURES:
        match = pattern.search(log)
        if match:
            start = log.rfind("\n", 0, match.start()) + 1
            end = log.find("\n", match.end())
            return reason, log[start : end if end >= 0 else len(log)].strip()[:300]
    tail = log.strip().splitlines()[-1:] or [f"exit status {returncode}"]
    return "crashed", tail[0][:300]


def load_records(path: Path) -> dict[str, dict[str, Any]]:
    """Records already in a sweep's results file, by launch command (a cut-off last line is ignored)."""
    records: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            records[rec["command"]] = rec
    return records


def prediction(plan: SweepPlan, command: str) -> tuple[str | None, float | None, str | None]:
    """(layout, predicted output tok/s at the highest level, why it would not start) as shardwise sees it."""
    checked = check_command(command, cluster=plan.cluster)
    layout = checked.setup.layout
    if layout is None or not checked.setup.valid:
        return None, None, checked.setup.rejections[0].reason if checked.setup.rejections else "invalid"
    memory = memory_ledger(checked.model, layout, plan.cluster)
    if memory.verdict != "ok":
        return layout.describe(), None, memory.reason or memory.verdict
    top = max(plan.concurrency)
    steps = StepTimes(checked.model, layout, plan.cluster)
    (p,) = Predictor(steps, memory).sweep([top], isl=plan.isl, osl=plan.osl)
    return layout.describe(), p.output_tok_s, None


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """Whether the engine at `url` answers its /health with 200."""
    try:
        return httpx.get(url + "/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_healthy(url: str, process: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        if healthy(url):
            return True
        time.sleep(0.2)
    return False


def stop(process: subprocess.Popen) -> None:
    """End the engine and everything it started: its whole process group."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_GRACE_S)
    except ProcessLookupError:
        pass


def measure_levels(
    url: str, *, concurrency: tuple[int, ...], isl: int, osl: int, num_prompts: int, alive: Callable[[], bool]
) -> tuple[list[dict[str, Any]], bool]:
    """Each benchmark level against the engine at `url`, one after another; (the levels measured,
    whether the engine was still up after the last one: `alive` is asked after each level, and a level run
    against a dead engine, or that could not run because the engine had gone, is not kept)."""
    levels = []
    for c in concurrency:
        try:
            level = asyncio.run(run_level(Target(url=url), isl=isl, osl=osl, num_prompts=num_prompts, concurrency=c))
        except BenchError:
            if alive():  # the engine is up and still did not serve: not a crash, say what the client saw
                raise
            return levels, False
        if not alive():
            return levels, False
        levels.append(
            {
                "max_concurrency": c,
                "completed": level.completed,
                "failed": level.failed,
                "output_throughput": round(level.output_throughput, 2),
                "mean_tpot_ms": round(level.tpot_s.mean * 1e3, 3),
                "mean_ttft_ms": round(level.ttft_s.mean * 1e3, 3),
            }
        )
    return levels, True


def measured(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """A setup's record once every level ran: the levels and the most output tok/s any gave."""
    return {
        "status": "measured",
        "levels": levels,
        "measured_output_tok_s": max(lv["output_throughput"] for lv in levels),
    }


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM ends a sweep through a scheduler as Ctrl-C does (its jobs cancelled)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_one(plan: SweepPlan, command: str, index: int, log_path: Path | None = None) -> dict[str, Any]:
    """Check, start, benchmark and stop one setup; its engine's output goes to `log_path` (appended; default a log of
    its own in the sweep's folder)."""
    layout, predicted, refusal = prediction(plan, command)
    record: dict[str, Any] = {"command": command, "layout": layout, "predicted_output_tok_s": predicted}
    if refusal and not plan.force:
        return {**record, "status": "skipped", "reason": refusal}
    port = _free_port()
    mode = "a" if log_path is not None else "w"  # a job's log holds the scheduler's words before the engine's
    log_path = log_path or plan.folder / f"engine-{index}.log"
    with log_path.open(mode) as log:
        process = subprocess.Popen(
            _argv(plan, command, port), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        if not _wait_healthy(url, process, plan.health_timeout_s):
            code = process.poll()
            stop(process)
            if code is None:
                return {
                    **record,
                    "status": "failed",
                    "reason": "startup_timeout",
                    "detail": f"no /health within {plan.health_timeout_s:g} s",
                    "log": str(log_path),
                }
            reason, detail = diagnose(log_path.read_text(errors="replace"), code)
            return {**record, "status": "failed", "reason": reason, "detail": detail, "log": str(log_path)}
        levels, alive = measure_levels(
            url,
            concurrency=plan.concurrency,
            isl=plan.isl,
            osl=plan.osl,
            num_prompts=plan.num_prompts,
            alive=lambda: process.poll() is None,
        )
        if not alive:
            reason, detail = diagnose(log_path.read_text(errors="replace"), process.returncode)
            return {
                **record,
                "status": "failed",
                "reason": "crashed_during_bench",
                "detail": detail,
                "log": str(log_path),
            }
        return {**record, **measured(levels), "log": str(log_path)}
    finally:
        stop(process)


def open_results(plan: SweepPlan) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The sweep's results file (its folder made if need be) and the records it already holds, by command."""
    try:
        plan.folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"cannot use {plan.folder} for the sweep: {exc.strerror or exc}") from exc
    results = plan.folder / "results.jsonl"
    return results, load_records(results)


def sweep(plan: SweepPlan, *, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run every command of the plan that has no record yet; return all records, old and new, in plan order."""
    results, done = open_results(plan)
    for index, command in enumerate(plan.commands):
        if command in done:
            continue
        if progress:
            progress(command)
        record = run_one(plan, command, index)
        jsontext.append_line(results, record)
        done[command] = record
    return [done[c] for c in plan.commands if c in done]


CALIBRATE_FIRST = ("eager_kernel_cpu_s", "mem_bandwidth_bytes_per_s", "collective_call_s")


def rows_of(records: list[dict[str, Any]], plan: SweepPlan) -> list[ReferenceRow]:
    """Every measured level of a sweep as a measurement to predict or calibrate on."""
    rows = []
    for n, rec in enumerate(records):
        for level in rec.get("levels", []):
            rows.append(
                ReferenceRow(
                    id=f"setup{n + 1}-C{level['max_concurrency']}",
                    source="shardwise sweep",
                    model="",
                    gpus=plan.cluster.name,
                    command=rec["command"],
                    isl=plan.isl,
                    osl=plan.osl,
                    concurrency=level["max_concurrency"],
                    output_tok_s=level["output_throughput"] or None,
                )
            )
    return [r for r in rows if r.output_tok_s]


def recalibrate(records: list[dict[str, Any]], plan: SweepPlan) -> tuple[Calibration | None, str]:
    """Fit what the sweep's measurements can determine; (the profile, or None with the reason)."""
    rows = rows_of(records, plan)
    names = list(CALIBRATE_FIRST)
    while names:
        try:
            return calibrate(rows, names=names).calibration, ""
        except SpecError as exc:
            dropped = next((n for n in names if f"determine {n}" in str(exc)), None)
            if dropped is None:
                return None, str(exc)
            names.remove(dropped)
    return None, "no constant is determined by these measurements"


def reranked(records: list[dict[str, Any]], plan: SweepPlan, calibration: Calibration | None) -> list[dict[str, Any]]:
    """Every setup with its default and calibrated predictions and what was measured: measured setups first,
    by measured throughput, then the rest by calibrated prediction."""
    out = []
    cluster = plan.cluster.calibrated(calibration) if calibration else plan.cluster
    for rec in records:
        calibrated = None
        if calibration is not None and rec.get("predicted_output_tok_s") is not None:
            calibrated = prediction(SweepPlan(**{**plan.__dict__, "cluster": cluster}), rec["command"])[1]
        out.append(
            {
                **{k: rec.get(k) for k in ("command", "layout", "status", "reason", "detail")},
                "predicted_output_tok_s": rec.get("predicted_output_tok_s"),
                "calibrated_output_tok_s": calibrated,
                "measured_output_tok_s": rec.get("measured_output_tok_s"),
            }
        )
    return sorted(
        out,
        key=lambda r: (
            r["measured_output_tok_s"] is None,
            -(r["measured_output_tok_s"] or r["calibrated_output_tok_s"] or r["predicted_output_tok_s"] or 0),
        ),
    )
