"""Anyone who can reach the port sends bytes that protobuf refuses: the engine answers at once
and keeps answering everyone else (issue 48, finding 3).

The attack: an `UpdateWorkflowRequest` of about 3.5 MB whose `set_state` nests past protobuf's
depth limit, with the bulk of its bytes at the bottom. Naming the bad field once cost time
proportional to depth times size, on the event loop, before authentication: three such calls
without credentials held a health check for seconds.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tests.conftest import RunningEngine
from tests.security.conftest import as_caller
from tests.security.stalls import HealthWatch
from tests.support.wire import deep_update

UPDATE = "/workflow_engine.v1.WorkflowEngine/UpdateWorkflow"
#: How long a health check may wait while the attack runs; it normally takes milliseconds.
HEALTH_BUDGET_SECONDS = 0.5
Metadata = list[tuple[str, str]] | None


async def call(served: RunningEngine, body: bytes, metadata: Metadata) -> grpc.aio.AioRpcError:
    """UpdateWorkflow with `body` as its bytes; the error it answers (it cannot succeed)."""
    update = served.channel.unary_unary(UPDATE)  # bytes in, bytes out
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await update(body, metadata=metadata, timeout=60)
    return refused.value


async def attack_while_timing_health(
    served: RunningEngine, body: bytes, metadata: Metadata, calls: int
) -> tuple[list[grpc.aio.AioRpcError], float]:
    """Send `body` `calls` times at once while health is polled: the answers, and the longest
    a health check waited."""
    async with HealthWatch(served.channel) as health:
        answers = await asyncio.gather(*(call(served, body, metadata) for _ in range(calls)))
    return answers, health.worst


@pytest.mark.timing
async def test_unauthenticated_deep_message_does_not_stall_the_server(
    served: RunningEngine,
) -> None:
    answers, worst = await attack_while_timing_health(served, deep_update(), None, calls=3)
    print(f"unauthenticated: worst health wait {worst:.3f}s")
    assert {a.code() for a in answers} == {grpc.StatusCode.UNAUTHENTICATED}
    assert worst < HEALTH_BUDGET_SECONDS


@pytest.mark.timing
async def test_authenticated_deep_message_is_refused_quickly_naming_the_field(
    served: RunningEngine,
) -> None:
    """The orchestrator's undecodable request is still INVALID_ARGUMENT naming the field, and
    naming it is bounded: health checks keep being answered meanwhile."""
    answers, worst = await attack_while_timing_health(
        served, deep_update(), as_caller("orchestrator"), calls=3
    )
    print(f"authenticated: worst health wait {worst:.3f}s")
    assert {a.code() for a in answers} == {grpc.StatusCode.INVALID_ARGUMENT}
    assert all(
        (a.details() or "").startswith("set_state.fields[0].value.struct_value.") for a in answers
    )
    assert "nested more than 100 deep" in (answers[0].details() or "")
    assert worst < HEALTH_BUDGET_SECONDS


@pytest.mark.parametrize(
    ("caller", "code"),
    [
        (None, grpc.StatusCode.UNAUTHENTICATED),
        ("orchestrator", grpc.StatusCode.INVALID_ARGUMENT),
        ("a-reader", grpc.StatusCode.PERMISSION_DENIED),
    ],
)
async def test_nesting_past_any_stack_is_refused_not_unknown(
    served: RunningEngine, caller: str | None, code: grpc.StatusCode
) -> None:
    """A small request nested 20,000 deep: walking it by recursion ran out of Python's stack,
    and the call answered UNKNOWN."""
    answer = await call(served, deep_update(20_000, size=1), as_caller(caller) if caller else None)
    assert answer.code() == code, answer.details()
