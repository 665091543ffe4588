"""The default context compressor keeps the newest outputs within the budget."""

from __future__ import annotations

from workflow_engine.capabilities._compressor import ENTRY_OVERHEAD, TruncatingCompressor


async def test_everything_that_fits_is_kept_whole() -> None:
    entries = [{"step_id": "a", "output": "one"}, {"step_id": "b", "output": "two"}]
    assert await TruncatingCompressor().compress(entries, 1000) == entries


async def test_the_oldest_lose_their_output_first_and_the_tail_is_kept() -> None:
    entries = [{"step_id": "old", "output": "x" * 500}, {"step_id": "new", "output": "y" * 100}]
    kept = await TruncatingCompressor().compress(entries, 2 * ENTRY_OVERHEAD + 150)
    assert kept[1] == {"step_id": "new", "output": "y" * 100}
    assert kept[0]["output"] == "x" * 50 and kept[0]["truncated"] is True


async def test_entries_beyond_the_budget_are_dropped_and_counted() -> None:
    entries = [{"step_id": str(i), "output": "z"} for i in range(10)]
    kept = await TruncatingCompressor().compress(entries, 3 * ENTRY_OVERHEAD)
    assert kept[0] == {"step_id": "", "output": "", "dropped_entries": 8}
    assert [e["step_id"] for e in kept[1:]] == ["8", "9"]
