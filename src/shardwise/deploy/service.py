"""What a deployment file needs to know of a setup: its engine release and container image, the command each node
runs, the GPUs each node gives it, the port it serves and the environment it needs. Built from the commands
shardwise prints (`check`'s launch, theorise's pick); the file forms in `forms.py` only lay it out."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from packaging.version import Version

from shardwise.engines.flags import HEAD_IP
from shardwise.errors import SpecError

GIB = 1024**3
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Variables that carry a Hugging Face token: never written into a file (each form passes HF_TOKEN from the
# environment or a secret)
TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_API_TOKEN")
# Spare room in the model cache beyond the weights (tokenizer, configs, a second copy while a download resumes):
# a choice, not a measurement.
CACHE_SPARE = 0.25
_HEAD_PORT = re.compile(r"\$\{HEAD_PORT:-(\d+)\}")


@cache
def _images() -> dict[str, Any]:
    path = Path(str(resources.files("shardwise") / "data" / "deploy" / "images.yaml"))
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@dataclass(frozen=True, kw_only=True)
class Service:
    """One setup, ready to be written as deployment files."""

    title: str  # the setup as shardwise names it ("sglang TP8 PP2, FP8 KV cache")
    prediction: str  # what shardwise predicted for it, one line
    engine: str
    version: str
    vendor: str  # nvidia | amd
    gpu: str  # the GPU family (the ROCm image differs by Instinct generation)
    gpus_per_node: int
    commands: tuple[tuple[str, ...], ...]  # each node's command, node 0 first, without the environment
    env: dict[str, str] = field(default_factory=dict)  # variables the setup needs
    weights_bytes: float  # the checkpoint on disk: sizes the model cache

    def __post_init__(self) -> None:
        if not self.commands:
            raise SpecError("a setup to deploy needs at least one launch command")
        refuse_tokens(self.env)

    @property
    def nodes(self) -> int:
        return len(self.commands)

    @property
    def name(self) -> str:
        """A name every form accepts (a Kubernetes DNS label): the engine and its layout, lower case."""
        layout = self.title.split(",")[0].removeprefix(self.engine)
        slug = re.sub(r"[^a-z0-9]+", "-", f"{self.engine} {layout}".lower()).strip("-")
        return slug[:50].rstrip("-") or self.engine

    @property
    def image(self) -> str:
        """The engine release's container image for this GPU vendor."""
        rule = self._image_rule
        generation = _images()["amd_generations"].get(self.gpu, "")
        if "{amd_generation}" in rule["image"] and not generation:
            raise SpecError(f"no {self.engine} ROCm image is known for {self.gpu}; use MI300X, MI325X or MI355X")
        return rule["image"].format(version=self.version, amd_generation=generation)

    @property
    def image_note(self) -> str | None:
        """What the image asks of the machine (a CUDA 13 image needs driver 580), where anything."""
        return self._image_rule.get("note")

    @property
    def _image_rule(self) -> dict[str, str]:
        rules = _images()[self.engine][self.vendor]
        for rule in rules:
            if Version(self.version) >= Version(rule["from"]):
                return rule
        raise SpecError(
            f"no {self.engine} container image is known for release {self.version} on {self.vendor} GPUs; give "
            f"--engine-version {rules[-1]['from']} or later"
        )

    @property
    def port(self) -> int:
        """The port the engine serves on: its --port, else the engine's default."""
        value = flag_value(self.commands[0], "--port")
        return int(value) if value is not None else int(_images()["default_port"][self.engine])

    @property
    def health_path(self) -> str:
        return str(_images()["health_path"])

    @property
    def cache_gib(self) -> int:
        """The model cache to ask for, GiB: the checkpoint and its spare room."""
        return max(1, math.ceil(self.weights_bytes * (1 + CACHE_SPARE) / GIB))

    def argv(self, node: int, *, head: str | None = None, rank: str | None = None, port: bool = False) -> list[str]:
        """Node `node`'s command as a container runs it: `python3` for `python` (the images have no `python`), the
        server bound to every address where the engine binds loopback alone, and where asked, node 0's address
        `head`, the node's rank `rank` (a variable the platform fills) and the rendezvous port at its default."""
        argv = list(self.commands[node])
        if argv and argv[0] == "python":
            argv[0] = "python3"
        host = flag_value(argv, "--host")
        if host in LOOPBACK:  # nothing outside the container could reach it
            argv = with_flag_value(argv, "--host", "0.0.0.0")
        elif host is None and self.engine in _images()["binds_loopback"]:
            argv += ["--host", "0.0.0.0"]
        if head is not None:
            argv = [token.replace(HEAD_IP, head) for token in argv]
        if port:
            argv = [_HEAD_PORT.sub(r"\1", token) for token in argv]
        if rank is not None:
            argv = with_flag_value(argv, "--node-rank", rank)
        return argv


def refuse_tokens(env: dict[str, str]) -> None:
    """One clear error where a command's environment carries a token: no deployment file holds one."""
    secret = next((k for k in env if k in TOKENS), None)
    if secret is not None:
        raise SpecError(
            f"the command sets {secret}: deploy writes no token into a file; drop it from the command (the files "
            "take HF_TOKEN from the environment, or from the secret hf-token on Kubernetes)"
        )


def head_address_flag(engine: str) -> str:
    """The flag of a multi-node command that names node 0's address."""
    return str(_images()["head_address_flags"][engine])


def flag_value(argv: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value a command gives `flag` (`--flag value` or `--flag=value`), or None."""
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def with_flag_value(argv: list[str], flag: str, value: str) -> list[str]:
    """The command with `flag`'s value replaced, or `flag value` added where it has none."""
    out = list(argv)
    for i, token in enumerate(out):
        if token == flag and i + 1 < len(out):
            out[i + 1] = value
            return out
        if token.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    return [*out, flag, value]


def split_env(command: tuple[str, ...] | list[str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The `VAR=value` words a command starts with, and the command after them."""
    env: dict[str, str] = {}
    argv = list(command)
    while argv and "=" in argv[0] and not argv[0].startswith("-"):
        key, _, value = argv.pop(0).partition("=")
        env[key] = value
    return env, tuple(argv)
