"""The sweep through Kubernetes. No cluster runs here: each setup's Job manifest is checked against the Kubernetes
OpenAPI schema (strict, offline, pinned release), and the sweep's own logic (create, follow, collect, diagnose,
resume, delete on Ctrl-C) runs against a stand-in API server whose kubelet runs each pod's containers as local
processes from the manifest's commands (fake_kubernetes.py), the engine the stand-in of the local sweep's tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest

from shardwise.cli.deploy import sweep_job_of
from shardwise.measure import kubernetes
from shardwise.measure.kubernetes import Kube, bench_main, sweep_kubernetes
from shardwise.measure.sweep import SweepPlan, load_records
from shardwise.spec.cluster import load_cluster

sys.path.insert(0, str(Path(__file__).parent))

from fake_kubernetes import FakeKube  # noqa: E402

STANDIN = f"{sys.executable} {Path(__file__).parent / 'standin_engine.py'}"
KIMI = "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --mem-fraction-static 0.85 "
KUBERNETES = "1.33.0"  # as tests/deploy: a release every maintained cluster runs or has passed
BENCH_IMAGE = "registry.example/shardwise:0.1.0"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def three() -> tuple[str, ...]:
    """EP8, the user's OOM (TP4 EP2) and TP8, each on a port of its own (a pod has its own network; these share
    this machine's)."""
    layouts = ("--tp-size 8 --ep-size 8", "--tp-size 4 --ep-size 2", "--tp-size 8")
    return tuple(f"{KIMI}{layout} --port {_port()}" for layout in layouts)


def plan(folder: Path, commands: tuple[str, ...], launcher: str = STANDIN, health_timeout_s: float = 60) -> SweepPlan:
    return SweepPlan(
        commands=commands, cluster=load_cluster("8xrtx-pro-6000"), concurrency=(1, 4), isl=16, osl=8,
        num_prompts=4, folder=folder, launcher=launcher, health_timeout_s=health_timeout_s, force=True,
        cluster_ref="8xrtx-pro-6000",
    )  # fmt: skip


def run(sweep_plan: SweepPlan, fake: FakeKube) -> list[dict]:
    job_of = sweep_job_of(sweep_plan, bench_image=BENCH_IMAGE, cache_claim="model-cache")
    return sweep_kubernetes(sweep_plan, Kube(fake, fake, "default"), job_of, poll_s=0.2)


@pytest.fixture
def fake(tmp_path):
    cluster = FakeKube(tmp_path / "kubelet")
    (tmp_path / "kubelet").mkdir()
    yield cluster
    for name in list(cluster.jobs):
        cluster.delete_namespaced_job(name, "default", propagation_policy="Foreground")


def test_each_setup_is_a_job_the_kubernetes_schema_accepts(tmp_path):
    commands = three()
    job_of = sweep_job_of(plan(tmp_path, commands, launcher=None), bench_image=BENCH_IMAGE, cache_claim="model-cache")
    job = job_of(0, commands[0], "shardwise-sweep-0")
    kubernetes_validate.validate(job, KUBERNETES, strict=True)
    pod = job["spec"]["template"]["spec"]
    (engine,), (bench,) = pod["initContainers"], pod["containers"]
    # the engine is a sidecar: restarted while it starts, stopped by the kubelet once the benchmark ends
    assert engine["restartPolicy"] == "Always" and pod["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] == 0  # a setup that fails is a finding, not a pod to run again
    assert engine["image"] == "lmsysorg/sglang:v0.5.23-cu130" and bench["image"] == BENCH_IMAGE
    assert engine["command"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert engine["command"][-2:] == ["--host", "0.0.0.0"]  # SGLang binds loopback by default
    assert engine["resources"]["limits"] == {"nvidia.com/gpu": 8}
    port = int(commands[0].rsplit(" ", 1)[1])
    assert engine["ports"][0]["containerPort"] == port
    # the startup probe allows the sweep's health timeout: 60 s in probes of 10 s
    assert engine["startupProbe"]["periodSeconds"] * engine["startupProbe"]["failureThreshold"] == 60
    assert bench["command"][:3] == ["python3", "-m", "shardwise.measure.kubernetes"]
    assert f"http://127.0.0.1:{port}" in bench["command"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}} in pod["volumes"]
    # a Job its sweep forgot frees its GPUs; on the pod, so the time it waits for a node does not count
    assert pod["activeDeadlineSeconds"] > 60 and "activeDeadlineSeconds" not in job["spec"]


def test_three_setups_one_failing_diagnosed_from_its_engine_log(tmp_path, fake):
    commands = three()
    records = run(plan(tmp_path / "sweep", commands), fake)
    assert [r["status"] for r in records] == ["measured", "failed", "measured"]
    failed = records[1]
    assert failed["reason"] == "oom" and "CUDA out of memory" in failed["detail"]
    # the engine's log is kept beside the results: the Job and its pod are deleted once collected
    assert "CUDA out of memory" in Path(failed["log"]).read_text()
    assert records[0]["levels"][1]["completed"] == 4 and records[0]["measured_output_tok_s"] > 0
    assert records[2]["layout"] and records[2]["predicted_output_tok_s"] > 0
    assert load_records(tmp_path / "sweep" / "results.jsonl") == {r["command"]: r for r in records}
    assert fake.jobs == {} and fake.running() == []
    assert len(fake.created) == 3


# an engine that never answers and, as vLLM does while it starts, turns SIGTERM into an exception of its own
NEVER = (
    f"{sys.executable} -c 'import signal, sys, time\n"
    'def stop(*_):\n    print("RuntimeError: terminated", flush=True); sys.exit(1)\n'
    "signal.signal(signal.SIGTERM, stop); time.sleep(600)'"
)


def test_an_engine_that_never_answers_is_a_startup_timeout_whatever_it_logs_when_stopped(tmp_path, fake, monkeypatch):
    """The startup probe (looks a second apart here, eight for an 8 s timeout) gives up within its last period and
    the kubelet stops the engine, which logs an error as it goes: the sweep records the timeout, not that error,
    and does not wait on the restarts."""
    monkeypatch.setattr(kubernetes, "PROBE_PERIOD_S", 1)
    (record,) = run(plan(tmp_path / "sweep", three()[:1], launcher=NEVER, health_timeout_s=8), fake)
    assert record["status"] == "failed" and record["reason"] == "startup_timeout", record
    assert "RuntimeError: terminated" in Path(record["log"]).read_text()
    assert fake.jobs == {} and fake.running() == []


def test_an_engine_that_ends_at_once_is_a_crash_not_a_timeout(tmp_path, fake, monkeypatch):
    """It ends within a second or two, even on a busy machine, of a timeout of 8 s (the probe gives up after 7 s at
    the soonest): a crash, read from its exit status."""
    monkeypatch.setattr(kubernetes, "PROBE_PERIOD_S", 1)
    quits = f"{sys.executable} -c 'import sys; sys.exit(3)'"
    (record,) = run(plan(tmp_path / "sweep", three()[:1], launcher=quits, health_timeout_s=8), fake)
    assert (record["status"], record["reason"], record["detail"]) == ("failed", "crashed", "exit status 3")


def test_an_engine_that_dies_during_the_benchmark_is_a_crash_not_a_measurement(tmp_path, fake):
    """The kubelet restarts a sidecar that ends, and the stand-in engine is up again within a second: the levels
    would go on against the new one. A measurement across a restart is recorded as the crash it is."""
    killed: list[int] = []

    def kill_engine_once_benchmarking(cluster: FakeKube) -> None:
        for pod in list(cluster.pods.values()):
            if pod.bench is not None and pod.bench.poll() is None and not killed:
                killed.append(pod.engine.pid)
                os.killpg(pod.engine.pid, signal.SIGKILL)

    fake.on_list = kill_engine_once_benchmarking
    (record,) = run(plan(tmp_path / "sweep", three()[:1]), fake)
    assert killed and record["status"] == "failed" and record["reason"] == "crashed_during_bench"
    assert fake.jobs == {} and fake.running() == []


def test_ctrl_c_deletes_the_jobs_and_a_rerun_finishes_the_sweep(tmp_path, fake):
    commands = three()
    sweep_plan = plan(tmp_path / "sweep", commands)
    seen: list[int] = []

    def interrupt_once_running(cluster: FakeKube) -> None:
        if cluster.running() and not seen:
            seen.append(1)
            raise KeyboardInterrupt

    fake.on_list = interrupt_once_running
    with pytest.raises(KeyboardInterrupt):
        run(sweep_plan, fake)
    assert fake.jobs == {} and fake.running() == []  # nothing left holding GPUs
    fake.on_list = None
    records = run(sweep_plan, fake)
    assert [r["status"] for r in records] == ["measured", "failed", "measured"]
    assert fake.jobs == {} and fake.running() == []


class Killed(BaseException):
    """The sweep's process killed outright: no handler of its own runs."""


def killed_once_running(sweep_plan: SweepPlan, fake: FakeKube) -> None:
    """Run the sweep until a pod runs, then kill it outright: its Jobs are left as they are."""

    def kill(cluster: FakeKube) -> None:
        if cluster.running():
            raise Killed

    fake.on_list = kill
    with pytest.raises(Killed):
        run(sweep_plan, fake)
    fake.on_list = None


def test_a_sweep_killed_outright_follows_its_jobs_instead_of_creating_them_twice(tmp_path, fake):
    commands = three()
    sweep_plan = plan(tmp_path / "sweep", commands)

    killed_once_running(sweep_plan, fake)
    assert len(fake.jobs) == 3  # left on the cluster, as a killed process leaves them
    records = run(sweep_plan, fake)
    assert [r["status"] for r in records] == ["measured", "failed", "measured"]
    assert len(fake.created) == 3  # followed, not created again
    assert fake.jobs == {}
    # run again: every setup has its record, nothing is created
    assert run(sweep_plan, fake) == records and len(fake.created) == 3


def test_the_benchmark_container_prints_one_record_line(capsys):
    """Against nothing listening, the levels fail and the engine is not alive: the record says so."""
    bench_main(["--url", f"http://127.0.0.1:{_port()}", "--concurrency", "1", "--isl", "8", "--osl", "4",
                "--num-prompts", "1"])  # fmt: skip
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith('shardwise-record: {"status": "failed", "reason": "crashed_during_bench"')


def test_without_a_cluster_or_a_bench_image_the_sweep_says_so_in_one_line(tmp_path):
    command = KIMI + "--tp-size 8"
    base = [sys.executable, "-m", "shardwise", "sweep", "--scheduler", "kubernetes", "--command", command]
    base += ["--dir", str(tmp_path / "sweep")]
    unreachable = tmp_path / "kubeconfig"  # a cluster whose API server is not listening
    unreachable.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:{_port()}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    cases = (
        ([], tmp_path / "nowhere", "needs --bench-image"),
        (["--bench-image", BENCH_IMAGE], tmp_path / "nowhere", "no Kubernetes cluster"),
        (["--bench-image", BENCH_IMAGE], unreachable, "cannot reach the Kubernetes API"),
    )
    for extra, kubeconfig, says in cases:
        env = {"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        done = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert says in line and "Traceback" not in done.stderr


def test_a_job_still_being_deleted_is_made_afresh_not_followed(tmp_path, fake):
    """A rerun that finds its Job marked for deletion (an earlier sweep's Ctrl-C that gave up waiting) would follow
    a pod being stopped into a false crash: it waits for the Job to go and makes it again."""
    sweep_plan = plan(tmp_path / "sweep", three()[:1])

    killed_once_running(sweep_plan, fake)
    (name,) = fake.jobs
    fake.delete_namespaced_job(name, "default", propagation_policy="Foreground")
    (record,) = run(sweep_plan, fake)
    assert record["status"] == "measured" and fake.created == [name, name]
