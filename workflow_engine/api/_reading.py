"""Reading a request: decoded, counted and converted without holding the event loop.

The service's handlers keep each request's bytes (`decoding.deferred`); the auth interceptor,
once the caller may call the method, or else the servicer, hands them to `RequestReader.read`.
A request that does not decode, or holds more of something than its limit (`api._limits`), is
answered INVALID_ARGUMENT naming the field before any of it is converted.

What reading costs follows the request's size and shape, which any authenticated caller
chooses (4 MiB of them by default), so where it runs depends on them:

- A small request (at most `INLINE_BYTES` and `INLINE_ELEMENTS`; every request a client
  normally sends) is read and converted on the event loop: a few milliseconds at worst, a
  tenth of one for a typical StartWorkflow, which a trip to a thread would triple.
- Any other is read and converted on the reader's one thread: counted on the wire
  (`decoding.MAX_REQUEST_FIELDS`) before protobuf decodes it, then decoded, counted and
  converted. Python code there gives the interpreter back to the event loop every switch
  interval (5 ms); protobuf's decoding, C that keeps it, is bounded by the field count. One
  thread, as a second would add no throughput (the work holds the interpreter) but would
  make the loop wait for two; big requests wait their turn, small ones do not.

Each caller may have `MAX_WAITING_PER_CALLER` requests (and answers) waiting for the thread or
on it, and all callers together `MAX_WAITING`; one more is answered RESOURCE_EXHAUSTED at once,
unread. So one caller's flood holds another's large request back by at most that many turns,
and the bytes kept waiting are bounded (each at most the server's message limit).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from google.protobuf.message import Message

from workflow_engine.api._auth import caller
from workflow_engine.api._decoding import RefusedRequest, Undecoded
from workflow_engine.api._limits import counted
from workflow_engine.errors import InvalidArgument, ResourceExhausted

#: The largest request read on the event loop: protobuf decodes it in 3 ms at worst.
INLINE_BYTES = 64 * 1024
#: The most elements (list items, map entries, a quarter of each JSON value's bytes) a request
#: read on the event loop may hold: converting one costs up to some 75 microseconds (a step).
INLINE_ELEMENTS = 64
#: Requests and answers for the reader's thread that one caller, and all callers, may have
#: waiting or being read (see the module docstring).
MAX_WAITING_PER_CALLER = 4
MAX_WAITING = 64
_BUSY = "{} large requests (or answers) of {} are already waiting to be read; retry later"

P = ParamSpec("P")
T = TypeVar("T")
#: Whether the request being served was found small (`read`): each call runs in its own task.
_SMALL: contextvars.ContextVar[bool] = contextvars.ContextVar("small_request", default=False)


class RequestReader:
    """Turns a request's kept bytes into a counted message, and converts it, each where its
    size says (see the module's docstring). `close` stops its thread."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="request-reader")
        # Waiting work by caller (an entry goes when it reaches 0), and in all; the thread
        # takes from them as it finishes.
        self._lock = threading.Lock()
        self._waiting: dict[str, int] = {}
        self._all_waiting = 0

    async def read(self, request: Any) -> Any:
        """`request` decoded and counted (or a `RefusedRequest`); a request already read is
        returned as it is."""
        if not isinstance(request, Undecoded):
            return request
        if len(request.body) > INLINE_BYTES:
            return await self._off_loop(_read, request)
        message = request.decoded()
        if isinstance(message, RefusedRequest):
            return message
        try:
            small = counted(message, stop_after=INLINE_ELEMENTS) is not None
        except InvalidArgument as exc:
            return RefusedRequest(exc.field, exc.problem)
        if not small:
            return await self._off_loop(_count, message)
        _SMALL.set(True)
        return message

    async def convert(self, convert: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`convert(*args, **kwargs)` for the request being served: on the event loop when it
        was read as small, else on the reader's thread."""
        if _SMALL.get():
            return convert(*args, **kwargs)
        return await self._off_loop(convert, *args, **kwargs)

    async def answer(
        self, build: Callable[P, T], small: bool, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """An answer, `build(*args, **kwargs)`: on the event loop when it is `small` (see
        `convert.cheap_to_show`), else on the reader's thread, as a large request is read."""
        if small:
            return build(*args, **kwargs)
        return await self._off_loop(build, *args, **kwargs)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`work` on the reader's thread, seeing the caller's context (its identity), unless
        the caller (or every caller) has as much waiting as it may. It counts as waiting until
        the thread is done with it: a call cancelled meanwhile frees its turn only then."""
        identity = caller()
        name = identity.name if identity is not None else ""
        with self._lock:
            mine = self._waiting.get(name, 0)
            if mine >= MAX_WAITING_PER_CALLER:
                raise ResourceExhausted(
                    "request", _BUSY.format(MAX_WAITING_PER_CALLER, "this caller")
                )
            if self._all_waiting >= MAX_WAITING:
                raise ResourceExhausted("request", _BUSY.format(MAX_WAITING, "all callers"))
            self._waiting[name] = mine + 1
            self._all_waiting += 1
        call = functools.partial(contextvars.copy_context().run, work, *args, **kwargs)
        future = self._thread.submit(call)
        future.add_done_callback(lambda _: self._done(name))
        return await asyncio.wrap_future(future)

    def _done(self, name: str) -> None:
        with self._lock:
            self._all_waiting -= 1
            left = self._waiting[name] - 1
            if left:
                self._waiting[name] = left
            else:
                del self._waiting[name]


def _read(request: Undecoded) -> Any:
    message = request.decoded()
    return message if isinstance(message, RefusedRequest) else _count(message)


def _count(message: Message) -> Message | RefusedRequest:
    try:
        counted(message)
    except InvalidArgument as exc:
        return RefusedRequest(exc.field, exc.problem)
    return message
