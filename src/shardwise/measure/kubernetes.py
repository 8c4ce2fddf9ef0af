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
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from shardwise import jsontext
from shardwise.errors import SpecError
from shardwise.measure.sweep import (
    SweepPlan,
    diagnose,
    healthy,
    measure_levels,
    measured,
    open_results,
    prediction,
    terminate_as_interrupt,
)

RECORD_MARK = "shardwise-record: "  # the benchmark container's one line of result
CANCEL_WAIT_S = 120.0  # how long to wait for the API server to let go of deleted Jobs
# How long a Job may run in all, beyond the engine's start: then Kubernetes stops it and frees its GPUs even if the
# sweep that made it is gone. A choice: three levels of 100 requests of 1k tokens at one client at 25 tok/s (the
# user's slowest measured setup) take about an hour each.
BENCH_ALLOWANCE_S = 6 * 3600.0
PROBE_PERIOD_S = 10  # the engine's startup probe: one look at /health each period, the timeout in looks
# A container that waits for one of these never starts: a failure to record, not a queue to wait in
# (ErrImagePull and CreateContainerError come first and may pass on a retry; the back-off after a failed pull
# does not, and a missing secret or config map waits on a person)
NEVER_STARTS = ("ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError")
_RAISE = object()
API_TRIES, API_RETRY_S = 4, 2.0  # a transient API failure is asked again this many times, this far apart


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


@cache
def _client() -> Any:
    from kubernetes.client import ApiClient

    return ApiClient()


def _plain(obj: Any) -> Any:
    """An API object as the JSON the API server sent (camelCase keys, times as ISO text)."""
    return _client().sanitize_for_serialization(obj)


def _call(doing: str, method: Callable[..., Any], *args: Any, missing: Any = _RAISE, **kwargs: Any) -> Any:
    """One API call; a refusal or an unreachable server is one line (SpecError), a 404 is `missing` where given. A
    busy or briefly unreachable server (429, 5xx, a dropped connection) is asked again a few times first: a sweep
    follows its Jobs for hours."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    attempt = 0
    while True:
        attempt += 1
        try:
            return method(*args, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and missing is not _RAISE:
                return missing
            if attempt < API_TRIES and (exc.status == 429 or (exc.status or 0) >= 500):
                time.sleep(API_RETRY_S)
                continue
            try:
                said = json.loads(exc.body or "{}").get("message")
            except (ValueError, AttributeError):
                said = None
            raise SpecError(f"the Kubernetes API refused to {doing}: {exc.status} {said or exc.reason}") from None
        except HTTPError as exc:
            if attempt < API_TRIES:
                time.sleep(API_RETRY_S)
                continue
            raise SpecError(f"cannot reach the Kubernetes API to {doing}: {exc}") from None


def job_name(plan: SweepPlan, index: int, command: str) -> str:
    """The Job of setup `index`: the same for the same sweep folder and command, so a rerun finds it."""
    digest = hashlib.sha1(f"{plan.folder.resolve()}\n{command}".encode()).hexdigest()[:10]
    return f"shardwise-sweep-{digest}-{index}"


def _job(kube: Kube, name: str) -> dict | None:
    found = _call(f"read Job {name}", kube.batch.read_namespaced_job_status, name, kube.namespace, missing=None)
    return None if found is None else _plain(found)


def _pod(kube: Kube, job: str) -> dict | None:
    """The Job's pod (the newest, should there be more than one)."""
    found = _call(
        f"list the pods of Job {job}", kube.core.list_namespaced_pod, kube.namespace, label_selector=f"job-name={job}"
    )
    pods = sorted(_plain(found)["items"], key=lambda p: p["metadata"].get("creationTimestamp") or "")
    return pods[-1] if pods else None


def _log(kube: Kube, pod: dict, container: str, *, previous: bool = False) -> str:
    """A container's log, or '' where the API server has none (the container never ran)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return kube.core.read_namespaced_pod_log(
            pod["metadata"]["name"], kube.namespace, container=container, previous=previous
        )
    except (ApiException, HTTPError):
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


def _failed(detail: str, reason: str = "crashed") -> dict[str, Any]:
    return {"status": "failed", "reason": reason, "detail": detail[:300]}


def _before(earlier: str | None, later: str | None) -> bool:
    """Strictly before: the API's times are whole seconds, and the same second may be either order."""
    try:
        return datetime.fromisoformat(earlier or "") < datetime.fromisoformat(later or "")
    except ValueError:
        return False


def _probe_gave_up(stopped: dict, startup_s: float) -> bool:
    """Whether the engine ran until its startup probe gave up: the kubelet stops it after the last failed look,
    which comes within the final period (its looks are not aligned with the start; times are whole seconds)."""
    ran_s = _seconds(stopped)
    looks = max(1, math.ceil(startup_s / PROBE_PERIOD_S))
    return ran_s is not None and ran_s >= (looks - 1) * PROBE_PERIOD_S - 1


def outcome(kube: Kube, job: str, *, startup_s: float) -> tuple[dict[str, Any], str] | None:
    """(what the Job found, its engine's log) once it has an answer; None while its pod waits for a node, the engine
    starts or the benchmark runs."""
    state = _job(kube, job)
    if state is None or state["metadata"].get("deletionTimestamp"):
        return _failed(f"Job {job} was deleted outside the sweep"), ""
    pod = _pod(kube, job)
    failed = next(
        (c for c in state.get("status", {}).get("conditions") or [] if c["type"] == "Failed" and c["status"] == "True"),
        None,
    )
    if pod is None:
        return None if failed is None else (_failed(failed.get("message") or failed["reason"]), "")
    engine, bench = _status(pod, "initContainerStatuses", "engine"), _status(pod, "containerStatuses", "bench")
    for name, status in (("engine", engine), ("benchmark", bench)):
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in NEVER_STARTS:
            return _failed(f"the {name} container cannot start: {waiting['reason']}: {waiting.get('message', '')}"), ""
    restarted = engine.get("restartCount", 0) > 0
    bench_state = bench.get("state") or {}
    ended = bench_state.get("terminated")
    began = (bench_state.get("running") or ended or {}).get("startedAt")
    # the engine's run that ended on its own: the kubelet stops it once the benchmark has ended, which is no crash
    stopped = (engine.get("lastState") or {}).get("terminated") if restarted else None
    if stopped is not None and began and _before(stopped.get("finishedAt"), began):
        stopped = None  # it restarted while it started, then served the whole benchmark (a Job followed late)
    if stopped is None and not ended:
        stopped = (engine.get("state") or {}).get("terminated")
    if stopped:  # the kubelet restarts it for ever: what it said when it ended is the finding
        engine_log = _log(kube, pod, "engine", previous=restarted)
        reason, detail = diagnose(engine_log, stopped.get("exitCode"))
        if stopped.get("reason") == "OOMKilled":
            reason, detail = "crashed", "the engine's container passed its memory limit (OOMKilled)"
        elif began:  # a measurement across a restart is no measurement
            reason = "crashed_during_bench"
        elif reason not in ("oom", "no_kv_room") and _probe_gave_up(stopped, startup_s):
            # the kubelet stopped it after its startup probe's last look; what it logged as it was stopped (an
            # engine may raise on SIGTERM) says nothing more
            reason, detail = "startup_timeout", f"no /health within {startup_s:g} s"
        return _failed(detail, reason), engine_log
    if ended:
        log = _log(kube, pod, "bench")
        engine_log = _log(kube, pod, "engine")
        line = next((ln for ln in reversed(log.splitlines()) if ln.startswith(RECORD_MARK)), None)
        try:
            found = json.loads(line.removeprefix(RECORD_MARK)) if line is not None else None
        except ValueError:
            found = None
        if isinstance(found, dict) and found.get("status") in ("measured", "failed"):
            if found["status"] == "failed":  # the engine stopped answering during the benchmark
                found["detail"] = diagnose(engine_log, None)[1]
            return found, engine_log
        tail = (log.strip().splitlines() or [f"exit status {ended.get('exitCode')}"])[-1]
        return _failed(f"the benchmark ended without a record ({ended.get('reason')}): {tail}"), engine_log
    if failed is not None:  # stopped by Kubernetes: the pod's deadline, an eviction
        return _failed(failed.get("message") or failed["reason"]), _log(kube, pod, "engine")
    return None


def delete(kube: Kube, jobs: list[str]) -> list[str]:
    """Delete `jobs` with their pods (foreground: the Job goes once its pods have) and wait until the API server no
    longer has them; those still there after CANCEL_WAIT_S, or that could not be asked."""
    asked = []
    for name in jobs:
        try:
            _call(
                f"delete Job {name}",
                kube.batch.delete_namespaced_job,
                name,
                kube.namespace,
                propagation_policy="Foreground",
                missing=None,
            )
            asked.append(name)
        except SpecError:
            continue
    deadline = time.monotonic() + CANCEL_WAIT_S
    left = list(asked)
    while left:
        try:
            left = [name for name in left if _job(kube, name) is not None]
        except SpecError:
            break
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return [name for name in jobs if name not in asked] + left


def sweep_kubernetes(
    plan: SweepPlan,
    kube: Kube,
    job_of: Callable[[int, str, str], dict],
    *,
    poll_s: float = 5.0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every command of the plan that has no record yet as a Kubernetes Job (`job_of(index, command, name)`
    writes its manifest; every manifest is written before any Job is made); return all records, old and new, in
    plan order."""
    results, done = open_results(plan)

    def keep(record: dict[str, Any]) -> None:
        jsontext.append_line(results, record)
        done[record["command"]] = record

    todo: list[tuple[int, str, dict[str, Any], dict]] = []
    for index, command in enumerate(plan.commands):
        if command in done:
            continue
        layout, predicted, refusal = prediction(plan, command)
        record = {"command": command, "layout": layout, "predicted_output_tok_s": predicted}
        if refusal and not plan.force:
            keep({**record, "status": "skipped", "reason": refusal})
            continue
        name = job_name(plan, index, command)
        todo.append((index, name, record, job_of(index, command, name)))
    active: dict[int, tuple[str, dict[str, Any]]] = {}
    with terminate_as_interrupt():
        try:
            made: list[str] = []
            try:
                for index, name, record, manifest in todo:
                    existing = _job(kube, name)
                    if existing is not None and existing["metadata"].get("deletionTimestamp"):
                        _gone(kube, [name])  # an earlier sweep's, still being deleted: make it afresh
                        existing = None
                    if existing is None:
                        if progress:
                            progress(record["command"])
                        made.append(name)  # before the call: an interrupted create may still have made it
                        _call(f"create Job {name}", kube.batch.create_namespaced_job, kube.namespace, manifest)
                    active[index] = (name, record)
            except (SpecError, KeyboardInterrupt):
                delete(kube, made)  # none of this run's Jobs is left behind unfollowed (a 404 is no matter)
                raise
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
            _gone(kube, [name for name, _ in active.values()])
            raise
    return [done[c] for c in plan.commands if c in done]


def _gone(kube: Kube, jobs: list[str]) -> None:
    """Delete `jobs` and wait for them; one line naming those the API server still holds."""
    left = delete(kube, jobs)
    if left:
        raise SpecError(
            f"{len(left)} Job(s) still being deleted after {CANCEL_WAIT_S:g} s ({', '.join(left)}): "
            f"kubectl get jobs -n {kube.namespace} shows them; run the sweep again once they are gone"
        )


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
        alive=lambda: healthy(args.url, timeout_s=10.0),
    )
    found = measured(levels) if alive else {"status": "failed", "reason": "crashed_during_bench", "levels": levels}
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
