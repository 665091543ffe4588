"""`grpc.health.v1.Health`: grpcio's asyncio servicer, completed with `List`.

grpcio-health-checking's proto has `List` (every service's status in one answer), but its
servicers leave it unimplemented, so a client calling it got UNIMPLEMENTED while reflection
listed it. `List` here answers from the same statuses that `Check` and `Watch` read, so the
three cannot disagree.
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer as _AsyncHealthServicer


# grpc-stubs types `grpc_health.v1._async` as Any; the base class is grpcio's own.
class HealthServicer(_AsyncHealthServicer):  # type: ignore[misc]
    """Health checking with `Check`, `Watch` (inherited) and `List`."""

    async def List(
        self,
        request: health_pb2.HealthListRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> health_pb2.HealthListResponse:
        """A snapshot of every registered service's status (the empty name is the server's)."""
        # `_server_status` is the base class's record of what `set` and `enter_graceful_shutdown`
        # wrote, declared on the class; nothing awaits here, so no `set` lands mid-answer.
        return health_pb2.HealthListResponse(
            statuses={
                name: health_pb2.HealthCheckResponse(status=status)
                for name, status in self._server_status.items()
            }
        )
