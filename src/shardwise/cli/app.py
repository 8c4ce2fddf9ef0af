"""The command-line app, its shared options and helpers, and the entry point that turns every user error into
one line on stderr."""

from __future__ import annotations

import gc
import inspect
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup

from shardwise.engines.layout import Layout
from shardwise.errors import ShardwiseError, SpecError
from shardwise.hardware.calibration import load_calibration
from shardwise.serve.speculative import accept_length_from_rate, spec_plan
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.drafter import drafter_block
from shardwise.spec.workload import Lengths, WorkloadSpec, dataset, read_pairs

if TYPE_CHECKING:
    import click  # typer's own: its commands are click commands


class _Commands(TyperGroup):
    """The app's commands, each listed with its docstring's first paragraph as one line, for rich to reflow at the
    console's width (in the list of commands it keeps the docstring's own line breaks, mid-sentence)."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None and command.help and command.short_help is None:
            command.short_help = " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split())
        return command


app = typer.Typer(
    cls=_Commands,
    help="What is the best way to serve this LLM on these GPUs, and why.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON (SI units) instead of tables.")]
DecodeOnlyFlag = Annotated[
    bool,
    typer.Option(
        "--decode-only",
        help="Every prompt is in the KV cache already (a decode benchmark): price the decode steps only.",
    ),
]
_state = {"debug": False}


@app.callback()
def _options(debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")] = False) -> None:
    _state["debug"] = debug


def int_list(text: str, option: str) -> list[int]:
    """'1,8,64' → [1, 8, 64]; anything else is one clear error."""
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise SpecError(f"{option} takes positive whole numbers separated by commas, e.g. 1,8,64; got {text!r}")
    return values


GpusOption = Annotated[str, typer.Option("--gpus", help="Cluster: 8xrtx-pro-6000, 2x8xh100, or a cluster YAML file.")]
ProfileOption = Annotated[
    Path | None, typer.Option("--profile", help="A calibration profile written by `shardwise calibrate`.")
]
ModelOption = Annotated[str, typer.Option(help="Bundled name, config.json path or Hub id.")]
FrameworkOption = Annotated[str, typer.Option(help="sglang, vllm or all.")]
IslOption = Annotated[int, typer.Option(min=1, help="Input tokens per request.")]
OslOption = Annotated[int, typer.Option(min=1, help="Output tokens per request.")]
BurstinessOption = Annotated[
    float, typer.Option(min=0.01, help="Gamma shape of the gaps between requests; 1 is Poisson.")
]
RequestRateOption = Annotated[
    str | None,
    typer.Option(help="Requests per second of an open loop, comma-separated: one run each; inf sends all at once."),
]
RangeRatioOption = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        max=1.0,
        help="Random lengths, as the engine's benchmark tool draws them with --random-range-ratio "
        "(SGLang: from ratio × len to len; vLLM: from (1 − ratio) × len to (1 + ratio) × len); default: fixed.",
    ),
]
LengthsOption = Annotated[
    str | None,
    typer.Option(
        help="Request lengths instead of --isl/--osl: a bundled dataset (sharegpt, sharegpt-sglang; sampled and "
        "filtered as the benchmark tools do), or a JSONL file of {input_tokens, output_tokens} per line."
    ),
]
SeedOption = Annotated[int, typer.Option(help="Seed of the sampled lengths and arrivals.")]
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


def loads_of(concurrency: str | None, request_rate: str | None) -> list[tuple[int | None, float]]:
    """(clients, requests per second) of each level: closed loops first, then open ones."""
    levels = int_list(concurrency, "--concurrency") if concurrency else []
    rates = rate_list(request_rate) if request_rate else []
    if not levels and not rates:
        raise SpecError("give --concurrency (closed loop, e.g. 1,16,64) or --request-rate (open loop, e.g. 2,8)")
    return [(c, math.inf) for c in levels] + [(None, r) for r in rates]


def rate_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise SpecError(f"--request-rate takes positive numbers separated by commas, e.g. 2,8 or inf; got {text!r}")
    return values


def mean_accept_length(layout: Layout, length: float | None, rate: float | None) -> float | None:
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


def lengths_of(
    engine: str, name: str | None, *, isl: int, osl: int, ratio: float | None, num_prompts: int, seed: int
) -> tuple[Lengths, Lengths, tuple[tuple[int, int], ...]]:
    """Input and output lengths: a bundled dataset (sampled as the benchmark tools sample it), a JSONL file,
    or the engine benchmark's random ranges. With pairs, the ranges say what the pairs span."""
    if name is not None:
        path = Path(name)
        pairs = (
            read_pairs(path) if path.suffix == ".jsonl" or path.is_file() else dataset(name).sample(num_prompts, seed)
        )
        inputs, outputs = [i for i, _ in pairs], [o for _, o in pairs]
        return Lengths(low=min(inputs), high=max(inputs)), Lengths(low=min(outputs), high=max(outputs)), pairs
    if ratio is None:
        return Lengths.fixed(isl), Lengths.fixed(osl), ()
    draw_range = Lengths.vllm_random if engine == "vllm" else Lengths.sglang_random
    return draw_range(isl, ratio), draw_range(osl, ratio), ()


def workloads_of(
    engine: str,
    *,
    concurrency: str | None,
    request_rate: str | None,
    lengths: str | None,
    isl: int,
    osl: int,
    range_ratio: float | None,
    num_prompts: int,
    burstiness: float,
    seed: int,
    decode_only: bool,
) -> list[WorkloadSpec]:
    """One workload per load level, as the benchmark tools would send it (each with the lengths it draws from)."""
    inputs, outputs, pairs = lengths_of(
        engine, lengths, isl=isl, osl=osl, ratio=range_ratio, num_prompts=num_prompts, seed=seed
    )
    workloads = [
        WorkloadSpec(
            input=inputs,
            output=outputs,
            pairs=pairs,
            num_requests=num_prompts,
            concurrency=c,
            request_rate=r,
            burstiness=burstiness,
            seed=seed,
            decode_only=decode_only,
        )
        for c, r in loads_of(concurrency, request_rate)
    ]
    return workloads


def with_profile(cluster_spec: ClusterSpec, profile: Path | None) -> ClusterSpec:
    return cluster_spec.calibrated(load_calibration(profile)) if profile else cluster_spec


def main() -> None:
    """Console entry point: every user error becomes one line on stderr; exit 2 for bad input. It ends the process
    (`sys.exit`), and freezes the objects on its way out: the process lets go of them all at once, and the collector's
    last walk over them at exit would find nothing to free (0.6 s after a search of 64 GPUs)."""
    try:
        _run()
    finally:
        gc.freeze()


def _run() -> None:
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
