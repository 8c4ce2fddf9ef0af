"""Commands that predict serving: simulate a launch command under load, theorise the best setup."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
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
    IslOption,
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
    loads_of,
    mean_accept_length,
    with_profile,
    workloads_of,
)
from shardwise.cost.book import PriceBook
from shardwise.cost.memory import memory_ledger
from shardwise.decide.economics import Pricing
from shardwise.decide.rank import OBJECTIVES, Objective
from shardwise.decide.theory import SCREEN_LEVELS
from shardwise.decide.theory import theorise as run_theorise
from shardwise.engines.base import engine_names, get_engine
from shardwise.engines.check import check_command, model_reference, without_speculative
from shardwise.errors import SpecError
from shardwise.report import files as report_files
from shardwise.report import json as report_json
from shardwise.report import simulation as report_simulation
from shardwise.report import table as report_table
from shardwise.report import theory as report_theory
from shardwise.serve.simulate import ServeResult
from shardwise.serve.simulate import simulate as run_simulation
from shardwise.serve.steps import StepTimes
from shardwise.spec.catalog import DEFAULT_MODEL, load_model
from shardwise.spec.cluster import DEFAULT_CLUSTER, load_cluster
from shardwise.spec.workload import dataset


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def simulate(
    ctx: typer.Context,
    model: CommandModel = None,
    gpus: GpusOption = DEFAULT_CLUSTER,
    engine_version: VersionOption = None,
    concurrency: Annotated[
        str | None, typer.Option(help="Clients of a closed loop, comma-separated: one run each (--max-concurrency).")
    ] = None,
    request_rate: RequestRateOption = None,
    burstiness: BurstinessOption = 1.0,
    isl: IslOption = 1024,
    osl: OslOption = 1024,
    range_ratio: RangeRatioOption = None,
    lengths: LengthsOption = None,
    num_prompts: Annotated[int, typer.Option(min=1, help="Requests per run.")] = 1000,
    accept_length: AcceptLength = None,
    accept_rate: AcceptRate = None,
    seed: SeedOption = 0,
    decode_only: DecodeOnlyFlag = False,
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
    loads_of(concurrency, request_rate)  # a missing or malformed load is the first thing to say
    cluster_spec = with_profile(load_cluster(gpus), profile)
    checked = check_command(ctx.args, cluster=cluster_spec, model=model, version=engine_version)
    setup = checked.setup
    if setup.layout is None or not setup.valid:
        reason = setup.rejections[0].reason if setup.rejections else "the command describes no layout"
        raise SpecError(f"this setup would not start: {reason}")
    book = PriceBook()  # one price book for the simulation
    memory = memory_ledger(checked.model, setup.layout, cluster_spec, book=book)
    if memory.verdict != "ok":
        raise SpecError(f"this setup would not start: {memory.reason or memory.verdict}")
    acceptance = mean_accept_length(setup.layout, accept_length, accept_rate)
    steps = StepTimes(checked.model, setup.layout, cluster_spec, accept_length=acceptance, book=book)
    workloads = workloads_of(
        setup.engine,
        concurrency=concurrency,
        request_rate=request_rate,
        lengths=lengths,
        isl=isl,
        osl=osl,
        range_ratio=range_ratio,
        num_prompts=num_prompts,
        burstiness=burstiness,
        seed=seed,
        decode_only=decode_only,
    )
    runs = [(steps, memory)]
    if acceptance is not None:  # the same command without drafting, to say what speculative decoding gains
        plain = check_command(without_speculative(ctx.args), cluster=cluster_spec, model=model, version=engine_version)
        assert plain.setup.layout is not None
        plain_memory = memory_ledger(plain.model, plain.setup.layout, cluster_spec, book=book)
        runs.append((StepTimes(plain.model, plain.setup.layout, cluster_spec, book=book), plain_memory))
    results: list[list[ServeResult]] = [[] for _ in runs]
    with report_simulation.progress_bar(num_prompts * len(workloads) * len(runs), label="simulating") as update:
        for n, (workload, (run_steps, run_memory)) in enumerate(itertools.product(workloads, runs)):
            label = f"C={workload.concurrency}" if workload.concurrency else f"{workload.request_rate:g} req/s"
            if workload.concurrency is None and math.isinf(workload.request_rate):
                label = "burst"

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
            "workload": {
                "input": workloads[0].input.model_dump(),
                "output": workloads[0].output.model_dump(),
                "pairs": len(workloads[0].pairs),
                "num_prompts": num_prompts,
                "burstiness": burstiness,
                "seed": seed,
                "decode_only": decode_only,
            },
            "accept_length": acceptance,
            "results": report_simulation.results_payload(results[0], baseline),
        }
        typer.echo(report_json.dumps(payload))
    else:
        mean_in, mean_out = workloads[0].mean_lengths
        shape = f"{mean_in:,.0f} in / {mean_out:,.0f} out"
        if workloads[0].pairs:
            shape = f"{lengths} lengths (mean {shape})"
        title = f"simulated {setup.layout.describe()} on {cluster_spec.name}, {num_prompts} requests of {shape}"
        if acceptance:
            title += f", {acceptance:.2f} tokens kept per speculative step"
        view = report_simulation.results_table(results[0], title=title, baseline=baseline)
        report_table.print_renderable(view)


LEVELS_TEXT = ",".join(map(str, SCREEN_LEVELS))


@app.command()
def theorise(
    model: ModelOption = DEFAULT_MODEL,
    gpus: GpusOption = DEFAULT_CLUSTER,
    framework: FrameworkOption = "sglang",
    engine_version: VersionOption = None,
    isl: IslOption = 1024,
    osl: OslOption = 1024,
    workload: Annotated[
        str | None, typer.Option(help="A bundled length set instead of --isl/--osl (its means): sharegpt.")
    ] = None,
    concurrency: Annotated[
        str | None,
        typer.Option(
            help=f"Clients to predict at, comma-separated (closed loop); default {LEVELS_TEXT} and on, "
            "doubling, until every setup's KV pool binds."
        ),
    ] = None,
    lengths: LengthsOption = None,
    request_rate: RequestRateOption = None,
    num_prompts: Annotated[
        int | None, typer.Option(min=1, help="Requests per benchmark run (the tools' default: 1000).")
    ] = None,
    range_ratio: RangeRatioOption = None,
    burstiness: BurstinessOption = 1.0,
    seed: SeedOption = 0,
    objective: Annotated[
        str,
        typer.Option(
            help="max-throughput, max-throughput-under-slo (with --tpot-ms/--ttft-ms), min-latency, min-cost (USD per "
            "million output tokens) or max-tokens-per-watt."
        ),
    ] = "max-throughput",
    gpu_hour_usd: Annotated[
        float | None,
        typer.Option(min=0.0, help="USD per GPU-hour to price at (default: the GPU's published price)."),
    ] = None,
    kwh_usd: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="USD per kWh: add the estimated energy to the hourly cost (an owned box; a rental price includes it).",
        ),
    ] = None,
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
    commands. Defaults: the user's case (Kimi K2.6 on 8× RTX PRO 6000 over PCIe, SGLang, 1k in / 1k out).
    With a benchmark's workload (--lengths, --request-rate, --num-prompts or --range-ratio) the best setups of
    the steady-state screen are also simulated as the benchmark would send it (by default every prompt at once,
    as the tools do; --request-rate for an open loop; --concurrency given for closed loops) and ranked again."""
    try:
        goal = Objective(objective)
    except ValueError:
        raise SpecError(f"unknown objective {objective!r}; use {OBJECTIVES}") from None
    pricing = Pricing(gpu_hour_usd=gpu_hour_usd, kwh_usd=kwh_usd)
    engines = engine_names() if framework == "all" else [get_engine(framework).name]
    if workload is not None:
        mean_in, mean_out = dataset(workload).means
        isl, osl = round(mean_in), round(mean_out)
    levels = int_list(concurrency, "--concurrency") if concurrency else None  # None: until saturation
    workloads = []
    if lengths is not None or request_rate is not None or num_prompts is not None or range_ratio is not None:
        lengths = lengths or workload  # a bundled set named either way is drawn from, request by request
        if range_ratio is not None and len(engines) > 1:
            raise SpecError(
                "--range-ratio draws lengths differently in SGLang ([ratio × len, len]) and vLLM "
                "(len × [1 − ratio, 1 + ratio]); give --framework sglang or --framework vllm with it"
            )
        workloads = workloads_of(
            engines[0],
            concurrency=concurrency,
            request_rate=request_rate or (None if concurrency else "inf"),
            lengths=lengths,
            isl=isl,
            osl=osl,
            range_ratio=range_ratio,
            num_prompts=num_prompts or 1000,
            burstiness=burstiness,
            seed=seed,
            decode_only=False,
        )
        if workloads[0].pairs:  # the screen prices the dataset's mean lengths
            isl, osl = (round(mean) for mean in workloads[0].mean_lengths)
    cluster_spec = with_profile(load_cluster(gpus), profile)
    spec = load_model(model)
    with report_simulation.progress_bar(1, label="predicting setups") as update:
        theory = run_theorise(
            spec,
            cluster_spec,
            model_ref=model,
            engines=engines,
            isl=isl,
            osl=osl,
            concurrency=levels,
            objective=goal,
            tpot_s=tpot_ms / 1e3 if tpot_ms is not None else None,
            ttft_s=ttft_ms / 1e3 if ttft_ms is not None else None,
            accept_length=accept_length,
            version=engine_version,
            workloads=workloads,
            lengths=lengths,
            range_ratio=range_ratio,
            progress=lambda done, total: update("predicting setups", done / total),
            pricing=pricing,
        )
    if markdown is not None:
        report_files.write_text(markdown, report_theory.theory_markdown(theory, top=top))
    if html is not None:
        from shardwise.report.html import theory_html  # imported here: matplotlib takes a while to import

        report_files.write_text(html, theory_html(theory, top=top))
    if json:
        typer.echo(report_json.dumps(report_theory.theory_payload(theory, top=top)))
    else:
        report_table.print_renderable(report_theory.theory_view(theory, top=top))
