"""Serves `WatchWorkflow` streams the events of this process's runs, and wakes them for others.

Events this process writes reach its watchers from memory: the checkpoint write answers with
the events it appended (`WriteOutcome`), the saver hands them to `written`, and each task keeps
its latest few (`FEED_EVENTS`) in a feed. A watcher takes events from the feed only while the
feed holds the very next sequence number it needs, so it can never skip one; anything else
(a workflow running in another process, a watcher catching up from an old sequence, an event
another writer appended, such as a cancel) is read from `workflow_events`. A watch starts from
the feed only when the feed holds the table's end: a run here is writing the workflow (its feed
starts afresh with the run), or the feed's newest event ended it; otherwise it reads the table
first, so it never waits for events that another process already wrote. A feed goes when its
run here ends (`release`), but for the latest `ENDED_FEEDS` of workflows that ended here, so
that a watch that comes just after a short workflow ended reads nothing (issue 62: an engine
keeps nothing of a finished workflow beyond a stated bound).

One dedicated connection per process LISTENs on ``workflow_events`` (a trigger notifies with
``task_id:seq``). A notification for a sequence the feed already holds is this process's own
write and is dropped; one that arrives while the task's write is still in flight waits for that
write's answer; any other marks the task's watchers stale, so they read the table. Watchers
still poll every `poll_seconds`, so a notification lost while the listening connection was
down delays an event by at most that long; it is never missed.

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
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import psycopg
import structlog

from workflow_engine.domain.held import Held
from workflow_engine.domain.records import WorkflowEventRecord
from workflow_engine.domain.status import TERMINAL_STATUSES

log = structlog.get_logger(__name__)

#: The listener's `application_name`, so operators can tell its connection apart.
LISTENER_NAME = "workflow-engine-listener"
#: Events kept per task (a whole 3-step workflow's); an older sequence is read from the table.
FEED_EVENTS = 24
#: Feeds are kept for the runs here (`release` drops one as its run ends); at most this many,
#: least recently written dropped first (about 200 bytes an event).
FEED_TASKS = 20_000
#: Feeds kept after their workflows ended here, the latest ones.
ENDED_FEEDS = 256


@dataclass(eq=False)
class Subscription:
    """One watcher's wake-up: `woken` is set on news; `stale` says the table has some."""

    woken: asyncio.Event = field(default_factory=asyncio.Event)
    stale: bool = False


@dataclass
class _Feed:
    events: deque[WorkflowEventRecord] = field(default_factory=lambda: deque(maxlen=FEED_EVENTS))
    writing: int = 0  # this process's writes in flight for the task
    notified: int = 0  # the highest sequence notified while one was


class EventHub:
    """Per-task feeds of this process's events, and wake-ups from PostgreSQL notifications."""

    def __init__(
        self, conninfo: str | None, *, on_control: Callable[[str], None] | None = None
    ) -> None:
        self._conninfo = conninfo
        self._on_control = on_control
        self._waiters: defaultdict[str, set[Subscription]] = defaultdict(set)
        self._feeds: OrderedDict[str, _Feed] = OrderedDict()  # of runs here
        self._ended: OrderedDict[str, _Feed] = OrderedDict()  # of workflows that ended here
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Listen for notifications; `on_control` gets the task id of each cancel."""
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
    def subscribe(self, task_id: str) -> Iterator[Subscription]:
        """Woken whenever `task_id` gets new workflow events; clear `woken` after each wake."""
        subscription = Subscription()
        self._waiters[task_id].add(subscription)
        try:
            yield subscription
        finally:
            waiters = self._waiters.get(task_id)
            if waiters is not None:
                waiters.discard(subscription)
                if not waiters:
                    del self._waiters[task_id]

    def recent(self, task_id: str, from_seq: int) -> list[WorkflowEventRecord] | None:
        """The task's events from `from_seq` on, or `None` when the feed does not hold that
        sequence (then the table must be read). An empty list: none written here since."""
        feed = self._feed(task_id)
        if feed is None or not feed.events:
            return None
        first, last = feed.events[0].seq, feed.events[-1].seq
        if not first <= from_seq <= last + 1:
            return None
        return list(feed.events)[from_seq - first :]

    def writing(self, task_id: str) -> None:
        """A checkpoint write of the task is about to be sent (see `written`)."""
        self._ended.pop(task_id, None)
        feed = self._feeds.get(task_id)
        if feed is None:
            feed = self._feeds[task_id] = _Feed()
            self._trim()
        feed.writing += 1

    def written(self, task_id: str, events: Sequence[WorkflowEventRecord]) -> None:
        """The write announced by `writing` is over; `events` are what it appended (if any)."""
        feed = self._feeds.get(task_id)
        if feed is None:  # dropped meanwhile
            feed = self._feeds[task_id] = _Feed(writing=1)
            self._trim()
        feed.writing = max(feed.writing - 1, 0)
        self._append(task_id, feed, events)
        stale = feed.writing == 0 and feed.notified > _last_seq(feed)
        if feed.writing == 0:
            feed.notified = 0
        if stale:
            feed.events.clear()  # someone else wrote past this write: the table holds the end
        self._wake(task_id, stale=stale)

    def ended(self, task_id: str) -> bool:
        """Whether the feed's newest event ended the workflow (nothing can follow it)."""
        feed = self._feed(task_id)
        return feed is not None and _ends(feed)

    def release(self, task_id: str) -> None:
        """A run of the task ended here: its feed goes (a later watch reads the table), but
        for the last `ENDED_FEEDS` of workflows that ended here (a watch that comes just
        after a short workflow ended needs no read); unless a write is in flight."""
        feed = self._feeds.get(task_id)
        if feed is None or feed.writing:
            return
        del self._feeds[task_id]
        if _ends(feed):
            self._ended[task_id] = feed
            while len(self._ended) > ENDED_FEEDS:
                self._ended.popitem(last=False)

    def held(self) -> list[Held]:
        return [
            Held("events.feeds", len(self._feeds)),
            Held("events.ended_feeds", len(self._ended), ENDED_FEEDS),
            Held("events.watched_tasks", len(self._waiters), 0),
        ]

    def forget(self, task_id: str) -> None:
        """Drop the task's feed: a run of it starts here after others may have written it."""
        self._ended.pop(task_id, None)
        feed = self._feeds.get(task_id)
        if feed is not None:
            feed.events.clear()

    def started(self, task_id: str, event: WorkflowEventRecord) -> None:
        """A workflow was started here: its first event opens the task's feed."""
        self._ended.pop(task_id, None)
        feed = self._feeds[task_id] = _Feed()
        self._trim()
        self._append(task_id, feed, [event])
        self._wake(task_id, stale=False)

    def _append(self, task_id: str, feed: _Feed, events: Sequence[WorkflowEventRecord]) -> None:
        if not events:
            return
        if feed.events and feed.events[-1].seq + 1 != events[0].seq:
            feed.events.clear()  # someone else wrote in between: only what follows is here
        feed.events.extend(events)
        self._feeds.move_to_end(task_id)

    def _feed(self, task_id: str) -> _Feed | None:
        return self._feeds.get(task_id) or self._ended.get(task_id)

    def _trim(self) -> None:
        while len(self._feeds) > FEED_TASKS:
            self._feeds.popitem(last=False)

    def _wake(self, task_id: str, *, stale: bool) -> None:
        for subscription in self._waiters.get(task_id, ()):
            subscription.stale = subscription.stale or stale
            subscription.woken.set()

    def _notified(self, payload: str) -> None:
        """A `workflow_events` notification: ``task_id:seq`` (or a bare task id).

        An event past the feed's newest that this process did not write means the feed no
        longer holds the table's end: it is emptied, watched or not, so no later watch trusts it.
        """
        task_id, _, seq_text = payload.partition(":")
        feed = self._feed(task_id)
        if feed is not None:
            seq = int(seq_text) if seq_text.isdigit() else None
            if seq is not None and seq <= _last_seq(feed):
                return  # this process wrote it, and its watchers have it
            if seq is not None and feed.writing:
                feed.notified = max(feed.notified, seq)  # decided when the write answers
                return
            feed.events.clear()
        if task_id in self._waiters:
            self._wake(task_id, stale=True)

    async def _listen(self, conninfo: str) -> None:
        delay = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    conninfo, autocommit=True, client_encoding="utf8"
                ) as conn:
                    await conn.execute("LISTEN workflow_events")
                    await conn.execute("LISTEN workflow_control")
                    delay = 0.1
                    async for note in conn.notifies():
                        if note.channel == "workflow_control":
                            if self._on_control is not None:
                                self._on_control(note.payload)
                            continue
                        self._notified(note.payload)
            except psycopg.Error as exc:
                log.warning("event_listener_lost", error=repr(exc), retry_in=delay)
                # Wake everyone so they read the table while we are deaf.
                for task_id in list(self._waiters):
                    self._wake(task_id, stale=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


def _ends(feed: _Feed) -> bool:
    """Whether the feed's newest event ended its workflow."""
    newest = feed.events[-1] if feed.events else None
    return newest is not None and newest.kind == "status" and newest.status in TERMINAL_STATUSES


def _last_seq(feed: _Feed) -> int:
    return feed.events[-1].seq if feed.events else 0
