"""The `workflow-engine` command: `serve` (the default), `migrate`, `prune` and `worker-node`,
and the client commands for people (`start`, `get`, `watch`, `list`, `schedule`, ...:
`client`);
`--version` says which engine this is.

Settings come from ``WORKFLOW_ENGINE_*`` environment variables; flags override them. For
`worker-node`, `--listen` and `--data-dir` are the node's own (``WORKFLOW_ENGINE_NODE_*``), and
its token comes from ``WORKFLOW_ENGINE_NODE_TOKEN`` only, never from a flag (which `ps` shows).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from workflow_engine import client
from workflow_engine._logs import configure_logging
from workflow_engine.config import ENV_PREFIX, MAX_RETENTION_DAYS, Settings, settings_from_env
from workflow_engine.errors import AddressInUse, ConfigError, NodeInUse, UsageError
from workflow_engine.version import __version__

# Each command imports what it runs when it runs (below): `--version`, `--help` and the client
# commands never import the engine, LangGraph or a model SDK (tests/unit/test_cli_imports.py).


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workflow-engine",
        description="Durable LangGraph workflow worker, driven over gRPC.",
        epilog="Every flag has a WORKFLOW_ENGINE_<NAME> environment variable; flags win. "
        "To call a running engine: workflow-engine {start,get,watch,list,cancel,approve,"
        "reject,update,schedule} --help.",
    )
    parser.add_argument(
        "command",
        nargs="?",
        default="serve",
        choices=["serve", "migrate", "prune", "worker-node"],
    )
    parser.add_argument("--version", action="version", version=f"workflow-engine {__version__}")
    parser.add_argument("--database-url", help="PostgreSQL URL (default: embedded server)")
    parser.add_argument(
        "--listen",
        help="host:port to serve on: gRPC (default 127.0.0.1:50051), or for worker-node the "
        "Worker API over HTTP (default 127.0.0.1:8090)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="embedded database and job directories; for worker-node its own job directories "
        "(default .data/node)",
    )
    parser.add_argument("--holder-id", help="this process's lease holder identity")
    parser.add_argument(
        "--processes", type=int, help="engine processes sharing the port (default: cores)"
    )
    parser.add_argument("--lease-ttl-seconds", type=int, help="default lease time to live")
    parser.add_argument("--log-level", help="debug, info, warning or error")
    prune = parser.add_argument_group("prune")
    prune.add_argument(
        "--older-than",
        type=float,
        metavar="DAYS",
        help="prune finished workflows whose row last changed more than DAYS ago (0: all)",
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="print what prune would remove; change nothing"
    )
    node = parser.add_argument_group("worker-node")
    node.add_argument(
        "--max-timeout-seconds", type=int, help="cap on a job's timeout (default 3600, max 10800)"
    )
    node.add_argument(
        "--default-timeout-seconds", type=int, help="a job's timeout when it gives none (300)"
    )
    node.add_argument("--max-body-bytes", type=int, help="largest request body (10 MiB)")
    node.add_argument(
        "--drain-seconds", type=float, help="how long SIGTERM lets running jobs finish (30)"
    )
    node.add_argument("--not-ready-file", help="while this file exists, /readyz answers 503")
    node.add_argument(
        "--tls-cert-file", help="worker-node's certificate chain (PEM): it then serves HTTPS only"
    )
    node.add_argument("--tls-key-file", help="worker-node's private key (PEM), with the former")
    return parser


def settings_from_args(args: argparse.Namespace, base: Settings) -> Settings:
    if args.command == "worker-node":
        node = replace(
            base.node,
            **_given(
                args,
                "listen",
                "data_dir",
                "max_timeout_seconds",
                "default_timeout_seconds",
                "max_body_bytes",
                "drain_seconds",
                "not_ready_file",
                "tls_cert_file",
                "tls_key_file",
            ),
        )
        if not node.token:
            raise ConfigError(f"{ENV_PREFIX}NODE_TOKEN: required by worker-node (its bearer token)")
        return base.with_overrides(node=node, log_level=args.log_level)
    return base.with_overrides(
        **_given(
            args,
            "database_url",
            "listen",
            "data_dir",
            "holder_id",
            "processes",
            "lease_ttl_seconds",
            "log_level",
        )
    )


def _given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The flags among `names` given on the command line (a setting of the same name each)."""
    values = {name: getattr(args, name) for name in names}
    return {name: value for name, value in values.items() if value is not None}


async def _migrate(settings: Settings) -> None:
    import structlog

    from workflow_engine.storage import database_url, migrate_database

    async with database_url(settings) as url:
        applied = await migrate_database(url, settings)
    structlog.get_logger(__name__).info("migrated", migrations=applied)


def _check_prune_args(args: argparse.Namespace) -> None:
    days = args.older_than
    if days is None:
        raise UsageError("prune: --older-than DAYS is required")
    if not 0 <= days <= MAX_RETENTION_DAYS:
        raise UsageError(
            f"prune: --older-than: expected 0 to {MAX_RETENTION_DAYS} days, got {days}"
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in client.COMMANDS:
        return client.main(argv)
    args = _parser().parse_args(argv)
    try:
        settings = settings_from_args(args, settings_from_env())
        configure_logging(settings.log_level)
        _check_before_start(args, settings)
    except ValueError as exc:
        print(f"workflow-engine: {exc}", file=sys.stderr)
        return 2
    try:
        _run(args, settings)
    # An unknown capability, a bad nodes file, an address or data directory in use.
    except (ConfigError, NodeInUse, AddressInUse) as exc:
        print(f"workflow-engine: {exc}", file=sys.stderr)
        return 2
    return 0


def _check_before_start(args: argparse.Namespace, settings: Settings) -> None:
    """What stops a command before it starts anything: bad settings, files it cannot use."""
    if args.command == "serve":
        from workflow_engine._serving import auth_of, server_credentials

        settings.check_exposure()
        auth_of(settings)  # a tokens file that cannot be used stops the start here
        server_credentials(settings)
    elif args.command == "prune":
        _check_prune_args(args)
    elif args.command == "worker-node":
        from workflow_engine.worker_node import node_tls_context

        settings.node.check_exposure()
        node_tls_context(settings.node)  # a certificate that cannot be used stops it here


def _run(args: argparse.Namespace, settings: Settings) -> None:
    if args.command == "migrate":
        asyncio.run(_migrate(settings))
    elif args.command == "prune":
        from workflow_engine.runtime import prune_command

        print(asyncio.run(prune_command(settings, args.older_than, dry_run=args.dry_run)))
    elif args.command == "worker-node":
        from workflow_engine.worker_node import serve_node

        asyncio.run(serve_node(settings.node))
    else:
        from workflow_engine._serving import serve
        from workflow_engine._supervisor import supervise
        from workflow_engine._under_supervisor import supervised

        if settings.processes > 1 and not supervised():
            asyncio.run(supervise(settings))
        else:
            asyncio.run(serve(settings))


if __name__ == "__main__":
    sys.exit(main())
