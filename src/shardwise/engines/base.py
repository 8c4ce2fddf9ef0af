"""What every engine module provides, the values it returns, and the registry that finds engines.

An engine reads a launch command's flags, applies its own silent rewrites and checks (`resolve` → a
`Setup` with notes and rejections), maps the result to an engine-neutral `Layout`, lists every valid
layout for a model on a cluster (`enumerate`), and writes the launch command of a layout. Flag-driven
engines get all of that from `flag_engine.FlagEngine` and supply only what differs.
Rules are small functions returning a `Rejection` (or None); the engine's error text goes with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, ClassVar, Literal, Protocol

from pydantic import Field

from shardwise.engines.layout import Layout
from shardwise.errors import SpecError
from shardwise.frozen import Frozen
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec


class Rejection(Frozen):
    """Why the engine will not run a setup, and what it says when it refuses."""

    rule: str = Field(description="short rule id, e.g. 'moe_tp_zero'")
    reason: str = Field(description="what is wrong, with the numbers")
    engine_error: str | None = Field(None, description="the error the engine raises")
    source: str = Field(description="engine version and source file of the check")
    stage: Literal["arguments", "load", "run"] = Field(
        "arguments",
        description="when the engine fails: resolving its arguments (before any weight loads), building and "
        "loading the model, or at its first steps (a kernel or a collective); 'run' failures the engine does "
        "not report as such (a hang, a wrong answer) carry no engine_error",
    )


class Note(Frozen):
    """Something the engine does that the command does not say: a rewrite, a deprecation, a warning."""

    kind: Literal["rewrite", "deprecated", "warning"]
    message: str
    source: str | None = None


class Setup(Frozen):
    """One launch of one engine, as the engine will run it (or refuse to)."""

    engine: str
    version: str
    given: dict[str, Any] = Field(description="options as the command gives them, by canonical name")
    flags: dict[str, Any] = Field(description="effective options by canonical name, after the engine's rewrites")
    notes: tuple[Note, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    layout: Layout | None = None
    gpus_used: int = Field(description="GPUs the engine starts processes on")
    gpus_available: int

    @property
    def valid(self) -> bool:
        return not self.rejections


@dataclass(frozen=True)
class Context:
    """What a rule may look at."""

    flags: dict[str, Any]
    model: ModelSpec
    cluster: ClusterSpec
    version: Any  # packaging Version
    gpus_available: int
    blocks: dict[str, tuple[int, int]]  # role → FP8 scale-block shape, for block-quantized checkpoints


Rule = Callable[[Context], "Rejection | None"]


@dataclass(frozen=True, kw_only=True)
class BenchLoad:
    """A load for an engine's own benchmark client: `prompts` requests of ShareGPT (`dataset`) or of random lengths
    (fixed, or drawn with `range_ratio`), capped at `concurrency` clients, sent at `request_rate` (None or inf: all
    at once)."""

    isl: int
    osl: int
    concurrency: int | None
    prompts: int
    dataset: str | None = None
    request_rate: float | None = None
    range_ratio: float | None = None

    @property
    def sharegpt(self) -> bool:
        return self.dataset is not None and self.dataset.startswith("sharegpt")

    def sending(self) -> list[str]:
        """How many requests and how they are sent, as both clients spell it (their default rate is inf and they cap
        no clients unless told)."""
        sent = ["--num-prompts", str(self.prompts)]
        if self.request_rate is not None and math.isfinite(self.request_rate):
            sent += ["--request-rate", f"{self.request_rate:g}"]
        return sent + (["--max-concurrency", str(self.concurrency)] if self.concurrency else [])


class Engine(Protocol):
    name: ClassVar[str]
    supports_expert_parallel: ClassVar[bool]
    supports_attention_dp: ClassVar[bool]
    kv_budget: ClassVar[str]  # "of_total" (SGLang mem_fraction_static, vLLM gpu_memory_utilization)
    option_variants: ClassVar[tuple[tuple[str, dict[str, Any]], ...]]  # engine options worth trying per layout
    what_if_options: ClassVar[tuple[tuple[str, dict[str, Any]], ...]]  # options priced as what-ifs, not searched
    memory_fraction_option: ClassVar[str | None]  # the flag whose fraction leaves activations and graphs outside
    context_option: ClassVar[str | None]  # the flag that lowers the context the engine must hold

    def resolve(
        self,
        argv: list[str],
        *,
        model: ModelSpec,
        cluster: ClusterSpec,
        version: str | None = None,
        env: dict[str, str] | None = None,
        waive: frozenset[str] = frozenset(),
    ) -> Setup: ...

    def enumerate(self, model: ModelSpec, cluster: ClusterSpec, *, version: str | None = None) -> list[Setup]: ...

    def launch_command(self, setup: Setup, *, model_ref: str, remote_code: bool = False) -> list[str]: ...

    def launch_commands(self, setup: Setup, *, model_ref: str, remote_code: bool = False) -> list[list[str]]: ...

    def setup(
        self,
        given: dict[str, Any],
        *,
        model: ModelSpec,
        cluster: ClusterSpec,
        version: Any,
        env: dict[str, str] | None = None,
    ) -> Setup: ...

    def version(self, text: str | None) -> Any: ...

    def hand_tried(self, model: ModelSpec, cluster: ClusterSpec) -> Iterable[dict[str, Any]]:
        """The commands people try first by hand, as the options they give (a search shows why each is out)."""
        ...

    def candidates(self, model: ModelSpec, cluster: ClusterSpec) -> Iterable[dict[str, Any]]:
        """Every layout the engine can run the model with on the cluster, as the options its command gives."""
        ...

    def speculative_options(self, algorithm: str, *, draft_model: str | None = None) -> dict[str, Any]: ...

    def benchmark_command(self, load: BenchLoad, *, model_ref: str) -> list[str]:
        """The engine's own benchmark client sending `load` to the model it serves as `model_ref`."""
        ...


_REGISTRY: dict[str, type] = {}


def register_engine(name: str) -> Callable[[type], type]:
    """Class decorator: make an engine findable by name (built-ins use it too)."""

    def add(cls: type) -> type:
        cls.name = name  # type: ignore[attr-defined]
        _REGISTRY[name] = cls
        return cls

    return add


def _load_engines() -> None:
    """Import the built-in engines and any installed under the 'shardwise.engines' entry point group;
    importing a module runs its @register_engine."""
    import shardwise.engines.sglang  # noqa: F401
    import shardwise.engines.vllm  # noqa: F401

    for entry in entry_points(group="shardwise.engines"):
        entry.load()


def get_engine(name: str) -> Engine:
    if name not in _REGISTRY:
        _load_engines()
    if name not in _REGISTRY:
        raise SpecError(f"unknown engine {name!r}; known engines: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]()


def engine_names() -> list[str]:
    _load_engines()
    return sorted(_REGISTRY)


def run_rules(rules: list[Rule], ctx: Context) -> Iterator[Rejection]:
    for rule in rules:
        rejection = rule(ctx)
        if rejection is not None:
            yield rejection


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
