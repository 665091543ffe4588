"""The `workflow_engine.v1.WorkflowEngine` gRPC service: messages in, `WorkflowService` calls out.

Every method parses its request (refusing malformed fields before anything is stored), calls
the service, and converts the answer. Exceptions become status codes in `api._status_codes`, here at
the boundary and nowhere else. Requests are decoded and counted by `api._reading` (by the auth
interceptor, when there is one), which hands over a `RefusedRequest` rather than failing
inside grpcio.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from functools import wraps
from typing import Any, TypeVar

import grpc

from workflow_engine._masking import EngineSecrets
from workflow_engine.api import _convert as convert
from workflow_engine.api import _listing as listing
from workflow_engine.api import _requests as requests
from workflow_engine.api import _schedules as schedules
from workflow_engine.api._auth import caller, recorded_actor, scope
from workflow_engine.api._decoding import RefusedRequest
from workflow_engine.api._reading import RequestReader
from workflow_engine.api._status_codes import status_for
from workflow_engine.domain.records import WorkflowEventRecord, WorkflowRecord
from workflow_engine.errors import RunControl
from workflow_engine.service import ScheduleService, WorkflowService
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Context = grpc.aio.ServicerContext[Any, Any]


def _unary(
    method: Callable[[WorkflowEngineServicer, Req, Context], Awaitable[Resp]],
) -> Callable[[WorkflowEngineServicer, Req, Context], Awaitable[Resp]]:
    @wraps(method)
    async def wrapper(self: WorkflowEngineServicer, request: Req, context: Context) -> Resp:
        try:
            request = await self.reader.read(request)
            if isinstance(request, RefusedRequest):
                raise request.error()
            return await method(self, request, context)
        except (Exception, RunControl) as exc:
            code, message = status_for(exc, self.secrets)
            await context.abort(code, message)
            raise AssertionError("unreachable: abort raises") from exc

    return wrapper


class WorkflowEngineServicer(pb_grpc.WorkflowEngineServicer):
    """gRPC front end of a `WorkflowService`."""

    def __init__(
        self,
        service: WorkflowService,
        reader: RequestReader,
        secrets: EngineSecrets,
        schedules: ScheduleService,
    ) -> None:
        self._service = service
        self._schedules = schedules
        self.reader = reader
        #: The engine's: masked in every answer and error message.
        self.secrets = secrets

    async def _shown(
        self, record: WorkflowRecord, history: Sequence[WorkflowEventRecord] = ()
    ) -> pb.Workflow:
        """`record` (with `history`) as answers show it, built off the event loop when its
        secrets or its size make that costly (`convert.cheap_to_show`)."""
        return await self.reader.answer(
            convert.workflow_to_proto,
            convert.cheap_to_show(record.state),
            record,
            history,
            engine_secrets=self.secrets,
        )

    @_unary
    async def StartWorkflow(
        self, request: pb.StartWorkflowRequest, context: Context
    ) -> pb.StartWorkflowResponse:
        task_id = requests.parse_task_id(request.task_id)
        holder_id = requests.parse_holder_id(request.holder_id)
        key = requests.parse_uuid(request.idempotency_key, "idempotency_key", required=False)
        task = await self.reader.convert(requests.optional_task, request)
        outcome = await self._service.start(
            task_id=task_id,
            holder_id=holder_id,
            idempotency_key=key,
            task=task,
            lease_ttl_seconds=requests.parse_lease_ttl(request.lease_ttl_seconds),
            scope=scope(),
        )
        lease = outcome.lease
        return pb.StartWorkflowResponse(
            run_id=outcome.run_id,
            lease_id=lease.lease_id if lease else "",
            status=pb.StartStatus.Value(outcome.status),
            task_id=task_id,
            holder_id=(lease.holder_id or "") if lease else "",
            lease_expires_at=convert.to_timestamp(lease.expires_at) if lease else None,
            workflow_status=convert.status_to_proto(outcome.workflow_status),
        )

    @_unary
    async def ResumeWorkflow(
        self, request: pb.ResumeWorkflowRequest, context: Context
    ) -> pb.ResumeWorkflowResponse:
        task_id = requests.parse_task_id(request.task_id)
        holder_id = requests.parse_holder_id(request.holder_id)
        lease_ttl_seconds = requests.parse_lease_ttl(request.lease_ttl_seconds)
        decision = (
            await self.reader.convert(requests.decision_from_proto, request.decision)
            if request.HasField("decision")
            else None
        )
        outcome = await self._service.resume(
            task_id=task_id,
            holder_id=holder_id,
            lease_ttl_seconds=lease_ttl_seconds,
            decision=decision,
            budget=requests.budget_from_proto(request.budget)
            if request.HasField("budget")
            else None,
            scope=scope(),
            actor=recorded_actor(""),
        )
        record = outcome.record
        state = await self.reader.answer(
            convert.shown_state,
            convert.cheap_to_show(record.state),
            record.state,
            engine_secrets=self.secrets,
        )
        return pb.ResumeWorkflowResponse(
            task_id=record.task_id,
            run_id=record.run_id or "",
            state=convert.to_struct(state),
            last_node_id=record.last_node_id or "",
            updated_at=convert.to_timestamp(record.updated_at),
            status=convert.status_to_proto(outcome.status),
            lease_id=outcome.lease.lease_id if outcome.lease else "",
            resumed=outcome.resumed,
        )

    @_unary
    async def GetWorkflow(self, request: pb.GetWorkflowRequest, context: Context) -> pb.Workflow:
        """The workflow with its history: its events, oldest first, and at most the newest
        `MAX_HISTORY_EVENTS` (1000) of them; WatchWorkflow from sequence 1 has them all."""
        task_id = requests.parse_task_id(request.task_id)
        record, history = await self._service.get_with_history(task_id, scope())
        return await self._shown(record, history)

    @_unary
    async def CancelWorkflow(
        self, request: pb.CancelWorkflowRequest, context: Context
    ) -> pb.Workflow:
        task_id = requests.parse_task_id(request.task_id)
        reason = requests.parse_reason(request.reason)
        actor = recorded_actor("")
        cancelled = await self._service.cancel(task_id, reason, actor, scope())
        return await self._shown(cancelled)

    async def WatchWorkflow(
        self, request: pb.WatchWorkflowRequest, context: Context
    ) -> AsyncIterator[pb.WorkflowEvent]:
        try:
            request = await self.reader.read(request)
            if isinstance(request, RefusedRequest):
                raise request.error()
            task_id = requests.parse_task_id(request.task_id)
            kinds = requests.parse_event_kinds(request.kinds)
            identity = caller()
            async for event in self._service.watch(
                task_id,
                request.from_sequence,
                scope(),
                kinds,
                caller=identity.name if identity is not None else "",
            ):
                yield convert.event_to_proto(task_id, event, engine_secrets=self.secrets)
        except (Exception, RunControl) as exc:
            code, message = status_for(exc, self.secrets)
            await context.abort(code, message)

    @_unary
    async def ListWorkflows(
        self, request: pb.ListWorkflowsRequest, context: Context
    ) -> pb.ListWorkflowsResponse:
        """Workflows newest update first, without state or history; see `api._listing`."""
        query = replace(listing.parse_list_request(request), scope=scope())
        page = await self._service.list_workflows(query)
        return listing.list_response(page, query, self.secrets)

    @_unary
    async def UpdateWorkflow(
        self, request: pb.UpdateWorkflowRequest, context: Context
    ) -> pb.Workflow:
        task_id = requests.parse_task_id(request.task_id)
        override = await self.reader.convert(requests.update_from_proto, request)
        applied = await self._service.update(task_id, override, scope())
        workflow = await self._shown(applied.record)
        workflow.status = convert.status_to_proto(applied.status)
        return workflow

    # Schedules (see `service._schedules`; the firing is `runtime._schedules`').
    @_unary
    async def CreateSchedule(
        self, request: pb.CreateScheduleRequest, context: Context
    ) -> pb.Schedule:
        msg = request.schedule
        schedule_id = schedules.parse_schedule_id(
            msg.schedule_id, required=False, field="schedule.schedule_id"
        )
        draft = await self.reader.convert(schedules.draft_from_proto, msg)
        record = await self._schedules.create(schedule_id, draft, scope(), recorded_actor(""))
        return schedules.schedule_to_proto(record, self.secrets)

    @_unary
    async def GetSchedule(self, request: pb.GetScheduleRequest, context: Context) -> pb.Schedule:
        schedule_id = schedules.parse_schedule_id(request.schedule_id, required=True)
        assert schedule_id is not None
        return schedules.schedule_to_proto(
            await self._schedules.get(schedule_id, scope()), self.secrets
        )

    @_unary
    async def ListSchedules(
        self, request: pb.ListSchedulesRequest, context: Context
    ) -> pb.ListSchedulesResponse:
        """Newest first; `page_size` 1 to 500 (0: 50)."""
        limit = schedules.parse_page_size(request.page_size)
        after = schedules.decode_token(request.page_token)
        page = await self._schedules.list(scope(), limit, after)
        return pb.ListSchedulesResponse(
            schedules=[schedules.schedule_to_proto(record, self.secrets) for record in page.items],
            next_page_token=schedules.encode_token(page.next_after) if page.next_after else "",
        )

    @_unary
    async def UpdateSchedule(
        self, request: pb.UpdateScheduleRequest, context: Context
    ) -> pb.Schedule:
        schedule_id = schedules.parse_schedule_id(
            request.schedule.schedule_id, required=True, field="schedule.schedule_id"
        )
        assert schedule_id is not None
        mask = schedules.parse_mask(request.update_mask)
        draft = await self.reader.convert(schedules.draft_from_proto, request.schedule, mask)
        record = await self._schedules.update(schedule_id, draft, mask, scope())
        return schedules.schedule_to_proto(record, self.secrets)

    @_unary
    async def DeleteSchedule(
        self, request: pb.DeleteScheduleRequest, context: Context
    ) -> pb.DeleteScheduleResponse:
        schedule_id = schedules.parse_schedule_id(request.schedule_id, required=True)
        assert schedule_id is not None
        await self._schedules.delete(schedule_id, scope())
        return pb.DeleteScheduleResponse()
