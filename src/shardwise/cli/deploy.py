"""The command that writes deployment files for a setup: a launch command given after --, or theorise's pick."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shardwise.cli.app import (
    CommandModel,
    FrameworkOption,
    GpusOption,
    IslOption,
    OslOption,
    ProfileOption,
    VersionOption,
    app,
    with_profile,
)
from shardwise.cost.memory import memory_ledger
from shardwise.decide.theory import theorise as run_theorise
from shardwise.deploy.forms import FORMS, sweep_job
from shardwise.deploy.service import (
    Service,
    flag_value,
    head_address_flag,
    refuse_tokens,
    split_env,
    with_flag_value,
)
from shardwise.engines.base import Setup, get_engine
from shardwise.engines.check import check_command
from shardwise.engines.flags import HEAD_IP, split_command
from shardwise.errors import SpecError
from shardwise.report import files as report_files
from shardwise.report import setups as report_setups
from shardwise.serve.steady import predict
from shardwise.spec.catalog import DEFAULT_MODEL, load_model
from shardwise.spec.cluster import DEFAULT_CLUSTER, ClusterSpec, load_cluster
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import weight_ledger

if TYPE_CHECKING:  # the sweep's modules load only when a sweep runs
    from shardwise.measure.sweep import SweepPlan


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def deploy(
    ctx: typer.Context,
    form: Annotated[str, typer.Option(help="docker (a Compose file per node), kubernetes or slurm.")],
    output: Annotated[
        Path, typer.Option(help="Folder to write into; made if missing. Files already there are not overwritten.")
    ] = Path("deploy"),
    model: CommandModel = None,
    gpus: GpusOption = DEFAULT_CLUSTER,
    framework: FrameworkOption = "sglang",
    engine_version: VersionOption = None,
    isl: IslOption = 1024,
    osl: OslOption = 1024,
    rank: Annotated[int, typer.Option(min=1, help="Without a command: theorise's setup of this rank.")] = 1,
    profile: ProfileOption = None,
) -> None:
    """Deployment files for a setup: the launch command given after --, checked first, or without one the setup
    theorise ranks first (--rank for another) for --model on --gpus. Writes a Compose file per node, Kubernetes
    manifests (a Deployment, or a LeaderWorkerSet across nodes) or an sbatch script, each headed by the setup and
    its prediction."""
    if form not in FORMS:
        raise SpecError(f"unknown form {form!r}; use docker, kubernetes or slurm")
    cluster = with_profile(load_cluster(gpus), profile)
    if ctx.args:
        service = _from_command(ctx.args, cluster, model=model, version=engine_version, isl=isl, osl=osl)
    else:
        service = _from_theorise(
            model or DEFAULT_MODEL, cluster, framework=framework, version=engine_version, isl=isl, osl=osl, rank=rank
        )
    written = FORMS[form](service)
    clashes = [name for name in written if (output / name).exists()]
    if clashes:
        raise SpecError(f"{output / clashes[0]} exists; remove it or give another --output")
    if output.exists() and not output.is_dir():
        raise SpecError(f"cannot write into {output}: it is a file; give a folder")
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"cannot make {output}: {exc.strerror or exc}; give a folder you can write to") from exc
    done: list[Path] = []
    try:
        for name, text in written.items():
            report_files.write_text(output / name, text)
            done.append(output / name)
    except SpecError:
        for path in done:  # all the files or none
            path.unlink(missing_ok=True)
        raise
    typer.echo(f"{service.title}: wrote {', '.join(str(output / n) for n in written)}")


def _service(
    *,
    title: str,
    prediction: str,
    engine: str,
    version: str,
    model: ModelSpec,
    cluster: ClusterSpec,
    launches: list[list[str]] | tuple[tuple[str, ...], ...],
    gpus_used: int,
) -> Service:
    """The service of one setup: each node's command split from the environment it starts with."""
    commands: list[tuple[str, ...]] = []
    needs: dict[str, str] = {}
    for launch in launches:
        words, argv = split_env(launch)
        needs.update(words)
        commands.append(argv)
    ledger = weight_ledger(model)
    return Service(
        title=title,
        prediction=prediction,
        engine=engine,
        version=version,
        vendor=cluster.gpu.vendor,
        gpu=cluster.gpu.family,
        gpus_per_node=-(-gpus_used // len(launches)),  # a setup across nodes takes each node's share
        commands=tuple(commands),
        env=needs,
        weights_bytes=ledger.total_bytes + ledger.mtp_bytes,
    )


def _from_command(
    command: list[str], cluster: ClusterSpec, *, model: str | None, version: str | None, isl: int, osl: int
) -> Service:
    refuse_tokens(split_command(command).env)
    checked = check_command(command, cluster=cluster, model=model, version=version)
    setup = checked.setup
    memory = memory_ledger(checked.model, setup.layout, cluster) if setup.layout is not None else None
    if report_setups.verdict(setup, memory) != "ok":
        first = setup.rejections[0].reason if setup.rejections else (memory.reason if memory else None)
        raise SpecError(f"this command would not start, so there is nothing to deploy: {first}")
    assert setup.layout is not None and memory is not None
    launches = _node_commands(setup, command)
    best = max(
        predict(checked.model, setup.layout, cluster, memory, concurrency=[1, 8, 64], isl=isl, osl=osl),
        key=lambda p: p.output_tok_s,
    )
    prediction = (
        f"checked by shardwise check: starts; predicted {best.output_tok_s:,.0f} output tok/s at {best.concurrency} "
        f"clients of 1, 8, 64 ({isl} in / {osl} out)"
    )
    return _service(
        title=f"{setup.engine} {setup.layout.describe()}",
        prediction=prediction,
        engine=setup.engine,
        version=setup.version,
        model=checked.model,
        cluster=cluster,
        launches=launches,
        gpus_used=setup.gpus_used,
    )


def _node_commands(setup: Setup, command: list[str]) -> list[list[str]]:
    """The command as given (flags shardwise does not model, such as --port, kept), once per node: each with its
    --node-rank, node 0's address as the placeholder every form fills in (its port kept), and --headless on vLLM's
    nodes after the first, as the engine's own node commands are."""
    tokens = shlex.split(command[0]) if len(command) == 1 and any(c.isspace() for c in command[0]) else command
    env, words = split_env(tokens)
    engine, nodes = get_engine(setup.engine), setup.flags.get("nnodes", 1)
    if nodes == 1:
        return [[*(f"{k}={v}" for k, v in env.items()), *words]]
    head = head_address_flag(setup.engine)
    given = flag_value(words, head)
    port = given.rpartition(":")[2] if given and setup.engine == "sglang" else None
    words = with_flag_value(list(words), head, f"{HEAD_IP}:{port}" if port else HEAD_IP)
    commands = []
    for rank in range(nodes):
        argv = with_flag_value(list(words), "--node-rank", str(rank))
        headless = bool(engine.node_options({}, rank).get("headless"))
        argv = [t for t in argv if t != "--headless"] + (["--headless"] if headless else [])
        commands.append([*(f"{k}={v}" for k, v in env.items()), *argv])
    return commands


def _from_theorise(
    model_ref: str, cluster: ClusterSpec, *, framework: str, version: str | None, isl: int, osl: int, rank: int
) -> Service:
    engines = ["sglang", "vllm"] if framework == "all" else [get_engine(framework).name]
    spec = load_model(model_ref)
    theory = run_theorise(spec, cluster, model_ref=model_ref, engines=engines, isl=isl, osl=osl, version=version)
    scores = theory.ranking.scores
    if not scores:
        raise SpecError(f"no setup of {model_ref} serves on {cluster.name}; `shardwise theorise` says what would")
    if rank > len(scores):
        raise SpecError(f"--rank {rank}: theorise ranks {len(scores)} setups here; give 1 to {len(scores)}")
    score = scores[rank - 1]
    candidate = score.candidate
    confidence = theory.ranking.confidence(score)
    spread = f" (±{confidence.uncertainty:.0%})" if confidence is not None else ""
    prediction = (
        f"rank {rank} of shardwise theorise ({isl} in / {osl} out): {score.at.output_tok_s:,.0f} output tok/s"
        f"{spread} at {score.at.concurrency} clients"
    )
    return _service(
        title=candidate.name,
        prediction=prediction,
        engine=candidate.engine,
        version=candidate.version,
        model=spec,
        cluster=cluster,
        launches=candidate.launches,
        gpus_used=candidate.gpus,
    )


def sweep_job_of(plan: SweepPlan, *, bench_image: str, cache_claim: str) -> Callable[[int, str, str], dict]:
    """How `sweep --scheduler kubernetes` writes each setup's Job: the engine's image for its release, its command
    as a container runs it (the plan's --launcher in place of the engine's own, its --port made explicit for the
    benchmark beside it), the benchmark in `bench_image`, the model cache from the claim `cache_claim`."""
    from shardwise.measure.kubernetes import BENCH_ALLOWANCE_S, PROBE_PERIOD_S, bench_argv

    def job_of(index: int, command: str, name: str) -> dict:
        checked = check_command(command, cluster=plan.cluster)
        setup = checked.setup
        if setup.flags.get("nnodes", 1) > 1:
            raise SpecError(
                f"a sweep runs one-node setups; {command!r} spans {setup.flags['nnodes']} nodes "
                "(`shardwise deploy --form kubernetes` writes it as a LeaderWorkerSet)"
            )
        title = f"{setup.engine} {setup.layout.describe()}" if setup.layout is not None else setup.engine
        service = _service(
            title=title,
            prediction=f"setup {index + 1} of a shardwise sweep in {plan.folder}",
            engine=setup.engine,
            version=setup.version,
            model=checked.model,
            cluster=plan.cluster,
            launches=[shlex.split(command)],
            gpus_used=setup.gpus_used,
        )
        argv = service.argv(0)
        if plan.launcher:
            argv = [*shlex.split(plan.launcher), *split_command(argv).argv]
        if flag_value(argv, "--port") is None:
            argv += ["--port", str(service.port)]
        return sweep_job(
            service,
            name=name,
            engine_argv=argv,
            bench_image=bench_image,
            bench_argv=bench_argv(plan, service.port),
            cache_claim=cache_claim,
            startup_s=plan.health_timeout_s,
            probe_period_s=PROBE_PERIOD_S,
            deadline_s=plan.health_timeout_s + BENCH_ALLOWANCE_S,
            labels={"app.kubernetes.io/managed-by": "shardwise", "app.kubernetes.io/component": "sweep"},
        )

    return job_of
