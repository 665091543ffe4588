"""The ``mcp`` task source: the orchestrator's MCP server, over streamable HTTP.

Each load is one short MCP session (the official SDK's `Client`): the task tool, then the
effective-preferences tool, both with the required ``task_id``. The HTTP client (connection
pool, bearer token, timeouts) lives as long as the engine; a session per load keeps a
restarted or replaced server from leaving a stale session behind, and a start costs a few
round trips more, which a start can afford.

A tool's JSON is read from its structured content, or else from its text. The task tool's
answer (id, status, prompt, summary, created_by, project_id, timestamps: no acceptance criteria
or metadata) becomes a task as `orchestrator_task` says; the preferences become its one
preference layer (``{"effective": {...}}``, as their gateway wraps them, or the object itself).
A tool error that says "not found" is `TaskNotFound` (in the engine's words, not the tool's:
the same for every task); a server that cannot be reached, times
out, or answers with anything else is `TaskSourceUnavailable`.
"""

from __future__ import annotations

import asyncio
import json
from types import TracebackType
from typing import Any, Self

import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent
from pydantic import ValidationError

from workflow_engine.capabilities.tasks._orchestrator import task_from_orchestrator
from workflow_engine.config import McpSettings
from workflow_engine.domain.task import TaskSpec
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import TaskNotFound, TaskSourceUnavailable

#: What the SDK and the network raise when the server cannot be used (anyio task groups wrap
#: them in exception groups).
_UNREACHABLE = (OSError, TimeoutError, httpx2.HTTPError, MCPError, ValidationError, ExceptionGroup)


class McpTaskSource:
    """Loads a task and its effective preferences from the orchestrator's MCP tools."""

    def __init__(self, settings: McpSettings) -> None:
        self._settings = settings
        self.where = f"the MCP server at {settings.url}"
        self._http: httpx2.AsyncClient | None = None

    async def __aenter__(self) -> Self:
        headers = {}
        if self._settings.bearer_token:
            headers["Authorization"] = f"Bearer {self._settings.bearer_token}"
        self._http = httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(self._settings.timeout_seconds)
        )
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def load(self, task_id: str) -> TaskSpec:
        task_result, preferences_result = await self._call_tools(task_id)
        task = self._json(task_id, self._settings.task_tool, task_result)
        if not isinstance(task, dict):
            raise self._unavailable(task_id, f"tool {self._settings.task_tool} returned no object")
        if str(task.get("id") or task_id).lower() != task_id:
            raise self._unavailable(
                task_id, f"tool {self._settings.task_tool} returned task {task['id']!r}"
            )
        assert preferences_result is not None  # asked whenever the task was found
        preferences = self._json(task_id, self._settings.preferences_tool, preferences_result)
        return task_from_orchestrator(
            task_id,
            task,
            source=self.where,
            preferences=self._preferences(task_id, preferences),
        )

    async def _call_tools(self, task_id: str) -> tuple[CallToolResult, CallToolResult | None]:
        """The task tool's result and, unless it failed, the preferences tool's, from one
        session that has closed when they are read."""
        if self._http is None:
            raise RuntimeError("McpTaskSource used before the engine opened it")
        arguments = {"task_id": task_id}
        preferences = None
        try:
            async with asyncio.timeout(self._settings.timeout_seconds):
                transport = streamable_http_client(self._settings.url, http_client=self._http)
                async with Client(transport, cache=None) as client:
                    task = await client.call_tool(self._settings.task_tool, arguments)
                    if not task.is_error:
                        preferences = await client.call_tool(
                            self._settings.preferences_tool, arguments
                        )
        except _UNREACHABLE as exc:
            raise self._unavailable(task_id, _describe(exc)) from None
        return task, preferences

    def _json(self, task_id: str, tool: str, result: CallToolResult) -> Any:
        if result.is_error:
            message = _text(result)[:500] or "no message"
            if "not found" in message.lower():
                # In the words of every missing task (the server's own may differ by task),
                # which is also what a caller scoped to others hears for another tenant's.
                raise TaskNotFound(task_id, self.where)
            raise self._unavailable(task_id, f"tool {tool} failed: {message}")
        structured = result.structured_content
        if isinstance(structured, dict) and set(structured) == {"result"}:
            structured = structured["result"]  # the SDK's wrapping of a non-object return value
        if structured is not None and not isinstance(structured, str):
            return structured
        text = structured if isinstance(structured, str) else _text(result)
        try:
            return json.loads(text)
        except ValueError:
            raise self._unavailable(task_id, f"tool {tool} returned no JSON") from None

    def _preferences(self, task_id: str, value: Any) -> JsonObject:
        if isinstance(value, dict) and set(value) == {"effective"}:
            value = value["effective"]
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self._unavailable(
                task_id, f"tool {self._settings.preferences_tool} returned no object"
            )
        return value

    def _unavailable(self, task_id: str, why: str) -> TaskSourceUnavailable:
        return TaskSourceUnavailable(task_id, self.where, why)


def _text(result: CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


def _describe(exc: BaseException) -> str:
    """The first error inside `exc`'s exception groups, as the reason the server is unusable."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError | httpx2.TimeoutException):  # ours or the client's, first
        return "no answer in time"
    return f"the server could not be used ({type(exc).__name__}: {str(exc)[:300] or 'no detail'})"
