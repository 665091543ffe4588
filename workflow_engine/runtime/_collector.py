"""Keeps the garbage collector's full collections short while many workflows are in flight.

CPython's cyclic collector walks every object it tracks in a full collection, and the engine
answers nothing meanwhile. A workflow waiting on its job holds about 150 tracked objects (its
run task and coroutines, its state's lists and dicts) and the event feeds keep the last
workflows' events, so with 10,000 in flight a full collection walks about 1.5 million objects:
0.5 to 1.2 s here (`benchmarks/inflight.py`). Full collections come whenever the long-lived
population has grown by a quarter, so they keep coming while workflows are being started.

So, besides freezing what start-up built (modules, the compiled graph, pools), the engine
freezes the survivors of every full collection that took longer than `SLOW_SECONDS`: they are
the engine's long-lived objects, and `gc.freeze` moves them to the permanent generation, which
later collections do not walk. The next full collections then walk only what is newer
(10,000 in flight: at most 126 ms, against 1,262 ms). Freezing costs nothing itself, and a
frozen object is still freed by reference counting once released; what freezing gives up is
collecting a reference cycle that was alive at a freeze and dies afterwards. Such a cycle is
rare here (a run's objects are released by reference counting when it ends: running 15,000
workflows through left as many objects with freezing as without), and only collections slower
than `SLOW_SECONDS` freeze, which a small engine never has.
"""

from __future__ import annotations

import gc
import time

import structlog

log = structlog.get_logger(__name__)

#: A full collection slower than this froze the engine long enough to freeze its survivors.
SLOW_SECONDS = 0.02


class Collector:
    """The policy above for one engine: `install` at start, `uninstall` at close."""

    def __init__(self, slow_seconds: float = SLOW_SECONDS) -> None:
        self._slow_seconds = slow_seconds
        self._started: float | None = None
        self.freezes = 0  # full collections whose survivors this froze

    def install(self) -> None:
        """Freeze what exists now, and freeze the survivors of slow full collections."""
        gc.freeze()
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return
        took = time.perf_counter() - self._started
        self._started = None
        if took > self._slow_seconds:
            gc.freeze()
            self.freezes += 1
            log.debug(
                "gc_survivors_frozen",
                seconds=round(took, 3),
                frozen=gc.get_freeze_count(),
            )
