"""Wakes `WatchWorkflow` streams when a task's events are appended, in any replica.

One dedicated connection per process LISTENs on ``workflow_events`` (a trigger notifies with the
task id). Watchers still poll every `poll_seconds`, so a notification lost while the listening
connection was down delays an event by at most that long; it is never missed.

The same connection LISTENs on ``workflow_control``, where a cancel (in any replica) names the
task it cancelled; `on_control` hands it to the run manager, which stops the run and its jobs
if they are here. A lost control notification delays that until the run's next lease renewal.

`LISTEN` must reach PostgreSQL on a connection of its own: through a transaction-mode pooler it
would stick to whichever server connection ran it, which then serves other clients. So the
listener has its own URL (`listen_database_url`), and without one (`none`) it does not run:
watchers then see each event within their poll interval, and a cancel reaches the replica
running the workflow at that run's next lease renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator

import psycopg
import structlog

log = structlog.get_logger(__name__)

#: The listener's `application_name`, so operators can tell its connection apart.
LISTENER_NAME = "workflow-engine-listener"


class EventHub:
    """Per-task wake-ups from PostgreSQL notifications."""

    def __init__(
        self, conninfo: str | None, *, on_control: Callable[[str], None] | None = None
    ) -> None:
        self._conninfo = conninfo
        self._on_control = on_control
        self._waiters: defaultdict[str, set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._conninfo is None:
            log.info("watch_notifications_off", reason="no listen database URL")
            return
        self._task = asyncio.create_task(self._listen(self._conninfo), name="event-hub")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @contextlib.contextmanager
    def subscribe(self, task_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever `task_id` gets new workflow events; clear it after each wake."""
        event = asyncio.Event()
        self._waiters[task_id].add(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(task_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[task_id]

    async def _listen(self, conninfo: str) -> None:
        delay = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    await conn.execute("LISTEN workflow_events")
                    await conn.execute("LISTEN workflow_control")
                    delay = 0.1
                    async for note in conn.notifies():
                        if note.channel == "workflow_control":
                            if self._on_control is not None:
                                self._on_control(note.payload)
                            continue
                        for event in self._waiters.get(note.payload, ()):
                            event.set()
            except psycopg.Error as exc:
                log.warning("event_listener_lost", error=repr(exc), retry_in=delay)
                # Wake everyone so they poll while we are deaf.
                for waiters in self._waiters.values():
                    for event in waiters:
                        event.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
