"""The `workflow-engine` command: `serve` (the default) and `migrate`.

Settings come from ``WORKFLOW_ENGINE_*`` environment variables; flags override them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import structlog

from workflow_engine.app import open_database, open_pool, run_migrations, serve
from workflow_engine.capabilities.base import CapabilityConfigError
from workflow_engine.config import Settings, settings_from_env
from workflow_engine.logs import configure_logging

log = structlog.get_logger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workflow-engine",
        description="Durable LangGraph workflow worker, driven over gRPC.",
        epilog="Every flag has a WORKFLOW_ENGINE_<NAME> environment variable; flags win.",
    )
    parser.add_argument("command", nargs="?", default="serve", choices=["serve", "migrate"])
    parser.add_argument("--database-url", help="PostgreSQL URL (default: embedded server)")
    parser.add_argument("--listen", help="host:port to serve gRPC on (default 127.0.0.1:50051)")
    parser.add_argument("--data-dir", type=Path, help="embedded database and job directories")
    parser.add_argument("--holder-id", help="this process's lease holder identity")
    parser.add_argument("--lease-ttl-seconds", type=int, help="default lease time to live")
    parser.add_argument("--log-level", help="debug, info, warning or error")
    return parser


def settings_from_args(args: argparse.Namespace, base: Settings) -> Settings:
    return base.with_overrides(
        database_url=args.database_url,
        listen=args.listen,
        data_dir=args.data_dir,
        holder_id=args.holder_id,
        lease_ttl_seconds=args.lease_ttl_seconds,
        log_level=args.log_level,
    )


async def _migrate(settings: Settings) -> None:
    url, embedded = open_database(settings)
    try:
        pool = await open_pool(url, settings)
        try:
            applied = await run_migrations(pool)
            log.info("migrated", migrations=applied)
        finally:
            await pool.close()
    finally:
        if embedded is not None:
            embedded.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = settings_from_args(args, settings_from_env())
        configure_logging(settings.log_level)
    except ValueError as exc:
        print(f"workflow-engine: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "migrate":
            asyncio.run(_migrate(settings))
        else:
            asyncio.run(serve(settings))
    except CapabilityConfigError as exc:  # an unknown capability, a bad nodes file
        print(f"workflow-engine: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
