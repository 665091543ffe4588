"""ListWorkflows page tokens: they round-trip and are bound to the filters they were made for."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from workflow_engine.api._listing import _decode_token, _encode_token
from workflow_engine.domain.records import WorkflowQuery
from workflow_engine.errors import InvalidArgument

AFTER = (datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "6f1c2e1a-0b5e-4d9a-8c2b-1d2e3f4a5b6c")


def test_a_page_token_round_trips_with_its_filters() -> None:
    query = WorkflowQuery(statuses=("FAILED",), user_id="u1")
    assert _decode_token(_encode_token(AFTER, query), query) == AFTER


@pytest.mark.parametrize(
    "other", [WorkflowQuery(statuses=("SUCCEEDED",), user_id="u1"), WorkflowQuery()]
)
def test_a_token_is_refused_with_other_filters(other: WorkflowQuery) -> None:
    token = _encode_token(AFTER, WorkflowQuery(statuses=("FAILED",), user_id="u1"))
    with pytest.raises(InvalidArgument, match=r"^page_token"):
        _decode_token(token, other)


@pytest.mark.parametrize("token", ["", "!!!", "e30", "x" * 600])
def test_a_malformed_token_is_refused(token: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^page_token"):
        _decode_token(token, replace(WorkflowQuery()))
