"""Load the bundled hardware data: GPUs, links and measured collective tables (YAML under data/hardware/)."""

from __future__ import annotations

import difflib
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from shardwise.errors import DataError, SpecError
from shardwise.hardware.collectives import CollectiveTables
from shardwise.hardware.profile import GpuProfile, LinkProfile, Overheads, PowerFacts, RuntimeProfile

T = TypeVar("T", bound=BaseModel)


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's safe loader where built: same result, faster


def data_dir() -> Path:
    return Path(str(resources.files("shardwise") / "data" / "hardware"))


def read_yaml(path: Path) -> Any:
    """Parse one YAML file (safe_load), as one DataError line when it is unreadable or malformed."""
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise DataError(f"{path} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from exc


def validate(schema: type[T], raw: Any, *, origin: str) -> T:
    """Build `schema` from parsed YAML, naming the first bad field in one line."""
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise DataError(f"{origin}: field {where}: {err['msg']}") from exc


def _load_folder(folder: str, schema: type[T]) -> dict[str, T]:
    items: dict[str, T] = {}
    for path in sorted((data_dir() / folder).glob("*.yaml")):
        item = validate(schema, read_yaml(path), origin=str(path))
        items[item.name] = item  # type: ignore[attr-defined]
    return items


@cache
def gpus() -> dict[str, GpuProfile]:
    """Every bundled GPU by catalog name."""
    return _load_folder("gpus", GpuProfile)


@cache
def links() -> dict[str, LinkProfile]:
    return _load_folder("links", LinkProfile)


@cache
def collective_tables() -> tuple[CollectiveTables, ...]:
    return tuple(_load_folder("collectives", CollectiveTables).values())


@cache
def runtime() -> RuntimeProfile:
    """Per-GPU memory of the CUDA stack and communication buffers."""
    path = data_dir() / "runtime.yaml"
    return validate(RuntimeProfile, read_yaml(path), origin=str(path))


@cache
def power_facts() -> PowerFacts:
    """What a node draws besides its GPUs."""
    path = data_dir() / "power.yaml"
    return validate(PowerFacts, read_yaml(path), origin=str(path))


@cache
def overheads() -> Overheads:
    """Kernel-launch and scheduler times."""
    path = data_dir() / "overheads.yaml"
    return validate(Overheads, read_yaml(path), origin=str(path))


@cache
def sources() -> dict[str, str]:
    """Source keys cited by the hardware data, with what each one is."""
    return dict(read_yaml(data_dir() / "sources.yaml"))


def load_gpu(name: str) -> GpuProfile:
    """A GPU by catalog name or alias ("rtx-pro-6000", "h100", "mi300x")."""
    key = name.strip().lower()
    by_alias = {alias: gpu for gpu in gpus().values() for alias in (gpu.name, *gpu.aliases)}
    if key in by_alias:
        return by_alias[key]
    close = difflib.get_close_matches(key, list(by_alias), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise SpecError(f"unknown GPU {name!r}; {hint}run 'shardwise gpus' for the known ones")


def load_link(name: str) -> LinkProfile:
    if name not in links():
        raise SpecError(f"unknown link {name!r}; known links: {', '.join(sorted(links()))}")
    return links()[name]
