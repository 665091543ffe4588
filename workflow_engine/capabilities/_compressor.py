"""The context compressor: keep the newest results, truncating outputs to a budget.

Each dispatch receives the outputs of the steps it depends on (or of every earlier step, for a
sequential plan). Outputs are kept whole while they fit; past the budget the oldest entries
lose their output first (the tail of an output is kept, where programs print their result),
and entries that no longer fit at all are dropped and counted. It is the one implementation
(no setting chooses it); an LLM summariser could replace it behind the same `ContextCompressor`
interface, and earn a setting then.
"""

from __future__ import annotations

from collections.abc import Sequence

from workflow_engine.domain.values import JsonObject

#: What an entry costs besides its output (its id and the JSON around it), roughly.
ENTRY_OVERHEAD = 64


class TruncatingCompressor:
    """`ContextCompressor` that truncates; see the module docstring."""

    async def compress(self, entries: Sequence[JsonObject], budget_chars: int) -> list[JsonObject]:
        kept: list[JsonObject] = []
        left = budget_chars
        for entry in reversed(entries):  # newest first: they matter most to the next step
            if left < ENTRY_OVERHEAD:
                break
            output = str(entry.get("output") or "")
            room = left - ENTRY_OVERHEAD
            compressed = dict(entry)
            if len(output) > room:
                compressed["output"] = output[-room:] if room else ""
                compressed["truncated"] = True
            kept.append(compressed)
            left -= ENTRY_OVERHEAD + len(str(compressed.get("output") or ""))
        kept.reverse()
        dropped = len(entries) - len(kept)
        if dropped:
            kept.insert(0, {"step_id": "", "output": "", "dropped_entries": dropped})
        return kept
