"""The errors shardwise raises for things a user can fix.

    ShardwiseError            anything the user can fix; the CLI prints its message as one line, exit 2
    ├── SpecError             a model, cluster or workload description that is malformed or unknown
    ├── DataError             a bundled or user-supplied data file (GPU, link, collective table) that is wrong
    └── BenchError            a server to measure that cannot be reached or does not serve

Programmer errors stay ordinary exceptions (and asserts): they are bugs, not user input.
"""

from __future__ import annotations


class ShardwiseError(Exception):
    """An error the user can fix. Its message is one line: what is wrong and what would be right."""


class SpecError(ShardwiseError):
    """A model, cluster or workload description is malformed, incomplete or unknown."""


class DataError(ShardwiseError):
    """A hardware or collective-table data file is malformed or inconsistent."""


class BenchError(ShardwiseError):
    """The server to benchmark cannot be reached or does not answer as an OpenAI-compatible server."""
