"""A stand-in for a Kubernetes API server and the kubelet of one node with eight GPUs, for the sweep's tests where no
cluster runs: the few calls of BatchV1Api and CoreV1Api the sweep makes, answering with the JSON the API server
sends. A Job's pod is admitted once the node has its GPUs free; its containers run as local processes from the
manifest's commands (`python3` is this interpreter, the image is not pulled): the engine first, as a sidecar the
kubelet restarts when it ends, its startup probe polled as the manifest sets it (period x failure threshold), then
the benchmark container once the probe passes; when the benchmark ends the engine is stopped and the Job completes
or fails by its exit status. Deleting a Job stops its processes (foreground propagation) before the Job goes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
from kubernetes.client.exceptions import ApiException

NODE_GPUS = 8


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def _argv(command: list[str]) -> list[str]:
    return [sys.executable, *command[1:]] if command[0] == "python3" else list(command)


def _stop(process: subprocess.Popen | None, grace_s: float = 2.0) -> None:
    """As the kubelet stops a container: SIGTERM, then SIGKILL after the grace period."""
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _exit_code(process: subprocess.Popen) -> int:
    """The status a container runtime reports: 128 + the signal that ended it."""
    code = process.returncode
    return 128 - code if code < 0 else code


class Pod(threading.Thread):
    def __init__(self, cluster: FakeKube, job: dict, folder: Path):
        super().__init__(daemon=True)
        self.cluster, self.job, self.folder = cluster, job, folder
        self.name = job["metadata"]["name"] + "-pod"
        spec = job["spec"]["template"]["spec"]
        self.engine_spec, self.bench_spec = spec["initContainers"][0], spec["containers"][0]
        self.gpus = int(self.engine_spec["resources"]["limits"]["nvidia.com/gpu"])
        self.engine: subprocess.Popen | None = None
        self.bench: subprocess.Popen | None = None
        self.engine_status: dict = {"name": "engine", "restartCount": 0, "state": {"waiting": {}}}
        self.bench_status: dict = {"name": "bench", "restartCount": 0, "state": {"waiting": {}}}
        self.phase, self.runs, self.previous_run = "Pending", 0, 0
        self.stopping = threading.Event()

    def log_path(self, container: str, run: int) -> Path:
        return self.folder / f"{self.name}-{container}-{run}.log"

    def _start(self, spec: dict, container: str, run: int) -> subprocess.Popen:
        with self.log_path(container, run).open("w") as log:
            return subprocess.Popen(
                _argv(spec["command"]), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _healthy(self) -> bool:
        probe = self.engine_spec["startupProbe"]["httpGet"]
        port = next(p["containerPort"] for p in self.engine_spec["ports"] if p["name"] == probe["port"])
        try:
            return httpx.get(f"http://127.0.0.1:{port}{probe['path']}", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _engine_ended(self, started: str) -> None:
        """The sidecar ended: its status as the kubelet shows it before it restarts it."""
        self.engine_status["lastState"] = {
            "terminated": {"exitCode": _exit_code(self.engine), "startedAt": started, "finishedAt": _now()}
        }
        self.engine_status["restartCount"] += 1
        self.previous_run = self.runs
        self.engine_status["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
        self.stopping.wait(0.5)  # the kubelet's back-off

    def _start_engine(self) -> str:
        self.runs += 1
        started = _now()
        self.engine = self._start(self.engine_spec, "engine", self.runs)
        self.engine_status["state"] = {"running": {"startedAt": started}}
        return started

    def run(self) -> None:
        while not self.cluster.admit(self):
            if self.stopping.wait(0.1):
                return
        probe = self.engine_spec["startupProbe"]
        # the probe's looks are not aligned with the start: the last failed look comes within its final period
        give_up_s = probe["periodSeconds"] * (probe["failureThreshold"] - 0.5)
        while not self.stopping.is_set():  # the sidecar, restarted each time it ends before it is healthy
            started = self._start_engine()
            deadline = time.monotonic() + give_up_s
            while not self.stopping.is_set() and self.engine.poll() is None and time.monotonic() < deadline:
                if self._healthy():
                    break
                time.sleep(0.1)
            else:
                _stop(self.engine)  # the startup probe gave up, or the engine ended
                self._engine_ended(started)
                continue
            break
        if self.stopping.is_set():
            return
        self.bench = self._start(self.bench_spec, "bench", 1)
        self.bench_status["state"] = {"running": {"startedAt": _now()}}
        while self.bench.poll() is None:  # the sidecar is restarted whenever it ends, benchmark or not
            if self.engine.poll() is not None and not self.stopping.is_set():
                self._engine_ended(started)
                started = self._start_engine()
            time.sleep(0.1)
        code = _exit_code(self.bench)
        self.bench_status["state"] = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}
        _stop(self.engine)  # the benchmark has ended: the kubelet stops the sidecar
        self.engine_status["state"] = {"terminated": {"exitCode": _exit_code(self.engine), "finishedAt": _now()}}
        self.phase = "Succeeded" if code == 0 else "Failed"
        self.cluster.finished(self, succeeded=code == 0)

    def halt(self) -> None:
        self.stopping.set()
        _stop(self.bench)
        _stop(self.engine)

    def alive(self) -> bool:
        return any(p is not None and p.poll() is None for p in (self.engine, self.bench))

    def json(self) -> dict:
        return {
            "metadata": {"name": self.name, "labels": {"job-name": self.job["metadata"]["name"]}},
            "status": {
                "phase": self.phase,
                "initContainerStatuses": [self.engine_status],
                "containerStatuses": [self.bench_status],
            },
        }


class FakeKube:
    """BatchV1Api and CoreV1Api in one object; `batch` and `core` of the sweep's Kube are both this."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.jobs: dict[str, dict] = {}
        self.pods: dict[str, Pod] = {}
        self.created: list[str] = []
        self.lock = threading.Lock()
        self.on_list = None  # a hook called on each pod listing (a test's Ctrl-C)

    # the kubelet's side
    def admit(self, pod: Pod) -> bool:
        with self.lock:
            used = sum(p.gpus for p in self.pods.values() if p.phase == "Running")
            if used + pod.gpus > NODE_GPUS:
                return False
            pod.phase = "Running"
            return True

    def finished(self, pod: Pod, *, succeeded: bool) -> None:
        job = self.jobs.get(pod.job["metadata"]["name"])
        if job is not None:
            kind = "Complete" if succeeded else "Failed"
            job["status"] = {"conditions": [{"type": kind, "status": "True", "reason": kind}]}

    def running(self) -> list[Pod]:
        return [p for p in self.pods.values() if p.alive()]

    # BatchV1Api
    def create_namespaced_job(self, namespace: str, body: dict) -> dict:
        name = body["metadata"]["name"]
        if name in self.jobs:
            raise ApiException(status=409, reason="AlreadyExists")
        self.jobs[name] = {**body, "status": {}}
        self.created.append(name)
        pod = self.pods[name] = Pod(self, body, self.folder)
        pod.start()
        return self.jobs[name]

    def read_namespaced_job_status(self, name: str, namespace: str) -> dict:
        if name not in self.jobs:
            raise ApiException(status=404, reason="NotFound")
        return self.jobs[name]

    def delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str | None = None) -> dict:
        """Foreground deletion as the API server does it: the Job is marked, its pod stopped, then the Job goes."""
        if name not in self.jobs:
            raise ApiException(status=404, reason="NotFound")
        assert propagation_policy == "Foreground"  # else the pods would outlive the Job
        job = self.jobs[name]
        if not job["metadata"].get("deletionTimestamp"):
            job["metadata"] = {**job["metadata"], "deletionTimestamp": _now()}
            threading.Thread(target=self._finish_deletion, args=(name,), daemon=True).start()
        return {}

    def _finish_deletion(self, name: str) -> None:
        pod = self.pods[name]
        pod.halt()
        pod.join(timeout=30)
        pod.halt()  # a container it started while being halted
        time.sleep(0.3)  # the garbage collector's round trip
        with self.lock:
            self.pods.pop(name, None)
            self.jobs.pop(name, None)

    # CoreV1Api
    def list_namespaced_pod(self, namespace: str, label_selector: str) -> dict:
        if self.on_list is not None:
            self.on_list(self)
        job = label_selector.removeprefix("job-name=")
        pod = self.pods.get(job)
        return {"items": [pod.json()] if pod is not None and pod.phase != "Pending" else []}

    def read_namespaced_pod_log(self, name: str, namespace: str, container: str, previous: bool = False) -> str:
        pod = next((p for p in self.pods.values() if p.name == name), None)
        if pod is None:
            raise ApiException(status=404, reason="NotFound")
        run = 1 if container == "bench" else pod.previous_run if previous else pod.runs
        path = pod.log_path(container, run)
        if run < 1 or not path.exists():
            raise ApiException(status=400, reason="BadRequest")
        return path.read_text()
