"""Schedule messages: requests checked into `ScheduleDraft`s, records into `Schedule` messages.

Each malformed field is an `InvalidArgument` naming it as the client spelled it
(``schedule.cron``, ``update_mask``); the calendar and the template are checked again by the
service (`service._schedules`), which is where what depends on the caller's scope is judged.
ListSchedules' page token is urlsafe base64 of the last item's creation time and id: opaque to
clients, refused as INVALID_ARGUMENT naming `page_token` when it does not decode.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TypeVar

from google.protobuf import json_format

from workflow_engine._masking import MASK, EngineSecrets, redact_json, step_secrets
from workflow_engine.api import _convert as convert
from workflow_engine.api import _requests as requests
from workflow_engine.domain.schedules import (
    MAX_CRON_CHARS,
    MAX_TIME_ZONE_CHARS,
    CatchUp,
    Overlap,
    ScheduleRecord,
)
from workflow_engine.domain.task import TaskSpec
from workflow_engine.errors import InvalidArgument
from workflow_engine.service import UPDATABLE, ScheduleDraft
from workflow_engine.v1 import workflow_engine_pb2 as pb

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
_MAX_TOKEN_CHARS = 256
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_-]+")
T = TypeVar("T")
_OVERLAP: dict[int, Overlap] = {0: "SKIP", pb.SKIP: "SKIP", pb.ALLOW: "ALLOW"}
_CATCH_UP: dict[int, CatchUp] = {
    0: "SKIP_MISSED",
    pb.SKIP_MISSED: "SKIP_MISSED",
    pb.RUN_ONCE: "RUN_ONCE",
}


def parse_schedule_id(value: str, *, required: bool, field: str = "schedule_id") -> str | None:
    return requests.parse_uuid(value, field, required=required)


def draft_from_proto(msg: pb.Schedule, fields: Sequence[str] = UPDATABLE) -> ScheduleDraft:
    """The settable fields of `msg` among `fields`, each checked for its form (the calendar
    and the template are the service's to check)."""
    cron = msg.cron
    if len(cron) > MAX_CRON_CHARS:
        raise InvalidArgument("schedule.cron", f"longer than {MAX_CRON_CHARS} characters")
    if len(msg.time_zone) > MAX_TIME_ZONE_CHARS:
        raise InvalidArgument("schedule.time_zone", f"longer than {MAX_TIME_ZONE_CHARS} characters")
    task: TaskSpec | None = None
    if "task" in fields and msg.HasField("task"):
        task = _task(msg.task)
    template = ""
    if "template_task_id" in fields and msg.template_task_id:
        template = requests.parse_uuid(msg.template_task_id, "schedule.template_task_id") or ""
    return ScheduleDraft(
        cron=cron,
        time_zone=msg.time_zone,
        task=task,
        template_task_id=template,
        overlap=_choice(msg.overlap, _OVERLAP, "schedule.overlap"),
        catch_up=_choice(msg.catch_up, _CATCH_UP, "schedule.catch_up"),
        paused=msg.paused,
    )


def _task(msg: pb.TaskSpec) -> TaskSpec:
    """The template, with its fields named under ``schedule.``.

    A secret's value as answers show it (`MASK`) is refused: a client that sends back the
    template it read would otherwise store, and run every job with, the mask for the secret.
    """
    try:
        task = requests.task_from_proto(msg)
    except InvalidArgument as exc:
        raise InvalidArgument(f"schedule.{exc.field}", exc.problem) from None
    for i, step in enumerate(task.steps):
        for name in step.secret_env:
            if step.env.get(name) == MASK:
                raise InvalidArgument(
                    f"schedule.task.steps[{i}].env",
                    f"the secret {name} is {MASK}, as answers show it; send its value",
                )
    return task


def _choice(value: int, accepted: Mapping[int, T], field: str) -> T:
    """An enum field's value (0 is the default); a number the contract does not define is
    refused."""
    if value not in accepted:
        raise InvalidArgument(field, f"unknown value {value}")
    return accepted[value]


def parse_mask(mask: Sequence[str]) -> list[str]:
    """UpdateSchedule's `update_mask`: required, each name one of `UPDATABLE`."""
    if not mask:
        raise InvalidArgument("update_mask", f"required: any of {', '.join(UPDATABLE)}")
    for name in mask:
        if name not in UPDATABLE:
            raise InvalidArgument(
                "update_mask", f"unknown field {name[:64]!r}; any of {', '.join(UPDATABLE)}"
            )
    return list(dict.fromkeys(mask))


def parse_page_size(value: int) -> int:
    if value > MAX_PAGE_SIZE:
        raise InvalidArgument("page_size", f"must be at most {MAX_PAGE_SIZE}")
    return value or DEFAULT_PAGE_SIZE


def schedule_to_proto(record: ScheduleRecord, engine_secrets: EngineSecrets) -> pb.Schedule:
    """A stored schedule as answers show it: its template's secret values (and the engine's
    credentials) masked, as GetWorkflow masks a workflow's."""
    task = TaskSpec.from_json(record.task) if record.task is not None else None
    return pb.Schedule(
        schedule_id=record.shown_id,
        cron=record.cron,
        time_zone=record.time_zone,
        task=task_to_proto(task, engine_secrets) if task is not None else None,
        overlap=pb.OverlapPolicy.Value(record.overlap),
        catch_up=pb.CatchUpPolicy.Value(record.catch_up),
        paused=record.paused,
        next_fire_time=convert.to_timestamp(record.next_fire_time),
        last_fire_time=convert.to_timestamp(record.last_fire_time),
        template_task_id=record.template_task_id,
        last_task_id=record.last_task_id,
        created_at=convert.to_timestamp(record.created_at),
        updated_at=convert.to_timestamp(record.updated_at),
        created_by=record.created_by,
    )


def task_to_proto(task: TaskSpec, engine_secrets: EngineSecrets) -> pb.TaskSpec:
    """A stored template as the message it came from (the message's JSON names are the
    task's, so the JSON form reads back as it was sent, but for enum values, which the JSON
    spells in lower case), with its secrets masked."""
    shown = engine_secrets.credentials.redact_json(
        redact_json(task.to_json(), step_secrets(task.steps))
    )
    for holder in [shown, *shown.get("steps", ())]:
        if isinstance(holder.get("on_approval_timeout"), str):
            holder["on_approval_timeout"] = holder["on_approval_timeout"].upper()
    message = pb.TaskSpec()
    json_format.ParseDict(shown, message, ignore_unknown_fields=True)
    return message


def encode_token(after: tuple[datetime, str]) -> str:
    raw = json.dumps({"c": after[0].isoformat(), "s": after[1]}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(token: str) -> tuple[datetime, str] | None:
    if not token:
        return None
    try:
        if len(token) > _MAX_TOKEN_CHARS or not _TOKEN_CHARS.fullmatch(token):
            raise ValueError("not a token")
        body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if not isinstance(body, dict) or not all(isinstance(body.get(k), str) for k in "cs"):
            raise ValueError("not a token")
        created_at = datetime.fromisoformat(body["c"])
        schedule_id = str(uuid.UUID(body["s"]))
        if created_at.tzinfo is None:
            raise ValueError("no time zone")
    except (binascii.Error, UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise InvalidArgument("page_token", "malformed; pass next_page_token unchanged") from None
    return created_at, schedule_id
