"""The garbage-collection policy: survivors of slow full collections are frozen, others not."""

from __future__ import annotations

import gc

from workflow_engine.runtime import Collector

SURVIVORS = 1000


def frozen_by_a_full_collection() -> int:
    """How many of `SURVIVORS` tracked objects, made just before a full collection and alive
    through it, the collection moved to the permanent generation.

    Counted by identity rather than by `gc.get_freeze_count()`, which also drops whenever an
    object frozen earlier dies during the collection."""
    survivors = [[i] for i in range(SURVIVORS)]
    gc.collect()
    collectable = {id(thing) for thing in gc.get_objects()}  # the permanent generation is not
    return sum(id(thing) not in collectable for thing in survivors)


def test_survivors_of_a_slow_full_collection_are_frozen() -> None:
    collector = Collector(slow_seconds=0.0)  # every full collection counts as slow
    collector.install()
    try:
        assert frozen_by_a_full_collection() == SURVIVORS
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
