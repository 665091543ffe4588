"""ListWorkflows: the request checked and turned into a `WorkflowQuery`, pages into messages.

The page token is opaque to clients: urlsafe base64 of a small JSON holding the last row's
`updated_at` and `task_id` (the keyset), and a digest of them together with the request's
filters. A token that does not decode, was edited, or comes with other filters than the ones
that produced it is refused as INVALID_ARGUMENT naming `page_token`. The digest is a checksum,
not a signature: a client that forges a well-formed token only moves its own cursor.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import timestamp_pb2

from workflow_engine._masking import Secrets, for_workflow
from workflow_engine.api import _convert as convert
from workflow_engine.api import _requests as requests
from workflow_engine.domain.records import WorkflowListItem, WorkflowPage, WorkflowQuery
from workflow_engine.errors import InvalidArgument
from workflow_engine.v1 import workflow_engine_pb2 as pb

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_FILTER_CHARS = 256
#: `statuses` filter entries: each status once, and room for statuses the contract may add.
MAX_STATUSES = 32
# A page stops early (with a next_page_token) once its items reach this many bytes, so a page of
# long summaries stays well under the default 4 MiB message limit of gRPC clients.
MAX_PAGE_BYTES = 1 << 20
_MAX_TOKEN_CHARS = 512
_TOKEN_VERSION = 1
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_-]+")
_STATUS_NAMES: dict[int, str] = {
    number: name
    for name, number in pb.WorkflowStatus.items()
    if number != pb.WORKFLOW_STATUS_UNSPECIFIED
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# google.protobuf.Timestamp's valid range: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
_MIN_SECONDS = -62_135_596_800
_MAX_SECONDS = 253_402_300_799


def parse_list_request(msg: pb.ListWorkflowsRequest) -> WorkflowQuery:
    """The query a request asks for; every malformed field is an `InvalidArgument`."""
    statuses: set[str] = set()
    for i, value in enumerate(msg.statuses):
        if value == pb.WORKFLOW_STATUS_UNSPECIFIED:
            raise InvalidArgument(f"statuses[{i}]", "WORKFLOW_STATUS_UNSPECIFIED is not a status")
        statuses.add(
            requests.parse_enum(
                value, pb.WorkflowStatus.DESCRIPTOR, _STATUS_NAMES, f"statuses[{i}]", "status"
            )
        )
    user_id = _parse_filter(msg.user_id, "user_id")
    project_id = _parse_filter(msg.project_id, "project_id")
    schedule_id = requests.parse_uuid(msg.schedule_id, "schedule_id", required=False) or ""
    after = _parse_time(msg.updated_after, "updated_after", msg.HasField("updated_after"))
    before = _parse_time(msg.updated_before, "updated_before", msg.HasField("updated_before"))
    if (
        after is not None
        and before is not None
        and _instant(msg.updated_after) >= _instant(msg.updated_before)
    ):
        raise InvalidArgument("updated_after", "must be before updated_before")
    if msg.page_size > MAX_PAGE_SIZE:
        raise InvalidArgument("page_size", f"must be at most {MAX_PAGE_SIZE}")
    query = WorkflowQuery(
        statuses=tuple(sorted(statuses)),
        user_id=user_id,
        project_id=project_id,
        updated_after=after,
        updated_before=before,
        limit=msg.page_size or DEFAULT_PAGE_SIZE,
        schedule_id=schedule_id,
    )
    if not msg.page_token:
        return query
    return replace(query, after=_decode_token(msg.page_token, query))


def list_response(
    page: WorkflowPage, query: WorkflowQuery, engine_secrets: Secrets
) -> pb.ListWorkflowsResponse:
    """The page as a response, `engine_secrets` masked; cut short (with a token) when it would
    grow too large."""
    response = pb.ListWorkflowsResponse()
    size = 0
    last: WorkflowListItem | None = None
    for item in page.items:
        workflow = list_item_to_proto(item, engine_secrets)
        size += workflow.ByteSize()
        if last is not None and size > MAX_PAGE_BYTES:
            response.next_page_token = _encode_token((last.updated_at, last.task_id), query)
            return response
        response.workflows.append(workflow)
        last = item
    if page.next_after is not None:
        response.next_page_token = _encode_token(page.next_after, query)
    return response


def list_item_to_proto(item: WorkflowListItem, engine_secrets: Secrets) -> pb.Workflow:
    """A listed workflow: everything but its state, history and pending approval."""
    return pb.Workflow(
        task_id=item.task_id,
        run_id=item.run_id or "",
        status=convert.status_to_proto(item.status),
        last_node_id=item.last_node_id or "",
        updated_at=convert.to_timestamp(item.updated_at),
        lease_holder_id=item.lease_holder_id or "",
        lease_expires_at=convert.to_timestamp(item.lease_expires_at),
        # Stored masked with the workflow's own secrets (`storage._checkpointer`).
        summary=for_workflow(engine_secrets, ()).redact(item.summary),
        error=for_workflow(engine_secrets, ()).redact(item.error),
        stopped_reason=item.stopped_reason,
        schedule_id=item.schedule_id,
        schedule_slot=convert.to_timestamp(item.schedule_slot),
    )


def _parse_filter(value: str, field: str) -> str:
    if len(value) > MAX_FILTER_CHARS:
        raise InvalidArgument(field, f"longer than {MAX_FILTER_CHARS} characters")
    if "\x00" in value:
        raise InvalidArgument(field, "contains a NUL character")
    return value


def _parse_time(ts: timestamp_pb2.Timestamp, field: str, is_set: bool) -> datetime | None:
    """A set Timestamp field as an aware datetime, rounded up to PostgreSQL's microseconds.

    Rounding up keeps both bounds exact for stored (microsecond) times: t >= 1.5 us holds
    exactly when t >= 2 us, and t < 1.5 us exactly when t < 2 us.
    """
    if not is_set:
        return None
    if not _MIN_SECONDS <= ts.seconds <= _MAX_SECONDS:
        raise InvalidArgument(field, "outside years 1 to 9999")
    if not 0 <= ts.nanos <= 999_999_999:
        raise InvalidArgument(field, "nanos must be between 0 and 999999999")
    try:
        return _EPOCH + timedelta(seconds=ts.seconds, microseconds=-(-ts.nanos // 1000))
    except OverflowError:
        raise InvalidArgument(field, "outside years 1 to 9999") from None


def _instant(ts: timestamp_pb2.Timestamp) -> tuple[int, int]:
    return ts.seconds, ts.nanos


def _filters(query: WorkflowQuery) -> list[Any]:
    return [
        list(query.statuses),
        query.user_id,
        query.project_id,
        query.updated_after.isoformat() if query.updated_after else None,
        query.updated_before.isoformat() if query.updated_before else None,
        *([query.schedule_id] if query.schedule_id else []),
    ]


def _digest(updated_at: str, task_id: str, query: WorkflowQuery) -> str:
    canonical = json.dumps([_TOKEN_VERSION, updated_at, task_id, _filters(query)])
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _encode_token(after: tuple[datetime, str], query: WorkflowQuery) -> str:
    updated_at, task_id = after[0].isoformat(), after[1]
    body = {"v": _TOKEN_VERSION, "u": updated_at, "t": task_id}
    body["d"] = _digest(updated_at, task_id, query)
    raw = json.dumps(body, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_token(token: str, query: WorkflowQuery) -> tuple[datetime, str]:
    if len(token) > _MAX_TOKEN_CHARS:
        raise InvalidArgument("page_token", "malformed (too long)")
    try:
        if not _TOKEN_CHARS.fullmatch(token):
            raise ValueError("not urlsafe base64 without padding")
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        body = json.loads(raw)
        if not isinstance(body, dict) or body.get("v") != _TOKEN_VERSION:
            raise ValueError("not a page token of this version")
        updated_at, task_id, digest = body["u"], body["t"], body["d"]
        if not all(isinstance(value, str) for value in (updated_at, task_id, digest)):
            raise ValueError("fields must be strings")
        after = datetime.fromisoformat(updated_at)
        if after.tzinfo is None:
            raise ValueError("time without a time zone")
        if str(uuid.UUID(task_id)) != task_id:
            raise ValueError("task id not canonical")
    except (binascii.Error, UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise InvalidArgument("page_token", "malformed; pass next_page_token unchanged") from None
    if digest != _digest(updated_at, task_id, query):
        raise InvalidArgument(
            "page_token", "altered, or issued for other filters than this request's"
        )
    return after, task_id
