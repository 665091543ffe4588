"""The client commands: parse the command line, call the engine, print, and exit with a code.

Exit codes (scripts rely on them):

====  =====================================================================================
0     done; for ``get``, ``watch`` and ``start --wait``: the workflow SUCCEEDED (or, for
      ``get``, is RUNNING)
1     the workflow FAILED
2     a usage error, or the engine refused the request (INVALID_ARGUMENT,
      FAILED_PRECONDITION, ALREADY_EXISTS); the message names the field
3     the workflow was CANCELLED
4     the workflow waits for an approval, or is blocked for an operator
5     the workflow is SUSPENDED (a budget ran out)
6     no such workflow or schedule (NOT_FOUND)
7     not allowed: UNAUTHENTICATED or PERMISSION_DENIED
8     the engine could not be reached or failed (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL)
130   interrupted (Ctrl-C); the workflow runs on
====  =====================================================================================
"""

from __future__ import annotations

import argparse
import getpass
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

import grpc
from google.protobuf import struct_pb2
from rich.console import Console

from workflow_engine.client import _render as render
from workflow_engine.client._arguments import BRANCHES, CATCH_UP, OVERLAP, parser
from workflow_engine.client._connection import Connection
from workflow_engine.client._taskfile import read_task
from workflow_engine.errors import UsageError
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

EXIT_BY_STATUS = {
    pb.RUNNING: 0,
    pb.SUCCEEDED: 0,
    pb.FAILED: 1,
    pb.CANCELLED: 3,
    pb.WAITING_FOR_APPROVAL: 4,
    pb.SUSPENDED: 5,
}
EXIT_USAGE, EXIT_WAITING, EXIT_NOT_FOUND, EXIT_DENIED, EXIT_ENGINE = 2, 4, 6, 7, 8
EXIT_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: EXIT_USAGE,
    grpc.StatusCode.FAILED_PRECONDITION: EXIT_USAGE,
    grpc.StatusCode.ALREADY_EXISTS: EXIT_USAGE,
    grpc.StatusCode.OUT_OF_RANGE: EXIT_USAGE,
    grpc.StatusCode.NOT_FOUND: EXIT_NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED: EXIT_DENIED,
    grpc.StatusCode.PERMISSION_DENIED: EXIT_DENIED,
}
#: Statuses a watch stops at: the workflow ended, or it waits for someone.
STOPS = {pb.SUCCEEDED, pb.FAILED, pb.CANCELLED, pb.WAITING_FOR_APPROVAL, pb.SUSPENDED}


class Client:
    """One command's view of the engine: its stub, its output, and its options."""

    def __init__(self, args: argparse.Namespace, channel: grpc.Channel, metadata: Any) -> None:
        self.args = args
        self.stub = pb_grpc.WorkflowEngineStub(channel)
        self.metadata = metadata
        self.out = Console(highlight=False)
        if not self.out.is_terminal:  # piped: no 80-column default to wrap tables at
            self.out = Console(highlight=False, width=max(self.out.width, 160))

    def emit(self, message: Any) -> None:
        """`--json`: one JSON document per line."""
        document = render.to_dict(message) if not isinstance(message, dict | list) else message
        print(json.dumps(document, ensure_ascii=False), flush=True)

    def get(self, task_id: str) -> pb.Workflow:
        request = pb.GetWorkflowRequest(task_id=task_id)
        return self.stub.GetWorkflow(request, metadata=self.metadata)

    def show(self, workflow: pb.Workflow) -> int:
        """Print a workflow; its status's exit code."""
        if self.args.json:
            self.emit(workflow)
        else:
            render.print_workflow(self.out, workflow, history=getattr(self.args, "history", False))
        return exit_code(workflow)


def exit_code(workflow: pb.Workflow) -> int:
    if workflow.blocked_reason:
        return EXIT_WAITING
    return EXIT_BY_STATUS.get(workflow.status, 0)


def cmd_start(client: Client) -> int:
    args = client.args
    if args.task_file is None and not args.prompt:
        raise UsageError("start: give a task file (or - for stdin), or --prompt")
    spec = read_task(args.task_file) if args.task_file is not None else pb.TaskSpec()
    if args.prompt:
        spec.prompt = args.prompt
    task_id = args.task_id or str(uuid.uuid4())
    request = pb.StartWorkflowRequest(
        task_id=task_id, task=spec, idempotency_key=args.idempotency_key or ""
    )
    answer = client.stub.StartWorkflow(request, metadata=client.metadata)
    if args.wait:
        if not args.json:
            client.out.print(
                f"{pb.StartStatus.Name(answer.status).lower().replace('_', ' ')}: {task_id}"
            )
        return follow(client, task_id)
    if args.json:
        client.emit(answer)
    else:
        client.out.print(
            f"{pb.StartStatus.Name(answer.status).lower().replace('_', ' ')}: [bold]{task_id}[/]"
            f"  {render.styled_status(answer.workflow_status)}\n"
            f"  follow it: workflow-engine watch {task_id}"
        )
    return 0


def cmd_get(client: Client) -> int:
    return client.show(client.get(client.args.task_id))


def cmd_watch(client: Client) -> int:
    return follow(client, client.args.task_id)


def follow(client: Client, task_id: str) -> int:
    """Show a workflow's events as they come, with a bar of steps passed, until it ends or
    waits for someone; then show the workflow, and exit with its status's code."""
    workflow = client.get(task_id)
    if client.args.json:
        for event in _events(client, task_id, workflow):
            client.emit(event)
        return client.show(client.get(task_id))
    with render.progress_view(client.out) as progress:
        bar = progress.add_task(render.status_name(workflow.status), total=None)

        def refresh(workflow: pb.Workflow, doing: str) -> None:
            passed, planned = render.plan_progress(workflow)
            progress.update(bar, completed=passed, total=planned or None, description=doing)

        refresh(workflow, render.status_name(workflow.status))
        for event in _events(client, task_id, workflow):
            progress.console.print(render.event_line(event), highlight=False)
            if event.kind != pb.NODE_COMPLETED or event.node_id in (
                "plan_steps",
                "verify_step_result",
            ):
                workflow = client.get(task_id)
            doing = event.node_id if event.kind == pb.NODE_COMPLETED else ""
            refresh(workflow, doing or render.status_name(event.status))
    final = client.get(task_id)
    client.out.print()
    return client.show(final)


def _events(client: Client, task_id: str, workflow: pb.Workflow) -> Iterator[pb.WorkflowEvent]:
    """The workflow's events from the first, ending where `follow` stops."""
    if workflow.status in STOPS or workflow.blocked_reason:
        yield from workflow.history
        return
    request = pb.WatchWorkflowRequest(task_id=task_id, from_sequence=1)
    stream = client.stub.WatchWorkflow(request, metadata=client.metadata)
    try:
        for event in stream:
            yield event
            if event.kind == pb.BLOCKED or (
                event.kind in (pb.STATUS_CHANGED, pb.APPROVAL_REQUESTED) and event.status in STOPS
            ):
                return
    finally:
        # The stream is also a grpc.Future, whose `cancel` the type stubs know.
        cast("grpc.Future[pb.WorkflowEvent]", stream).cancel()


def cmd_list(client: Client) -> int:
    args = client.args
    statuses = [pb.WorkflowStatus.Value(s.upper()) for s in args.status]
    request = pb.ListWorkflowsRequest(
        statuses=statuses,
        user_id=args.user or "",
        project_id=args.project or "",
        page_size=min(args.limit, 500),
        schedule_id=args.schedule_id or "",
    )
    workflows: list[pb.Workflow] = []
    while len(workflows) < args.limit:
        page = client.stub.ListWorkflows(request, metadata=client.metadata)
        workflows.extend(page.workflows)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    workflows = workflows[: args.limit]
    if args.json:
        client.emit([render.to_dict(w) for w in workflows])
    else:
        render.print_list(client.out, workflows)
    return 0


def cmd_cancel(client: Client) -> int:
    request = pb.CancelWorkflowRequest(task_id=client.args.task_id, reason=client.args.reason)
    workflow = client.stub.CancelWorkflow(request, metadata=client.metadata)
    return _answer(client, workflow, f"cancelled: {workflow.task_id}")


def _decide(client: Client, verdict: pb.Verdict.ValueType) -> int:
    args = client.args
    step_id = args.step
    if not step_id:
        pending = client.get(args.task_id)
        if not pending.HasField("pending_approval"):
            raise UsageError(
                f"{args.command}: workflow {args.task_id} waits for no approval "
                f"(it is {render.status_name(pending.status)})"
            )
        step_id = pending.pending_approval.step_id
    decision = pb.ApprovalDecision(
        step_id=step_id, verdict=verdict, reason=args.reason or "", decided_by=_who()
    )
    request = pb.ResumeWorkflowRequest(task_id=args.task_id, decision=decision)
    answer = client.stub.ResumeWorkflow(request, metadata=client.metadata)
    if args.json:
        client.emit(answer)
        return 0
    client.out.print(
        f"{'approved' if verdict == pb.APPROVE else 'rejected'} step [bold]{step_id}[/] of "
        f"{args.task_id}: now {render.styled_status(answer.status)}"
    )
    return 0


def cmd_approve(client: Client) -> int:
    return _decide(client, pb.APPROVE)


def cmd_reject(client: Client) -> int:
    return _decide(client, pb.REJECT)


def cmd_update(client: Client) -> int:
    args = client.args
    request = pb.UpdateWorkflowRequest(
        task_id=args.task_id, operator=args.operator or _who(), reason=args.reason or ""
    )
    if args.set_state is not None:
        try:
            fields = json.loads(args.set_state)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--set-state: not JSON: {exc}") from None
        if not isinstance(fields, dict):
            raise UsageError("--set-state: expected a JSON object of state fields")
        state = struct_pb2.Struct()
        state.update(fields)
        request.set_state.CopyFrom(state)
    elif args.reject_last_result:
        request.reject_last_result.SetInParent()
    elif args.force_branch:
        request.force_branch = BRANCHES[args.force_branch]
    else:
        request.accept_outside_state.SetInParent()
    workflow = client.stub.UpdateWorkflow(request, metadata=client.metadata)
    return _answer(client, workflow, f"updated: {workflow.task_id}")


def _answer(client: Client, workflow: pb.Workflow, said: str) -> int:
    if client.args.json:
        client.emit(workflow)
    else:
        client.out.print(f"{said}  {render.styled_status(workflow.status)}")
    return 0


def cmd_schedule(client: Client) -> int:
    return SCHEDULE_HANDLERS[client.args.verb](client)


def cmd_schedule_create(client: Client) -> int:
    args = client.args
    if args.template_task_id and (args.task_file is not None or args.prompt):
        raise UsageError("give a task file (or --prompt) or --template-task-id, not both")
    if not args.template_task_id and args.task_file is None and not args.prompt:
        raise UsageError("give a task file (or - for stdin), --prompt, or --template-task-id")
    schedule = pb.Schedule(
        schedule_id=args.schedule_id or "",
        cron=args.cron,
        time_zone=args.time_zone or "",
        template_task_id=args.template_task_id or "",
        paused=args.paused,
    )
    if not args.template_task_id:
        spec = read_task(args.task_file) if args.task_file is not None else pb.TaskSpec()
        if args.prompt:
            spec.prompt = args.prompt
        schedule.task.CopyFrom(spec)
    if args.overlap:
        schedule.overlap = OVERLAP[args.overlap]
    if args.catch_up:
        schedule.catch_up = CATCH_UP[args.catch_up]
    request = pb.CreateScheduleRequest(schedule=schedule)
    created = client.stub.CreateSchedule(request, metadata=client.metadata)
    return _show_schedule(client, created, "created")


def cmd_schedule_get(client: Client) -> int:
    request = pb.GetScheduleRequest(schedule_id=client.args.schedule_id)
    schedule = client.stub.GetSchedule(request, metadata=client.metadata)
    return _show_schedule(client, schedule, "")


def cmd_schedule_list(client: Client) -> int:
    args = client.args
    request = pb.ListSchedulesRequest(page_size=min(args.limit, 500))
    schedules: list[pb.Schedule] = []
    while len(schedules) < args.limit:
        page = client.stub.ListSchedules(request, metadata=client.metadata)
        schedules.extend(page.schedules)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    schedules = schedules[: args.limit]
    if args.json:
        client.emit([render.to_dict(s) for s in schedules])
    else:
        render.print_schedules(client.out, schedules)
    return 0


def _set_paused(client: Client, paused: bool) -> int:
    request = pb.UpdateScheduleRequest(
        schedule=pb.Schedule(schedule_id=client.args.schedule_id, paused=paused),
        update_mask=["paused"],
    )
    schedule = client.stub.UpdateSchedule(request, metadata=client.metadata)
    return _show_schedule(client, schedule, "paused" if paused else "resumed")


def cmd_schedule_pause(client: Client) -> int:
    return _set_paused(client, True)


def cmd_schedule_resume(client: Client) -> int:
    return _set_paused(client, False)


def cmd_schedule_delete(client: Client) -> int:
    request = pb.DeleteScheduleRequest(schedule_id=client.args.schedule_id)
    answer = client.stub.DeleteSchedule(request, metadata=client.metadata)
    if client.args.json:
        client.emit(answer)
    else:
        client.out.print(
            f"deleted: [bold]{client.args.schedule_id}[/] (the workflows it started are kept)"
        )
    return 0


def _show_schedule(client: Client, schedule: pb.Schedule, said: str) -> int:
    if client.args.json:
        client.emit(schedule)
    else:
        if said:
            client.out.print(f"{said}: ", end="")
        render.print_schedule(client.out, schedule)
    return 0


def _who() -> str:
    """Who is at the terminal: a note beside the authenticated caller the engine records."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


HANDLERS: dict[str, Callable[[Client], int]] = {
    "start": cmd_start,
    "get": cmd_get,
    "watch": cmd_watch,
    "list": cmd_list,
    "cancel": cmd_cancel,
    "approve": cmd_approve,
    "reject": cmd_reject,
    "update": cmd_update,
    "schedule": cmd_schedule,
}
SCHEDULE_HANDLERS: dict[str, Callable[[Client], int]] = {
    "create": cmd_schedule_create,
    "list": cmd_schedule_list,
    "get": cmd_schedule_get,
    "pause": cmd_schedule_pause,
    "resume": cmd_schedule_resume,
    "delete": cmd_schedule_delete,
}


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    name = " ".join(filter(None, (args.command, getattr(args, "verb", None))))
    try:
        connection = Connection.from_flags(
            args.address,
            tls=args.tls,
            ca_file=args.ca_file,
            cert_file=args.cert_file,
            key_file=args.key_file,
            token_file=args.token_file,
            allow_plaintext_remote=args.allow_plaintext_remote,
        )
        with connection.channel() as channel:
            return HANDLERS[args.command](Client(args, channel, connection.metadata()))
    except UsageError as exc:
        err.print(f"workflow-engine {name}: {exc}", markup=False)
        return EXIT_USAGE
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
        details = exc.details() if hasattr(exc, "details") else str(exc)
        if code == grpc.StatusCode.UNAVAILABLE:
            details = f"cannot reach the engine at {connection.address}: {details}"
        err.print(f"workflow-engine {name}: {code.name}: {details}", markup=False)
        return EXIT_BY_CODE.get(code, EXIT_ENGINE)
    except KeyboardInterrupt:
        return 130
