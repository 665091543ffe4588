"""Reading a request: decoded, counted and converted without holding the event loop.

The service's handlers keep each request's bytes (`decoding.deferred`); the auth interceptor,
once the caller may call the method, or else the servicer, hands them to `RequestReader.read`.
A request that does not decode, or holds more of something than its limit (`api.limits`), is
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
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from google.protobuf.message import Message

from workflow_engine.api.decoding import RefusedRequest, Undecoded
from workflow_engine.api.limits import counted
from workflow_engine.errors import InvalidArgument

#: The largest request read on the event loop: protobuf decodes it in 3 ms at worst.
INLINE_BYTES = 64 * 1024
#: The most elements (list items, map entries, a quarter of each JSON value's bytes) a request
#: read on the event loop may hold: converting one costs up to some 75 microseconds (a step).
INLINE_ELEMENTS = 64

P = ParamSpec("P")
T = TypeVar("T")
#: Whether the request being served was found small (`read`): each call runs in its own task.
_SMALL: contextvars.ContextVar[bool] = contextvars.ContextVar("small_request", default=False)


class RequestReader:
    """Turns a request's kept bytes into a counted message, and converts it, each where its
    size says (see the module's docstring). `close` stops its thread."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="request-reader")

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
        """`work` on the reader's thread, seeing the caller's context (its identity)."""
        call = functools.partial(contextvars.copy_context().run, work, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._thread, call)


def _read(request: Undecoded) -> Any:
    message = request.decoded()
    return message if isinstance(message, RefusedRequest) else _count(message)


def _count(message: Message) -> Message | RefusedRequest:
    try:
        counted(message)
    except InvalidArgument as exc:
        return RefusedRequest(exc.field, exc.problem)
    return message
