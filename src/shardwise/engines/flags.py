"""Engine flag tables (data/engines/*.yaml) and launch commands: parsed as the engine parses them, and written.

Parsing builds an `argparse` parser from the table for the engine version, with the engine's own
`allow_abbrev` setting, so abbreviations (`--tp` for `--tp-size`), ambiguous prefixes and unknown options
fail exactly where the engine's parser fails, with the same message.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from functools import cache, cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NamedTuple

from packaging.version import InvalidVersion, Version
from pydantic import Field

from shardwise.errors import SpecError
from shardwise.frozen import Frozen
from shardwise.hardware.load import read_yaml, validate
from shardwise.memo import Memo


def human_readable_int(value: str) -> int:
    """vLLM's integer reader (utils/argparse_utils.py): '32k' = 32,000, '32K' = 32,768, '25.6k' = 25,600; decimals
    only with the decimal suffixes. The name is vLLM's: argparse puts it in its error message."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if not match:
        return int(value)
    number, suffix = match.groups()
    if suffix in "kmgt":
        return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
    try:
        return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use "
            f"{number}{suffix.lower()} instead?"
        ) from exc


def human_readable_int_or_auto(value: str) -> int:
    """human_readable_int, or -1 for '-1' / 'auto': vLLM then fits --max-model-len to the KV cache."""
    return -1 if value.strip() == "-1" or value.strip().lower() == "auto" else human_readable_int(value)


_TYPES = {
    "int": int,
    "float": float,
    "str": str,
    "human_int": human_readable_int,
    "human_int_or_auto": human_readable_int_or_auto,
}


class Spelling(Frozen):
    flag: str
    since: str | None = None
    until: str | None = None

    def exists_in(self, version: Version) -> bool:
        return (self.since is None or version >= Version(self.since)) and (
            self.until is None or version <= Version(self.until)
        )


class Option(Frozen):
    flags: tuple[Spelling | str, ...]
    off_flags: tuple[str, ...] = ()  # spellings that turn a switch off (--no-x, --disable-x)
    type: Literal["int", "float", "str", "bool", "json", "human_int", "human_int_or_auto"]
    default: Any = None
    choices: tuple[Spelling | str, ...] | None = None  # a choice some releases lack carries its since / until
    required: bool = False
    partly: str | None = None  # what of it the model does not price: listed as not modelled where a command sets it

    def spellings(self, version: Version) -> list[str]:
        return _held(self.flags, version)

    def choices_in(self, version: Version) -> list[str] | None:
        return _held(self.choices, version) if self.choices else None


def _held(items: tuple[Spelling | str, ...], version: Version) -> list[str]:
    """The flags (or choices) of `items` that exist in `version`."""
    out = []
    for item in items:
        spelling = Spelling(flag=item) if isinstance(item, str) else item
        if spelling.exists_in(version):
            out.append(spelling.flag)
    return out


class OtherFlag(Frozen):
    flags: tuple[str, ...]
    takes: Literal["flag", "value", "values"]
    since: str | None = None  # the first release that has it; None: every release the table knows
    until: str | None = None  # the last release that has it (inclusive); None: every release the table knows
    unread: str | None = None  # where the parser keeps it and no code reads it: the releases searched, and how

    def exists_in(self, version: Version) -> bool:
        return (self.since is None or version >= Version(self.since)) and (
            self.until is None or version <= Version(self.until)
        )


class ModelSupport(Frozen):
    """What one model's implementation in the engine supports (None: not recorded for this architecture)."""

    attention_dp: bool | None = None
    mla_dcp: bool | None = None
    vision_config: dict[str, int] | None = Field(
        None, description="vision-config fields as the engine's class reads them"
    )
    mla_default_backend: dict[str, str] | None = Field(None, description="the model's own default, by capability")
    vision_modalities: tuple[str, ...] | None = Field(None, description="modalities the vision tower serves")
    cuda_graph_max_bs: int | None = Field(None, description="the model's own largest captured decode batch")
    source: str | None = None


class FlagTable(Frozen):
    engine: str
    default_version: str
    known_versions: tuple[str, ...]
    allow_abbrev: bool
    launchers: tuple[tuple[str, ...], ...]
    model_positional: bool
    options: dict[str, Option]
    other_flags: tuple[OtherFlag, ...] = ()
    other_flags_source: str | None = None
    memory_tiers: tuple[dict[str, Any], ...] = ()
    scheduler: dict[str, Any] = Field(default_factory=dict, description="SchedulerPolicy fields, with sources")
    underscores_to_dashes: bool = Field(False, description="the parser rewrites --opt_name to --opt-name first")
    dotted_args: bool = Field(
        False, description="the parser merges -X.a.b=v (or -X.a.b v) into the JSON value of X before it parses"
    )
    positional_model_launchers: tuple[tuple[str, ...], ...] = Field(
        (), description="launchers that take the model as first positional and rewrite it to model_flag"
    )
    model_flag: str = "--model-path"
    prefill_graph: dict[str, Any] = Field(default_factory=dict, description="which prefill steps run under a graph")
    models: dict[str, ModelSupport] = Field(default_factory=dict, description="support by HF architecture")
    language_model_only_architectures: tuple[str, ...] = ()
    kv_sizing: tuple[dict[str, Any], ...] = Field((), description="KV-cache sizing by release (vLLM)")
    mla_default_backend: dict[str, str] = Field(default_factory=dict, description="by compute capability")
    rocm_aiter_kv_heads: tuple[int, ...] = ()
    sparse_attention: dict[str, Any] = Field(
        default_factory=dict, description="how the engine caches and pages DeepSeek Sparse Attention models"
    )
    mla_dcp_backends: tuple[str, ...] = ()
    mla_dcp_spec_backends: tuple[str, ...] = ()
    allreduce_fusion: dict[str, Any] = Field(
        default_factory=dict, description="where the engine fuses all-reduce and norm"
    )

    def since(self, entries: tuple[dict[str, Any], ...], version: Version) -> dict[str, Any]:
        """The entry of a by-release list (each with `since`) that holds at `version`: the newest not after it."""
        held = [e for e in entries if Version(e["since"]) <= version]
        return max(held, key=lambda e: Version(e["since"])) if held else entries[0]

    def support(self, architecture: str, wrapper: str | None = None) -> ModelSupport:
        """What the engine's implementation of this model supports: the language model's entry, overridden
        field by field by its multimodal wrapper's (merged once per table and model: every setup asks)."""

        def merged() -> ModelSupport:
            fields: dict[str, Any] = {}
            for name in (architecture, wrapper):
                entry = self.models.get(name or "")
                if entry is not None:
                    fields.update(entry.model_dump(exclude_none=True))
            return ModelSupport(**fields)

        return _SUPPORT.get((self,), (architecture, wrapper), merged)


_SUPPORT = Memo(64)  # per flag table, architecture and wrapper: what the engine supports


@cache
def flag_table(engine: str) -> FlagTable:
    path = Path(str(resources.files("shardwise") / "data" / "engines" / f"{engine}.yaml"))
    return validate(FlagTable, read_yaml(path), origin=str(path))


@cache
def _defaults(engine: str) -> dict[str, Any]:
    return {name: option.default for name, option in flag_table(engine).options.items() if option.default is not None}


def table_defaults(engine: str) -> dict[str, Any]:
    """The options of `engine`'s table that have a default, with it (a new dict: the caller may change it)."""
    return dict(_defaults(engine))


class Release(Version):
    """An engine release: a version whose text is worked out once (a setup names it in every rule and note)."""

    @cached_property
    def _text(self) -> str:
        return super().__str__()

    def __str__(self) -> str:
        return self._text


def parse_version(text: str, engine: str) -> Version:
    try:
        return Release(text)
    except InvalidVersion as exc:
        raise SpecError(
            f"{engine} version {text!r} is not a version number; write e.g. {flag_table(engine).default_version}"
        ) from exc


class EngineArgError(Exception):
    """The engine's argument parser would exit with this message."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage and exit(2); the engine does the same
        raise EngineArgError(message)


def _parser(table: FlagTable, version: Version) -> _Parser:
    parser = _Parser(prog=table.engine, allow_abbrev=table.allow_abbrev, add_help=False)
    if table.model_positional:
        parser.add_argument("model_tag", nargs="?")
    for name, option in table.options.items():
        spellings = option.spellings(version)
        if not spellings:
            continue
        if option.type == "bool":
            parser.add_argument(*spellings, dest=name, action="store_true", default=None)
            if option.off_flags:
                parser.add_argument(*option.off_flags, dest=name, action="store_false", default=None)
        else:
            kind = _TYPES.get(option.type, str)
            choices = option.choices_in(version)
            parser.add_argument(
                *spellings, dest=name, type=kind, default=None, choices=choices, required=option.required
            )
    for i, other in enumerate(table.other_flags):
        if not other.exists_in(version):
            continue
        if other.takes == "flag":
            parser.add_argument(*other.flags, dest=f"_other{i}", action="store_true", default=None)
        else:
            parser.add_argument(*other.flags, dest=f"_other{i}", nargs="+" if other.takes == "values" else None)
    return parser


def parse_flags(table: FlagTable, argv: list[str], version: Version) -> dict[str, Any]:
    """The options shardwise models, by canonical name, as the engine's parser reads `argv`.
    Raises EngineArgError with the engine's own message for an unknown, ambiguous or malformed option."""
    namespace = _parser(table, version).parse_args(_preprocessed(table, argv))
    values = {k: v for k, v in vars(namespace).items() if not k.startswith("_other") and v is not None}
    return values


# Options that say where the server listens, what it is called and what code it may load: never how fast it runs.
ADDRESSING = frozenset({"--host", "--port", "--trust-remote-code", "--served-model-name", "--api-key", "--log-level"})


def _set_apart_from_default(option: Option, value: Any) -> bool:
    """Whether a parsed value says something the default does not: not unset, not a switch left off, and not the
    default itself (a switch compared only with a switch: an int 0 is not False, and 16384.0 is 16384)."""
    if value is None or (option.type == "bool" and value is False):
        return False
    return not (value == option.default and isinstance(value, bool) == isinstance(option.default, bool))


def unmodelled_flags(table: FlagTable, argv: list[str], version: Version) -> tuple[str, ...]:
    """The options of `argv` the engine parses and shardwise does not model (its `other_flags`), as given, less
    the addressing ones, each the engine parses and never reads said so; empty for a command the parser refuses."""
    try:
        namespace = _parser(table, version).parse_args(_preprocessed(table, argv))
    except EngineArgError:
        return ()
    out = []
    for key, value in vars(namespace).items():
        option = table.options.get(key)
        if option is not None and option.partly and _set_apart_from_default(option, value):
            given = option.spellings(version)[0] if value is True else f"{option.spellings(version)[0]} {value}"
            out.append(f"{given} ({option.partly})")
        if not key.startswith("_other") or value is None:
            continue
        flag = table.other_flags[int(key.removeprefix("_other"))].flags[0]
        if flag in ADDRESSING:
            continue
        shown = " ".join(value) if isinstance(value, list) else value
        given = flag if value is True else f"{flag} {shown}"
        unread = table.other_flags[int(key.removeprefix("_other"))].unread
        out.append(f"{given} (the engine never reads it)" if unread else given)
    return tuple(out)


def _preprocessed(table: FlagTable, argv: list[str]) -> list[str]:
    """`argv` as the engine's parser rewrites it before parsing (vLLM's FlexibleArgumentParser.parse_args,
    vllm/utils/argparse_utils.py): underscores to dashes in an option's name up to its first dot; each dotted
    option (`-cc.pass_config.fuse_allreduce_rms=True`, `--speculative-config.method mtp`) taken out and merged,
    with the others of its root, into one JSON value given to the root option (a value that is not JSON as text)."""
    if table.underscores_to_dashes:
        argv = [_dashed(a) for a in argv]
    if not table.dotted_args:
        return argv
    out, merged, i = [], {}, 0
    while i < len(argv):
        token = argv[i]
        name, has_value, value = token.partition("=")
        # -O… is the optimization level before any dotted key is read (-O.mode=3 is the level '.mode=3')
        if not (token.startswith("-") and "." in name) or (token.startswith("-O") and token != "-O"):
            out.append(token)
            i += 1
            continue
        if not has_value:
            if i + 1 >= len(argv):
                raise EngineArgError(f"argument {name}: expected one argument")
            value, i = argv[i + 1], i + 1
        root, *keys = name.split(".")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        node = merged.setdefault(root, {})
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = parsed
        i += 1
    for root, value in merged.items():
        out += [root, json.dumps(value)]
    return out


def _dashed(token: str) -> str:
    """--opt_name → --opt-name, up to the first dot of the name (vLLM keeps a dotted key's own underscores)."""
    if not token.startswith("--"):
        return token
    name, sep, value = token.partition("=")
    head, dot, keys = name.partition(".")
    return head.replace("_", "-") + dot + keys + sep + value


# --- recognising and writing whole commands ---------------------------------------------------------

ENGINES = ("sglang", "vllm")


class LaunchCommand(NamedTuple):
    """A launch command read: its engine, its environment assignments and the flags after the launcher."""

    engine: str
    env: dict[str, str]
    argv: list[str]


def split_command(command: list[str] | str) -> LaunchCommand:
    """The engine, environment and flags of a launch command."""
    try:
        tokens = shlex.split(command) if isinstance(command, str) else list(command)
        if len(tokens) == 1 and any(c.isspace() for c in tokens[0]):  # the whole command quoted as one argument
            tokens = shlex.split(tokens[0])
    except ValueError as exc:  # an unclosed quote
        raise SpecError(f"cannot read the launch command ({exc}); close its quotes, e.g. 'a b' or \"a b\"") from exc
    env: dict[str, str] = {}
    while tokens and "=" in tokens[0] and not tokens[0].startswith("-"):
        key, _, value = tokens.pop(0).partition("=")
        env[key] = value
    for engine in ENGINES:
        table = flag_table(engine)
        for launcher in table.launchers:
            if _starts_with(tokens, launcher):
                rest = tokens[len(launcher) :]
                if launcher in table.positional_model_launchers and rest and not rest[0].startswith("-"):
                    rest = [table.model_flag, rest[0], *rest[1:]]
                return LaunchCommand(engine, env, rest)
    shown = " ".join(tokens[:3]) or "(nothing)"
    raise SpecError(
        f"not a launch command shardwise knows: {shown!r}; expected 'python -m sglang.launch_server …', "
        "'sglang serve …', 'vllm serve MODEL …' or 'python -m vllm.entrypoints.openai.api_server …'"
    )


def _starts_with(tokens: list[str], launcher: tuple[str, ...]) -> bool:
    if len(tokens) < len(launcher):
        return False
    first = Path(tokens[0]).name
    python = launcher[0] == "python" and (first == "python" or first.startswith("python3"))
    return (python or first == launcher[0]) and tokens[1 : len(launcher)] == list(launcher[1:])


def render_command(table: FlagTable, version: Version, *, model_ref: str, values: dict[str, Any]) -> list[str]:
    """A launch command for `values` (canonical names), spelled as this version of the engine spells it."""
    argv = list(table.launchers[0])
    if table.model_positional:
        argv.append(model_ref)
    else:
        values = {"model_path": model_ref, **values}
    for name, value in values.items():
        argv += flag_words(table, version, name, value)
    return argv


def flag_words(table: FlagTable, version: Version, name: str, value: Any) -> list[str]:
    """One option (canonical name) as this version of the engine spells it: `--flag value`, a switch alone, or
    nothing for a switch that is off."""
    option = table.options[name]
    spellings = option.spellings(version)
    if not spellings:
        raise SpecError(f"{table.engine} {version} has no flag for {name}")
    if option.type == "bool":
        return [spellings[0]] if value else []
    return [spellings[0], str(value)]


# What a multi-node command says where only the user knows the value: node 0's address (the shell stops with this
# message while HEAD_IP is unset) and a port (HEAD_PORT, or the default after ':-').
HEAD_IP = "${HEAD_IP:?set HEAD_IP to the address of node 0}"


def head_port(default: int) -> str:
    return f"${{HEAD_PORT:-{default}}}"


def command_text(argv: list[str]) -> str:
    """The command as a shell line: tokens with a ${…} placeholder in double quotes, so the shell fills them in."""
    return " ".join(_placeholder(token) if "${" in token else shlex.quote(token) for token in argv)


def _placeholder(token: str) -> str:
    """A token in double quotes: the shell expands its ${…}; what else it would expand there is escaped."""
    escaped = token.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")
    return f'"{escaped}"'
