"""The machinery every engine configured by command-line flags shares: read the command with the engine's
own parser, apply its rewrites, run its rules, map to a Layout, enumerate, and write commands back.

An engine subclasses `FlagEngine` and supplies what differs: its rules, its rewrites (`effective`), its
flags → Layout mapping, how many GPUs a configuration uses, and which configurations to try.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any, ClassVar

from packaging.version import Version

from shardwise.engines.base import Context, Note, Rejection, Rule, Setup, run_rules
from shardwise.engines.flags import (
    EngineArgError,
    flag_table,
    parse_flags,
    parse_version,
    render_command,
    table_defaults,
)
from shardwise.engines.layout import Layout
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import block_shapes


class FlagEngine:
    name: ClassVar[str]
    display: ClassVar[str]  # "SGLang", "vLLM"
    prog: ClassVar[str]  # what the engine's parser calls itself in its errors (see `parser_name`)
    parser_source: ClassVar[str]
    rules: ClassVar[list[Rule]]
    supports_expert_parallel: ClassVar[bool] = True
    supports_attention_dp: ClassVar[bool] = True
    kv_budget: ClassVar[str] = "of_total"
    # engine options worth trying on every layout: (label, options by canonical name)
    option_variants: ClassVar[tuple[tuple[str, dict[str, Any]], ...]] = ()
    # the option (canonical name) whose fraction of GPU memory holds weights and KV, with activations and CUDA
    # graphs outside it, so a search may raise it up to what the memory model says leaves them room
    memory_fraction_option: ClassVar[str | None] = None
    # the option that lowers the context the engine must hold, where it refuses a KV pool shorter than the context
    context_option: ClassVar[str | None] = None
    # options people try on a MoE model's winner (overlap, all-to-all kernels): priced as what-ifs, not searched
    what_if_options: ClassVar[tuple[tuple[str, dict[str, Any]], ...]] = ()

    # --- what each engine supplies ----------------------------------------------------------------------

    def effective(self, f: dict[str, Any], *, version: Version, cluster: ClusterSpec, model: ModelSpec) -> list[Note]:
        """Apply the engine's own rewrites to `f` (its defaults with the command's options over them), in place, and
        say each one."""
        raise NotImplementedError

    def layout(self, flags: dict[str, Any], model: ModelSpec, version: Version) -> Layout:
        raise NotImplementedError

    def env_options(self, env: dict[str, str]) -> dict[str, Any]:
        """The environment variables of the launch that change what the engine runs, as options its rewrites read
        (none by default)."""
        return {}

    def launch_env(self, flags: dict[str, Any]) -> list[str]:
        """`VAR=value` words a launch command starts with to set what `env_options` read (none by default)."""
        return []

    def gpus_used(self, flags: dict[str, Any]) -> int:
        raise NotImplementedError

    def candidates(self, model: ModelSpec, cluster: ClusterSpec) -> Iterable[dict[str, Any]]:
        raise NotImplementedError

    def speculative_options(self, algorithm: str, *, draft_model: str | None = None) -> dict[str, Any]:
        """Options that turn on `algorithm` drafting ("mtp", "dflash"); {} where the engine has none."""
        return {}

    def hand_tried(self, model: ModelSpec, cluster: ClusterSpec) -> Iterable[dict[str, Any]]:
        """Commands people try by hand that `candidates` leaves out (fewer GPUs, sizes that do not nest), so a
        ranking can say why each one is out."""
        return []

    def nodes(self, flags: dict[str, Any], cluster: ClusterSpec) -> int:
        """Nodes one launch spans."""
        return cluster.nodes

    def read(self, given: dict[str, Any]) -> dict[str, Any]:
        """Post-process parsed options (decode JSON, drop the model); raise EngineArgError like the engine."""
        return given

    def hint(self, message: str, argv: list[str]) -> str:
        """A sentence that explains a parser error better than the engine does, or ''."""
        return ""

    def render_values(self, given: dict[str, Any], version: Version) -> dict[str, Any]:
        """Options to write for `given` in this version's spelling."""
        return dict(given)

    def idle_note(self, flags: dict[str, Any], used: int, available: int) -> str:
        return f"uses {used} of {available} GPUs"

    # --- shared --------------------------------------------------------------------------------------

    def version(self, text: str | None) -> Version:
        return parse_version(text or flag_table(self.name).default_version, self.name)

    def resolve(
        self,
        argv: list[str],
        *,
        model: ModelSpec,
        cluster: ClusterSpec,
        version: str | None = None,
        env: dict[str, str] | None = None,
        waive: frozenset[str] = frozenset(),
    ) -> Setup:
        """Read the flags after the launcher the way the engine will run them (`waive`: rules a custom build of the
        engine lifts, by name, as a measured row's image does)."""
        v = self.version(version)
        try:
            given = self.read(parse_flags(flag_table(self.name), argv, v))
        except EngineArgError as exc:
            return self._argument_error(str(exc), argv, v, cluster)
        return self.setup(given, model=model, cluster=cluster, version=v, env=env or {}, waive=waive)

    def setup(
        self,
        given: dict[str, Any],
        *,
        model: ModelSpec,
        cluster: ClusterSpec,
        version: Version,
        env: dict[str, str] | None = None,
        waive: frozenset[str] = frozenset(),
    ) -> Setup:
        """Rewrites, rules and layout of options given by canonical name."""
        flags = {**table_defaults(self.name), **given, **self.env_options(env or {})}
        notes = self.effective(flags, version=version, cluster=cluster, model=model)
        available = self._gpus_available(cluster, flags, env or {})
        ctx = Context(
            flags=flags,
            model=model,
            cluster=cluster,
            version=version,
            gpus_available=available,
            blocks=block_shapes(model),
        )
        rejections = tuple(run_rules(self.rules, ctx))
        for lifted in (r for r in rejections if r.rule in waive):
            notes.append(Note(kind="warning", message=f"lifted for this build: {lifted.reason}", source=lifted.source))
        rejections = tuple(r for r in rejections if r.rule not in waive)
        notes += self._version_note(version)
        used = self.gpus_used(flags)
        if not rejections and used < available:
            notes.append(Note(kind="warning", message=self.idle_note(flags, used, available)))
        return Setup(
            engine=self.name,
            version=str(version),
            given=given,
            flags=flags,
            notes=tuple(notes),
            rejections=rejections,
            layout=None if rejections else self.layout(flags, model, version),
            gpus_used=used,
            gpus_available=available,
        )

    def enumerate(self, model: ModelSpec, cluster: ClusterSpec, *, version: str | None = None) -> list[Setup]:
        """Every valid layout on all of the cluster's GPUs, each effective layout once."""
        v = self.version(version)
        seen: set[tuple[int, ...]] = set()
        found = []
        for given in self.candidates(model, cluster):
            setup = self.setup(given, model=model, cluster=cluster, version=v)
            if setup.layout is None or setup.gpus_used != cluster.num_gpus or setup.layout.structure() in seen:
                continue
            seen.add(setup.layout.structure())
            found.append(setup)
        return found

    def node_options(self, given: dict[str, Any], rank: int) -> dict[str, Any]:
        """The options of node `rank` of a multi-node launch (the engine's rank flag, and what else differs)."""
        return {**given, "node_rank": rank}

    def launch_commands(self, setup: Setup, *, model_ref: str, remote_code: bool = False) -> list[list[str]]:
        """The commands that start `setup`, one per node (node 0 first), spelled for its engine version."""
        nodes, env = setup.flags.get("nnodes", 1), self.launch_env(setup.flags)
        if nodes == 1:
            return [env + self._render(setup.given, setup.version, model_ref=model_ref, remote_code=remote_code)]
        return [
            env
            + self._render(
                self.node_options(setup.given, rank), setup.version, model_ref=model_ref, remote_code=remote_code
            )
            for rank in range(nodes)
        ]

    def launch_command(self, setup: Setup, *, model_ref: str, remote_code: bool = False) -> list[str]:
        """The command that starts `setup` (on node 0 of a multi-node launch), spelled for its engine version."""
        return self.launch_commands(setup, model_ref=model_ref, remote_code=remote_code)[0]

    def _render(self, given: dict[str, Any], version_text: str, *, model_ref: str, remote_code: bool) -> list[str]:
        version = Version(version_text)
        values = self.render_values(given, version)
        if remote_code:
            values["trust_remote_code"] = True
        return render_command(flag_table(self.name), version, model_ref=model_ref, values=values)

    def _version_note(self, version: Version) -> list[Note]:
        known = _known_versions(self.name)
        if known[0] <= version <= known[-1]:
            return []
        return [
            Note(
                kind="warning",
                message=f"{self.display} {version} is outside the releases these rules were "
                f"read from ({min(known)} to {max(known)}); flags and checks may differ",
            )
        ]

    def _gpus_available(self, cluster: ClusterSpec, flags: dict[str, Any], env: dict[str, str]) -> int:
        """GPUs one launch reaches: its nodes, and CUDA_VISIBLE_DEVICES on a single node."""
        nodes = self.nodes(flags, cluster)
        count = min(cluster.num_gpus, cluster.gpus_per_node * nodes)
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and nodes == 1:
            count = min(count, len([d for d in visible.split(",") if d.strip()]))
        return count

    def parser_name(self, version: Version, message: str) -> str:
        """What the engine's argument parser calls itself in the error line of `message`, in this release."""
        return self.prog

    def _argument_error(self, message: str, argv: list[str], version: Version, cluster: ClusterSpec) -> Setup:
        rejection = Rejection(
            rule="arguments",
            reason=f"{self.display}'s argument parser refuses the command: {message}" + self.hint(message, argv),
            engine_error=f"SystemExit: {self.parser_name(version, message)}: error: {message}",  # argparse, exit 2
            source=f"{self.name} {version} {self.parser_source}",
        )
        return Setup(
            engine=self.name,
            version=str(version),
            given={},
            flags={},
            rejections=(rejection,),
            gpus_used=0,
            gpus_available=cluster.num_gpus,
        )


@cache
def _known_versions(engine: str) -> tuple[Version, ...]:
    """The releases an engine's rules were read from (parsed once: every setup checks against them)."""
    return tuple(sorted(Version(v) for v in flag_table(engine).known_versions))  # oldest first
