"""The event feed's rules, one notification ordering at a time (the races the integration
tests cannot time): a watcher is never served past a sequence it has not seen, and a
notification of someone else's event always leaves the watcher stale (it reads the table)."""

from __future__ import annotations

from datetime import UTC, datetime

from workflow_engine.domain.records import WorkflowEventRecord
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.runtime._events import ENDED_FEEDS, FEED_EVENTS, EventHub

TASK = "6c1b2f4e-0000-4000-8000-000000000001"


def event(seq: int, ends: WorkflowStatus | None = None) -> WorkflowEventRecord:
    """A node event, or with `ends` the status event that ended the workflow."""
    if ends is not None:
        return WorkflowEventRecord(seq, "status", None, ends, datetime.now(UTC), "run")
    return WorkflowEventRecord(seq, "node", "n", "RUNNING", datetime.now(UTC), "run")


def wrote(hub: EventHub, *seqs: int) -> None:
    hub.writing(TASK)
    hub.written(TASK, [event(s) for s in seqs])


async def test_the_feed_serves_only_from_a_sequence_it_holds() -> None:
    hub = EventHub(None)
    assert hub.recent(TASK, 1) is None
    wrote(hub, 2, 3)
    assert hub.recent(TASK, 1) is None  # 1 was never here
    assert [e.seq for e in hub.recent(TASK, 2) or []] == [2, 3]
    assert hub.recent(TASK, 4) == []
    assert hub.recent(TASK, 5) is None
    wrote(hub, 5)  # someone else wrote 4: only what follows the gap is kept
    assert hub.recent(TASK, 4) is None
    assert [e.seq for e in hub.recent(TASK, 5) or []] == [5]


async def test_the_feed_keeps_the_latest_events_only() -> None:
    hub = EventHub(None)
    wrote(hub, *range(1, FEED_EVENTS + 6))
    assert hub.recent(TASK, 1) is None
    assert len(hub.recent(TASK, 6) or []) == FEED_EVENTS


async def test_own_events_notified_after_the_write_do_not_make_watchers_stale() -> None:
    hub = EventHub(None)
    wrote(hub, 1)
    with hub.subscribe(TASK) as news:
        wrote(hub, 2, 3)
        assert news.woken.is_set() and not news.stale
        hub._notified(f"{TASK}:3")
        assert not news.stale


async def test_a_notification_during_a_write_waits_for_its_answer() -> None:
    hub = EventHub(None)
    wrote(hub, 1)
    with hub.subscribe(TASK) as news:
        hub.writing(TASK)
        hub._notified(f"{TASK}:2")  # the write's own event, notified before its answer
        assert not news.woken.is_set()
        hub.written(TASK, [event(2)])
        assert news.woken.is_set() and not news.stale

        news.woken.clear()
        hub.writing(TASK)
        hub._notified(f"{TASK}:4")  # someone else's: 3 is this write's, 4 is not
        hub.written(TASK, [event(3)])
        assert news.woken.is_set() and news.stale

        news.stale = False
        hub.writing(TASK)
        hub._notified(f"{TASK}:5")
        hub.written(TASK, [])  # the write failed (a cancel took the lease): 5 is not ours
        assert news.stale


async def test_other_notifications_make_watchers_stale() -> None:
    hub = EventHub(None)
    with hub.subscribe(TASK) as news:
        hub._notified(f"{TASK}:1")  # nothing of this task written here
        assert news.woken.is_set() and news.stale
    wrote(hub, 1)
    with hub.subscribe(TASK) as news:
        hub._notified(TASK)  # no sequence (an older engine's trigger)
        assert news.stale


async def test_someone_elses_event_empties_the_feed_watched_or_not() -> None:
    # No watcher is subscribed when the other process's events are notified: the feed must
    # still stop standing in for the table, or the next watch would wait for them.
    hub = EventHub(None)
    wrote(hub, 1, 2, 3)
    hub._notified(f"{TASK}:4")
    assert hub.recent(TASK, 1) is None
    wrote(hub, 5)  # this process writes again, after the gap: only that is served
    assert [e.seq for e in hub.recent(TASK, 5) or []] == [5]

    hub.writing(TASK)
    hub._notified(f"{TASK}:7")  # past the write in flight, which turns out to be 6
    hub.written(TASK, [event(6)])
    assert hub.recent(TASK, 5) is None


async def test_the_feed_says_whether_its_newest_event_ended_the_workflow() -> None:
    hub = EventHub(None)
    wrote(hub, 1)
    assert not hub.ended(TASK)
    hub.writing(TASK)
    done = WorkflowEventRecord(2, "status", None, "SUCCEEDED", datetime.now(UTC), "run")
    hub.written(TASK, [done])
    assert hub.ended(TASK)
    hub.forget(TASK)
    assert not hub.ended(TASK) and hub.recent(TASK, 1) is None


def test_a_feed_goes_with_its_run_but_for_the_latest_ended_ones() -> None:
    hub = EventHub(None)
    unfinished, ended = "00000000-0000-4000-8000-0000000000aa", TASK
    for task_id in (unfinished, ended):
        hub.started(task_id, event(1))
    hub.writing(ended)
    hub.written(ended, [event(2, WorkflowStatus.SUCCEEDED)])
    hub.release(unfinished)  # its run stopped (waiting, say): a watch reads the table
    hub.release(ended)  # it ended here: kept, among the latest ENDED_FEEDS
    assert hub.recent(unfinished, 1) is None
    assert hub.ended(ended) and [e.seq for e in hub.recent(ended, 1) or []] == [1, 2]
    for i in range(ENDED_FEEDS):
        other = f"00000000-0000-4000-8000-{i:012}"
        hub.started(other, event(1, WorkflowStatus.SUCCEEDED))
        hub.release(other)
    assert hub.recent(ended, 1) is None  # the oldest ended feed went
    held = {h.structure: (h.entries, h.bound) for h in hub.held()}
    assert held["events.feeds"] == (0, 0)
    assert held["events.ended_feeds"] == (ENDED_FEEDS, ENDED_FEEDS)
