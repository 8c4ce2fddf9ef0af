"""Commands that measure and learn: bench a server, validate predictions, calibrate constants."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from shardwise import jsontext
from shardwise.cli.app import (
    BurstinessOption,
    CommandModel,
    GpusOption,
    IslOption,
    JsonFlag,
    OslOption,
    app,
    int_list,
    loads_of,
)
from shardwise.decide.theory import theorise as run_theorise
from shardwise.engines.check import check_command
from shardwise.engines.flags import command_text
from shardwise.errors import SpecError
from shardwise.hardware.calibration import CONSTANTS, Calibration, calibration_yaml
from shardwise.hardware.load import read_yaml
from shardwise.report import files as report_files
from shardwise.report import json as report_json
from shardwise.report import simulation as report_simulation
from shardwise.report import table as report_table
from shardwise.spec.catalog import DEFAULT_MODEL, load_model
from shardwise.spec.cluster import DEFAULT_CLUSTER, load_cluster


@app.command()
def bench(
    url: Annotated[str, typer.Option(help="Base URL of an OpenAI-compatible server, e.g. http://localhost:30000.")],
    model: Annotated[str | None, typer.Option(help="Model name to send (the server's default when omitted).")] = None,
    concurrency: Annotated[
        str | None, typer.Option(help="Clients of a closed loop, comma-separated: one level each.")
    ] = None,
    request_rate: Annotated[
        str | None, typer.Option(help="Requests per second of an open loop, comma-separated: one level each.")
    ] = None,
    burstiness: BurstinessOption = 1.0,
    isl: Annotated[int, typer.Option(min=1, help="Input tokens per request (words of one token each).")] = 1024,
    osl: Annotated[int, typer.Option(min=1, help="Output tokens per request (max_tokens, ignore_eos).")] = 1024,
    num_prompts: Annotated[int, typer.Option(min=1, help="Requests per level.")] = 100,
    chat: Annotated[bool, typer.Option("--chat", help="Use /v1/chat/completions instead of /v1/completions.")] = False,
    output: Annotated[Path, typer.Option(help="JSONL file each finished level is appended to, at once.")] = Path(
        "shardwise-bench.jsonl"
    ),
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds one request may take.")] = 600.0,
    json: JsonFlag = False,
) -> None:
    """Measure a live server the way the engines' benchmark tools do: TTFT, TPOT, ITL, E2E and throughput per
    load level; each level is appended to --output as soon as it finishes."""
    import asyncio  # the measuring commands' libraries load only when they run

    from shardwise.measure.bench import Target, run_level
    from shardwise.report import bench as report_bench

    loads = loads_of(concurrency, request_rate)
    if not url.startswith(("http://", "https://")):
        raise SpecError(f"--url must start with http:// or https://, e.g. http://localhost:30000; got {url!r}")
    target = Target(url=url, model=model, chat=chat, timeout_s=timeout)
    records: list[dict] = []

    async def every_level(update: Callable[[str, int], None]) -> None:
        """All levels on one event loop: Ctrl-C at any moment cancels it cleanly (a loop per level left a window
        between two loops where the interrupt could leave one half closed)."""
        for n, (c, rate) in enumerate(loads):
            label = f"C={c}" if c else f"{rate:g} req/s"

            def tick(k: int, done: int = n * num_prompts, text: str = label) -> None:
                update(text, done + k)

            level = await run_level(
                target,
                isl=isl,
                osl=osl,
                num_prompts=num_prompts,
                concurrency=c,
                request_rate=rate,
                burstiness=burstiness,
                progress=tick,
            )
            record = report_bench.level_record(level, url=url, model=model)
            jsontext.append_line(output, record)
            records.append(record)

    with report_simulation.progress_bar(num_prompts * len(loads), label="benchmarking") as update:
        asyncio.run(every_level(update))
    if json:
        typer.echo(report_json.dumps(records))
    else:
        title = f"measured {url}, {isl} in / {osl} out, {num_prompts} requests per level (appended to {output})"
        report_table.print_renderable(report_bench.levels_table(records, title=title))


@app.command()
def validate(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Results of sglang.bench_serving, vllm bench serve or shardwise bench; default: the "
            "bundled published measurements."
        ),
    ] = None,
    gpus: Annotated[
        str | None, typer.Option(help="Cluster the results were measured on, when they do not say.")
    ] = None,
    command: Annotated[
        str | None, typer.Option(help="The launch command the results were measured with, when they do not say.")
    ] = None,
    model: CommandModel = None,
    measured: Annotated[
        str,
        typer.Option(
            "--set",
            help="Bundled measurements to predict when no FILE is given: publications (the hand-checked "
            "published rows), inferencex (every SGLang / vLLM point of the InferenceX benchmark, replayed as its "
            "script launched it), all (those two: what every prediction's confidence reads), or pcie (the "
            "community decode curves and KV capacities of the newest MoE models on RTX PRO 6000 over PCIe, each "
            "on its own custom build).",
        ),
    ] = "publications",
    record: Annotated[
        Path | None,
        typer.Option(
            help="Also write each predicted row's family, load, GPU and errors to this CSV: the file every "
            "prediction's confidence reads (bundled as data/measurements/validated.csv, from --set all)."
        ),
    ] = None,
    json: JsonFlag = False,
) -> None:
    """Predict measurements and report the error per metric and how often the predictions rank setups as the
    measurements do."""
    from shardwise.measure.gaps import explain  # imported here: the other commands need none of it
    from shardwise.measure.importers import read_results
    from shardwise.measure.inferencex import read_points
    from shardwise.measure.pcie import from_pcie, read_set
    from shardwise.measure.reference import (
        breakdown,
        check_row,
        from_inferencex,
        headline,
        load_rows,
        rank_agreement,
        rows_from_results,
        validated_csv,
    )
    from shardwise.report import validation as report_validation
    from shardwise.report.files import check_writable, write_text

    sets = ("publications", "inferencex", "pcie", "all")
    if measured not in sets:
        raise SpecError(f"--set {measured!r}: use one of {', '.join(sets)}")
    if record is not None:
        check_writable(record)  # before minutes of predictions
    rows, skipped, capacities = [], [], []
    for path in files or []:
        if path.suffix == ".csv":  # the InferenceX points form
            points = read_points(path)
            rows += points.rows
            skipped += points.skipped
        else:
            levels = read_results(path)
            rows += rows_from_results(levels, command=command, gpus=gpus, model=model)
    if not files:
        if measured in ("publications", "all"):
            rows += load_rows()
        if measured in ("inferencex", "all"):
            points = read_points()
            rows += points.rows
            skipped += points.skipped
        if measured == "pcie":  # custom builds: replayed beside the others, not yet in the confidence file
            pcie = read_set()
            rows += pcie.rows
            skipped += pcie.skipped
            capacities += pcie.capacities
    checked = [check_row(row) for row in rows]
    if record is not None:
        write_text(record, validated_csv(checked))
    summary = headline(checked)
    ranks = rank_agreement(checked)
    # what may explain a gap is priced row by row for the publications and the user's files; the InferenceX and
    # PCIe sets' points (hundreds) are not priced again: each names only what its measurement itself says, if anything
    gaps = {}
    for c in checked:
        bulk = from_inferencex(c.row) or from_pcie(c.row)
        found = explain(c, checked, priced=not bulk)
        if found or not bulk:
            gaps[c.row.id] = found
    parts = report_validation.Validation(checked, summary, breakdown(checked), ranks, gaps, skipped, capacities)
    if json:
        typer.echo(report_json.dumps(report_validation.validation_payload(parts)))
    else:
        report_table.print_renderable(report_validation.validation_view(parts))


@app.command()
def calibrate(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Results of sglang.bench_serving, vllm bench serve or shardwise bench; default: the "
            "bundled measurements of --gpus (the user's runs on the default cluster)."
        ),
    ] = None,
    constants: Annotated[
        str, typer.Option(help="Constants to fit, comma-separated: " + ", ".join(CONSTANTS) + ".")
    ] = "eager_kernel_cpu_s",
    holdout: Annotated[
        str | None, typer.Option(help="Measurement ids kept out of the fit, comma-separated, to check it on.")
    ] = None,
    gpus: GpusOption = DEFAULT_CLUSTER,
    command: Annotated[
        str | None, typer.Option(help="The launch command the results were measured with, when they do not say.")
    ] = None,
    output: Annotated[Path, typer.Option(help="Where to write the profile (YAML).")] = Path("shardwise-profile.yaml"),
    log: Annotated[
        Path | None,
        typer.Option(
            help="A server's start-up log (SGLang or vLLM): fit the memory it holds besides weights, KV "
            "cache, activations and graphs; give the launch command with --command."
        ),
    ] = None,
    json: JsonFlag = False,
) -> None:
    """Fit named physical constants to measurements of this machine and write a profile that theorise, check
    and simulate take with --profile; report the error before and after, on held-out measurements too. With
    --log, fit the machine's non-weight memory to what a server printed while it started."""
    from shardwise.measure.calibrate import calibrate as run_calibrate
    from shardwise.measure.importers import read_results
    from shardwise.measure.reference import load_rows, rows_from_results
    from shardwise.report import validation as report_validation
    from shardwise.report.files import check_writable

    check_writable(output)  # before the fit
    if log is not None:
        _calibrate_memory(log, command=command, gpus=gpus, output=output, json=json)
        return
    if files:
        levels = [level for path in files for level in read_results(path)]
        rows = rows_from_results(levels, command=command, gpus=gpus, model=None)
    else:
        name = load_cluster(gpus).name
        rows = [row for row in load_rows() if row.gpus == name and row.concurrency is not None]
        if not rows:
            raise SpecError(f"no bundled measurements on {name}; give results files of this machine")
    names = [n.strip() for n in constants.split(",") if n.strip()]
    held = [h.strip() for h in holdout.split(",")] if holdout else []
    missing = set(held) - {row.id for row in rows}
    if missing:
        raise SpecError(f"--holdout names no measurement: {sorted(missing)}; ids: {', '.join(r.id for r in rows)}")
    report = run_calibrate(rows, names=names, held_out=held)
    fitted = {"fitted_error_before": report.fitted_error_before, "fitted_error_after": report.fitted_error_after}
    _write_profile(output, report.calibration, fitted, report_validation.calibration_view, json=json)


def _calibrate_memory(log: Path, *, command: str | None, gpus: str, output: Path, json: bool) -> None:
    from shardwise.measure.memory_fit import fit_memory
    from shardwise.measure.startup_log import read_startup_log
    from shardwise.report import validation as report_validation

    if not command:
        raise SpecError("--log needs the launch command the server ran: --command 'python -m sglang.launch_server …'")
    cluster_spec = load_cluster(gpus)
    checked = check_command(command, cluster=cluster_spec)
    fit = fit_memory(read_startup_log(log), model=checked.model, setup=checked.setup, cluster=cluster_spec)
    kv_tokens = {"logged": fit.logged_kv_tokens, "default": fit.default_kv_tokens, "calibrated": fit.fitted_kv_tokens}
    fitted = {"default_non_torch_bytes": fit.default_non_torch_bytes, "kv_tokens": kv_tokens}
    _write_profile(output, fit.calibration, fitted, report_validation.memory_fit_view, json=json)


def _write_profile(
    output: Path, calibration: Calibration, fitted: dict[str, Any], view: Callable[[dict], Any], *, json: bool
) -> None:
    """Write the fitted profile to `output` and show it with what the fit found (`view` draws it)."""
    report_files.write_text(output, calibration_yaml(calibration))
    payload = {**calibration.model_dump(mode="json"), **fitted, "profile": str(output)}
    if json:
        typer.echo(report_json.dumps(payload))
    else:
        report_table.print_renderable(view(payload))


@app.command()
def sweep(
    command: Annotated[
        list[str] | None, typer.Option("--command", help="A launch command to run; repeat for several.")
    ] = None,
    plan: Annotated[Path | None, typer.Option(help="A YAML file: commands: \\[launch command, …].")] = None,
    top: Annotated[int | None, typer.Option(min=1, help="Run the best N setups theorise predicts.")] = None,
    model: Annotated[str, typer.Option(help="Model for --top.")] = DEFAULT_MODEL,
    gpus: GpusOption = DEFAULT_CLUSTER,
    concurrency: Annotated[str, typer.Option(help="Benchmark levels: clients, comma-separated.")] = "1,8,64",
    isl: IslOption = 1024,
    osl: OslOption = 1024,
    num_prompts: Annotated[int, typer.Option(min=1, help="Requests per level.")] = 100,
    folder: Annotated[Path, typer.Option("--dir", help="Where the results and engine logs go.")] = Path(
        "shardwise-sweep"
    ),
    launcher: Annotated[
        str | None, typer.Option(help="Run this instead of the engine's launcher (a wrapper, a stand-in).")
    ] = None,
    health_timeout: Annotated[float, typer.Option(min=1.0, help="Seconds to wait for an engine's /health.")] = 1800.0,
    force: Annotated[bool, typer.Option("--force", help="Also start setups check says cannot start.")] = False,
    scheduler: Annotated[
        str,
        typer.Option(
            help="local (one after another on this machine), slurm (one batch job per setup) or kubernetes (one Job "
            "per setup)."
        ),
    ] = "local",
    slurm_option: Annotated[
        list[str] | None,
        typer.Option(
            "--slurm-option", help="An sbatch option for every job, e.g. --slurm-option=--gpus-per-node=8; repeatable."
        ),
    ] = None,
    poll: Annotated[float, typer.Option(min=0.1, help="Seconds between looks at the scheduler's queue.")] = 5.0,
    bench_image: Annotated[
        str | None,
        typer.Option(help="Kubernetes: an image with shardwise installed; it runs the benchmark beside each engine."),
    ] = None,
    namespace: Annotated[str, typer.Option(help="Kubernetes: the namespace of the sweep's Jobs.")] = "default",
    kube_context: Annotated[
        str | None, typer.Option(help="Kubernetes: the kubeconfig context (default: the current one).")
    ] = None,
    cache_claim: Annotated[
        str, typer.Option(help="Kubernetes: the PersistentVolumeClaim that holds the model's download.")
    ] = "shardwise-model-cache",
    json: JsonFlag = False,
) -> None:
    """Start each setup, benchmark it, stop it, record it; diagnose the ones that fail; then calibrate on what
    was measured and print the re-ranked setups. Run again to continue: finished setups are not re-run. With
    --scheduler slurm each setup is a batch job (sbatch), with --scheduler kubernetes a Job; each is followed until
    it ends, and Ctrl-C cancels them."""
    from shardwise.measure.sweep import SweepPlan, recalibrate, reranked
    from shardwise.measure.sweep import sweep as run_sweep

    if scheduler not in ("local", "slurm", "kubernetes"):
        raise SpecError(f"unknown scheduler {scheduler!r}; use local, slurm or kubernetes")
    if scheduler == "kubernetes" and not bench_image:
        raise SpecError(
            "--scheduler kubernetes needs --bench-image: an image with shardwise installed, which benchmarks each "
            "engine from inside its pod"
        )
    from shardwise.report import bench as report_bench

    cluster_spec = load_cluster(gpus)
    commands = list(command or [])
    if plan is not None:
        commands += _plan_commands(plan)
    if top:
        spec = load_model(model)
        theory = run_theorise(
            spec,
            cluster_spec,
            model_ref=model,
            engines=["sglang"],
            isl=isl,
            osl=osl,
            concurrency=int_list(concurrency, "--concurrency"),
        )
        single_node = [s for s in theory.ranking.scores if len(s.candidate.launches) == 1]  # a sweep runs here
        commands += [command_text(list(s.candidate.launch)) for s in single_node[:top]]
    if not commands:
        raise SpecError("give setups to sweep: --command '<launch command>' (repeatable), --plan FILE or --top N")
    sweep_plan = SweepPlan(
        commands=tuple(dict.fromkeys(commands)),
        cluster=cluster_spec,
        concurrency=tuple(int_list(concurrency, "--concurrency")),
        isl=isl,
        osl=osl,
        num_prompts=num_prompts,
        folder=folder,
        launcher=launcher,
        health_timeout_s=health_timeout,
        force=force,
        cluster_ref=gpus,
    )
    if scheduler == "slurm":
        from shardwise.measure.slurm import sweep_slurm

        try:
            records = sweep_slurm(
                sweep_plan,
                options=tuple(slurm_option or ()),
                poll_s=poll,
                progress=lambda c: typer.echo(f"submitted: {c}", err=True),
            )
        except KeyboardInterrupt:
            typer.echo("interrupted: the sweep's Slurm jobs are cancelled; run it again to continue", err=True)
            raise typer.Exit(130) from None
    elif scheduler == "kubernetes":
        from shardwise.cli.deploy import sweep_job_of
        from shardwise.measure.kubernetes import connect, sweep_kubernetes

        assert bench_image is not None
        try:
            records = sweep_kubernetes(
                sweep_plan,
                connect(kube_context, namespace),
                sweep_job_of(sweep_plan, bench_image=bench_image, cache_claim=cache_claim),
                poll_s=poll,
                progress=lambda c: typer.echo(f"created a Job: {c}", err=True),
            )
        except KeyboardInterrupt:
            typer.echo("interrupted: the sweep's Jobs are deleted; run it again to continue", err=True)
            raise typer.Exit(130) from None
    else:
        records = run_sweep(sweep_plan, progress=lambda c: typer.echo(f"sweeping: {c}", err=True))
    calibration, why = recalibrate(records, sweep_plan)
    ranked = reranked(records, sweep_plan, calibration)
    if calibration is not None:
        report_files.write_text(folder / "profile.yaml", calibration_yaml(calibration))
    payload = {
        "results": records,
        "ranked": ranked,
        "calibration": calibration.model_dump(mode="json") if calibration else None,
        "calibration_note": why or None,
    }
    if json:
        typer.echo(report_json.dumps(payload))
    else:
        report_table.print_renderable(report_bench.sweep_table(ranked, calibrated=calibration is not None))
        if why:
            report_table.print_renderable(f"not recalibrated: {why}")


def _plan_commands(path: Path) -> list[str]:
    raw = read_yaml(path)
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("commands"), list)
        or not all(isinstance(c, str) for c in raw["commands"])
    ):
        raise SpecError(f"{path}: a sweep plan is YAML with commands: ['<launch command>', …]")
    return raw["commands"]
