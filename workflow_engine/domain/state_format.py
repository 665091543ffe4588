"""Which state format a workflow row holds, and whether this engine may touch it.

Every row the engine writes records the state format it wrote (`state_format`) and the engine
that wrote it (`engine_version`). The format is an integer that grows whenever what the row holds
changes meaning: the state's form, the graph's node names, or its next-node triggers (the
format's pieces are listed, and upgraded, in `workflow_engine.graph.formats`).

A replica runs, resumes, decides on, recovers, cancels or overrides a workflow only when it
reads that row's format. A row of a newer format (a newer engine wrote it during a rolling
deploy) is left exactly as it is: no claim, no status, no block, no event; the calls that would
change it are answered `FAILED_PRECONDITION` with `unreadable_reason`, which `GetWorkflow` also
shows as the row's `blocked_reason`. A row of an older format is upgraded as it is read.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The format this engine writes, and the newest it reads.
STATE_FORMAT = 4
#: The oldest format this engine reads (upgrading it as it reads). Format 1 is every row written
#: before rows recorded a format: the column's default, forever, so that a row inserted by an
#: engine that does not know the column says what it is.
FIRST_STATE_FORMAT = 1
#: LangGraph's name for the channel that triggers a node (``branch:to:<node>``): the row's
#: checkpoint names its next node so (`storage._checkpointer`), and the formats read it back
#: (`graph.formats`).
TRIGGER = "branch:to:"

_MAX_SHOWN = 64


def triggered(channels: Iterable[str]) -> list[str]:
    """The nodes whose triggers are among `channels` (in their order)."""
    return [name[len(TRIGGER) :] for name in channels if name.startswith(TRIGGER)]


def readable(state_format: int) -> bool:
    """Whether this engine reads (and so may change) a row of `state_format`."""
    return FIRST_STATE_FORMAT <= state_format <= STATE_FORMAT


def unreadable_reason(state_format: int, engine_version: str, this_version: str) -> str:
    """Why a row of `state_format`, written by `engine_version`, is left alone ('' if not)."""
    if readable(state_format):
        return ""
    # Whoever can write the row wrote this: shown short and printable (it goes into a status
    # message, whose header a long or binary value would break).
    shown = "".join(c if c.isprintable() else "?" for c in engine_version[:_MAX_SHOWN])
    writer = f"engine {shown}" if shown else "an unknown engine"
    return (
        f"written by {writer} in state format {state_format}; this engine ({this_version}) "
        f"reads formats {FIRST_STATE_FORMAT} to {STATE_FORMAT}, so it leaves the workflow "
        "alone: send the call to a replica of that engine or newer"
    )
