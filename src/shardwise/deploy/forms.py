"""Deployment files for one setup, in the form a team runs it: a Compose file per node (`docker`), a Deployment
or, across nodes, a LeaderWorkerSet with its Service (`kubernetes`), or an sbatch script (`slurm`). Each file
starts with a header naming the setup and the prediction it came from; each form says in its own terms where
node 0's address and each node's rank come from."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable

import yaml

from shardwise.deploy.service import Service
from shardwise.engines.flags import command_text

CACHE_IN_CONTAINER = "/root/.cache/huggingface"  # where the images' Hugging Face client keeps downloads
SHM_GIB = 64  # shared memory for the engine's worker processes: NCCL and the data loaders' buffers; a choice
STARTUP_S = 3600  # how long a start may take before the platform gives up: a 1 TB checkpoint's download and load
# Kubernetes: the labels LeaderWorkerSet puts on its pods and the variables it gives each container
# (LWS_LEADER_ADDRESS, LWS_WORKER_INDEX), kubernetes-sigs/lws v0.10.0 api/leaderworkerset/v1/leaderworkerset_types.go
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


def header(service: Service, comment: str = "#") -> list[str]:
    lines = [
        f"shardwise deploy: {service.title}",
        f"{service.engine} {service.version} on {service.nodes} node{'s' if service.nodes > 1 else ''}, "
        f"{service.gpus_per_node} {service.gpu} GPUs each; image {service.image}"
        + (f" ({service.image_note})" if service.image_note else ""),
        service.prediction,
    ]
    if service.nodes > 1:
        lines.append(
            "across nodes NCCL needs the nodes' RDMA network inside the container (/dev/infiniband, or your "
            "cluster's RDMA device resource); without it it falls back to TCP, far slower than predicted"
        )
    return [f"{comment} {line}" for line in lines]


class _Dumper(yaml.SafeDumper):
    """Writes a value that appears twice (a pod's labels, a probe's target) in full each time: no YAML anchors."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _yaml(documents: list[dict], service: Service, notes: list[str]) -> str:
    body = yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, width=120, default_flow_style=False)
    return "\n".join([*header(service), *(f"# {n}" for n in notes), body])


def docker(service: Service) -> dict[str, str]:
    """One Compose file per node. Across nodes every container shares its host's network (NCCL connects node to
    node) and Compose fills node 0's address from HEAD_IP when the file is brought up."""
    files = {}
    for node in range(service.nodes):
        multi = service.nodes > 1
        engine: dict = {
            "image": service.image,
            "entrypoint": service.argv(node),
            # Compose fills ${...} in values: a $ the command's environment holds is written $$
            "environment": {"HF_TOKEN": "${HF_TOKEN:-}", **{k: v.replace("$", "$$") for k, v in service.env.items()}},
            "ipc": "host",
            "ulimits": {"memlock": -1, "stack": 67108864},
            "volumes": [f"${{HF_HOME:-~/.cache/huggingface}}:{CACHE_IN_CONTAINER}"],
            "restart": "unless-stopped",
        }
        if service.vendor == "nvidia":
            engine["deploy"] = {
                "resources": {
                    "reservations": {
                        "devices": [{"driver": "nvidia", "count": service.gpus_per_node, "capabilities": ["gpu"]}]
                    }
                }
            }
        else:  # ROCm: the kernel driver's devices, as AMD's container guide passes them
            engine["devices"] = ["/dev/kfd", "/dev/dri"]
            engine["group_add"] = ["video"]
            engine["security_opt"] = ["seccomp=unconfined"]
        if multi:
            engine["network_mode"] = "host"
            engine["cap_add"] = ["IPC_LOCK"]  # NCCL pins memory for RDMA
        else:
            engine["ports"] = [f"{service.port}:{service.port}"]
        if node == 0:  # the other nodes of SGLang and vLLM serve no HTTP
            engine["healthcheck"] = {
                "test": ["CMD", "curl", "-fsS", f"http://localhost:{service.port}{service.health_path}"],
                "interval": "30s",
                "timeout": "5s",
                "retries": 3,
                "start_period": f"{STARTUP_S}s",
            }
        name = f"compose.node{node}.yaml" if multi else "compose.yaml"
        up = f"docker compose -f {name} up -d"
        notes = [f"node {node} of {service.nodes}: HEAD_IP=<node 0's address> {up}" if multi else up]
        files[name] = _yaml([{"name": service.name, "services": {"engine": engine}}], service, notes)
    return files


def _container(service: Service, argv: list[str]) -> dict:
    gpu_resource = "nvidia.com/gpu" if service.vendor == "nvidia" else "amd.com/gpu"
    env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}}}]
    env += [{"name": k, "value": v} for k, v in service.env.items()]
    rdma = {"securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}} if service.nodes > 1 else {}
    return {
        **rdma,
        "name": "engine",
        "image": service.image,
        "command": argv,
        "env": env,
        "ports": [{"name": "http", "containerPort": service.port}],
        "resources": {"limits": {gpu_resource: service.gpus_per_node}},
        "volumeMounts": [
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "model-cache", "mountPath": CACHE_IN_CONTAINER},
        ],
    }


def _health_probe(service: Service) -> dict:
    # a health check may wait behind a busy step: 10 s, not the 1 s default
    return {"httpGet": {"path": service.health_path, "port": "http"}, "timeoutSeconds": 10}


def _probes(container: dict, service: Service) -> dict:
    probe = _health_probe(service)
    return {
        **container,
        "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": STARTUP_S // 10},
        "readinessProbe": {**probe, "periodSeconds": 10},
        "livenessProbe": {**probe, "periodSeconds": 30, "failureThreshold": 3},
    }


def _pod(service: Service, container: dict) -> dict:
    return {
        "containers": [container],
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GIB}Gi"}},
            {"name": "model-cache", "persistentVolumeClaim": {"claimName": f"{service.name}-model-cache"}},
        ],
    }


def kubernetes(service: Service) -> dict[str, str]:
    """One manifest: the model cache's claim, the engine (a Deployment on one node; a LeaderWorkerSet of one group
    of `nodes` pods across nodes, the leader node 0) and a Service in front of node 0. The HF token comes from the
    secret `hf-token` (key `token`), never a literal."""
    labels = {"app.kubernetes.io/name": service.name, "app.kubernetes.io/managed-by": "shardwise"}
    multi = service.nodes > 1
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{service.name}-model-cache", "labels": labels},
        "spec": {
            # every node's pod mounts the cache at once across nodes
            "accessModes": ["ReadWriteMany" if multi else "ReadWriteOnce"],
            "resources": {"requests": {"storage": f"{service.cache_gib}Gi"}},
        },
    }
    if not multi:
        pod = _pod(service, _probes(_container(service, service.argv(0)), service))
        engine = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": service.name, "labels": labels},
            "spec": {
                "replicas": 1,
                # the new pod needs the GPUs and the cache the old one holds: stop it first
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": {"app.kubernetes.io/name": service.name}},
                "template": {"metadata": {"labels": labels}, "spec": pod},
            },
        }
        selector = {"app.kubernetes.io/name": service.name}
    else:
        # Kubernetes expands $(VAR) in a container's command from its environment
        leader = service.argv(0, head="$(LWS_LEADER_ADDRESS)", port=True)
        worker = service.argv(1, head="$(LWS_LEADER_ADDRESS)", rank="$(LWS_WORKER_INDEX)", port=True)
        engine = {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {"name": service.name, "labels": labels},
            "spec": {
                "replicas": 1,
                "leaderWorkerTemplate": {
                    "size": service.nodes,
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": {
                        "metadata": {"labels": labels},
                        "spec": _pod(service, _probes(_container(service, leader), service)),
                    },
                    "workerTemplate": {
                        "metadata": {"labels": labels},
                        "spec": _pod(service, _container(service, worker)),
                    },
                },
            },
        }
        selector = {LWS_NAME_LABEL: service.name, LWS_INDEX_LABEL: "0"}
    front = {
        "apiVersion": "v1",
        "kind": "Service",
        # not the set's own name: LeaderWorkerSet makes a headless Service of that name, which its pods' addresses
        # (LWS_LEADER_ADDRESS) resolve through
        "metadata": {"name": f"{service.name}-api", "labels": labels},
        "spec": {"selector": selector, "ports": [{"name": "http", "port": service.port, "targetPort": "http"}]},
    }
    notes = [
        "kubectl create secret generic hf-token --from-literal=token=<your token>   (gated models only)",
        f"kubectl apply -f {service.name}.yaml",
    ]
    if multi:
        notes.insert(0, "needs the LeaderWorkerSet controller (kubernetes-sigs/lws) and a ReadWriteMany storage class")
    return {f"{service.name}.yaml": _yaml([claim, engine, front], service, notes)}


def sweep_job(
    service: Service,
    *,
    name: str,
    engine_argv: list[str],
    bench_image: str,
    bench_argv: list[str],
    cache_claim: str,
    startup_s: float,
    probe_period_s: int,
    deadline_s: float,
    labels: dict[str, str],
) -> dict:
    """One setup of a sweep as a Kubernetes Job: the engine a sidecar (an init container that restarts, Kubernetes
    1.29 and later), the benchmark the Job's one container, started once the engine's startup probe passes and
    reaching it on the pod's loopback; when the benchmark ends the kubelet stops the engine and the Job is done.
    Nothing is retried: a failed start or benchmark is a finding, recorded, not a pod to run again; a Job still
    running `deadline_s` after its node took it (its sweep gone) is stopped by Kubernetes and gives its GPUs back;
    the time a pod waits for a node does not count."""
    engine = {**_container(service, engine_argv), "restartPolicy": "Always"}
    engine["startupProbe"] = {
        **_health_probe(service),
        "periodSeconds": probe_period_s,
        "failureThreshold": max(1, math.ceil(startup_s / probe_period_s)),
    }
    bench = {"name": "bench", "image": bench_image, "command": bench_argv}
    pod = _pod(service, engine)
    for volume in pod["volumes"]:
        if "persistentVolumeClaim" in volume:
            volume["persistentVolumeClaim"]["claimName"] = cache_claim
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    **pod,
                    "restartPolicy": "Never",
                    "activeDeadlineSeconds": math.ceil(deadline_s),
                    "initContainers": [engine],
                    "containers": [bench],
                },
            },
        },
    }


def slurm(service: Service) -> dict[str, str]:
    """An sbatch script: one engine process per node through srun (node 0's address read from the job's node list
    at run time, each node's command chosen by its SLURM_NODEID), then a wait on node 0's health before it says
    ready. It runs the engine installed on the nodes; with a container plugin (pyxis) add
    --container-image=<image> to the srun line."""
    cases = "\n".join(f"  {node}) exec {command_text(service.argv(node))} ;;" for node in range(service.nodes))
    body = f'case "$SLURM_NODEID" in\n{cases}\nesac'
    exports = [f"export {k}={shlex.quote(v)}" for k, v in service.env.items()]
    lines = [
        "#!/bin/bash",
        *header(service),
        f"#SBATCH --job-name={service.name}",
        f"#SBATCH --nodes={service.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={service.gpus_per_node}",
        "#SBATCH --exclusive",
        "#SBATCH --output=%x-%j.log",
        "set -euo pipefail",
        "",
        # sed reads the whole list: head would close the pipe early and, under pipefail, kill the script (SIGPIPE)
        'HEAD_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        "HEAD_PORT=${HEAD_PORT:-50000}",
        "export HEAD_IP HEAD_PORT",
        'export HF_TOKEN="${HF_TOKEN:-}"',
        *exports,
        "",
        "# each node runs its own command; the shell srun starts expands HEAD_IP and HEAD_PORT there",
        "# shellcheck disable=SC2016",
        f"srun --nodes={service.nodes} --ntasks={service.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
        f"  bash -c {shlex.quote(body)} &",
        "SERVER=$!",
        "",
        f"DEADLINE=$((SECONDS + {STARTUP_S}))",
        f'until curl -fsS "http://$HEAD_IP:{service.port}{service.health_path}" >/dev/null 2>&1; do',
        '  if ! kill -0 "$SERVER" 2>/dev/null; then',
        '    echo "the engine stopped before it was ready: see the log above" >&2',
        "    exit 1",
        "  fi",
        '  if [ "$SECONDS" -ge "$DEADLINE" ]; then',
        f'    echo "node 0 did not answer {service.health_path} within {STARTUP_S} s: stopping" >&2',
        '    kill "$SERVER"',
        "    exit 1",
        "  fi",
        "  sleep 10",
        "done",
        f'echo "ready: http://$HEAD_IP:{service.port}"',
        'wait "$SERVER"',
        "",
    ]
    return {f"{service.name}.sbatch": "\n".join(lines)}


FORMS: dict[str, Callable[[Service], dict[str, str]]] = {"docker": docker, "kubernetes": kubernetes, "slurm": slurm}
