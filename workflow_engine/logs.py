"""structlog set-up: JSON lines on stderr, with task_id/run_id/node bound through contextvars.

Configured once, by the entry point. Below the configured level, log calls return at once
without formatting anything (`make_filtering_bound_logger`), so debug lines on the hot path
cost nothing when nobody reads them.
"""

from __future__ import annotations

import logging
import sys

import structlog

from workflow_engine.secrets import SECRETS


def configure_logging(level: str = "info") -> None:
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.dict_tracebacks,
            SECRETS.redact_event,  # last before rendering: sees every value as it is written
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries that log through the standard library (psycopg_pool, grpc) go to stderr too.
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
