"""Which database errors are retried: the connection's failures, never the statement's."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest

from workflow_engine.storage import is_transient


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (psycopg.errors.ConnectionFailure("gone"), True),  # 08006
        (psycopg.errors.AdminShutdown("restart"), True),  # 57P01
        (psycopg.errors.DeadlockDetected("cycle"), True),  # 40P01
        (psycopg.OperationalError("socket closed"), True),  # no SQLSTATE: the socket died
        # 08P01: the connection is up and the statement was wrong (a pooler's mix-up of
        # prepared statements); a retry may run yet another wrong one.
        (psycopg.errors.ProtocolViolation("bind message supplies 1 parameters"), False),
        (psycopg.errors.UniqueViolation("dup"), False),
        (psycopg.errors.UndefinedTable("nope"), False),
    ],
)
def test_retried_conditions(error: Exception, transient: bool) -> None:
    assert is_transient(error) is transient
