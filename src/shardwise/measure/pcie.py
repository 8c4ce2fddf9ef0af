"""The PCIe RTX PRO 6000 set as rows to predict: community measurements of the newest MoE models on 8× (and 4×)
RTX PRO 6000 Blackwell joined only by PCIe, the user's class of box.

The file is data/measurements/pcie.csv, written by scripts/pcie_launches.py from the reference set's
other-models.csv: one measured row per line with the engine command recovered from what the row records (or why
there is none), the build it ran on (`image`, the rows' group), the prompt the engine held and the draft tokens.

Decode-only cells (llm_decode_bench): the prompt is loaded into the prefix cache first, then C streams decode
`max_tokens` each (ignore_eos) and restart as they end; the aggregate rate is counted over a window once C run.
Each is replayed as C decode-only requests from the cached prompt (no prefill), whose simulated rate is that of
the streams. Cells over the KV budget are absent from the set, not queued. A speculative cell is replayed with
its own measured acceptance: τ = 1 + k × the draft acceptance rate, for k draft tokens a step.

KV capacities: the tokens the engine's start-up log gave its KV pool (the whole layout's, DCP ranks together),
against the ledger's pool for the same command.

Rows the source flags INVALID, capacity-limited, or as warm-up cells are kept, listed, and left out of every
figure. Values only the set's custom images accept (their own kernels) are out of the commands and listed as
not modelled: the replay prices the upstream engine's kernels for them. Where such a kernel serves what the
upstream release refuses (`waived`: the B12X sparse-MLA backend serves DCP on SM 12.x, where vLLM's own has none),
the row is replayed with that rule lifted, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from shardwise.cost.memory import memory_ledger
from shardwise.engines.check import check_command
from shardwise.errors import SpecError
from shardwise.measure.inferencex import Skipped, read_table
from shardwise.measure.reference import PCIE, ReferenceRow
from shardwise.spec.catalog import find_by_repo
from shardwise.spec.cluster import load_cluster

GPU = "rtx-pro-6000"
COLUMNS = ("id", "source", "checkpoint", "n_gpus", "kind", "prompt_tokens", "max_tokens", "concurrency")
COLUMNS += ("output_tok_s", "kv_tokens", "accept_rate", "release", "image", "mtp_tokens", "command")
COLUMNS += ("not_modelled", "waived", "launch_problem", "excluded")
# llm_decode_bench's max_tokens in recent versions (the set's README), where a row does not say: it only sets the
# mean context a cell decodes at (its prompt and half of it), a few per cent of the long cells' context
DEFAULT_MAX_TOKENS = 2048


def from_pcie(row: ReferenceRow) -> bool:
    return row.source.startswith(PCIE)


@dataclass(frozen=True)
class Capacity:
    """A KV pool the engine's start-up log reported, and the ledger's for the same command."""

    id: str
    model: str
    gpus: str
    image: str
    command: str
    measured_tokens: int
    predicted_tokens: int | None  # None: the setup does not start as modelled (problem says why)
    problem: str | None = None

    @property
    def error(self) -> float | None:
        if self.predicted_tokens is None:
            return None
        return (self.predicted_tokens - self.measured_tokens) / self.measured_tokens


@dataclass(frozen=True)
class PcieSet:
    rows: tuple[ReferenceRow, ...]  # decode-only cells to simulate
    capacities: tuple[Capacity, ...]
    skipped: tuple[Skipped, ...]  # every other row, with why


def bundled_path() -> Path:
    return Path(str(resources.files("shardwise") / "data" / "measurements" / "pcie.csv"))


def read_set(path: Path | None = None) -> PcieSet:
    """Every row of the file: the decode-only cells to predict, the KV capacities to compare, and the rest with why."""
    path = path or bundled_path()
    points = read_table(path, COLUMNS, "a PCIe set file")
    rows, skipped, logs = [], [], {}
    for p in points:
        try:
            row = _row(p)
            int(p["kv_tokens"] or 0)  # compared apart, read below
        except ValueError as exc:
            reason = str(exc).splitlines()[0]
            raise SpecError(
                f"{path}: row {p.get('id') or '?'}: {reason}; give numbers in its numeric columns"
            ) from None
        if isinstance(row, ReferenceRow):
            rows.append(row)
        elif row is not None:
            skipped.append(Skipped(id=p["id"], reason=row))
        if p["kv_tokens"] and p["command"] and not p["excluded"] and find_by_repo(p["checkpoint"]):
            logs.setdefault((p["command"], p["n_gpus"], p["release"], p["kv_tokens"]), p)
    return PcieSet(tuple(rows), tuple(_capacity(p) for p in logs.values()), tuple(skipped))


def _row(p: dict[str, str]) -> ReferenceRow | str | None:
    """A row as a decode-only cell to predict, or why it is not one (None: a capacity row, compared apart)."""
    if p["excluded"]:
        return f"left out of the figures: {p['excluded']}"
    if p["kind"] == "kv_capacity":
        if not (p["command"] and p["kv_tokens"]):
            return f"a KV capacity without {_missing(p)}"
        return None if find_by_repo(p["checkpoint"]) else f"{p['checkpoint']} is not in the bundled model catalog"
    if p["kind"] != "decode_only":
        kinds = {
            "prefill": "a prefill rate (not replayed yet)",
            "single_stream": "a community report of one stream, without its prompt length or window",
            "serving": "a served run whose prompt lengths or load the row does not give",
        }
        return kinds.get(p["kind"], "a measurement of another kind")
    if not p["command"]:
        return f"no launch command: {p['launch_problem']}"
    entry = find_by_repo(p["checkpoint"])
    if entry is None:
        return f"{p['checkpoint']} is not in the bundled model catalog"
    if not p["output_tok_s"] or not p["concurrency"]:
        return "no output tok/s or concurrency"
    draft = int(p["mtp_tokens"] or 0)
    if (draft or "--speculative-" in p["command"]) and not p["accept_rate"]:
        return "speculative decoding, and the cell's acceptance is not given"
    return ReferenceRow(
        id=p["id"],
        source=f"{PCIE} ({p['source']})",
        model=entry.alias,
        gpus=f"{p['n_gpus']}x{GPU}",
        command=p["command"],
        engine_version=p["release"] or None,
        benchmark="decode_only",
        isl=max(1, int(p["prompt_tokens"] or 0)),
        osl=int(p["max_tokens"] or DEFAULT_MAX_TOKENS),
        concurrency=int(p["concurrency"]),
        output_tok_s=float(p["output_tok_s"]),
        accept_length=1 + draft * float(p["accept_rate"]) if draft else None,
        split_key=f"{p['image']} ({entry.alias})",  # the build and model: the training / held-out split's unit
        not_modelled=tuple(x for x in p["not_modelled"].split("; ") if x),
        waived=tuple(x for x in p["waived"].split() if x),
    )


def _missing(p: dict[str, str]) -> str:
    return "a launch command" if not p["command"] else "its token count"


def _capacity(p: dict[str, str]) -> Capacity:
    entry = find_by_repo(p["checkpoint"])
    assert entry is not None  # read_set keeps only catalogued rows
    gpus = f"{p['n_gpus']}x{GPU}"
    common = {"id": p["id"], "model": entry.alias, "gpus": gpus, "image": p["image"], "command": p["command"]}
    measured = int(p["kv_tokens"])
    cluster = load_cluster(gpus)
    waive = frozenset(p["waived"].split())
    checked = check_command(p["command"], cluster=cluster, model=entry.alias, version=p["release"] or None, waive=waive)
    layout = checked.setup.layout
    if layout is None or not checked.setup.valid:
        reason = checked.setup.rejections[0].reason if checked.setup.rejections else "no layout"
        return Capacity(**common, measured_tokens=measured, predicted_tokens=None, problem=reason)
    memory = memory_ledger(checked.model, layout, cluster)
    if memory.verdict != "ok":
        return Capacity(**common, measured_tokens=measured, predicted_tokens=None, problem=memory.reason)
    return Capacity(**common, measured_tokens=measured, predicted_tokens=memory.kv_tokens_per_rank)
