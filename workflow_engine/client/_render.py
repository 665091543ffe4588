"""What the client commands print for people: a workflow, a list, events, a live view, schedules.

Plain text with colour where the terminal has it (`rich`); `--json` bypasses all of this.
"""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from google.protobuf import json_format
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from workflow_engine.v1 import workflow_engine_pb2 as pb

STATUS_STYLE: dict[int, str] = {
    pb.RUNNING: "cyan",
    pb.WAITING_FOR_APPROVAL: "yellow",
    pb.SUSPENDED: "yellow",
    pb.SUCCEEDED: "green",
    pb.FAILED: "red",
    pb.CANCELLED: "magenta",
}
STEP_STYLE = {"passed": "green", "failed": "red", "pending": "dim"}


def status_name(status: pb.WorkflowStatus.ValueType) -> str:
    return pb.WorkflowStatus.Name(status) if status in pb.WorkflowStatus.values() else "?"


def styled_status(status: pb.WorkflowStatus.ValueType) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status_name(status)}[/]"


def to_dict(message: Any) -> dict[str, Any]:
    """A message as the contract's JSON, with the .proto's field names (what `--json` prints)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def time_of(stamp: Any) -> str:
    if not stamp.seconds and not stamp.nanos:
        return "-"
    return str(stamp.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")) + " UTC"


def zoned_time_of(stamp: Any, zone: str) -> str:
    """A time in UTC and, for a named zone, also there: "2026-11-28 01:00:00 UTC (02:00 CET)"."""
    shown = time_of(stamp)
    if shown == "-" or not zone or zone == "UTC":
        return shown
    try:
        local = stamp.ToDatetime(tzinfo=ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError):
        return shown
    return f"{shown} ({local.strftime('%Y-%m-%d %H:%M %Z')})"


def plan_progress(workflow: pb.Workflow) -> tuple[int, int]:
    """(steps passed, steps planned) of a workflow's state; (0, 0) before it is planned."""
    state = to_dict(workflow.state) if workflow.HasField("state") else {}
    planned = (state.get("plan") or {}).get("steps") or []
    steps = state.get("steps") or {}
    passed = sum(1 for s in planned if (steps.get(s.get("id")) or {}).get("status") == "passed")
    return passed, len(planned)


def print_workflow(console: Console, workflow: pb.Workflow, *, history: bool = False) -> None:
    console.print(f"[bold]{workflow.task_id}[/]  {styled_status(workflow.status)}")
    rows = [
        ("last node", workflow.last_node_id or "-"),
        ("updated", time_of(workflow.updated_at)),
        ("run", workflow.run_id or "-"),
    ]
    if workflow.lease_holder_id:
        rows.append(
            ("lease", f"{workflow.lease_holder_id} until {time_of(workflow.lease_expires_at)}")
        )
    if workflow.schedule_id:
        rows.append(("schedule", f"{workflow.schedule_id}, slot {time_of(workflow.schedule_slot)}"))
    for name, value in rows:
        console.print(f"  {name:<10} {escape(value)}")
    _print_steps(console, workflow)
    if workflow.HasField("pending_approval"):
        ask = workflow.pending_approval
        console.print(
            f"[yellow]waiting for approval[/] of step [bold]{escape(ask.step_id)}[/]: "
            f"{escape(' '.join(ask.command))}\n  {escape(ask.reason)}\n{_expiry(ask)}"
            f"  approve: workflow-engine approve {workflow.task_id}\n"
            f"  reject:  workflow-engine reject {workflow.task_id} --reason ..."
        )
    if workflow.blocked_reason:
        console.print(f"[red]blocked[/]: {escape(workflow.blocked_reason)}")
    if workflow.summary:
        console.print(f"[bold]summary[/]\n{escape(workflow.summary)}")
    if workflow.error:
        console.print(f"[bold red]error[/]\n{escape(workflow.error)}")
    if history:
        for event in workflow.history:
            print_event(console, event)


def _expiry(ask: pb.ApprovalRequest) -> str:
    """When a pending approval expires and what happens then; empty when it never does."""
    if not ask.HasField("expires_at"):
        return ""
    then = {pb.ApprovalTimeout.SUSPEND: "suspended"}.get(ask.on_timeout, "rejected")
    return f"  expires {time_of(ask.expires_at)} (then {then})\n"


def _print_steps(console: Console, workflow: pb.Workflow) -> None:
    state = to_dict(workflow.state) if workflow.HasField("state") else {}
    planned = (state.get("plan") or {}).get("steps") or []
    if not planned:
        return
    steps = state.get("steps") or {}
    table = Table("step", "status", "attempts", "exit", "command", box=None, pad_edge=False)
    for step in planned:
        record = steps.get(step.get("id")) or {}
        status = str(record.get("status", "pending"))
        result = record.get("result") or {}
        exit_code = result.get("exit_code")
        table.add_row(
            escape(str(step.get("id"))),
            f"[{STEP_STYLE.get(status, 'cyan')}]{status}[/]",
            str(int(record.get("attempts", 0))),
            "-" if exit_code is None else str(int(exit_code)),
            escape(" ".join(map(str, step.get("command") or []))[:60]),
        )
    console.print(table)


def event_line(event: pb.WorkflowEvent) -> str:
    kind = str(pb.EventKind.Name(event.kind)) if event.kind in pb.EventKind.values() else "?"
    when = event.time.ToDatetime().strftime("%H:%M:%S") if event.time.seconds else "--:--:--"
    if event.kind == pb.STATUS_CHANGED:
        what = f"status {styled_status(event.status)}"
    elif event.kind == pb.NODE_COMPLETED:
        what = f"[bold]{escape(event.node_id)}[/]"
    else:
        what = f"[yellow]{kind.lower().replace('_', ' ')}[/]"
    detail = f"  {escape(event.detail)}" if event.detail else ""
    actor = f"  [dim]({escape(event.actor)})[/]" if event.actor else ""
    return f"[dim]#{event.sequence:<3} {when}[/]  {what}{detail}{actor}"


def print_event(console: Console, event: pb.WorkflowEvent) -> None:
    console.print(event_line(event), highlight=False)


def print_list(console: Console, workflows: list[pb.Workflow]) -> None:
    if not workflows:
        console.print("no workflows")
        return
    table = Table(box=None)
    table.add_column("task", no_wrap=True, min_width=36)
    for name in ("status", "last node", "updated", "lease holder"):
        table.add_column(name)
    for workflow in workflows:
        table.add_row(
            workflow.task_id,
            styled_status(workflow.status),
            escape(workflow.last_node_id or "-"),
            time_of(workflow.updated_at),
            escape(workflow.lease_holder_id or "-"),
        )
    console.print(table)


def progress_view(console: Console) -> Progress:
    """The live view's bar: steps passed of steps planned, and what the workflow is doing."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
    )


def _policy(enum: Any, value: int) -> str:
    """A schedule policy's name; an unspecified one as its default (the first named value)."""
    return str(enum.Name(value or 1)) if value in enum.values() else "?"


def schedule_state(schedule: pb.Schedule) -> str:
    return "[yellow]paused[/]" if schedule.paused else "[green]active[/]"


def print_schedule(console: Console, schedule: pb.Schedule) -> None:
    console.print(f"[bold]{schedule.schedule_id}[/]  {schedule_state(schedule)}")
    if schedule.template_task_id:
        task = f"task {schedule.template_task_id}, loaded at every slot"
    else:
        steps = len(schedule.task.steps)
        task = (schedule.task.prompt or "(no prompt)") + (f"; {steps} step(s)" if steps else "")
    zone = schedule.time_zone or "UTC"
    rows = [
        ("cron", f"{schedule.cron}  ({zone})"),
        ("overlap", _policy(pb.OverlapPolicy, schedule.overlap)),
        ("catch-up", _policy(pb.CatchUpPolicy, schedule.catch_up)),
        ("next fire", zoned_time_of(schedule.next_fire_time, zone)),
        ("last fire", zoned_time_of(schedule.last_fire_time, zone)),
        ("last task", schedule.last_task_id or "-"),
        ("task", task),
        ("created", time_of(schedule.created_at) + _by(schedule.created_by)),
    ]
    for name, value in rows:
        console.print(f"  {name:<10} {escape(value)}")
    if schedule.last_task_id:
        console.print(f"  its runs:  workflow-engine list --schedule-id {schedule.schedule_id}")


def _by(caller: str) -> str:
    return f" by {caller}" if caller else ""


def print_schedules(console: Console, schedules: list[pb.Schedule]) -> None:
    if not schedules:
        console.print("no schedules")
        return
    table = Table(box=None)
    table.add_column("schedule", no_wrap=True, min_width=36)
    for name in ("cron", "zone", "state", "next fire", "last fire"):
        table.add_column(name)
    for schedule in schedules:
        table.add_row(
            schedule.schedule_id,
            escape(schedule.cron),
            escape(schedule.time_zone or "UTC"),
            schedule_state(schedule),
            time_of(schedule.next_fire_time),
            time_of(schedule.last_fire_time),
        )
    console.print(table)
