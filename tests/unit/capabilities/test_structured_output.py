"""The structured-output ladder's parts: request shapes, shape refusals, JSON out of text."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from workflow_engine.capabilities.model._structured_output import (
    MAX_SEARCHED_CHARS,
    OutputModes,
    asked_for,
    extract_json,
    refuses_shape,
)
from workflow_engine.config import OUTPUT_MODES

LLAMA_CPP_PYTHON = "Input should be 'text' or 'json_object'"
LM_STUDIO = "'response_format.type' must be 'json_schema' or 'text'"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You answer."},
    {"role": "user", "content": "Go."},
]


def status_error(status: int, body: Any) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://model/v1/chat/completions")
    response = httpx.Response(status, json=body, request=request)
    message = json.dumps(body)
    cls = openai.InternalServerError if status >= 500 else openai.BadRequestError
    return cls(message, response=response, body=body)


def test_each_rung_sends_the_schema_once() -> None:
    first = asked_for("json_schema", MESSAGES, "plan", SCHEMA)
    assert first.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "plan", "schema": SCHEMA, "strict": False},
    }
    assert first.messages == MESSAGES
    second = asked_for("json_object_schema", MESSAGES, "plan", SCHEMA)
    assert second.response_format == {"type": "json_object", "schema": SCHEMA}
    assert second.messages == MESSAGES
    for mode, form in (("json_object", {"type": "json_object"}), ("text", None)):
        lower = asked_for(mode, MESSAGES, "plan", SCHEMA)
        assert lower.response_format == form
        assert lower.messages[0]["content"].startswith("You answer.")
        assert lower.messages[0]["content"].endswith(json.dumps(SCHEMA))
        assert lower.messages[1:] == MESSAGES[1:]
    assert MESSAGES[0]["content"] == "You answer."  # the caller's list is not changed


@pytest.mark.parametrize(
    ("status", "body", "about_shape"),
    [
        # llama-cpp-python 0.3.36, as the issue saw it
        (500, {"detail": [{"msg": LLAMA_CPP_PYTHON, "input": "json_schema"}]}, True),
        (400, {"error": {"message": LM_STUDIO}}, True),
        (400, {"error": {"message": "Failed to parse grammar"}}, True),
        (400, {"error": {"message": "Error in guided decoding: unsupported keyword"}}, True),
        (500, {"error": {"message": "CUDA out of memory"}}, False),
        (500, {"error": {"message": "Unexpected empty grammar stack"}}, False),
        (503, {"error": {"message": "server busy: grammar sampler not ready"}}, False),
        (400, {"error": {"message": "messages: required"}}, False),
        (401, {"error": {"message": "bad key for response_format"}}, False),
        (429, {"error": {"message": "slow down, json_schema user"}}, False),
        (404, {"error": {"message": "model not found (json_schema)"}}, False),
    ],
)
def test_a_shape_refusal_is_told_from_other_errors(
    status: int, body: Any, about_shape: bool
) -> None:
    assert refuses_shape(status_error(status, body)) is about_shape


def test_the_rung_is_remembered_per_endpoint_and_a_pinned_one_is_kept() -> None:
    OutputModes.forget()
    one, other = OutputModes("http://one/v1"), OutputModes("http://other/v1")
    assert one.mode() == OUTPUT_MODES[0]
    assert one.step_down("json_schema", "refused")
    assert OutputModes("http://one/v1").mode() == "json_object_schema"  # a new client knows
    assert other.mode() == "json_schema"
    assert one.step_down("json_schema", "a late refusal of the old rung")  # no double step
    assert one.mode() == "json_object_schema"
    for mode in OUTPUT_MODES[1:-1]:
        assert one.step_down(mode, "refused")
    assert one.mode() == "text"
    assert not one.step_down("text", "refused")  # nowhere lower
    pinned = OutputModes("http://pinned/v1", "json_object")
    assert not pinned.step_down("json_object", "refused")
    assert pinned.mode() == "json_object"
    OutputModes.forget()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('  \n{"a": 1}\n', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('Here it is: {"a": 1}. Anything else?', {"a": 1}),
        ('{not json} then {"a": 2}', {"a": 2}),
        ('{"a": "x\ty\nz"}', {"a": "x\ty\nz"}),  # a raw tab and newline in a string
        ("[1, 2]", [1, 2]),  # all of it is JSON: the domain judges its shape
        ('[1, 2] and {"a": 3}', {"a": 3}),
        ('{"a": {"b": [1, {"c": "}"}]}} trailing', {"a": {"b": [1, {"c": "}"}]}}),
    ],
)
def test_json_is_found_in_what_a_model_writes(content: str, expected: Any) -> None:
    assert extract_json(content) == expected


@pytest.mark.parametrize(
    "content",
    ["", "   ", "no json here", "{" * 100_000, "[" * 100_000, "{" * 40 + '{"a": 1}'],
    ids=["empty", "blank", "prose", "braces", "brackets", "past-the-starts"],
)
def test_an_answer_without_json_is_a_value_error(content: str) -> None:
    with pytest.raises(ValueError, match=r"."):  # never RecursionError, never a hang
        extract_json(content)


def test_only_the_start_of_a_huge_answer_is_searched() -> None:
    with pytest.raises(ValueError, match="Expecting value"):
        extract_json("x" * MAX_SEARCHED_CHARS + '{"a": 1}')
