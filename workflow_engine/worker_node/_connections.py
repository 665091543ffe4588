"""The node's HTTP connections, bounded: in number, and in how long a request's head may take.

uvicorn closes a connection that stays idle after a response (`timeout_keep_alive`), but
nothing else: a client that connects and sends nothing, or a request line and then one header
byte a minute, holds its connection (a descriptor, a protocol object) for ever, before any
token is checked, and uvicorn takes connections without limit. A stranger on the network could
so take every descriptor the node has, and its jobs could then open no file.

`bounded_h11` makes uvicorn's h11 protocol (given as `uvicorn.Config(http=...)`) with both
bounds: a connection beyond ``WORKFLOW_ENGINE_NODE_MAX_CONNECTIONS`` is closed as it is made,
and a connection that has not sent a whole request head within
``WORKFLOW_ENGINE_NODE_HEAD_TIMEOUT_SECONDS`` of connecting (or of its last response) is
closed. A request whose head came is not timed here: its body is read only once
its token was checked, and a job's answer may take hours.
"""

from __future__ import annotations

import asyncio

import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

log = structlog.get_logger(__name__)


def bounded_h11(max_connections: int, head_seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with these bounds (see the module docstring)."""

    class Bounded(BoundedH11Protocol):
        pass

    Bounded.max_connections, Bounded.head_seconds = max_connections, head_seconds
    return Bounded


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the bounds of the module docstring (`bounded_h11`)."""

    max_connections = 1024
    head_seconds = 20.0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            log.warning("node_connection_refused", open_connections=len(self.connections) - 1)
            transport.close()
            return
        self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_request():
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_head()  # the next request's head, if the client sends one

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _await_head(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_seconds, self._head_late)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self._in_request() and not self.transport.is_closing():
            log.info("node_connection_closed", reason=f"no request head in {self.head_seconds:g} s")
            self.transport.close()
