"""WatchWorkflow's stream: a workflow's events from a sequence number on, to its end.

Events this process wrote come from its event feed (`runtime._events`); the table is read only
for what the feed does not hold, and on every poll interval without news (another replica may
be writing). Each caller may hold `max_watches_per_caller` streams open here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from workflow_engine._masking import Secrets, state_secrets
from workflow_engine.config import ENV_PREFIX
from workflow_engine.domain.held import Held
from workflow_engine.domain.records import Scope, WorkflowEventRecord, WorkflowRecord
from workflow_engine.domain.status import TERMINAL_STATUSES
from workflow_engine.runtime import EventHub, Quota, RunManager
from workflow_engine.service._checks import in_scope
from workflow_engine.storage import Pool, queries


class Watches:
    """The open event streams of this process."""

    def __init__(
        self,
        *,
        pool: Pool,
        runs: RunManager,
        events: EventHub,
        poll_seconds: float,
        max_per_caller: int,
        secrets: Secrets,
    ) -> None:
        self._pool = pool
        self._secrets = secrets
        self._runs = runs
        self._events = events
        self._watch_poll = poll_seconds
        self._watches = Quota(
            max_per_caller,
            setting=f"{ENV_PREFIX}MAX_WATCHES_PER_CALLER",
            holder="caller",
            what="open watches",
        )

    def held(self) -> list[Held]:
        return [Held("watches.callers", self._watches.holders())]

    async def stream(
        self,
        task_id: str,
        from_sequence: int,
        scope: Scope | None = None,
        kinds: frozenset[str] | None = None,
        caller: str = "",
    ) -> AsyncIterator[WorkflowEventRecord]:
        """Yield the task's events from `from_sequence` on, ending after a terminal status;
        with `kinds`, only events of those kinds and the terminal one.

        Events this process wrote come from its event feed; the table is read only for what
        the feed does not hold (see `runtime._events`). A `caller` (the authenticated identity)
        with `max_watches_per_caller` open here is refused before anything is read.
        """
        next_seq = max(from_sequence, 1)
        with self._watches.holding(caller):
            if scope is not None:  # NOT_FOUND, as for a workflow that does not exist
                in_scope(await queries.get(self._pool, task_id), scope)
            with self._events.subscribe(task_id) as news:
                record: WorkflowRecord | None = None
                if not self._feed_holds_the_end(task_id, next_seq):
                    # NOT_FOUND before anything is streamed; the table may be ahead of the feed.
                    record = await queries.get(self._pool, task_id)
                    self._secrets.add(state_secrets(record.state))  # it may run elsewhere
                    news.stale = True
                while True:
                    news.woken.clear()  # before reading: a wake-up during the read is kept
                    batch = None if news.stale else self._events.recent(task_id, next_seq)
                    if batch is None:
                        news.stale = False
                        batch = await queries.events(self._pool, task_id, next_seq)
                    for event in batch:
                        next_seq = event.seq + 1
                        ends = event.kind == "status" and event.status in TERMINAL_STATUSES
                        if ends or kinds is None or event.kind in kinds:
                            yield event
                        if ends:
                            return
                    if batch:
                        continue
                    if record is not None and record.terminal and next_seq > record.event_seq:
                        return
                    try:
                        async with asyncio.timeout(self._watch_poll):
                            await news.woken.wait()
                    except TimeoutError:
                        record = await queries.get(self._pool, task_id)
                        news.stale = True

    def _feed_holds_the_end(self, task_id: str, from_seq: int) -> bool:
        """Whether this process's event feed may stand in for the table at a watch's start: it
        holds `from_seq`, and the table holds nothing newer that it does not know of (a run
        here writes the workflow, and anyone else's event empties the feed; or its newest event
        ended the workflow). A feed left by a run that went on elsewhere does not."""
        if not self._events.recent(task_id, from_seq):
            return False
        return self._runs.is_live(task_id) or self._events.ended(task_id)
