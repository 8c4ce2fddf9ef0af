"""The `shardwise` command: parse arguments, call the library, render. A ShardwiseError becomes one line, exit 2.

Importing the command modules registers their commands, in the order the help lists them."""

# isort: off
from shardwise.cli import describe  # noqa: F401  (models, gpus, inspect, cluster, check, layouts)
from shardwise.cli import serve  # noqa: F401  (simulate, theorise)
from shardwise.cli import measure  # noqa: F401  (bench, validate, calibrate)
from shardwise.cli import deploy  # noqa: F401  (deploy)

# isort: on
from shardwise.cli.app import app, main

__all__ = ["app", "main"]
