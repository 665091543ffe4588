"""Request checks at the API edge: each refusal names the field the client sent."""

from __future__ import annotations

import pytest

from workflow_engine.api._requests import parse_lease_ttl, parse_reason, parse_state_patch
from workflow_engine.errors import InvalidArgument


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({}, "set_state"),
        ({"status": "succeeded"}, "set_state.status"),
        ({"max_attempts_per_step": 0}, "set_state.max_attempts_per_step"),
        ({"plan": {"steps": []}}, "set_state.plan.steps"),
        ({"summary": "a\x00b"}, "set_state.summary"),
    ],
)
def test_set_state_refuses_with_the_field_named(patch: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_state_patch(patch)
    assert err.value.field.startswith(field)


def test_a_patched_plan_is_stored_in_the_domain_models_form() -> None:
    values = parse_state_patch({"plan": {"steps": [{"id": "a", "command": ["true"]}]}})
    [step] = values["plan"]["steps"]
    assert step["depends_on"] == [] and step["expect"] == [] and step["env"] == {}
    with pytest.raises(InvalidArgument, match=r"^set_state\.plan\.steps\[0\]\.command: "):
        parse_state_patch({"plan": {"steps": [{"id": "a", "command": []}]}})
    with pytest.raises(InvalidArgument, match=r"^set_state\.max_parallel_steps: "):
        parse_state_patch({"max_parallel_steps": 65})


def test_lease_ttl_and_reason() -> None:
    assert parse_lease_ttl(0) == 0
    assert parse_lease_ttl(30) == 30
    for bad in (1, 2, 24 * 3600 + 1, -5):
        with pytest.raises(InvalidArgument, match=r"^lease_ttl_seconds: "):
            parse_lease_ttl(bad)
    assert parse_reason("why\nnot") == "why\nnot"
    with pytest.raises(InvalidArgument, match=r"^reason: "):
        parse_reason("a\x00b")
