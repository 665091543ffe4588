"""Descriptors a forked child must close: the engine's ends of pipes and sockets it shares with
the wrappers and helpers it started.

A child this process forks (a library's, a test's) is not the engine: if it kept the engine's
end of a pipe or socket, a wrapper or a helper would not see end of file when the engine goes.
The hook that closes them in the child is registered with `os.register_at_fork` when the first
one is held, never at import: importing the package changes nothing in the process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ClosedInChild(Generic[T]):
    """Things (descriptors, sockets) of this process that a forked child closes with `close`."""

    def __init__(self, close: Callable[[T], object]) -> None:
        self._close = close
        self._held: set[T] = set()
        self._registered = False

    def add(self, item: T) -> None:
        if not self._registered:  # once: a hook cannot be unregistered
            os.register_at_fork(after_in_child=self._close_all)
            self._registered = True
        self._held.add(item)

    def discard(self, item: T) -> None:
        self._held.discard(item)

    def _close_all(self) -> None:
        for item in self._held:
            with contextlib.suppress(OSError):
                self._close(item)
        self._held.clear()
