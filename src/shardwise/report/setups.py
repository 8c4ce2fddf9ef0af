"""How engine setups are shown: `check` verdicts and `layouts` lists, as rich views and as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from shardwise.cost.memory import MemoryLedger
from shardwise.engines.base import Setup
from shardwise.engines.flags import command_text
from shardwise.engines.layout import Layout, groups, splits
from shardwise.ops.collectives import comm_steps
from shardwise.spec.model import ModelSpec

GiB = 2**30


def verdict(setup: Setup, memory: MemoryLedger | None = None) -> str:
    """invalid (the engine refuses the flags), oom (weights do not load), no_kv_room, or ok."""
    if not setup.valid:
        return "invalid"
    return memory.verdict if memory else "ok"


def memory_payload(memory: MemoryLedger, *, isl: int, osl: int) -> dict[str, Any]:
    return {
        "verdict": memory.verdict,
        "reason": memory.reason,
        "engine_error": memory.engine_error,
        "per_gpu": [
            {**row.model_dump(), "other_bytes": row.other_bytes, "free_bytes": row.free_bytes} for row in memory.per_gpu
        ],
        "weights_by_component_bytes": memory.weights_by_component_bytes,
        "kv_bytes_per_token_per_gpu": memory.kv_bytes_per_token,
        "kv_tokens_per_rank": memory.kv_tokens_per_rank,
        "kv_tokens": memory.kv_tokens_total,
        "kv_pools": memory.ranks,
        "max_running_requests_per_rank": memory.max_running_requests_per_rank,
        "isl": isl,
        "osl": osl,
        "max_concurrency": memory.max_concurrency(isl=isl, osl=osl),
        "warnings": list(memory.warnings),
    }


def layout_payload(layout: Layout, model: ModelSpec) -> dict[str, Any]:
    return {
        **layout.model_dump(mode="json"),
        "description": layout.describe(),
        "groups": groups(layout),
        "splits": [s.model_dump() for s in splits(layout, model)],
        "collectives": [{**asdict(c), "op": c.op.value} for c in comm_steps(layout, model)],
    }


def check_payload(
    setup: Setup,
    model: ModelSpec,
    launch: list[list[str]] | None,
    memory: MemoryLedger | None = None,
    *,
    isl: int = 1024,
    osl: int = 1024,
) -> dict[str, Any]:
    first = setup.rejections[0] if setup.rejections else None
    reason = first.reason if first else (memory.reason if memory else None)
    error = first.engine_error if first else (memory.engine_error if memory else None)
    return {
        "verdict": verdict(setup, memory),
        "engine": setup.engine,
        "version": setup.version,
        "model": model.name,
        "gpus_used": setup.gpus_used,
        "gpus_available": setup.gpus_available,
        "reason": reason,
        "engine_error": error,
        "rejections": [r.model_dump() for r in setup.rejections],
        "warnings": [n.message for n in setup.notes if n.kind == "warning"],
        "rewrites": [n.model_dump() for n in setup.notes if n.kind != "warning"],
        "given_flags": setup.given,
        "effective_flags": setup.flags,
        "layout": layout_payload(setup.layout, model) if setup.layout else None,
        "launch_command": command_text(launch[0]) if launch else None,
        "launch_per_node": [command_text(c) for c in launch] if launch else None,
        "memory": memory_payload(memory, isl=isl, osl=osl) if memory else None,
    }


WHEN = {
    "arguments": "fails while resolving its arguments, before any weight loads",
    "load": "fails while building or loading the model",
    "run": "fails or hangs at its first steps",
}


def check_view(
    setup: Setup, model: ModelSpec, memory: MemoryLedger | None = None, *, isl: int = 1024, osl: int = 1024
) -> Group:
    parts: list[Any] = []
    if memory and memory.verdict != "ok":
        head = Text(memory.verdict.replace("_", " "), style="bold red")
        head.append(
            f"  {setup.engine} {setup.version} accepts the flags but will not start: {memory.reason}", style="default"
        )
    elif setup.valid:
        head = Text("ok", style="bold green")
        head.append(
            f"  {setup.engine} {setup.version} starts this on {setup.gpus_used} of {setup.gpus_available} GPUs"
            f" as {setup.layout.describe() if setup.layout else '?'}",
            style="default",
        )
    else:
        head = Text("invalid", style="bold red")
        head.append(f"  {setup.engine} {setup.version} will not start this", style="default")
    parts.append(head)
    for r in setup.rejections:
        parts.append(Text(f"  ✗ {r.reason}", style="red"))
        if r.engine_error:
            parts.append(Text(f"    the engine says: {' '.join(r.engine_error.split())}", style="dim"))  # one line
        parts.append(Text(f"    checked in: {r.source}; {WHEN[r.stage]}", style="dim"))
    for note in setup.notes:
        style = "yellow" if note.kind == "warning" else "cyan"
        parts.append(Text(f"  {'!' if note.kind == 'warning' else '→'} {note.message}", style=style))
    if memory:
        if memory.engine_error:
            parts.append(Text(f"    the engine says: {memory.engine_error}", style="dim"))
        parts.extend(Text(f"  ! {w}", style="yellow") for w in memory.warnings)
        parts.append(_memory_table(memory))
        if memory.verdict == "ok":
            parts.append(_kv_summary(memory, isl=isl, osl=osl))
    if setup.layout:
        parts.append(_placement_table(setup.layout, model))
        parts.append(_collectives_table(setup.layout, model))
    return Group(*parts)


def _memory_table(memory: MemoryLedger) -> Table:
    table = Table(title="memory per GPU (GiB = 2^30 bytes)", title_justify="left")
    states = bool(memory.state_pool_bytes)
    kv = "KV cache + states" if states else "KV cache"
    for col in ("GPU", "stage", "capacity", "weights", kv, "runtime", "activations", "CUDA graphs", "free"):
        table.add_column(col, justify="right")
    rows = memory.per_gpu
    shown = rows if len(rows) <= 16 else [r for r in rows if r.gpu % max(1, len(rows) // 8) == 0]
    for r in shown:
        table.add_row(
            str(r.gpu),
            str(r.stage),
            *(
                f"{v / GiB:,.2f}"
                for v in (
                    r.capacity_bytes,
                    r.weights_bytes,
                    r.kv_bytes + r.state_bytes,
                    r.runtime_bytes,
                    r.activation_bytes,
                    r.cuda_graph_bytes,
                    r.free_bytes,
                )
            ),
        )
    return table


def _kv_summary(memory: MemoryLedger, *, isl: int, osl: int) -> Text:
    pools = f" in each of {memory.ranks} pools ({memory.kv_tokens_total:,} in all)" if memory.ranks > 1 else ""
    slots = (
        f", at most {memory.max_running_requests_per_rank:,} running per pool"
        if memory.max_running_requests_per_rank
        else ""
    )
    states = (
        f"; linear-attention states: {memory.state_slots_per_rank:,} slots of "
        f"{memory.state_bytes_per_request / 2**20:,.1f} MiB per GPU ({memory.state_pool_bytes / GiB:,.1f} GiB)"
        if memory.state_slots_per_rank is not None
        else ""
    )
    return Text(
        f"  KV cache: {memory.kv_tokens_per_rank:,} tokens{pools} at {memory.kv_bytes_per_token:,.0f} B per "
        f"token per GPU{slots}{states}; {memory.max_concurrency(isl=isl, osl=osl):,} requests of {isl} + {osl} "
        "tokens fit at once"
    )


def _placement_table(layout: Layout, model: ModelSpec) -> Table:
    table = Table(title=f"placement in each pipeline stage ({layout.stage_gpus} GPUs)", title_justify="left")
    table.add_column("component")
    table.add_column("split", justify="right")
    table.add_column("how")
    for s in splits(layout, model):
        table.add_row(s.component, f"÷{s.ways}" if s.ways > 1 else "full copy", s.how)
    return table


def _collectives_table(layout: Layout, model: ModelSpec) -> Table:
    table = Table(title="collectives in one forward step", title_justify="left")
    for col in ("where", "collective", "group", "GPUs", "how often", "bytes/token"):
        table.add_column(col, justify="right" if col in ("GPUs", "bytes/token") else "left")
    counts = {
        "layer": model.num_layers,
        "attention_layer": sum(kind != "linear" for kind in model.layer_attention),
        "moe_layer": model.num_moe_layers,
        "dense_layer": model.num_layers - model.num_moe_layers,
        "step": 1,
        "stage_boundary": 1,
    }
    steps = comm_steps(layout, model)
    for c in steps:
        per_pp = f" (÷{layout.pp} stages)" if layout.pp > 1 and c.per.endswith("layer") else ""
        when = f" in {c.phase}" if c.phase else ""
        table.add_row(
            c.where,
            c.op.value,
            c.group,
            str(c.group_size),
            f"{counts[c.per] * c.count} per step{when}{per_pp}",
            f"{c.bytes_per_token:,.0f}" + (" per cached token" if c.sized_by == "cached" else ""),
        )
    if not steps:
        table.add_row("none: every GPU runs a whole copy", "", "", "", "", "")
    return table


@dataclass(frozen=True)
class LayoutRow:
    """A layout as `layouts` lists it: its setup (at a raised memory fraction where none fits at the engine's
    defaults), the commands that start it, its memory, and the engine's default memory fraction for it."""

    setup: Setup
    commands: list[list[str]]
    memory: MemoryLedger
    default_fraction: float | None

    @property
    def fraction(self) -> float | None:
        return self.setup.layout.options.memory_fraction if self.setup.layout else None

    @property
    def raised(self) -> bool:
        return self.fraction != self.default_fraction


def layouts_payload(rows: list[LayoutRow], model: ModelSpec, *, isl: int, osl: int) -> list[dict[str, Any]]:
    return [
        {
            "engine": r.setup.engine,
            "version": r.setup.version,
            "verdict": verdict(r.setup, r.memory),
            "layout": layout_payload(r.setup.layout, model) if r.setup.layout else None,
            "memory_fraction": r.fraction,
            "default_memory_fraction": r.default_fraction,
            "launch_command": command_text(r.commands[0]),
            "launch_per_node": [command_text(c) for c in r.commands],
            "notes": [n.message for n in r.setup.notes],
            "memory": memory_payload(r.memory, isl=isl, osl=osl),
        }
        for r in rows
    ]


def layouts_heading(
    rows: list[LayoutRow],
    *,
    engine: str,
    model: str,
    cluster: str,
    flag: str | None,
    show_all: bool,
    would_fit: tuple[str, ...],
) -> str:
    """One line: how many layouts pass the engine's checks and how many fit, at the engine's default memory
    fraction or, where none fits there, at the highest its rules allow; when none fits at all, what would."""
    n, of = len(rows), f"of {model} on {cluster}"
    if not rows:
        return f"no {engine} layout {of} uses all the GPUs and passes the engine's checks"
    fitting = sum(r.memory.verdict == "ok" for r in rows)
    raised = [r for r in rows if r.raised]
    if not fitting:
        none = (
            f"none of the {n} {engine} layouts {of} that pass the engine's checks fits"
            if n > 1
            else f"the one {engine} layout {of} that passes the engine's checks does not fit"
        )
        even = f", even at the highest {flag} the engine's rules allow" if raised else ""
        listed = "" if show_all else f"; --all lists {'them' if n > 1 else 'it'}"
        return f"{none} in memory{even}; what would: " + "; ".join(would_fit) + listed
    head = f"{n} {engine} layouts {of} pass the engine's checks; "
    others = "" if show_all or fitting == n else " (--all lists the others)"
    if not raised:
        return head + f"{fitting} fit in memory{others}"
    defaults = sorted({r.default_fraction for r in rows if r.default_fraction is not None})
    at = f"{defaults[0]:.3f}" + (f"–{defaults[-1]:.3f}" if len(defaults) > 1 else "")
    images = any(r.setup.layout and r.setup.layout.options.fraction_scale < 1 for r in raised)
    keep = "; serving images, keep the default: it leaves room for the image encoder" if images else ""
    return (
        head + f"none fits at the engine's default {flag} ({at} for these layouts); {fitting} fit at the highest "
        f"fraction the engine's rules allow, as theorise raises it{others}{keep}"
    )


def _common_ends(commands: list[list[str]]) -> tuple[int, int]:
    """How many leading and trailing tokens every command shares (launcher, model, --trust-remote-code)."""
    shortest = min(len(c) for c in commands)
    head = next((i for i in range(shortest) if len({c[i] for c in commands}) > 1), shortest)
    while head and commands[0][head - 1].startswith("-"):
        head -= 1  # keep a flag together with its value
    tail = next((i for i in range(shortest - head) if len({c[-1 - i] for c in commands}) > 1), shortest - head)
    return head, tail


def _other_nodes(commands: list[list[str]]) -> str:
    """Where node 1 and later differ from node 0's command, in words."""
    first, second = commands[0], commands[1]
    rank_value = second.index("--node-rank") + 1
    extra = [t for i, t in enumerate(second) if t not in first and i != rank_value]
    who = "on node 1" if len(commands) == 2 else f"on node N (1…{len(commands) - 1})"
    rank = "--node-rank 1" if len(commands) == 2 else "--node-rank N"
    return f"{who} run the same with {' '.join([rank, *extra])}"


def layouts_table(rows: list[LayoutRow], *, title: str, isl: int, osl: int) -> Group:
    """The heading, the launch command the flags go in, and a row per layout (each cell wraps between words: the
    flags column between options); the heading alone where there are no rows."""
    if not rows:
        return Group(Text(title))
    raised = any(r.raised for r in rows)
    # the layout's name says its degrees (attention TP×DP, MoE EP×TP, PP, DCP, copies); --json lists each
    columns = [
        "#",
        "layout",
        "memory",
        "KV tokens",
        f"fit at {isl}+{osl}",
        *(["memory fraction"] if raised else []),
        "flags",
    ]
    table = Table(title_justify="left")
    for col in columns:
        table.add_column(col, justify="left" if col in ("layout", "memory", "flags") else "right")
    commands = [r.commands[0] for r in rows]
    head, tail = _common_ends(commands)
    for i, r in enumerate(rows, 1):
        lay, cmd, fits = r.setup.layout, r.commands[0], r.memory.verdict == "ok"
        assert lay is not None
        table.add_row(
            str(i),
            lay.describe(),
            Text(r.memory.verdict, style="green" if fits else "red"),
            f"{r.memory.kv_tokens_total:,}" if fits else "—",
            f"{r.memory.max_concurrency(isl=isl, osl=osl):,}" if fits else "—",
            *([f"{r.fraction:.2f}" if r.raised and r.fraction is not None else "default"] if raised else []),
            command_text(cmd[head : len(cmd) - tail]) or "(none)",
        )
    sample = commands[0]
    launch = f"launch: {command_text(sample[:head])} FLAGS {command_text(sample[len(sample) - tail :])}".rstrip()
    nodes = rows[0].commands
    if len(nodes) > 1:
        launch += f"\n  that is node 0's command; {_other_nodes(nodes)}; set HEAD_IP to node 0's address on every node"
    return Group(Text(title), Text(launch, style="dim"), table)
