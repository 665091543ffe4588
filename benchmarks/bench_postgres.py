"""The benchmarks' embedded PostgreSQL (one data directory for them all), and a run on it that
ends cleanly on SIGTERM and on Ctrl-C.

SIGTERM, from `kill`, `timeout` or a CI runner giving up, used to end a benchmark on the spot:
the engines it started went with it (see `contenders.ended_with_us`), but the server stayed up,
and every later benchmark reused it and left it up too (see `workflow_engine.storage._embedded`).
Now SIGTERM cancels the run: every `finally` runs, the contenders close, the server this
process started stops, and the exit status is 143. Ctrl-C (SIGINT) does the same with status
130, and says "interrupted" instead of printing the traceback of wherever it happened to land.
Only SIGKILL still leaves the server behind.

One benchmark at a time per data directory: a second one started meanwhile would share the
cores (so both figures are wrong) and the server (so the first to end stops it under the
other). It waits for the first to end, saying which process it waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from workflow_engine import _pid_file as pid_file
from workflow_engine.storage._embedded import start_embedded_postgres

PGDATA = Path(__file__).resolve().parent.parent / ".data" / "bench-pgdata"
TERMINATED = 128 + signal.SIGTERM  # the status a shell gives a process SIGTERM ended
INTERRUPTED = 128 + signal.SIGINT  # and one Ctrl-C ended

T = TypeVar("T")


def run_on_bench_postgres(
    main: Callable[[str], Coroutine[Any, Any, T]], pgdata: Path = PGDATA
) -> T:
    """`main(url)` in asyncio on the embedded server for `pgdata`, started if need be and
    stopped at the end if this process started it, also when SIGTERM or Ctrl-C ends the run.

    asyncio.run already turns Ctrl-C into cancelling the run, then re-raises it here, after
    the run unwound and before the server stops."""
    previous = signal.signal(signal.SIGTERM, _terminated)  # until the run is under way
    try:
        with _alone_on(pgdata), start_embedded_postgres(pgdata) as server:
            try:
                return asyncio.run(_cancelled_by_sigterm(main(server.url)))
            except asyncio.CancelledError:
                raise SystemExit(TERMINATED) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _alone_on(pgdata: Path) -> contextlib.AbstractContextManager[None]:
    """Hold `pgdata`'s benchmark lock (next to it) for the block, waiting for whoever holds it."""

    def wait(holder: str) -> None:
        print(
            f"waiting for the benchmark (pid {holder}) running on {pgdata} to end:"
            " benchmarks measure one at a time",
            file=sys.stderr,
            flush=True,
        )

    return pid_file.held(pgdata.parent / f"{pgdata.name}.lock", wait)


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(TERMINATED)


async def _cancelled_by_sigterm(work: Coroutine[Any, Any, T]) -> T:
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await work
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _terminated)  # and after it, while the server stops
