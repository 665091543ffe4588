"""The garbage-collection policy: survivors of slow full collections are frozen, others not."""

from __future__ import annotations

import gc

from workflow_engine.runtime.collector import Collector

SURVIVORS = 1000


def frozen_by_a_full_collection() -> int:
    """How many objects a full collection moved to the permanent generation, `SURVIVORS`
    tracked objects made just before it surviving it."""
    frozen = gc.get_freeze_count()
    survivors = [[i] for i in range(SURVIVORS)]
    gc.collect()
    assert len(survivors) == SURVIVORS  # alive through the collection
    return gc.get_freeze_count() - frozen


def test_survivors_of_a_slow_full_collection_are_frozen() -> None:
    collector = Collector(slow_seconds=0.0)  # every full collection counts as slow
    collector.install()
    try:
        assert frozen_by_a_full_collection() >= SURVIVORS
        assert collector.freezes == 1
        gc.collect(1)  # a young collection freezes nothing
        assert collector.freezes == 1
    finally:
        collector.uninstall()


def test_a_quick_full_collection_freezes_nothing() -> None:
    collector = Collector(slow_seconds=3600.0)
    collector.install()
    try:
        assert frozen_by_a_full_collection() == 0
        assert collector.freezes == 0
    finally:
        collector.uninstall()


def test_uninstalled_it_freezes_no_more() -> None:
    collector = Collector(slow_seconds=0.0)
    collector.install()
    collector.uninstall()
    assert frozen_by_a_full_collection() == 0
    assert collector.freezes == 0
