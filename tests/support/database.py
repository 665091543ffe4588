"""Where the tests' databases are, and how an engine under test reaches them.

The suite runs against one PostgreSQL server: the embedded one, or the one named by
``WORKFLOW_ENGINE_TEST_DATABASE_URL``. Tests and engines may reach it through a pooler instead:
``WORKFLOW_ENGINE_TEST_POOLER=pgbouncer`` starts a transaction-mode PgBouncer in front of it (see
`tests.support.pgbouncer`), and a ``WORKFLOW_ENGINE_TEST_DATABASE_URL`` may itself be a pooler's,
with
``WORKFLOW_ENGINE_TEST_ADMIN_DATABASE_URL`` then naming the server directly. The direct URL is for
what a pooler cannot do: create a test database from the template (the pooler keeps idle
connections to it) and LISTEN.

`ROUTE` is set once per session by the `pg_server_url` fixture; `engine_env` gives an engine
process the settings that fit it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

#: How the embedded test server runs (`start_embedded`). Several pytest-xdist workers, each with
#: its engines' pools, their processes' and a pooler's, share it (PostgreSQL's default is 100
#: connections). It is a throwaway server on a machine that does not crash during a run: its
#: writes need not reach the disk, and a flush would wait behind everything else CI writes
#: meanwhile (ext4 orders a file's flush after the other files' new blocks: a compile's).
#: Commits still wait for their WAL to be written, so a crashed or killed server loses nothing.
TEST_SERVER_SETTINGS = {"max_connections": "500", "fsync": "off", "full_page_writes": "off"}


@dataclass(frozen=True)
class Route:
    """How test databases are reached: `admin_url` directly, `client_base` for the rest."""

    admin_url: str
    client_base: str
    pooled: bool

    def client(self, dbname: str) -> str:
        return make_conninfo(self.client_base, dbname=dbname)

    def direct(self, dbname: str) -> str:
        return make_conninfo(self.admin_url, dbname=dbname)


ROUTE: Route | None = None


def engine_settings(db_url: str) -> dict[str, str]:
    """Settings (field: value) an engine using `db_url` needs when it is behind a pooler."""
    if ROUTE is None or not ROUTE.pooled:
        return {}
    dbname = str(conninfo_to_dict(db_url).get("dbname") or "")
    return {"listen_database_url": ROUTE.direct(dbname), "database_prepare": "off"}


def engine_env(db_url: str) -> dict[str, str]:
    """`engine_settings` as ``WORKFLOW_ENGINE_*`` variables, for an engine process."""
    return {
        f"WORKFLOW_ENGINE_{name.upper()}": value for name, value in engine_settings(db_url).items()
    }


def start_embedded(pgdata: Path) -> Any:
    """A handle on the embedded test server in `pgdata` (`pgserver`), started if it is not
    running, with `TEST_SERVER_SETTINGS`; it stops when the last process holding a handle lets
    go (`cleanup`).

    A setting that takes a restart is set at the first start: pytest's controller starts the
    server before its workers attach, so the restart meets no one.
    """
    from pgserver.postgres_server import get_server

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = get_server(pgdata, cleanup_mode="stop")
    with psycopg.connect(str(server.get_uri()), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT name, setting, context FROM pg_settings WHERE name = ANY(%s)",
            [list(TEST_SERVER_SETTINGS)],
        ).fetchall()
        changed = [
            (name, context)
            for name, setting, context in rows
            if setting != TEST_SERVER_SETTINGS[name]
        ]
        for name, _ in changed:
            admin.execute(f"ALTER SYSTEM SET {name} = {TEST_SERVER_SETTINGS[name]}")
        admin.execute("SELECT pg_reload_conf()")
    if not any(context == "postmaster" for _, context in changed):
        return server
    server.cleanup()  # stops it, when no other process holds it
    return get_server(pgdata, cleanup_mode="stop")
