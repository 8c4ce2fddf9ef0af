"""The sweep through a Kubernetes cluster: each setup one Job, whose pod runs the engine as a sidecar and the
benchmark as its container (the manifest is the deploy layer's `sweep_job`); this side checks each setup, creates
the Jobs through the official Python client, follows their pods, and collects each outcome into the same results
file as the local sweep. The benchmark prints its record as one line of its log; a pod whose engine stops before
it is healthy is recorded as failed with the reason read from the engine's log (kept beside the results, since the
Job is deleted once collected). Jobs are named from the sweep's folder and the setup, so a sweep run again skips
every setup with a record and follows a Job it created before rather than creating it twice; interrupted (Ctrl-C,
SIGTERM), it deletes its Jobs and their pods and waits until the API server no longer has them.

API used: batch/v1 Jobs (create, read, delete with foreground propagation), v1 Pods (list by the `job-name`
label the Job controller sets, read a container's log, its previous run's where it restarted)."""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from shardwise import jsontext
from shardwise.errors import SpecError
from shardwise.measure.sweep import (
    SweepPlan,
    diagnose,
    load_records,
    measure_levels,
    prediction,
    terminate_as_interrupt,
)

RECORD_MARK = "shardwise-record: "  # the benchmark container's one line of result
CANCEL_WAIT_S = 120.0  # how long to wait for the API server to let go of deleted Jobs
# How long a Job may run in all, beyond the engine's start: then Kubernetes stops it and frees its GPUs even if the
# sweep that made it is gone. A choice: three levels of 100 requests of 1k tokens at one client at 25 tok/s (the
# user's slowest measured setup) take about an hour each.
BENCH_ALLOWANCE_S = 6 * 3600.0


@dataclass(frozen=True)
class Kube:
    """The API groups the sweep uses and the namespace its Jobs live in."""

    batch: Any  # kubernetes.client.BatchV1Api
    core: Any  # kubernetes.client.CoreV1Api
    namespace: str


def connect(context: str | None, namespace: str) -> Kube:
    """The cluster of the kubeconfig's context (the current one by default), or the one this runs inside."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise SpecError(
            "--scheduler kubernetes needs the Kubernetes Python client: pip install 'shardwise[kubernetes]'"
        ) from None
    try:
        config.load_kube_config(context=context)
    except (config.ConfigException, OSError) as exc:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            raise SpecError(
                f"no Kubernetes cluster to reach: {exc}; give a kubeconfig (KUBECONFIG) or --kube-context"
            ) from None
    return Kube(client.BatchV1Api(), client.CoreV1Api(), namespace)


def _plain(obj: Any) -> Any:
    """An API object as the JSON the API server sent (camelCase keys, times as ISO text)."""
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def _missing(exc: Exception) -> bool:
    return getattr(exc, "status", None) == 404


def _api_error(exc: Exception, doing: str) -> SpecError:
    reason = getattr(exc, "reason", None) or exc
    return SpecError(f"the Kubernetes API refused to {doing}: {getattr(exc, 'status', '')} {reason}".strip())


def job_name(plan: SweepPlan, index: int, command: str) -> str:
    """The Job of setup `index`: the same for the same sweep folder and command, so a rerun finds it."""
    digest = hashlib.sha1(f"{plan.folder.resolve()}\n{command}".encode()).hexdigest()[:10]
    return f"shardwise-sweep-{digest}-{index}"


def _job(kube: Kube, name: str) -> dict | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return _plain(kube.batch.read_namespaced_job_status(name, kube.namespace))
    except ApiException as exc:
        if _missing(exc):
            return None
        raise _api_error(exc, f"read Job {name}") from None


def _pod(kube: Kube, job: str) -> dict | None:
    pods = _plain(kube.core.list_namespaced_pod(kube.namespace, label_selector=f"job-name={job}"))["items"]
    return pods[-1] if pods else None


def _log(kube: Kube, pod: dict, container: str, *, previous: bool = False) -> str:
    """A container's log, or '' where the API server has none (the container never ran)."""
    from kubernetes.client.exceptions import ApiException

    try:
        return kube.core.read_namespaced_pod_log(
            pod["metadata"]["name"], kube.namespace, container=container, previous=previous
        )
    except ApiException:
        return ""


def _status(pod: dict, group: str, container: str) -> dict:
    return next((s for s in pod.get("status", {}).get(group) or [] if s["name"] == container), {})


def _seconds(terminated: dict) -> float | None:
    try:
        start = datetime.fromisoformat(terminated["startedAt"])
        end = datetime.fromisoformat(terminated["finishedAt"])
    except (KeyError, TypeError, ValueError):
        return None
    return (end - start).total_seconds()


def outcome(kube: Kube, job: str, *, startup_s: float) -> tuple[dict[str, Any], str] | None:
    """(what the Job found, its engine's log) once it has an answer; None while the engine starts or the
    benchmark runs."""
    pod = _pod(kube, job)
    state = _job(kube, job) or {}
    failed = next(
        (c for c in state.get("status", {}).get("conditions") or [] if c["type"] == "Failed" and c["status"] == "True"),
        None,
    )
    if pod is None:
        if failed is None:
            return None  # not scheduled yet: the cluster's queue
        return {"status": "failed", "reason": "crashed", "detail": failed.get("message") or failed["reason"]}, ""
    engine, bench = _status(pod, "initContainerStatuses", "engine"), _status(pod, "containerStatuses", "bench")
    restarted = engine.get("restartCount", 0) > 0
    ended = (bench.get("state") or {}).get("terminated")
    if ended:
        log = _log(kube, pod, "bench")
        line = next((ln for ln in reversed(log.splitlines()) if ln.startswith(RECORD_MARK)), None)
        engine_log = _log(kube, pod, "engine", previous=restarted)
        if line is not None:
            found = json.loads(line.removeprefix(RECORD_MARK))
            if found["status"] == "failed":  # the engine stopped answering during the benchmark
                found["detail"] = diagnose(engine_log, None)[1]
            return found, engine_log
        tail = (log.strip().splitlines() or [f"exit status {ended.get('exitCode')}"])[-1]
        detail = f"the benchmark ended without a record ({ended.get('reason')}): {tail}"
        return {"status": "failed", "reason": "crashed", "detail": detail[:300]}, engine_log
    stopped = (engine.get("lastState") or {}).get("terminated") or (engine.get("state") or {}).get("terminated")
    if stopped:  # the engine ended before it was healthy: the kubelet would restart it for ever
        engine_log = _log(kube, pod, "engine", previous=restarted)
        reason, detail = diagnose(engine_log, stopped.get("exitCode"))
        ran_s = _seconds(stopped)
        if reason == "crashed" and ran_s is not None and ran_s >= startup_s:  # its startup probe gave up on it
            reason, detail = "startup_timeout", f"no /health within {startup_s:g} s"
        return {"status": "failed", "reason": reason, "detail": detail}, engine_log
    if failed is not None:  # stopped by Kubernetes: the Job's deadline, an evicted pod
        return {
            "status": "failed",
            "reason": "crashed",
            "detail": failed.get("message") or failed["reason"],
        }, _log(kube, pod, "engine")
    return None


def delete(kube: Kube, jobs: list[str]) -> None:
    """Delete `jobs` with their pods and wait until the API server no longer has any of them."""
    from kubernetes.client.exceptions import ApiException

    for name in jobs:
        try:
            kube.batch.delete_namespaced_job(name, kube.namespace, propagation_policy="Foreground")
        except ApiException as exc:
            if not _missing(exc):
                raise _api_error(exc, f"delete Job {name}") from None
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline and any(_job(kube, name) is not None for name in jobs):
        time.sleep(0.5)


def sweep_kubernetes(
    plan: SweepPlan,
    kube: Kube,
    job_of: Callable[[int, str, str], dict],
    *,
    poll_s: float = 5.0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every command of the plan that has no record yet as a Kubernetes Job (`job_of(index, command, name)`
    writes its manifest); return all records, old and new, in plan order."""
    from kubernetes.client.exceptions import ApiException

    try:
        plan.folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"cannot use {plan.folder} for the sweep: {exc.strerror or exc}") from exc
    results = plan.folder / "results.jsonl"
    done = load_records(results)
    active: dict[int, tuple[str, dict[str, Any]]] = {}

    def keep(record: dict[str, Any]) -> None:
        jsontext.append_line(results, record)
        done[record["command"]] = record

    with terminate_as_interrupt():
        try:
            for index, command in enumerate(plan.commands):
                if command in done:
                    continue
                layout, predicted, refusal = prediction(plan, command)
                record = {"command": command, "layout": layout, "predicted_output_tok_s": predicted}
                if refusal and not plan.force:
                    keep({**record, "status": "skipped", "reason": refusal})
                    continue
                name = job_name(plan, index, command)
                if _job(kube, name) is None:
                    if progress:
                        progress(command)
                    try:
                        kube.batch.create_namespaced_job(kube.namespace, job_of(index, command, name))
                    except ApiException as exc:
                        raise _api_error(exc, f"create Job {name}") from None
                active[index] = (name, record)
            while active:
                for index, (name, record) in list(active.items()):
                    found = outcome(kube, name, startup_s=plan.health_timeout_s)
                    if found is None:
                        continue
                    result, engine_log = found
                    log = plan.folder / f"engine-{index}.log"
                    log.write_text(engine_log, encoding="utf-8")
                    keep({**record, **result, "log": str(log), "job": name})
                    delete(kube, [name])
                    del active[index]
                if active:
                    time.sleep(poll_s)
        except KeyboardInterrupt:
            delete(kube, [name for name, _ in active.values()])
            raise
    return [done[c] for c in plan.commands if c in done]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=10.0).status_code == 200
    except httpx.HTTPError:
        return False


def bench_main(argv: list[str] | None = None) -> None:
    """What a Job's benchmark container runs once its engine is healthy: every level, then one record line."""
    parser = argparse.ArgumentParser(prog="python -m shardwise.measure.kubernetes")
    parser.add_argument("--url", required=True)
    parser.add_argument("--concurrency", required=True, help="levels, comma-separated")
    parser.add_argument("--isl", type=int, required=True)
    parser.add_argument("--osl", type=int, required=True)
    parser.add_argument("--num-prompts", type=int, required=True)
    args = parser.parse_args(argv)
    levels, alive = measure_levels(
        args.url,
        concurrency=tuple(int(c) for c in args.concurrency.split(",")),
        isl=args.isl,
        osl=args.osl,
        num_prompts=args.num_prompts,
        alive=lambda: _healthy(args.url),
    )
    if alive:
        found = {
            "status": "measured",
            "levels": levels,
            "measured_output_tok_s": max(lv["output_throughput"] for lv in levels),
        }
    else:
        found = {"status": "failed", "reason": "crashed_during_bench", "levels": levels}
    print(RECORD_MARK + json.dumps(found), flush=True)


def bench_argv(plan: SweepPlan, port: int) -> list[str]:
    """The benchmark container's command for the engine serving on `port` in the same pod."""
    return [
        "python3",
        "-m",
        "shardwise.measure.kubernetes",
        "--url",
        f"http://127.0.0.1:{port}",
        "--concurrency",
        ",".join(str(c) for c in plan.concurrency),
        "--isl",
        str(plan.isl),
        "--osl",
        str(plan.osl),
        "--num-prompts",
        str(plan.num_prompts),
    ]


if __name__ == "__main__":
    bench_main()
