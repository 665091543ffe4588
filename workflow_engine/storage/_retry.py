"""The one place transient database errors are retried.

Only failures that say nothing about the statement itself are retried: the connection broke
(SQLSTATE class 08, or no SQLSTATE at all because the socket died), the server is short of
resources (53), an operator or shutdown intervened (57, e.g. ``admin_shutdown`` during a
restart), or the server rolled the transaction back to break a deadlock (40). Everything else
(constraint violations, syntax, a lost lease) is a real answer and is raised at once. Every
operation wrapped here must be safe to run twice.

One code of class 08 is not retried: 08P01, protocol violation. The connection is up; what it
ran was wrong (behind a transaction-mode pooler, a prepared statement of another server
connection), and a retry could land on yet another wrong statement.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
import psycopg_pool
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: SQLSTATE classes worth another try, and why.
RETRYABLE_SQLSTATE_CLASSES = {
    "08": "connection exception",
    "53": "insufficient resources",
    "57": "operator intervention (shutdown, terminated backend)",
    "40": "transaction rolled back (deadlock, serialization failure): nothing took effect",
}


#: Codes inside those classes that are not transient, and why.
NOT_RETRYABLE_SQLSTATES = {
    "08P01": "protocol violation: the statement itself went wrong, not the connection",
}


def is_transient(exc: BaseException) -> bool:
    """True when `exc` is a database failure that a retry on a new connection may cure."""
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    sqlstate = exc.sqlstate
    if sqlstate is None:  # connection lost before the server could say why
        return True
    if sqlstate in NOT_RETRYABLE_SQLSTATES:
        return False
    return sqlstate[:2] in RETRYABLE_SQLSTATE_CLASSES


#: How long `with_retry` goes on retrying when its caller does not say.
DEFAULT_MAX_SECONDS = 30.0


def _log_first_failure(exc: BaseException) -> None:
    log.warning("db_retry", attempt=1, error=repr(exc))


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("db_retry", attempt=state.attempt_number + 1, error=repr(exc))


async def with_retry(
    operation: Callable[[], Awaitable[T]],
    *,
    max_seconds: float = DEFAULT_MAX_SECONDS,
) -> T:
    """Run `operation`; retry transient failures with jittered backoff for up to `max_seconds`."""
    try:  # the common case pays nothing for the retry machinery
        return await operation()
    except Exception as exc:
        if not is_transient(exc):
            raise
        _log_first_failure(exc)
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(is_transient),
        wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
        stop=stop_after_delay(max_seconds),
        before_sleep=_log_retry,
        reraise=True,
    ):
        with attempt:
            return await operation()
    raise AssertionError("unreachable: tenacity reraises the last error")
