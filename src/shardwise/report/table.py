"""Rich tables for people: the only place that formats numbers for display."""

from __future__ import annotations

import shlex

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from shardwise.cost.comm import CollectiveCost
from shardwise.engines.flags import command_text
from shardwise.hardware.profile import GpuProfile
from shardwise.spec.catalog import CatalogEntry
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import WeightLedger
from shardwise.units import format_bytes, format_count, format_rate, format_time


def models_table(rows: list[tuple[CatalogEntry, ModelSpec, WeightLedger]]) -> Table:
    table = Table(
        title="Bundled models (any config.json path or Hub id works too); KV/token: every layer's cache of one token "
        "(sparse attention's indexer keys included), state/seq: the fixed linear-attention state of one sequence",
        title_justify="left",
    )
    numbers = ("params", "active", "weights", "KV/token", "state/seq")
    for col in ("name", "Hugging Face repo", "family", *numbers, "config"):
        table.add_column(col, justify="right" if col in numbers else "left")
    for entry, model, ledger in rows:
        table.add_row(
            entry.alias,
            entry.repo,
            model.family,
            format_count(ledger.total_params),
            format_count(ledger.active_params),
            format_bytes(ledger.total_bytes),
            f"{model.kv_bytes_per_token:,.0f} B",
            format_bytes(model.linear_state_bytes) if model.linear_state_bytes else "-",
            entry.provenance,
        )
    return table


def gpus_table(gpus: list[GpuProfile]) -> Table:
    table = Table(
        title="GPUs (dense tensor peaks; `shardwise gpus --json` gives every figure with its source)",
        title_justify="left",
    )
    for col in ("name", "memory", "usable", "mem BW spec", "mem BW meas.", "BF16", "FP8", "FP4", "GPU link", "P2P"):
        table.add_column(col, justify="left" if col in ("name", "GPU link", "P2P") else "right")
    for gpu in gpus:

        def tflops(dtype: str, g: GpuProfile = gpu) -> str:
            flops = g.dense_flops_per_s(dtype)
            return f"{flops / 1e12:,.0f}" if flops else "—"

        measured = gpu.mem_bandwidth_measured_bytes_per_s
        table.add_row(
            gpu.name,
            f"{gpu.memory.value:g} {gpu.memory.unit}",
            format_bytes(gpu.memory_bytes, binary=True),
            format_rate(gpu.mem_bandwidth_bytes_per_s),
            format_rate(measured) if measured else "—",
            tflops("bf16"),
            tflops("fp8"),
            tflops("fp4"),
            str(gpu.gpu_link.value),
            "yes" if gpu.p2p.value else "no",
        )
    return table


def _model_summary(model: ModelSpec, ledger: WeightLedger, entry: CatalogEntry | None) -> Text:
    att, moe = model.attention, model.moe
    lines = [
        f"[bold]{model.name}[/bold]" + (f"  ({entry.repo}, config {entry.provenance})" if entry else ""),
        f"architecture {model.architecture} → read as '{model.family}'"
        + ("  [yellow](unknown architecture: read with the generic reader)[/yellow]" if model.generic else ""),
    ]
    if att.kind == "mla" and att.mla:
        lines.append(
            f"attention MLA: {att.num_heads} heads, KV latent {att.mla.kv_lora_rank} + RoPE "
            f"{att.mla.qk_rope_head_dim} (one latent per token, shared by all heads)"
        )
    else:
        lines.append(f"attention GQA: {att.num_heads} query heads, {att.num_kv_heads} KV heads of {att.head_dim}")
    kinds = {k: model.layer_attention.count(k) for k in ("full", "sliding", "linear") if k in model.layer_attention}
    lines.append(
        f"{model.num_layers} layers: "
        + ", ".join(f"{n} {k}" for k, n in kinds.items())
        + f"; {model.num_moe_layers} MoE, {model.num_layers - model.num_moe_layers} dense"
    )
    if moe:
        shared = f" + {moe.num_shared_experts} shared" if moe.num_shared_experts else ""
        lines.append(
            f"experts: {moe.num_experts} routed, top-{moe.top_k}{shared}, width {moe.expert_intermediate_size}"
        )
    lines.append(
        f"params {format_count(ledger.total_params)} total, {format_count(ledger.active_params)} active "
        f"per token; weights {format_bytes(ledger.total_bytes)} ({ledger.total_bytes / 2**30:,.1f} GiB), "
        f"quantization: {model.quant.method}"
    )
    kv = f"KV cache {model.kv_bytes_per_token:,.0f} B/token ({model.kv_dtype})"
    if model.sliding_window:
        kv += (
            f"; sliding layers keep only {model.sliding_window} tokens, so past the window a token costs "
            f"{model.kv_bytes_per_token_beyond_window:,.0f} B"
        )
    if model.linear_state_bytes:
        kv += f"; linear-attention state {format_bytes(model.linear_state_bytes)} per sequence"
    if model.attention.sparse is not None:
        sparse = model.attention.sparse
        kv += (
            f"; sparse attention: each query reads the {sparse.top_k:,} cached tokens its indexer picks "
            f"({sparse.num_heads} heads of {sparse.head_dim}; {len(sparse.layers)} of {model.num_layers} layers run "
            f"one and keep {sparse.key_bytes:,.0f} B of indexer key per token, "
            f"{model.index_bytes_per_token():,.0f} B in all)"
        )
    lines.append(kv)
    if ledger.mtp_params:
        lines.append(
            f"MTP draft layers: {model.num_mtp_layers} ({format_count(ledger.mtp_params)}, "
            f"{format_bytes(ledger.mtp_bytes)}; loaded only for MTP speculative decoding)"
        )
    return Text.from_markup("\n".join(lines))


def inspect_view(model: ModelSpec, ledger: WeightLedger, entry: CatalogEntry | None) -> Group:
    table = Table(title_justify="left")
    for col in ("component", "params", "active", "bytes", "share", "format"):
        table.add_column(col, justify="left" if col in ("component", "format") else "right")
    total = ledger.total_bytes
    for c in ledger.components:
        table.add_row(
            c.name,
            format_count(c.params),
            format_count(c.active_params),
            format_bytes(c.bytes),
            f"{100 * c.bytes / total:.1f}%",
            ", ".join(c.formats),
        )
    table.add_section()
    table.add_row(
        "total", format_count(ledger.total_params), format_count(ledger.active_params), format_bytes(total), "100%", ""
    )
    return Group(_model_summary(model, ledger, entry), table)


def cluster_view(cluster: ClusterSpec, costs: list[CollectiveCost], sizes: list[float]) -> Group:
    """The cluster's GPUs and links, and a table of `costs`: one block of a cost per size for each collective, group
    and implementation asked for, in that order."""
    gpu, intra = cluster.gpu, cluster.intra
    lines = [
        f"[bold]{cluster.name}[/bold]: {cluster.nodes} node(s) × {cluster.gpus_per_node} {gpu.display_name} "
        f"= {cluster.num_gpus} GPUs, {format_bytes(gpu.memory_bytes * cluster.num_gpus, binary=True)} usable in all",
        f"inside a node: {intra.link.display_name}, P2P {'on' if intra.p2p else 'off'}"
        + (f", {intra.numa_nodes} NUMA nodes" if intra.numa_nodes > 1 else "")
        + f"; collective bandwidth {format_rate(intra.link.collective_bandwidth_bytes_per_s)} per GPU",
    ]
    if cluster.inter:
        note = " (assumed; give a cluster YAML to change)" if cluster.inter.assumed else ""
        lines.append(
            f"between nodes: {cluster.inter.network.display_name}, {cluster.inter.nics_per_node} NICs per node, "
            f"{format_rate(cluster.network_bytes_per_s_per_gpu or 0)} per GPU{note}"
        )
    lines.append(
        "collectives: "
        + (
            f"measured tables '{cluster.collectives.name}' where they cover a group, α–β elsewhere"
            if cluster.collectives
            else "α–β model from the link figures"
        )
    )
    table = Table(title="collective time by message size (nccl-tests size convention)", title_justify="left")
    table.add_column("collective")
    table.add_column("GPUs", justify="right")
    for size in sizes:
        table.add_column(format_bytes(size, binary=True), justify="right")
    table.add_column("from")
    # one row per collective, group and implementation asked for, a cost per size: a custom all-reduce hands
    # messages past its limit to NCCL, so a row is custom where any of its sizes ran custom
    for start in range(0, len(costs), len(sizes)):
        row = costs[start : start + len(sizes)]
        impl = "custom" if any(c.impl == "custom" for c in row) else row[0].impl
        label = row[0].op.value + ("" if impl == "nccl" else f" ({impl})")
        table.add_row(label, str(row[0].n_gpus), *(format_time(c.time_s) for c in row), row[0].method)
    return Group(Text.from_markup("\n".join(lines)), table)


class ShellLine:
    """A shell line that pastes whole at any width: a command wraps at the console's width with backslash
    continuations (an option stays beside its value; no word is split), a comment stays as it is."""

    def __init__(self, line: str, *, indent: int = 2) -> None:
        self.line, self.indent = line, indent

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        pad = " " * self.indent
        for text in shell_wrap(self.line, options.max_width - self.indent):
            yield Text(pad + text, no_wrap=True, overflow="ignore")


def shell_wrap(line: str, width: int) -> list[str]:
    """`line` as shell lines of at most `width` characters where the words allow, joined by `\\` (a word longer
    than the width gets a line of its own, whole). Continuations are indented by four spaces."""
    if line.startswith("#") or len(line) <= width:
        return [line]
    words = [command_text([w]) for w in shlex.split(line)]
    units: list[str] = []  # an option with its value, or a word
    for word in words:
        if units and units[-1].startswith("-") and " " not in units[-1] and not word.startswith("-"):
            units[-1] += " " + word
        else:
            units.append(word)
    lines, current = [], ""
    for unit in units:
        lead = "    " if lines else ""
        if current and len(lead + current + " " + unit + " \\") > width:
            lines.append(lead + current + " \\")
            current = unit
        else:
            current = f"{current} {unit}" if current else unit
    lines.append(("    " if lines else "") + current)
    return lines


def print_renderable(renderable: object, *, console: Console | None = None) -> None:
    """Print for people, never cutting a word: a table wider than the console drops its outer edge, one that still
    does not fit is printed at its least width (a terminal wraps its lines; a file keeps them), and its cells wrap
    between words. A group's parts are printed so, one after another."""
    console = console or Console()
    if isinstance(renderable, Group):
        for part in renderable.renderables:
            print_renderable(part, console=console)
        return
    if isinstance(renderable, Table) and _measure(console, renderable).minimum > console.width:
        renderable.show_edge = False
        need = _measure(console, renderable).minimum
        if need > console.width:
            console = Console(
                width=need, file=console.file, force_terminal=console.is_terminal, color_system=console.color_system
            )
    if isinstance(renderable, Table) and _measure(console, renderable).maximum > console.width:
        _keep_words_whole(console, renderable)
    console.print(renderable)


def _measure(console: Console, renderable: object) -> Measurement:
    """Its least width (every column at its longest word) and its widest (no cell wrapped)."""
    return Measurement.get(console, console.options.update(width=10_000), renderable)


def _keep_words_whole(console: Console, table: Table) -> None:
    """Rich narrows the widest columns first, to a common width, and cuts the words of a column narrowed below its
    longest. Where it would, fix the columns' widths as it would narrow them, but none below its longest word."""
    spans = []  # each column's (longest word, longest line)
    for column in table.columns:
        sizes = [_measure(console, cell) for cell in [column.header, *column.cells]]
        spans.append((max(s.minimum for s in sizes), max(s.maximum for s in sizes)))
    room = console.width - (_measure(console, table).minimum - sum(least for least, _ in spans))  # less rules, padding

    def widths(cap: int) -> list[int]:
        return [max(least, min(most, cap)) for least, most in spans]

    cap = max(most for _, most in spans)
    while cap > 1 and sum(widths(cap)) > room:
        cap -= 1
    if all(least <= cap for least, most in spans if most > cap):
        return  # rich's own widths keep every word whole
    spare = room - sum(widths(cap))
    for column, width, (_, most) in zip(table.columns, widths(cap), spans, strict=True):
        extra = int(spare > 0 and width == cap < most)  # what is left, a character each to the narrowed columns
        column.width, spare = width + extra, spare - extra
