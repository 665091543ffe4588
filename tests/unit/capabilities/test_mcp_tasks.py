"""How the `mcp` source reads a tool's result (the SDK's own result types, no server)."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.types import CallToolResult, TextContent

from workflow_engine.capabilities.tasks import McpTaskSource
from workflow_engine.config import McpSettings
from workflow_engine.errors import TaskNotFound, TaskSourceUnavailable

TASK = "33333333-3333-4333-8333-333333333333"
SOURCE = McpTaskSource(McpSettings(url="http://orchestrator/mcp"))


def result(text: str = "", structured: Any = None, *, error: bool = False) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(text=text)] if text else [],
        structured_content=structured,
        is_error=error,
    )


@pytest.mark.parametrize(
    "answer",
    [
        result('{"id": "x"}', {"id": "x"}),  # structured, with its text copy
        result(structured={"id": "x"}),  # structured only
        result('{"id": "x"}'),  # text only (a server without structured output)
        result('{"id": "x"}', {"result": '{"id": "x"}'}),  # the SDK's wrapping of a str return
    ],
)
def test_json_comes_from_structured_content_or_the_text(answer: CallToolResult) -> None:
    assert SOURCE._json(TASK, "db.task.get", answer) == {"id": "x"}


def test_a_tool_error_saying_not_found_is_task_not_found_in_the_engines_words() -> None:
    # The same words for every missing task: another tenant's task is answered in them.
    with pytest.raises(TaskNotFound) as err:
        SOURCE._json(TASK, "db.task.get", result('{"error":"not found"}', error=True))
    assert str(err.value) == f"task_id: task {TASK} not found in {SOURCE.where}"


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (result('{"error":"internal error"}', error=True), "tool db.task.get failed"),
        (result("Unknown tool: db.task.get", error=True), "Unknown tool"),
        (result("not JSON at all"), "returned no JSON"),
    ],
)
def test_other_failures_are_unavailable(answer: CallToolResult, why: str) -> None:
    with pytest.raises(TaskSourceUnavailable, match=why):
        SOURCE._json(TASK, "db.task.get", answer)


@pytest.mark.parametrize(
    ("value", "layer"),
    [({"effective": {"a": 1}}, {"a": 1}), ({"a": 1}, {"a": 1}), (None, {})],
)
def test_preferences_are_their_effective_object_or_the_object(value: Any, layer: Any) -> None:
    assert SOURCE._preferences(TASK, value) == layer


def test_preferences_that_are_not_an_object_are_unavailable() -> None:
    with pytest.raises(TaskSourceUnavailable, match="returned no object"):
        SOURCE._preferences(TASK, ["a"])
