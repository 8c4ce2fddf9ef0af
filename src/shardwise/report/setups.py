"""How engine setups are shown: `check` verdicts and `layouts` lists, as rich views and as JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from shardwise.engines.base import Setup
from shardwise.engines.flags import command_text
from shardwise.engines.layout import Layout, comm_steps, groups, splits
from shardwise.spec.model import ModelSpec


def verdict(setup: Setup) -> str:
    return "ok" if setup.valid else "invalid"


def layout_payload(layout: Layout, model: ModelSpec) -> dict[str, Any]:
    return {
        **layout.model_dump(mode="json"),
        "description": layout.describe(),
        "groups": groups(layout),
        "splits": [s.model_dump() for s in splits(layout, model)],
        "collectives": [{**c.model_dump(mode="json"), "op": c.op.value} for c in comm_steps(layout, model)],
    }


def check_payload(setup: Setup, model: ModelSpec, launch: list[str] | None) -> dict[str, Any]:
    first = setup.rejections[0] if setup.rejections else None
    return {
        "verdict": verdict(setup),
        "engine": setup.engine,
        "version": setup.version,
        "model": model.name,
        "gpus_used": setup.gpus_used,
        "gpus_available": setup.gpus_available,
        "reason": first.reason if first else None,
        "engine_error": first.engine_error if first else None,
        "rejections": [r.model_dump() for r in setup.rejections],
        "warnings": [n.message for n in setup.notes if n.kind == "warning"],
        "rewrites": [n.model_dump() for n in setup.notes if n.kind != "warning"],
        "given_flags": setup.given,
        "effective_flags": setup.flags,
        "layout": layout_payload(setup.layout, model) if setup.layout else None,
        "launch_command": command_text(launch) if launch else None,
    }


def check_view(setup: Setup, model: ModelSpec) -> Group:
    parts: list[Any] = []
    if setup.valid:
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
            parts.append(Text(f"    the engine says: {r.engine_error}", style="dim"))
        parts.append(Text(f"    checked in: {r.source}", style="dim"))
    for note in setup.notes:
        style = "yellow" if note.kind == "warning" else "cyan"
        parts.append(Text(f"  {'!' if note.kind == 'warning' else '→'} {note.message}", style=style))
    if setup.layout:
        parts.append(_placement_table(setup.layout, model))
        parts.append(_collectives_table(setup.layout, model))
    return Group(*parts)


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
        "moe_layer": model.num_moe_layers,
        "dense_layer": model.num_layers - model.num_moe_layers,
        "step": 1,
        "stage_boundary": 1,
    }
    for c in comm_steps(layout, model):
        per_pp = f" (÷{layout.pp} stages)" if layout.pp > 1 and c.per.endswith("layer") else ""
        table.add_row(
            c.where,
            c.op.value,
            c.group,
            str(c.group_size),
            f"{counts[c.per] * c.count} per step{per_pp}",
            f"{c.bytes_per_token:,.0f}",
        )
    if not comm_steps(layout, model):
        table.add_row("none: every GPU runs a whole copy", "", "", "", "", "")
    return table


def layouts_payload(rows: list[tuple[Setup, list[str]]], model: ModelSpec) -> list[dict[str, Any]]:
    return [
        {
            "engine": s.engine,
            "version": s.version,
            "layout": layout_payload(s.layout, model) if s.layout else None,
            "launch_command": command_text(cmd),
            "notes": [n.message for n in s.notes],
        }
        for s, cmd in rows
    ]


def layouts_table(rows: list[tuple[Setup, list[str]]], *, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("#", "layout", "attention TP×DP", "MoE EP×TP", "PP", "copies", "launch command"):
        table.add_column(col, justify="right" if col in ("#", "PP", "copies") else "left", overflow="fold")
    for i, (setup, cmd) in enumerate(rows, 1):
        lay = setup.layout
        assert lay is not None
        table.add_row(
            str(i),
            lay.describe(),
            f"{lay.attn_tp}×{lay.attn_dp}",
            f"{lay.moe_ep}×{lay.moe_tp}",
            str(lay.pp),
            str(lay.replicas),
            command_text(cmd),
        )
    return table
