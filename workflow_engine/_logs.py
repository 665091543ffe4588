"""structlog set-up: JSON lines on stderr, with task_id/run_id/node bound through contextvars.

Configured once, by the entry point. Every line masks the secrets of each engine of the process
(`mask_in_logs`, which an engine calls when it starts): the log is the process's, the secrets
are each engine's own. Below the configured level, log calls return at once
without formatting anything (`make_filtering_bound_logger`), so debug lines on the hot path
cost nothing when nobody reads them.

A line that cannot be written is dropped (`LineLogger`): when whatever reads stderr goes away
(the pipe's reader exits, a log shipper dies) every write fails, and a log call must not fail
the code around it. Before this, a worker node whose parent had died started jobs and then,
failing on the very next log line, never followed them: no result, and their wrappers left
unreaped.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import weakref
from collections.abc import Mapping, MutableMapping
from typing import Any, TextIO

import structlog

from workflow_engine._masking import Secrets
from workflow_engine.errors import ConfigError

#: One line at a time, whichever thread logs it (grpcio and the default executor log too).
_WRITING = threading.Lock()
#: The secrets of every engine of this process that writes to the log (see `mask_in_logs`).
_MASKED: weakref.WeakSet[Secrets] = weakref.WeakSet()


def mask_in_logs(secrets: Secrets) -> None:
    """Mask `secrets` (an engine's, as it starts) in every log line of this process."""
    _MASKED.add(secrets)


def unmask_in_logs(secrets: Secrets) -> None:
    """Stop masking `secrets` (an engine's, once it is closed)."""
    _MASKED.discard(secrets)


def _masked(logger: Any, name: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    """A structlog processor: the line with every engine's secrets masked in every value."""
    for secrets in list(_MASKED):
        event = dict(secrets.redact_event(logger, name, event))
    return event


class LineLogger:
    """structlog's logger: writes each rendered line to `file`, dropping what cannot be."""

    def __init__(self, file: TextIO) -> None:
        self._file = file

    def msg(self, message: str) -> None:
        # The reader is gone, the disk is full, the file closed: the line is lost, nothing else.
        with _WRITING, contextlib.suppress(OSError, ValueError):
            self._file.write(message + "\n")
            self._file.flush()

    debug = info = warning = warn = error = critical = exception = fatal = failure = err = msg
    log = msg


def configure_logging(level: str = "info") -> None:
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ConfigError(f"unknown log level {level!r}")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.dict_tracebacks,
            _masked,  # last before rendering: sees every value as it is written
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *_: LineLogger(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries that log through the standard library (psycopg_pool, grpc) go to stderr too.
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
