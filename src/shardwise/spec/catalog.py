"""Where model configs come from: a file or folder, the bundled offline catalog, or the Hugging Face Hub.

`load_model("kimi-k2.6")` reads the bundled config; `load_model("path/to/config.json")` or a folder
holding one reads the user's file; `load_model("org/name")` fetches config.json from the Hub (cached by
huggingface_hub, so a fetched config keeps working offline).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from shardwise.errors import SpecError
from shardwise.spec.hf_config import model_from_config
from shardwise.spec.model import ModelSpec

DEFAULT_MODEL = "kimi-k2.6"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # "org/name", as the Hub spells repo ids


@dataclass(frozen=True)
class CatalogEntry:
    alias: str
    repo: str
    provenance: str  # verbatim | sibling | derived | reconstructed
    source: str
    drafts_for: str | None = None  # a draft model: the alias of the target it drafts for
    also: tuple[str, ...] = ()  # other Hub names of the same checkpoint (a renamed repo)


def _models_dir() -> Path:
    return Path(str(resources.files("shardwise") / "data" / "models"))


def catalog() -> dict[str, CatalogEntry]:
    """The bundled models by alias."""
    return dict(_catalog())


@cache
def _catalog() -> dict[str, CatalogEntry]:
    raw = yaml.safe_load((_models_dir() / "catalog.yaml").read_text())
    return {
        alias: CatalogEntry(alias=alias, **{**fields, "also": tuple(fields.get("also", ()))})
        for alias, fields in raw.items()
    }


def drafter_of(alias: str, algorithm: str) -> CatalogEntry | None:
    """A bundled draft model of `algorithm` ("dflash") for the target `alias`, if there is one."""
    return next((e for e in _catalog().values() if e.drafts_for == alias and algorithm.lower() in e.alias), None)


def find_by_repo(repo: str) -> CatalogEntry | None:
    """The bundled entry that stands for Hub repo `repo` (case-insensitive), if any."""
    names = repo.lower()
    return next((e for e in catalog().values() if names in (e.repo.lower(), *(a.lower() for a in e.also))), None)


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a config.json, turning every way it can be wrong into one SpecError line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path} is not UTF-8 text; expected a Hugging Face config.json") from exc
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    if not isinstance(config, dict):
        raise SpecError(f"{path} must hold a JSON object (a Hugging Face config.json)")
    return config


def resolve_config(ref: str) -> tuple[str, dict[str, Any]]:
    """Find the config.json for `ref` (path, alias or Hub id) and return (display name, config)."""
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecError(f"folder {path} has no config.json; give the file or a folder that holds one")
        return path.name, read_config_file(path / "config.json")
    if path.is_file():
        return (path.parent.name if path.name == "config.json" else path.stem), read_config_file(path)
    entries = catalog()
    if ref.lower() in entries:
        return ref.lower(), read_config_file(_models_dir() / ref.lower() / "config.json")
    if _HUB_ID.match(ref) and not ref.endswith((".json", ".yaml")):
        return ref, _hub_config(ref)
    close = difflib.get_close_matches(ref.lower(), list(entries), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise SpecError(
        f"unknown model {ref!r}: not a file, a folder or a bundled model; {hint}"
        "run 'shardwise models' for the bundled ones, or give a config.json path or a Hub id 'org/name'"
    )


def _hub_config(repo_id: str) -> dict[str, Any]:
    from huggingface_hub import hf_hub_download  # imported here: it is slow to import and rarely needed

    try:
        path = hf_hub_download(repo_id=repo_id, filename="config.json")
    except Exception as exc:  # network, auth, missing repo: all become one line for the user
        reason = type(exc).__name__
        raise SpecError(
            f"cannot fetch config.json of {repo_id!r} from the Hugging Face Hub ({reason}); "
            "offline or gated? give a local config.json path or a bundled model name"
        ) from exc
    return read_config_file(Path(path))


def load_model(ref: str = DEFAULT_MODEL, *, weight_dtype: str | None = None, kv_dtype: str | None = None) -> ModelSpec:
    """The ModelSpec for a path, bundled alias or Hub id, with optional what-if overrides."""
    name, config = resolve_config(ref)
    model = model_from_config(config, name=name)
    if weight_dtype or kv_dtype:
        model = model.with_overrides(weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    return model
