"""Commands that describe: models, GPUs, a model, a cluster, a launch command, the layouts of a model."""

from __future__ import annotations

from typing import Annotated

import typer

from shardwise.cli.app import (
    AcceptLength,
    AcceptRate,
    BurstinessOption,
    CommandModel,
    DecodeOnlyFlag,
    FrameworkOption,
    GpusOption,
    JsonFlag,
    LengthsOption,
    ModelOption,
    OslOption,
    ProfileOption,
    RangeRatioOption,
    RequestRateOption,
    SeedOption,
    VersionOption,
    app,
    int_list,
    mean_accept_length,
    with_profile,
    workloads_of,
)
from shardwise.cost.book import PriceBook
from shardwise.cost.comm import CollectiveCost, collective_cost
from shardwise.cost.memory import memory_ledger
from shardwise.decide.economics import Economics, Pricing, economics
from shardwise.decide.search import raised_fraction
from shardwise.decide.theory import would_fit
from shardwise.engines.base import Engine, Setup, engine_names, get_engine
from shardwise.engines.check import check_command, model_reference
from shardwise.engines.check import layouts as list_layouts
from shardwise.engines.flags import flag_table, flag_words, parse_version
from shardwise.errors import SpecError
from shardwise.hardware.collectives import Collective
from shardwise.hardware.load import gpus as all_gpus
from shardwise.hardware.load import load_gpu
from shardwise.report import json as report_json
from shardwise.report import predictions as report_predictions
from shardwise.report import setups as report_setups
from shardwise.report import simulation as report_simulation
from shardwise.report import table as report_table
from shardwise.serve.accuracy import Confidence, confidence, regime_of
from shardwise.serve.simulate import ServeResult
from shardwise.serve.simulate import simulate as run_simulation
from shardwise.serve.steady import Prediction, predict
from shardwise.serve.steps import StepTimes
from shardwise.spec.catalog import DEFAULT_MODEL, catalog, load_model
from shardwise.spec.cluster import DEFAULT_CLUSTER, ClusterSpec, load_cluster
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import weight_ledger
from shardwise.units import parse_quantity


@app.command()
def models(json: JsonFlag = False) -> None:
    """List the bundled models: sizes, active parameters, weights and KV-cache bytes per token."""
    rows = []
    for alias, entry in catalog().items():
        model = load_model(alias)
        rows.append((entry, model, weight_ledger(model)))
    if json:
        typer.echo(
            report_json.dumps([report_json.model_payload(m, ledger, e) | {"components": None} for e, m, ledger in rows])
        )
    else:
        report_table.print_renderable(report_table.models_table(rows))


@app.command()
def gpus(
    name: Annotated[str | None, typer.Argument(help="One GPU by name or alias; all when omitted.")] = None,
    json: JsonFlag = False,
) -> None:
    """List the GPU catalog: memory, bandwidth (spec and measured), dense tensor FLOP/s, links."""
    chosen = [load_gpu(name)] if name else list(all_gpus().values())
    if json:
        typer.echo(report_json.dumps([report_json.gpu_payload(g) for g in chosen]))
    else:
        report_table.print_renderable(report_table.gpus_table(chosen))


@app.command()
def inspect(
    model: Annotated[
        str, typer.Argument(help="Bundled name, path to config.json (or its folder), or Hub id.")
    ] = DEFAULT_MODEL,
    weight_dtype: Annotated[
        str | None,
        typer.Option(help="What-if weight format: 'fp8', 'nvfp4', 'bf16', or per group 'experts=int4,attention=fp8'."),
    ] = None,
    kv_dtype: Annotated[str | None, typer.Option(help="What-if KV-cache dtype: bf16, fp8.")] = None,
    json: JsonFlag = False,
) -> None:
    """Parameters, bytes and format of every component of a model, and its KV-cache bytes per token."""
    spec = load_model(model, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    ledger = weight_ledger(spec)
    entry = catalog().get(model.lower())
    if json:
        typer.echo(report_json.dumps(report_json.model_payload(spec, ledger, entry)))
    else:
        report_table.print_renderable(report_table.inspect_view(spec, ledger, entry))


def _cluster_costs(cluster: ClusterSpec, sizes: list[float]) -> list[CollectiveCost]:
    groups = sorted({n for n in (2, 4, 8, cluster.gpus_per_node, cluster.num_gpus) if 2 <= n <= cluster.num_gpus})
    costs = []
    for op in (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.ALL_TO_ALL):
        for n in groups:
            costs.extend(collective_cost(cluster, op, size_bytes=s, gpus=n) for s in sizes)
            custom = cluster.collectives and cluster.collectives.curve(op, n, "custom")
            if custom:
                costs.extend(collective_cost(cluster, op, size_bytes=s, gpus=n, impl="custom") for s in sizes)
    return costs


@app.command()
def cluster(
    spec: Annotated[
        str, typer.Argument(help="Short form (8xrtx-pro-6000, 2x8xh100) or a cluster YAML file.")
    ] = DEFAULT_CLUSTER,
    sizes: Annotated[
        str, typer.Option(help="Message sizes for the collective table, comma-separated.")
    ] = "16 KiB,1 MiB,64 MiB",
    json: JsonFlag = False,
) -> None:
    """Describe a cluster and what its collectives cost (measured where measured, α–β elsewhere)."""
    parsed = load_cluster(spec)
    size_bytes = [parse_quantity(s, dimension="bytes") for s in sizes.split(",") if s.strip()]
    costs = _cluster_costs(parsed, size_bytes)
    if json:
        typer.echo(report_json.dumps(report_json.cluster_payload(parsed, costs)))
    else:
        report_table.print_renderable(report_table.cluster_view(parsed, costs, size_bytes))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def check(
    ctx: typer.Context,
    model: CommandModel = None,
    gpus: GpusOption = DEFAULT_CLUSTER,
    engine_version: VersionOption = None,
    isl: Annotated[
        int, typer.Option(min=1, help="Input tokens per request, for the concurrency the KV cache holds.")
    ] = 1024,
    osl: OslOption = 1024,
    concurrency: Annotated[
        str | None,
        typer.Option(help="Clients to predict serving figures for, comma-separated (closed loop); default 1,8,64."),
    ] = None,
    request_rate: RequestRateOption = None,
    lengths: LengthsOption = None,
    range_ratio: RangeRatioOption = None,
    num_prompts: Annotated[
        int | None, typer.Option(min=1, help="Requests per run: simulate them instead of the steady state.")
    ] = None,
    burstiness: BurstinessOption = 1.0,
    seed: SeedOption = 0,
    accept_length: AcceptLength = None,
    accept_rate: AcceptRate = None,
    decode_only: DecodeOnlyFlag = False,
    profile: ProfileOption = None,
    json: JsonFlag = False,
) -> None:
    """Will this launch command start, how, and how fast? Give the command after --. Exit 1 if it would not
    start. Fixed lengths in a closed loop are predicted in closed form (the steady state); a request rate, a
    dataset, random lengths or a number of prompts are simulated as the benchmark tools would send them. With
    speculative decoding, predictions need its acceptance (--accept-length or --accept-rate)."""
    if not ctx.args:
        raise SpecError(
            "give the launch command after --, e.g. shardwise check -- python -m sglang.launch_server "
            "--model-path moonshotai/Kimi-K2.6 --tp 8"
        )
    cluster_spec = with_profile(load_cluster(gpus), profile)
    checked = check_command(ctx.args, cluster=cluster_spec, model=model, version=engine_version)
    setup = checked.setup
    launch, memory, book = None, None, PriceBook()  # one price book for the check
    if setup.layout is not None:
        launch = get_engine(setup.engine).launch_commands(
            setup, model_ref=model_reference(checked.model_ref), remote_code=checked.model.remote_code
        )
        memory = memory_ledger(checked.model, setup.layout, cluster_spec, book=book)
    simulating = request_rate is not None or lengths is not None or range_ratio is not None or num_prompts is not None
    if concurrency is None and not (simulating and request_rate is not None):
        concurrency = "1,8,64"
    levels = int_list(concurrency, "--concurrency") if concurrency else []
    predicted, note, simulated = None, None, None
    if setup.layout is not None and memory is not None and report_setups.verdict(setup, memory) == "ok":
        acceptance = mean_accept_length(setup.layout, accept_length, accept_rate)
        if setup.layout.options.spec is not None and acceptance is None:
            note = "no predictions: speculative decoding needs its acceptance (--accept-length or --accept-rate)"
        elif simulating:
            workloads = workloads_of(
                setup.engine,
                concurrency=concurrency,
                request_rate=request_rate,
                lengths=lengths,
                isl=isl,
                osl=osl,
                range_ratio=range_ratio,
                num_prompts=num_prompts or 1000,
                burstiness=burstiness,
                seed=seed,
                decode_only=decode_only,
            )
            steps = StepTimes(checked.model, setup.layout, cluster_spec, accept_length=acceptance, book=book)
            simulated = [run_simulation(steps, memory, w) for w in workloads]
        else:
            predicted = predict(
                checked.model,
                setup.layout,
                cluster_spec,
                memory,
                concurrency=levels,
                isl=isl,
                osl=osl,
                accept_length=acceptance,
                decode_only=decode_only,
                book=book,
            )

    def confidence_of(p: Prediction | ServeResult) -> Confidence:
        assert setup.layout is not None
        return confidence(setup.engine, setup.layout.family(), regime_of(p.concurrency), cluster_spec.gpu.name)

    def economics_of(p: Prediction) -> Economics:
        assert setup.layout is not None
        return economics(p, cluster_spec, setup.layout)

    if json:
        payload = report_setups.check_payload(setup, checked.model, launch, memory, isl=isl, osl=osl)
        payload["predicted"] = (
            report_predictions.predictions_payload(predicted, confidence_of, economics_of) if predicted else None
        )
        payload["prediction_note"] = note
        payload["decode_only"] = decode_only
        payload["simulated"] = (
            [
                {**row, "confidence": confidence_of(r).to_json()}  # a run's load as a prediction's
                for row, r in zip(report_simulation.results_payload(simulated, None), simulated, strict=True)
            ]
            if simulated
            else None
        )
        typer.echo(report_json.dumps(payload))
    else:
        report_table.print_renderable(report_setups.check_view(setup, checked.model, memory, isl=isl, osl=osl))
        if predicted:
            report_table.print_renderable(
                report_predictions.predictions_table(predicted, isl=isl, osl=osl, decode_only=decode_only)
            )
            if any(report_predictions.collective_times_s(p) for p in predicted):
                report_table.print_renderable(report_predictions.collectives_table(predicted))
            for line in report_predictions.confidence_lines(predicted, confidence_of):
                report_table.print_renderable(line)
            report_table.print_renderable(
                report_predictions.economics_line(
                    max(predicted, key=lambda p: p.output_tok_s),
                    economics_of(max(predicted, key=lambda p: p.output_tok_s)),
                    Pricing().basis(cluster_spec),
                )
            )
        if simulated:
            title = f"simulated{', decode only (prompts cached)' if decode_only else ''}" + (
                f", {lengths} lengths" if lengths else f", {isl} in / {osl} out"
            )
            report_table.print_renderable(report_simulation.results_table(simulated, title=title))
        if note:
            report_table.print_renderable(note)
    if report_setups.verdict(setup, memory) != "ok":
        raise typer.Exit(1)


def _layout_rows(
    engine: Engine, found: list[Setup], model: ModelSpec, cluster: ClusterSpec, *, model_ref: str
) -> list[report_setups.LayoutRow]:
    """Each layout at the engine's defaults; where none fits there, each at the highest memory fraction the engine's
    rules allow, as theorise raises it (where raising adds room)."""
    sized = [(s, memory_ledger(model, s.layout, cluster)) for s in found if s.layout is not None]
    none_fits = not any(memory.verdict == "ok" for _, memory in sized)
    rows = []
    for setup, memory in sized:
        default = setup.layout.options.memory_fraction if setup.layout else None
        raised = (
            raised_fraction(
                engine, setup.given, setup, memory, model=model, cluster=cluster, version=engine.version(setup.version)
            )
            if none_fits
            else None
        )
        if raised is not None:
            _, setup, memory = raised
        commands = engine.launch_commands(setup, model_ref=model_reference(model_ref), remote_code=model.remote_code)
        rows.append(report_setups.LayoutRow(setup, commands, memory, default))
    return rows


def _fraction_flag(engine: Engine, version: str) -> str | None:
    """The engine's memory-fraction option as this release spells it (--mem-fraction-static), if it has one."""
    option = engine.memory_fraction_option
    if option is None:
        return None
    return flag_words(flag_table(engine.name), parse_version(version, engine.name), option, 0)[0]


@app.command()
def layouts(
    model: ModelOption = DEFAULT_MODEL,
    gpus: GpusOption = DEFAULT_CLUSTER,
    framework: FrameworkOption = "sglang",
    engine_version: VersionOption = None,
    isl: Annotated[int, typer.Option(min=1, help="Input tokens per request, for the concurrency that fits.")] = 1024,
    osl: OslOption = 1024,
    show_all: Annotated[bool, typer.Option("--all", help="Also list layouts that do not fit in memory.")] = False,
    json: JsonFlag = False,
) -> None:
    """The layouts the engine accepts on all of the cluster's GPUs and that fit in memory, with KV capacity and
    launch command (--all for those that do not fit too). Where none fits at the engine's default memory fraction,
    those that fit at the highest fraction its rules allow, as theorise raises it."""
    engines = engine_names() if framework == "all" else [framework]
    cluster_spec = load_cluster(gpus)
    spec = load_model(model)
    payload = []
    for name in engines:
        engine = get_engine(name)
        found = list_layouts(model, cluster_spec, engine=name, version=None if framework == "all" else engine_version)
        rows = _layout_rows(engine, found, spec, cluster_spec, model_ref=model)
        shown = rows if show_all else [r for r in rows if r.memory.verdict == "ok"]
        if json:
            payload += report_setups.layouts_payload(shown, spec, isl=isl, osl=osl)
            continue
        fits = any(r.memory.verdict == "ok" for r in rows)
        title = report_setups.layouts_heading(
            rows,
            engine=name,
            model=model,
            cluster=cluster_spec.name,
            show_all=show_all,
            flag=_fraction_flag(engine, rows[0].setup.version) if rows else None,
            would_fit=() if fits else would_fit(spec, cluster_spec, isl=isl, osl=osl),
        )
        report_table.print_renderable(report_setups.layouts_table(shown, title=title, isl=isl, osl=osl))
    if json:
        typer.echo(report_json.dumps(payload))
