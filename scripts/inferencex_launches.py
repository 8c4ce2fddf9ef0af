"""Rebuild src/shardwise/data/measurements/inferencex.csv: the InferenceX single-node points that SGLang and vLLM
measured, each with the launch command its benchmark script ran.

InferenceX's points name the script that produced them (`launch_script`, path@commit in SemiAnalysisAI/InferenceX)
and the CI matrix values the script was given (tp, ep, dp_attention, concurrency, lengths). The scripts branch on
those values (flags per TP, a scheduler interval per concurrency, speculative settings), so the command of a point
is found by running its script as CI did, with every program it would start replaced by a recorder: `python3`
and `vllm` write down their arguments and the environment they were started with, `run_benchmark_serving`
writes down the client's. Nothing is started, downloaded or measured. A script that exits before it launches
(an unsupported matrix entry) leaves the point without a command, and the file says so.

Inputs: the points file (`points.csv` of the InferenceX reference set) and a git clone of
SemiAnalysisAI/InferenceX that holds every commit the points name:

    git clone https://github.com/SemiAnalysisAI/InferenceX /tmp/inferencex
    python scripts/inferencex_launches.py POINTS.csv /tmp/inferencex src/shardwise/data/measurements/inferencex.csv

Columns kept from the points file are listed in KEPT; `command` is the launch (environment assignments the script
exported for the engine, then the command line), `client` the benchmark client's arguments as the script passed
them, `launch_problem` why a point has no command.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ENGINES = ("sglang", "vllm")
KEPT = (
    "id", "provenance", "source", "model", "checkpoint", "precision", "gpu", "n_gpus", "framework",
    "framework_version", "spec_decoding", "tp", "ep", "dp_attention", "launch_script", "isl", "osl",
    "random_range_ratio", "dataset", "concurrency", "num_prompts", "num_warmups", "output_tok_s",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "date", "run_url", "notes",
)  # fmt: skip

# Programs a script may start: each is replaced by a recorder that writes one JSON line and succeeds.
RECORDED = ("python3", "python", "vllm")
SILENCED = (
    "nvidia-smi", "rocm-smi", "amd-smi", "hf", "huggingface-cli", "pip", "pip3", "docker", "srun", "sleep",
    "curl", "wget", "kill", "ps", "git", "lm_eval",
)  # fmt: skip
# Environment the recorder does not report: the shell's own and what this harness sets.
SHELL_VARS = {"PWD", "OLDPWD", "SHLVL", "_", "PATH", "HOME", "TMPDIR", "LAUNCH_LOG", "CLIENT_LOG", "LC_CTYPE"}

RECORDER = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["LAUNCH_LOG"], "a") as log:
    record = {"program": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "env": dict(os.environ)}
    log.write(json.dumps(record) + "\\n")
print("The server is fired up and ready to roll!", flush=True)  # what scripts that read the server log wait for
"""
LIBRARY = """
run_benchmark_serving() { printf '%s\\0' "$@" > "$CLIENT_LOG"; }
wait_for_server_ready() { :; }
command_not_found_handle() { return 0; }
"""


def matrix_env(point: dict) -> dict[str, str]:
    """What the CI matrix gave the script (InferenceX .github/workflows/benchmark-tmpl.yml, `env`)."""
    isl, osl = int(point["isl"]), int(point["osl"])
    dp = point["dp_attention"].startswith("true")
    return {
        "MODEL": point["checkpoint"],
        "ISL": str(isl),
        "OSL": str(osl),
        "MAX_MODEL_LEN": str(isl + osl + 256),
        "TP": point["tp"] or point["n_gpus"],
        "EP_SIZE": point["ep"] or "1",
        "DP_ATTENTION": "true" if dp else "false",
        "CONC": point["concurrency"],
        "NUM_PROMPTS": point["num_prompts"],
        "RANDOM_RANGE_RATIO": point["random_range_ratio"] if point["random_range_ratio"][:1].isdigit() else "0",
        "PRECISION": point["precision"],
        "FRAMEWORK": point["framework"],
        "SPEC_DECODING": "mtp" if point["spec_decoding"].startswith(("mtp", "eagle")) else "none",
        "RESULT_FILENAME": "result",
        "PORT": "8888",
    }


def run_script(repo: Path, script: str, env: dict[str, str]) -> tuple[list[dict], str | None]:
    """Run one script at one commit with recorders for its programs; its records and why it stopped short."""
    path, commit = script.split("@")
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, text=True)
    if shown.returncode != 0:
        return [], f"{path} is not at {commit} in the InferenceX history"
    text = shown.stdout
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        work = root / "workspace"
        work.mkdir()
        target.write_text(text.replace("/workspace", str(work)))  # the container's scratch folder, here
        for lib in {root / "benchmarks" / "benchmark_lib.sh", target.parent / "benchmark_lib.sh"}:
            lib.parent.mkdir(parents=True, exist_ok=True)
            lib.write_text(LIBRARY)
        stubs = root / "bin"
        stubs.mkdir()
        for name in RECORDED:
            (stubs / name).write_text(RECORDER.replace("#!/usr/bin/env python3", f"#!{sys.executable}"))
            (stubs / name).chmod(0o755)
        for name in SILENCED:
            (stubs / name).write_text("#!/bin/sh\nexit 0\n")
            (stubs / name).chmod(0o755)
        log = root / "launch.jsonl"
        client = root / "client.args"
        base = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(work), "TMPDIR": tmp}
        base |= {"LAUNCH_LOG": str(log), "CLIENT_LOG": str(client)}
        try:
            # sourced under a trap, so the recorders started in the background have written before it returns
            wrapped = ["bash", "-c", 'trap wait EXIT; . "$0"', str(target)]
            done = subprocess.run(wrapped, cwd=work, env=base | env, capture_output=True, text=True, timeout=20)
            ending = f"exit {done.returncode}: " + (done.stdout.strip().splitlines() or ["no output"])[-1]
        except subprocess.TimeoutExpired:
            ending = "it waits on something the harness does not give it"
            print(f"{script}: timed out", file=sys.stderr)
        here = str(work)  # written back as the container's path
        records = (
            [json.loads(line.replace(here, "/workspace")) for line in log.read_text().splitlines()]
            if log.exists()
            else []
        )
        if client.exists():
            records.append(
                {"program": "client", "argv": client.read_text().replace(here, "/workspace").split("\0")[:-1]}
            )
    launched = any(_is_launch(r) for r in records)
    problem = None if launched else f"the script stops before it launches ({ending})"
    return records, problem


def _is_launch(record: dict) -> bool:
    argv = record.get("argv", [])
    return (record["program"] == "vllm" and argv[:1] == ["serve"]) or (
        record["program"].startswith("python")
        and any(a in ("sglang.launch_server", "vllm.entrypoints.openai.api_server") for a in argv)
    )


def _is_client(record: dict) -> bool:
    argv = record.get("argv", [])
    return record["program"] == "client" or any(a.endswith("benchmark_serving.py") for a in argv[:1])


def command_of(records: list[dict], given: dict[str, str]) -> tuple[str, str]:
    """The launch as one line (the engine's environment beyond the harness's, then argv) and the client's args."""
    launch = next(r for r in records if _is_launch(r))
    env = {k: v for k, v in sorted(launch["env"].items()) if k not in SHELL_VARS and k not in given}
    program = "python3" if launch["program"].startswith("python") else launch["program"]
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(w) for w in (program, *launch["argv"])]
    client = next((r for r in records if _is_client(r)), None)
    args = client["argv"] if client else []
    for i, a in enumerate(args):  # the process id of the recorded server changes from run to run
        if a == "--server-pid":
            args = args[:i] + args[i + 2 :]
            break
    return " ".join(words), shlex.join(args)


def main(points: Path, repo: Path, out: Path) -> None:
    with points.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["framework"] in ENGINES]
    cache: dict[tuple, tuple[str, str, str]] = {}
    written = []
    for row in rows:
        env = matrix_env(row)
        key = (row["launch_script"], tuple(sorted(env.items())))
        if key not in cache:
            records, problem = run_script(repo, row["launch_script"], env)
            command, client = command_of(records, env) if problem is None else ("", "")
            cache[key] = (command, client, problem or "")
        command, client, problem = cache[key]
        written.append({**{k: row[k] for k in KEPT}, "command": command, "client": client, "launch_problem": problem})
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*KEPT, "command", "client", "launch_problem"], lineterminator="\n")
        w.writeheader()
        w.writerows(written)
    missing = sum(1 for r in written if r["launch_problem"])
    print(f"{len(written)} points, {len(cache)} script runs, {missing} without a launch command", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: inferencex_launches.py POINTS.csv INFERENCEX_CLONE OUT.csv")
    os.umask(0o022)
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
