"""The `shardwise` command: parse arguments, call the library, render. A ShardwiseError becomes one line, exit 2."""

from __future__ import annotations

import asyncio
import itertools
import math
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from shardwise.cost.comm import CollectiveCost, collective_cost
from shardwise.cost.memory import memory_ledger
from shardwise.decide.rank import Objective
from shardwise.decide.theory import theorise as run_theorise
from shardwise.engines.base import engine_names, get_engine
from shardwise.engines.check import check_command, model_reference, without_speculative
from shardwise.engines.check import layouts as list_layouts
from shardwise.engines.layout import Layout
from shardwise.errors import ShardwiseError, SpecError
from shardwise.hardware.calibration import CONSTANTS, calibration_yaml, load_calibration
from shardwise.hardware.collectives import Collective
from shardwise.hardware.load import gpus as all_gpus
from shardwise.hardware.load import load_gpu
from shardwise.measure.bench import Target, run_level
from shardwise.measure.calibrate import calibrate as run_calibrate
from shardwise.measure.importers import read_results
from shardwise.measure.reference import check_row, load_rows, rank_agreement, rows_from_results, summarise
from shardwise.report import bench as report_bench
from shardwise.report import files as report_files
from shardwise.report import json as report_json
from shardwise.report import predictions as report_predictions
from shardwise.report import setups as report_setups
from shardwise.report import simulation as report_simulation
from shardwise.report import table as report_table
from shardwise.report import theory as report_theory
from shardwise.report import validation as report_validation
from shardwise.serve.simulate import ServeResult
from shardwise.serve.simulate import simulate as run_simulation
from shardwise.serve.speculative import accept_length_from_rate, spec_plan
from shardwise.serve.steady import predict
from shardwise.serve.steps import StepTimes
from shardwise.spec.catalog import DEFAULT_MODEL, catalog, load_model
from shardwise.spec.cluster import DEFAULT_CLUSTER, ClusterSpec, load_cluster
from shardwise.spec.drafter import drafter_block
from shardwise.spec.weights import weight_ledger
from shardwise.spec.workload import Lengths, WorkloadSpec, bundled_lengths, read_pairs
from shardwise.units import parse_quantity

app = typer.Typer(
    help="What is the best way to serve this LLM on these GPUs, and why.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON (SI units) instead of tables.")]
_state = {"debug": False}


@app.callback()
def _options(debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")] = False) -> None:
    _state["debug"] = debug


def _int_list(text: str, option: str) -> list[int]:
    """'1,8,64' → [1, 8, 64]; anything else is one clear error."""
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise SpecError(f"{option} takes positive whole numbers separated by commas, e.g. 1,8,64; got {text!r}")
    return values


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


GpusOption = Annotated[str, typer.Option("--gpus", help="Cluster: 8xrtx-pro-6000, 2x8xh100, or a cluster YAML file.")]
ProfileOption = Annotated[
    Path | None, typer.Option("--profile", help="A calibration profile written by `shardwise calibrate`.")
]
CommandModel = Annotated[
    str | None, typer.Option(help="Model, if not the one the command names (bundled, path, Hub id).")
]
AcceptLength = Annotated[
    float | None, typer.Option(help="Speculative decoding: mean tokens kept per step (the bonus token included).")
]
AcceptRate = Annotated[
    float | None, typer.Option(help="Speculative decoding: chance each drafted token is accepted (0 to 1).")
]
VersionOption = Annotated[
    str | None, typer.Option("--engine-version", help="Engine release; default: the latest known.")
]


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def check(
    ctx: typer.Context,
    model: CommandModel = None,
    gpus: GpusOption = DEFAULT_CLUSTER,
    engine_version: VersionOption = None,
    isl: Annotated[
        int, typer.Option(min=1, help="Input tokens per request, for the concurrency the KV cache holds.")
    ] = 1024,
    osl: Annotated[int, typer.Option(min=1, help="Output tokens per request.")] = 1024,
    concurrency: Annotated[
        str, typer.Option(help="Clients to predict serving figures for, comma-separated (closed loop).")
    ] = "1,8,64",
    accept_length: AcceptLength = None,
    accept_rate: AcceptRate = None,
    profile: ProfileOption = None,
    json: JsonFlag = False,
) -> None:
    """Will this launch command start, how, and how fast? Give the command after --. Exit 1 if it would not
    start. With speculative decoding, predictions need its acceptance (--accept-length or --accept-rate)."""
    if not ctx.args:
        raise SpecError(
            "give the launch command after --, e.g. shardwise check -- python -m sglang.launch_server "
            "--model-path moonshotai/Kimi-K2.6 --tp 8"
        )
    cluster_spec = _with_profile(load_cluster(gpus), profile)
    checked = check_command(ctx.args, cluster=cluster_spec, model=model, version=engine_version)
    setup = checked.setup
    launch, memory = None, None
    if setup.layout is not None:
        launch = get_engine(setup.engine).launch_command(
            setup, model_ref=model_reference(checked.model_ref), remote_code=checked.model.remote_code
        )
        memory = memory_ledger(checked.model, setup.layout, cluster_spec)
    levels = _int_list(concurrency, "--concurrency")
    predicted, note = None, None
    if setup.layout is not None and memory is not None and report_setups.verdict(setup, memory) == "ok":
        acceptance = _acceptance(setup.layout, accept_length, accept_rate)
        if setup.layout.options.spec is not None and acceptance is None:
            note = "no predictions: speculative decoding needs its acceptance (--accept-length or --accept-rate)"
        else:
            predicted = predict(
                checked.model, setup.layout, cluster_spec, memory, concurrency=levels, isl=isl, osl=osl,
                accept_length=acceptance,
            )  # fmt: skip
    if json:
        payload = report_setups.check_payload(setup, checked.model, launch, memory, isl=isl, osl=osl)
        payload["predicted"] = report_predictions.predictions_payload(predicted) if predicted else None
        payload["prediction_note"] = note
        typer.echo(report_json.dumps(payload))
    else:
        report_table.print_renderable(report_setups.check_view(setup, checked.model, memory, isl=isl, osl=osl))
        if predicted:
            report_table.print_renderable(report_predictions.predictions_table(predicted, isl=isl, osl=osl))
        if note:
            report_table.print_renderable(note)
    if report_setups.verdict(setup, memory) != "ok":
        raise typer.Exit(1)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def simulate(
    ctx: typer.Context,
    model: CommandModel = None,
    gpus: GpusOption = DEFAULT_CLUSTER,
    engine_version: VersionOption = None,
    concurrency: Annotated[
        str | None, typer.Option(help="Clients of a closed loop, comma-separated: one run each (--max-concurrency).")
    ] = None,
    request_rate: Annotated[
        str | None, typer.Option(help="Requests per second of an open loop, comma-separated: one run each.")
    ] = None,
    burstiness: Annotated[
        float, typer.Option(min=0.01, help="Gamma shape of the gaps between requests; 1 is Poisson.")
    ] = 1.0,
    isl: Annotated[int, typer.Option(min=1, help="Input tokens per request.")] = 1024,
    osl: Annotated[int, typer.Option(min=1, help="Output tokens per request.")] = 1024,
    range_ratio: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Random lengths, as the engine's benchmark tool draws them with "
            "--random-range-ratio (SGLang: [ratio × len, len]; vLLM: len × [1 − ratio, 1 + ratio]); default: fixed.",
        ),
    ] = None,
    lengths: Annotated[
        str | None,
        typer.Option(
            help="Request lengths instead of --isl/--osl: 'sharegpt', or a JSONL file of "
            "{input_tokens, output_tokens} per line."
        ),
    ] = None,
    num_prompts: Annotated[int, typer.Option(min=1, help="Requests per run.")] = 1000,
    accept_length: AcceptLength = None,
    accept_rate: AcceptRate = None,
    seed: Annotated[int, typer.Option(help="Seed of the random lengths and arrivals.")] = 0,
    profile: ProfileOption = None,
    json: JsonFlag = False,
) -> None:
    """Simulate the engine a launch command starts under load: continuous batching, chunked prefill, KV admission
    and eviction, speculative decoding. Give the command after --."""
    if not ctx.args:
        raise SpecError(
            "give the launch command after --, e.g. shardwise simulate --concurrency 1,16,64 -- "
            "python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp 8 --ep 8"
        )
    levels = _int_list(concurrency, "--concurrency") if concurrency else []
    rates = _rate_list(request_rate) if request_rate else []
    if not levels and not rates:
        raise SpecError("give --concurrency (closed loop, e.g. 1,16,64) or --request-rate (open loop, e.g. 2,8)")
    cluster_spec = _with_profile(load_cluster(gpus), profile)
    checked = check_command(ctx.args, cluster=cluster_spec, model=model, version=engine_version)
    setup = checked.setup
    if setup.layout is None or not setup.valid:
        reason = setup.rejections[0].reason if setup.rejections else "the command describes no layout"
        raise SpecError(f"this setup would not start: {reason}")
    memory = memory_ledger(checked.model, setup.layout, cluster_spec)
    if memory.verdict != "ok":
        raise SpecError(f"this setup would not start: {memory.reason or memory.verdict}")
    acceptance = _acceptance(setup.layout, accept_length, accept_rate)
    steps = StepTimes(checked.model, setup.layout, cluster_spec, accept_length=acceptance)
    input_lengths, output_lengths, pairs = _lengths(setup.engine, lengths, isl=isl, osl=osl, ratio=range_ratio)
    loads = [(c, math.inf) for c in levels] + [(None, r) for r in rates]
    workloads = [
        WorkloadSpec(input=input_lengths, output=output_lengths, pairs=pairs, num_requests=num_prompts,
                     concurrency=c, request_rate=r, burstiness=burstiness, seed=seed)
        for c, r in loads
    ]  # fmt: skip
    runs = [(steps, memory)]
    if acceptance is not None:  # the same command without drafting, to say what speculative decoding gains
        plain = check_command(without_speculative(ctx.args), cluster=cluster_spec, model=model, version=engine_version)
        assert plain.setup.layout is not None
        plain_memory = memory_ledger(plain.model, plain.setup.layout, cluster_spec)
        runs.append((StepTimes(plain.model, plain.setup.layout, cluster_spec), plain_memory))
    results: list[list[ServeResult]] = [[] for _ in runs]
    with report_simulation.progress_bar(num_prompts * len(workloads) * len(runs), label="simulating") as update:
        for n, (workload, (run_steps, run_memory)) in enumerate(itertools.product(workloads, runs)):
            label = f"C={workload.concurrency}" if workload.concurrency else f"{workload.request_rate:g} req/s"

            def tick(k: int, done: int = n * num_prompts, text: str = label) -> None:
                update(text, done + k)

            results[n % len(runs)].append(run_simulation(run_steps, run_memory, workload, progress=tick))
    baseline = results[1] if len(results) > 1 else None
    launch = get_engine(setup.engine).launch_command(
        setup, model_ref=model_reference(checked.model_ref), remote_code=checked.model.remote_code
    )
    if json:
        payload = {
            "launch": launch,
            "layout": setup.layout.describe(),
            "workload": {"input": input_lengths.model_dump(), "output": output_lengths.model_dump(),
                         "pairs": len(pairs), "num_prompts": num_prompts, "burstiness": burstiness, "seed": seed},
            "accept_length": acceptance,
            "results": report_simulation.results_payload(results[0], baseline),
        }  # fmt: skip
        typer.echo(report_json.dumps(payload))
    else:
        shape = (
            f"{len(pairs)} length pairs" if pairs else f"{input_lengths.mean:,.0f} in / {output_lengths.mean:,.0f} out"
        )
        title = f"simulated {setup.layout.describe()} on {cluster_spec.name}, {num_prompts} requests of {shape}"
        if acceptance:
            title += f", {acceptance:.2f} tokens kept per speculative step"
        view = report_simulation.results_table(results[0], title=title, baseline=baseline)
        report_table.print_renderable(view)


def _rate_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise SpecError(f"--request-rate takes positive numbers separated by commas, e.g. 2,8 or inf; got {text!r}")
    return values


def _acceptance(layout: Layout, length: float | None, rate: float | None) -> float | None:
    """The mean accepted length from --accept-length or --accept-rate (None without speculative decoding)."""
    if layout.options.spec is None:
        if length is not None or rate is not None:
            raise SpecError("--accept-length and --accept-rate need a launch command with speculative decoding")
        return None
    if length is not None and rate is not None:
        raise SpecError("give --accept-length or --accept-rate, not both")
    if rate is None:
        return length
    drafted = spec_plan(layout.options.spec, block_size=drafter_block(layout.options.spec.draft_model)).drafted
    return accept_length_from_rate(rate, drafted)


def _lengths(
    engine: str, name: str | None, *, isl: int, osl: int, ratio: float | None
) -> tuple[Lengths, Lengths, tuple[tuple[int, int], ...]]:
    """Input and output lengths: a bundled set, a JSONL file, or the engine benchmark's random ranges."""
    if name is not None:
        path = Path(name)
        if path.suffix == ".jsonl" or path.is_file():
            pairs = read_pairs(path)
            return Lengths.fixed(pairs[0][0]), Lengths.fixed(pairs[0][1]), pairs
        input_lengths, output_lengths, _ = bundled_lengths(name)
        return input_lengths, output_lengths, ()
    if ratio is None:
        return Lengths.fixed(isl), Lengths.fixed(osl), ()
    draw_range = Lengths.vllm_random if engine == "vllm" else Lengths.sglang_random
    return draw_range(isl, ratio), draw_range(osl, ratio), ()


@app.command()
def theorise(
    model: Annotated[str, typer.Option(help="Bundled name, config.json path or Hub id.")] = DEFAULT_MODEL,
    gpus: GpusOption = DEFAULT_CLUSTER,
    framework: Annotated[str, typer.Option(help="sglang, vllm or all.")] = "sglang",
    engine_version: VersionOption = None,
    isl: Annotated[int, typer.Option(min=1, help="Input tokens per request.")] = 1024,
    osl: Annotated[int, typer.Option(min=1, help="Output tokens per request.")] = 1024,
    workload: Annotated[
        str | None, typer.Option(help="A bundled length set instead of --isl/--osl (its means): sharegpt.")
    ] = None,
    concurrency: Annotated[
        str, typer.Option(help="Clients to predict at, comma-separated (closed loop).")
    ] = "1,2,4,8,16,32,64,128,256,512",
    objective: Annotated[
        str, typer.Option(help="max-throughput, max-throughput-under-slo (with --tpot-ms/--ttft-ms) or min-latency.")
    ] = "max-throughput",
    tpot_ms: Annotated[float | None, typer.Option(min=0.0, help="SLO: longest mean time per output token, ms.")] = None,
    ttft_ms: Annotated[float | None, typer.Option(min=0.0, help="SLO: longest time to first token, ms.")] = None,
    top: Annotated[int, typer.Option(min=1, help="Setups listed in the ranking.")] = 10,
    accept_length: Annotated[
        float | None, typer.Option(help="Price MTP / DFlash drafting at this mean of tokens kept per step.")
    ] = None,
    profile: ProfileOption = None,
    markdown: Annotated[Path | None, typer.Option(help="Also write the report as Markdown to this file.")] = None,
    html: Annotated[Path | None, typer.Option(help="Also write a self-contained HTML page with charts.")] = None,
    json: JsonFlag = False,
) -> None:
    """The best setup for this model on these GPUs and why: every setup that starts predicted and ranked, the
    winner at each load, what bounds it, why the others lose, the ceiling, what-ifs, what is excluded, and the
    commands. Defaults: the user's case (Kimi K2.6 on 8× RTX PRO 6000 over PCIe, SGLang, 1k in / 1k out)."""
    try:
        goal = Objective(objective)
    except ValueError:
        raise SpecError(
            f"unknown objective {objective!r}; use max-throughput, max-throughput-under-slo or min-latency"
        ) from None
    engines = engine_names() if framework == "all" else [get_engine(framework).name]
    if workload is not None:
        inputs, outputs, _ = bundled_lengths(workload)
        isl, osl = round(inputs.mean), round(outputs.mean)
    levels = _int_list(concurrency, "--concurrency")
    cluster_spec = _with_profile(load_cluster(gpus), profile)
    spec = load_model(model)
    with report_simulation.progress_bar(1, label="predicting setups") as update:
        theory = run_theorise(
            spec, cluster_spec, model_ref=model, engines=engines, isl=isl, osl=osl, concurrency=levels,
            objective=goal, tpot_s=tpot_ms / 1e3 if tpot_ms is not None else None,
            ttft_s=ttft_ms / 1e3 if ttft_ms is not None else None, accept_length=accept_length,
            version=engine_version, progress=lambda done, total: update("predicting setups", done / total),
        )  # fmt: skip
    if markdown is not None:
        report_files.write_text(markdown, report_theory.theory_markdown(theory, top=top))
    if html is not None:
        from shardwise.report.html import theory_html  # imported here: matplotlib takes a while to import

        report_files.write_text(html, theory_html(theory, top=top))
    if json:
        typer.echo(report_json.dumps(report_theory.theory_payload(theory, top=top)))
    else:
        report_table.print_renderable(report_theory.theory_view(theory, top=top))


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
    burstiness: Annotated[
        float, typer.Option(min=0.01, help="Gamma shape of the gaps between requests; 1 is Poisson.")
    ] = 1.0,
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
    levels = _int_list(concurrency, "--concurrency") if concurrency else []
    rates = _rate_list(request_rate) if request_rate else []
    if not levels and not rates:
        raise SpecError("give --concurrency (closed loop, e.g. 1,8,64) or --request-rate (open loop, e.g. 2,8)")
    if not url.startswith(("http://", "https://")):
        raise SpecError(f"--url must start with http:// or https://, e.g. http://localhost:30000; got {url!r}")
    target = Target(url=url, model=model, chat=chat, timeout_s=timeout)
    loads = [(c, math.inf) for c in levels] + [(None, r) for r in rates]
    records = []
    with report_simulation.progress_bar(num_prompts * len(loads), label="benchmarking") as update:
        for n, (c, rate) in enumerate(loads):
            label = f"C={c}" if c else f"{rate:g} req/s"

            def tick(k: int, done: int = n * num_prompts, text: str = label) -> None:
                update(text, done + k)

            level = asyncio.run(run_level(target, isl=isl, osl=osl, num_prompts=num_prompts, concurrency=c,
                                          request_rate=rate, burstiness=burstiness, progress=tick))  # fmt: skip
            record = report_bench.level_record(level, url=url, model=model)
            report_bench.append_record(output, record)
            records.append(record)
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
    json: JsonFlag = False,
) -> None:
    """Predict measurements and report the error per metric and how often the predictions rank setups as the
    measurements do."""
    if files:
        levels = [level for path in files for level in read_results(path)]
        rows = rows_from_results(levels, command=command, gpus=gpus, model=model)
    else:
        rows = list(load_rows())
    checked = [check_row(row) for row in rows]
    summary = summarise(checked)
    ranks = rank_agreement(checked)
    if json:
        typer.echo(report_json.dumps(report_validation.validation_payload(checked, summary, ranks)))
    else:
        report_table.print_renderable(report_validation.validation_view(checked, summary, ranks))


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
    json: JsonFlag = False,
) -> None:
    """Fit named physical constants to measurements of this machine and write a profile that theorise, check
    and simulate take with --profile; report the error before and after, on held-out measurements too."""
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
    report_files.write_text(output, calibration_yaml(report.calibration))
    payload = {
        **report.calibration.model_dump(mode="json"),
        "fitted_error_before": report.fitted_error_before,
        "fitted_error_after": report.fitted_error_after,
        "profile": str(output),
    }
    if json:
        typer.echo(report_json.dumps(payload))
    else:
        report_table.print_renderable(report_validation.calibration_view(payload))


def _with_profile(cluster_spec: ClusterSpec, profile: Path | None) -> ClusterSpec:
    return cluster_spec.calibrated(load_calibration(profile)) if profile else cluster_spec


@app.command()
def layouts(
    model: Annotated[str, typer.Option(help="Bundled name, config.json path or Hub id.")] = DEFAULT_MODEL,
    gpus: GpusOption = DEFAULT_CLUSTER,
    framework: Annotated[str, typer.Option(help="sglang, vllm or all.")] = "sglang",
    engine_version: VersionOption = None,
    isl: Annotated[int, typer.Option(min=1, help="Input tokens per request, for the concurrency that fits.")] = 1024,
    osl: Annotated[int, typer.Option(min=1, help="Output tokens per request.")] = 1024,
    show_all: Annotated[bool, typer.Option("--all", help="Also list layouts that do not fit in memory.")] = False,
    json: JsonFlag = False,
) -> None:
    """The layouts the engine accepts on all of the cluster's GPUs and that fit in memory, with KV capacity and
    launch command (--all for those that do not fit too)."""
    engines = engine_names() if framework == "all" else [framework]
    cluster_spec = load_cluster(gpus)
    spec = load_model(model)
    payload = []
    for name in engines:
        found = list_layouts(model, cluster_spec, engine=name, version=None if framework == "all" else engine_version)
        engine = get_engine(name)
        rows = [
            (
                s,
                engine.launch_command(s, model_ref=model_reference(model), remote_code=spec.remote_code),
                memory_ledger(spec, s.layout, cluster_spec),
            )
            for s in found
            if s.layout is not None
        ]
        shown = rows if show_all else [row for row in rows if row[2].verdict == "ok"]
        if json:
            payload += report_setups.layouts_payload(shown, spec, isl=isl, osl=osl)
        else:
            fitting = sum(memory.verdict == "ok" for _, _, memory in rows)
            title = (
                f"{len(rows)} {name} layouts of {model} on {cluster_spec.name} pass the engine's checks; {fitting} fit "
                "in memory" + ("" if show_all else " (--all lists the others)")
            )
            report_table.print_renderable(report_setups.layouts_table(shown, title=title, isl=isl, osl=osl))
    if json:
        typer.echo(report_json.dumps(payload))


def main() -> None:
    """Console entry point: every user error becomes one line on stderr; exit 2 for bad input."""
    try:
        code = app(standalone_mode=False)  # returns the code of typer.Exit, None on success
    except ShardwiseError as exc:
        if _state["debug"]:
            raise
        _one_line(str(exc))
        sys.exit(2)
    except typer.Abort:
        sys.exit(130)
    except Exception as exc:
        if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
            raise  # not a usage error of the command line: a bug, shown as one
        _one_line(exc.format_message())  # bad option, bad value, missing argument
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


def _one_line(message: str) -> None:
    Console(stderr=True).print(Text("error: ", style="red") + Text(" ".join(message.split())), soft_wrap=True)
