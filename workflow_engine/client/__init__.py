"""The engine for people at a terminal: ``workflow-engine start|get|watch|list|schedule|...``.

A gRPC client of a running engine, as any other (it imports the contract, nothing of the
engine's insides): `connection` opens the channel (address, TLS, token), `taskfile` reads a
task from YAML or JSON, `render` turns answers into text for people, and `subcommands` holds
the command line itself and the exit codes scripts rely on. It offers ``workflow-engine``'s
command line `COMMANDS` (the client commands' names) and `main` (which runs one); the rest is
internal. `subcommands` is imported only when a client command runs.
"""

from __future__ import annotations

#: The client commands, as the first word of ``workflow-engine``'s command line.
COMMANDS = ("start", "get", "watch", "list", "cancel", "approve", "reject", "update", "schedule")


def main(argv: list[str]) -> int:
    """Run the client command `argv` names (its first word is one of `COMMANDS`)."""
    from workflow_engine.client import _subcommands as subcommands

    return subcommands.main(argv)


__all__ = ["COMMANDS", "main"]
