"""The client commands' command line: the verbs, their flags and the choices they map to
(`subcommands` runs them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from workflow_engine.client._connection import TOKEN_ENV
from workflow_engine.v1 import workflow_engine_pb2 as pb

BRANCHES = {"finalize_summary": pb.FINALIZE_SUMMARY, "mark_failed": pb.MARK_FAILED}
OVERLAP = {"skip": pb.SKIP, "allow": pb.ALLOW}
CATCH_UP = {"skip-missed": pb.SKIP_MISSED, "run-once": pb.RUN_ONCE}


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    reach = common.add_argument_group("reaching the engine")
    reach.add_argument(
        "--address", help="the engine's HOST:PORT (default: its WORKFLOW_ENGINE_LISTEN address)"
    )
    reach.add_argument("--tls", action="store_true", help="TLS with the system's CAs")
    reach.add_argument("--ca-file", type=Path, help="TLS, trusting this CA (PEM)")
    reach.add_argument("--cert-file", type=Path, help="client certificate (mutual TLS)")
    reach.add_argument("--key-file", type=Path, help="its private key")
    reach.add_argument("--token-file", type=Path, help=f"bearer token file (or set {TOKEN_ENV})")
    reach.add_argument(
        "--allow-plaintext-remote",
        action="store_true",
        help="send the token without TLS to an engine beyond loopback (a trusted network)",
    )
    common.add_argument("--json", action="store_true", help="JSON output, for scripts")

    top = argparse.ArgumentParser(
        prog="workflow-engine",
        description="Call a running engine. Exit codes: 0 ok or SUCCEEDED, 1 FAILED, 2 refused "
        "or bad usage, 3 CANCELLED, 4 waiting for approval, 5 SUSPENDED, 6 not found, "
        "7 not allowed, 8 engine unreachable or failed.",
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help_, description=help_)

    start = command("start", "start a workflow from a task file (YAML or JSON; - reads stdin)")
    start.add_argument("task_file", nargs="?", metavar="TASK_FILE")
    start.add_argument("--prompt", help="the task's prompt (with no file: a task of just this)")
    start.add_argument("--task-id", help="the task's UUID (default: a new one)")
    start.add_argument("--idempotency-key", help="a UUID; a repeated start with it changes nothing")
    start.add_argument(
        "--wait", action="store_true", help="follow it live until it ends or waits (as watch)"
    )
    get = command("get", "show a workflow: status, steps, summary or error")
    get.add_argument("task_id", metavar="TASK_ID")
    get.add_argument("--history", action="store_true", help="also every event so far")
    watch = command("watch", "follow a workflow live until it ends or waits for someone")
    watch.add_argument("task_id", metavar="TASK_ID")
    listing = command("list", "list workflows, newest update first")
    listing.add_argument(
        "--status",
        action="append",
        default=[],
        choices=[
            s.lower()
            for s in pb.WorkflowStatus.keys()  # noqa: SIM118 (an enum wrapper, not a dict)
            if s != "WORKFLOW_STATUS_UNSPECIFIED"
        ],
        help="only these (repeat the flag for several)",
    )
    listing.add_argument("--project", help="only this metadata.project_id")
    listing.add_argument("--user", help="only this metadata.user_id")
    listing.add_argument("--schedule-id", help="only the workflows this schedule started")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (50)")
    cancel = command("cancel", "cancel a workflow: its running jobs are stopped")
    cancel.add_argument("task_id", metavar="TASK_ID")
    cancel.add_argument("--reason", default="cancelled from the command line")
    for name, verb in (("approve", "approve"), ("reject", "reject")):
        decide = command(name, f"{verb} the step a workflow waits on")
        decide.add_argument("task_id", metavar="TASK_ID")
        decide.add_argument("--step", help="the step (default: the one it waits on)")
        decide.add_argument("--reason", required=name == "reject", help="why (required to reject)")
    update = command("update", "an operator's override of a workflow")
    update.add_argument("task_id", metavar="TASK_ID")
    action = update.add_mutually_exclusive_group(required=True)
    action.add_argument("--set-state", metavar="JSON", help="state fields to replace")
    action.add_argument(
        "--reject-last-result", action="store_true", help="one more attempt at the last step"
    )
    action.add_argument("--force-branch", choices=sorted(BRANCHES), help="go to this node next")
    action.add_argument(
        "--accept-outside-state",
        action="store_true",
        help="a blocked workflow: take another writer's state and go on",
    )
    update.add_argument("--reason", help="why (recorded)")
    update.add_argument("--operator", help="a name recorded beside the authenticated caller")
    schedule = sub.add_parser(
        "schedule",
        help="start workflows on a calendar: create, list, get, pause, resume, delete",
        description="Schedules start a workflow from a task template at every slot of a cron "
        "calendar (see docs/schedules.md).",
    )
    _schedule_parser(schedule, common)
    return top


def _schedule_parser(schedule: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """`schedule create|list|get|pause|resume|delete`; the common flags follow the verb."""
    verbs = schedule.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name: str, help_: str) -> argparse.ArgumentParser:
        return verbs.add_parser(name, parents=[common], help=help_, description=help_)

    create = verb("create", "create a schedule: a task template started at every cron slot")
    create.add_argument("task_file", nargs="?", metavar="TASK_FILE", help="as start takes one")
    create.add_argument("--prompt", help="the task's prompt (with no file: a task of just this)")
    create.add_argument(
        "--template-task-id", help="instead of a task: this task, loaded at every slot"
    )
    create.add_argument(
        "--cron",
        required=True,
        help='five cron fields, @hourly/@daily/@weekly/@monthly/@yearly, or "@every 30s"',
    )
    create.add_argument("--time-zone", help="IANA zone the cron is read in (default UTC)")
    create.add_argument(
        "--overlap", choices=sorted(OVERLAP), help="a slot while the last run is on (skip)"
    )
    create.add_argument(
        "--catch-up", choices=sorted(CATCH_UP), help="slots missed in downtime (skip-missed)"
    )
    create.add_argument("--paused", action="store_true", help="create it paused")
    create.add_argument("--schedule-id", help="the schedule's UUID (default: a new one)")
    listing = verb("list", "list schedules, newest first")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (50)")
    for name, help_ in (
        ("get", "show a schedule: its calendar, policies and next fire time"),
        ("pause", "pause a schedule: no slot fires until it is resumed"),
        ("resume", "resume a paused schedule from its next slot"),
        ("delete", "delete a schedule; the workflows it started are kept"),
    ):
        verb(name, help_).add_argument("schedule_id", metavar="SCHEDULE_ID")
