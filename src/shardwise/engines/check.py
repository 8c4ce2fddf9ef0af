"""Check a real launch command before anyone waits for weights to load; list the valid layouts of a model."""

from __future__ import annotations

from dataclasses import dataclass

from shardwise.engines.base import Setup, get_engine
from shardwise.engines.flags import EngineArgError, flag_table, parse_flags, parse_version, split_command
from shardwise.spec.catalog import DEFAULT_MODEL, catalog, find_by_repo, load_model
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec


@dataclass(frozen=True)
class Checked:
    setup: Setup
    model: ModelSpec
    model_ref: str  # what the command (or --model) named
    command: str


def _model_in_command(engine: str, argv: list[str], version: str | None) -> str | None:
    table = flag_table(engine)
    try:
        given = parse_flags(table, argv, parse_version(version or table.default_version, engine))
    except EngineArgError:
        return None
    return given.get("model_path") or given.get("model_tag") or given.get("model")


def _model_for(ref: str) -> ModelSpec:
    """A bundled model when `ref` is a bundled alias or the Hub repo one stands for; else a path or Hub id."""
    entry = catalog().get(ref.lower()) or find_by_repo(ref)
    return load_model(entry.alias if entry else ref)


def check_command(
    command: list[str] | str,
    *,
    cluster: ClusterSpec,
    model: str | None = None,
    version: str | None = None,
    waive: frozenset[str] = frozenset(),
) -> Checked:
    """Classify a launch command as the engine would: the effective setup, its rewrites and its refusals (less the
    rules `waive` names: a custom build's own kernels lift them)."""
    launch = split_command(command)
    model_ref = model or _model_in_command(launch.engine, launch.argv, version) or DEFAULT_MODEL
    spec = _model_for(model_ref)
    engine = get_engine(launch.engine)
    setup = engine.resolve(launch.argv, model=spec, cluster=cluster, version=version, env=launch.env, waive=waive)
    text = command if isinstance(command, str) else " ".join(command)
    return Checked(setup=setup, model=spec, model_ref=model_ref, command=text)


def model_reference(model_ref: str) -> str:
    """What to write after --model-path: the Hub repo of a bundled alias, else what the user gave."""
    entry = catalog().get(model_ref.lower())
    return entry.repo if entry else model_ref


def layouts(model_ref: str, cluster: ClusterSpec, *, engine: str, version: str | None = None) -> list[Setup]:
    return get_engine(engine).enumerate(_model_for(model_ref), cluster, version=version)


def without_speculative(argv: list[str] | str) -> list[str]:
    """The same launch command with its speculative-decoding options removed (SGLang's --speculative-*,
    vLLM's --speculative-config), for comparing against plain decoding."""
    args = argv.split() if isinstance(argv, str) else list(argv)
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg.startswith(("--speculative-", "--speculative_")):
            skip = "=" not in arg and i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append(arg)
    return out
