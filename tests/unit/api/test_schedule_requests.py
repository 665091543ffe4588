"""Schedule requests checked at the API edge: the update mask, page sizes and page tokens,
enum values, and a stored template shown as the message it came from."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from workflow_engine._masking import MASK, EngineSecrets
from workflow_engine.api import _requests as requests
from workflow_engine.api import _schedules as schedules
from workflow_engine.domain.schedules import ScheduleRecord
from workflow_engine.errors import InvalidArgument
from workflow_engine.v1 import workflow_engine_pb2 as pb


def test_the_mask_is_required_and_names_known_fields() -> None:
    assert schedules.parse_mask(["paused", "cron", "paused"]) == ["paused", "cron"]
    for mask in ([], ["paused", "schedule_id"], ["next_fire_time"]):
        with pytest.raises(InvalidArgument) as refused:
            schedules.parse_mask(mask)
        assert refused.value.field == "update_mask"


def test_page_sizes() -> None:
    assert schedules.parse_page_size(0) == 50
    assert schedules.parse_page_size(500) == 500
    with pytest.raises(InvalidArgument) as refused:
        schedules.parse_page_size(501)
    assert refused.value.field == "page_size"


def test_page_tokens_round_trip_and_refuse_what_they_did_not_issue() -> None:
    after = (
        datetime(2026, 11, 27, 21, 0, 0, 123456, tzinfo=UTC),
        "8e1c1b9e-0f5e-4a8e-9f0d-3b1f8c2d7a10",
    )
    assert schedules.decode_token(schedules.encode_token(after)) == after
    assert schedules.decode_token("") is None
    for token in ("x" * 300, "not base64!", "e30", "eyJjIjoiMjAyNiIsInMiOiJ4In0"):
        with pytest.raises(InvalidArgument) as refused:
            schedules.decode_token(token)
        assert refused.value.field == "page_token"


def test_enums_default_and_refuse_unknown_numbers() -> None:
    draft = schedules.draft_from_proto(pb.Schedule(cron="@daily"))
    assert (draft.overlap, draft.catch_up) == ("SKIP", "SKIP_MISSED")
    with pytest.raises(InvalidArgument) as refused:
        schedules.draft_from_proto(
            pb.Schedule(cron="@daily", catch_up=pb.CatchUpPolicy.ValueType(9))
        )
    assert refused.value.field == "schedule.catch_up"


def test_a_stored_template_reads_back_as_sent() -> None:
    sent = pb.TaskSpec(
        prompt="nightly",
        steps=[
            pb.Step(
                id="a",
                command=["echo", "hi"],
                env={"K": "V"},
                timeout_seconds=5,
                requires_approval=True,
                approval_timeout_seconds=60,
                on_approval_timeout=pb.ApprovalTimeout.SUSPEND,
            )
        ],
        approval_timeout_seconds=30,
        on_approval_timeout=pb.ApprovalTimeout.REJECT,
    )
    sent.metadata.project_id = "p"
    sent.metadata.labels["team"] = "x"
    task = requests.task_from_proto(sent)
    now = datetime.now(UTC)
    record = ScheduleRecord(
        schedule_id="s",
        project_id="p",
        user_id="",
        cron="@daily",
        time_zone="",
        task=task.to_json(),
        template_task_id="",
        overlap="SKIP",
        catch_up="RUN_ONCE",
        paused=False,
        next_fire_time=None,
        last_fire_time=None,
        last_task_id="",
        created_by="me",
        created_at=now,
        updated_at=now,
    )
    shown = schedules.schedule_to_proto(record, EngineSecrets())
    assert requests.task_from_proto(shown.task) == task  # the approval actions included
    assert shown.catch_up == pb.RUN_ONCE and shown.created_by == "me"


def test_page_tokens_of_the_wrong_shape_are_invalid_argument() -> None:
    """Tokens that decode to JSON of another shape (numbers, lists) name the field; an
    AttributeError inside would have been INTERNAL."""
    import base64
    import json

    for body in ({"c": "2026-01-01T00:00:00+00:00", "s": 123}, [1, 2], {"c": 5, "s": "x"}, 7):
        token = base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")
        with pytest.raises(InvalidArgument) as refused:
            schedules.decode_token(token)
        assert refused.value.field == "page_token"


def test_a_template_sent_back_with_a_masked_secret_is_refused() -> None:
    """A client that reads a schedule gets its secrets as MASK; sending that back would store
    the mask as the secret's value and run every job with it."""
    msg = pb.Schedule(cron="@daily")
    msg.task.steps.add(id="a", command=["env"], env={"TOKEN": MASK}, secret_env=["TOKEN"])
    with pytest.raises(InvalidArgument) as refused:
        schedules.draft_from_proto(msg)
    assert refused.value.field == "schedule.task.steps[0].env"
