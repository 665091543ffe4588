"""The garbage-collection policy: survivors of slow full collections are frozen, others not."""

from __future__ import annotations

import gc

from workflow_engine.runtime.collector import Collector


def test_survivors_of_a_slow_full_collection_are_frozen() -> None:
    collector = Collector(slow_seconds=0.0)  # every full collection counts as slow
    collector.install()
    try:
        frozen_at_install = gc.get_freeze_count()
        survivors = [[i] for i in range(1000)]  # tracked objects made after the install
        gc.collect()
        assert collector.freezes == 1
        assert gc.get_freeze_count() >= frozen_at_install + len(survivors)
        gc.collect(1)  # a young collection freezes nothing
        assert collector.freezes == 1
    finally:
        collector.uninstall()


def test_a_quick_full_collection_freezes_nothing() -> None:
    collector = Collector(slow_seconds=3600.0)
    collector.install()
    try:
        frozen = gc.get_freeze_count()
        survivors = [[i] for i in range(1000)]
        gc.collect()
        assert collector.freezes == 0
        assert gc.get_freeze_count() == frozen
        assert survivors
    finally:
        collector.uninstall()


def test_uninstalled_it_freezes_no_more() -> None:
    collector = Collector(slow_seconds=0.0)
    collector.install()
    collector.uninstall()
    frozen = gc.get_freeze_count()
    survivors = [[i] for i in range(1000)]
    gc.collect()
    assert collector.freezes == 0
    assert gc.get_freeze_count() == frozen
    assert survivors
