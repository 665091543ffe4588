"""An embedded PostgreSQL server for when no database URL is configured.

`pgserver` ships the server binaries inside its wheel and, when we run as root, runs them as an
unprivileged system user, so `workflow-engine serve` works on a fresh machine with nothing else
installed. The server keeps running after this process exits (a restarted engine finds it and
reuses it, which is also what a crash test needs).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


def start_embedded_postgres(pgdata: Path) -> str:
    """Start (or find) the server for `pgdata` and return a connection URL for it."""
    # Deferred: importing it is not free and only this path needs it. It asks platformdirs for
    # a runtime directory, which warns when XDG_RUNTIME_DIR is unset (always, in containers).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver.postgres_server import get_server

    pgdata = pgdata.resolve()
    pgdata.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = get_server(pgdata, cleanup_mode=None)
    url = str(server.get_uri())
    log.info("embedded_postgres_ready", pgdata=str(pgdata))
    return url
