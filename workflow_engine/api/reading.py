"""Reading a request: its bytes decoded and its lists counted, before anything converts it.

The service's handlers keep each request's bytes (`decoding.deferred`); the auth interceptor,
once the caller may call the method, or else the servicer, hands them to `RequestReader.read`.
A request that does not decode, or holds more of something than its limit (`api.limits`),
is answered INVALID_ARGUMENT naming the field, before any of it is converted.
"""

from __future__ import annotations

from typing import Any

from workflow_engine.api.decoding import RefusedRequest, Undecoded
from workflow_engine.api.limits import counted
from workflow_engine.errors import InvalidArgument


class RequestReader:
    """Turns a request's kept bytes into a counted message (or a `RefusedRequest`)."""

    async def read(self, request: Any) -> Any:
        """`request` decoded and counted; a request already read is returned as it is."""
        if not isinstance(request, Undecoded):
            return request
        message = request.decoded()
        if isinstance(message, RefusedRequest):
            return message
        try:
            counted(message)
        except InvalidArgument as exc:
            return RefusedRequest(exc.field, exc.problem)
        return message
