"""The engine for people at a terminal: ``workflow-engine start|get|watch|list|schedule|...``.

A gRPC client of a running engine, as any other (it imports the contract, nothing of the
engine's insides): `_connection` opens the channel (address, TLS, token), `_taskfile` reads a
task from YAML or JSON, `_render` turns answers into text for people, `_arguments` parses the
command line, and `_subcommands` holds the commands themselves and the exit codes scripts rely
on. It offers ``workflow-engine``'s command line `COMMANDS` (the client commands' names) and
`main` (which runs one). `_subcommands` is imported only when a client command runs.
"""

from __future__ import annotations

#: The client commands, as the first word of ``workflow-engine``'s command line.
COMMANDS = ("start", "get", "watch", "list", "cancel", "approve", "reject", "update", "schedule")


def main(argv: list[str]) -> int:
    """Run the client command `argv` names (its first word is one of `COMMANDS`)."""
    from workflow_engine.client import _subcommands as subcommands

    return subcommands.main(argv)


__all__ = [
    "COMMANDS",
    "main",
]
