"""The engine for people at a terminal: ``workflow-engine start|get|watch|list|schedule|...``.

A gRPC client of a running engine, as any other (it imports the contract, nothing of the
engine's insides): `connection` opens the channel (address, TLS, token), `taskfile` reads a
task from YAML or JSON, `render` turns answers into text for people, and `subcommands` holds
the command line itself and the exit codes scripts rely on. It offers `subcommands` (its
`COMMANDS` and `main`) to ``workflow-engine``'s command line; the rest is internal.
"""

from workflow_engine.client import subcommands

__all__ = ["subcommands"]
