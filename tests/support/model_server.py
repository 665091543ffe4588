"""A model server speaking the OpenAI-compatible Chat Completions API, answering from a script.

A real HTTP server (Starlette, uvicorn on a free port, in a thread with its own event loop), as
vLLM or llama.cpp's server would be. It checks that every request carries the model, the
messages and the answer's JSON Schema in one of the shapes the engine's structured-output
ladder sends (and the bearer token), refusing one that does not with 400 and recording why in
`problems`. Its `dialect` says which shapes it takes, as real servers differ:

- ``openai``: every shape (OpenAI, vLLM, llama.cpp's server);
- ``llama-cpp-python``: ``json_schema`` refused with HTTP 500, as its server does;
- ``no-response-format``: any ``response_format`` refused with 400 (the schema must be in the
  prompt), and the JSON answered inside prose and a Markdown fence, as an unconstrained model
  writes it.

Answers come from a script per schema (``plan``, ``step``, ``verification``, ``summary``, told
apart by the schema's top-level properties), in order; an empty script answers with its
default (a ``verification`` passes). A scripted answer is one of:

- a dict or list: answered as the JSON content;
- ``Reply(...)``: a status (429 with ``Retry-After``, 500, 401), a delay (a slow server), raw
  content (not JSON), a ``finish_reason`` (``length``), a refusal, a whole response body, a
  ``model`` name of the server's choosing, or a ``drip``: the body sent a byte at a time, that
  many seconds apart (a server that keeps a call alive without ever answering).

Usage is counted as a server does: prompt tokens from the messages' size, completion tokens
from the answer's (a quarter of the characters), so a test can read what a workflow cost.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from workflow_engine.capabilities.model._structured_output import OutputModes

MODEL = "test-model"
DIALECTS = ("openai", "llama-cpp-python", "no-response-format")
#: The schemas' top-level properties, and the name a script is kept under.
SCHEMA_NAMES = {"steps": "plan", "command": "step", "status": "verification", "summary": "summary"}
API_KEY = "sk-test-key"

DEFAULTS: dict[str, Any] = {
    "verification": {
        "status": "pass",
        "findings": [{"check": "evidence", "passed": True, "detail": "the output shows it"}],
        "recommended_actions": [],
    },
    "summary": {"summary": "The model's summary: everything passed."},
}


@dataclass
class Reply:
    """A scripted answer other than plain JSON content."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    content: str | None = None
    json: Any = None
    finish_reason: str = "stop"
    refusal: str | None = None
    #: A whole response body (JSON, or a string sent as it is): a hostile server's.
    body: Any = None
    #: The model the answer says it came from.
    model: str = MODEL
    #: Seconds between the body's bytes (0: all at once).
    drip: float = 0.0


@dataclass
class Call:
    """One request the server got."""

    schema_name: str
    body: dict[str, Any]
    status: int
    at: float = field(default_factory=time.monotonic)


class ModelServer:
    """The server, its scripts and what it was asked."""

    def __init__(self, dialect: str = "openai") -> None:
        assert dialect in DIALECTS, dialect
        self.dialect = dialect
        OutputModes.forget()  # a port reused by a server of another dialect starts at the top
        self.scripts: dict[str, deque[Any]] = defaultdict(deque)
        self.calls: list[Call] = []
        self.problems: list[str] = []
        self._lock = threading.Lock()
        app = Starlette(routes=[Route("/v1/chat/completions", self._complete, methods=["POST"])])
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        for _ in range(500):
            if self._server.started:
                break
            time.sleep(0.01)
        assert self._server.started, "the model server did not start"
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    def script(self, schema_name: str, *answers: Any) -> None:
        """Answer the next requests for `schema_name` with `answers`, in order."""
        with self._lock:
            self.scripts[schema_name].extend(answers)

    def asked(self, schema_name: str) -> list[Call]:
        return [c for c in self.calls if c.schema_name == schema_name]

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    def _check(self, request: Request, body: Any) -> str:
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return "no bearer token"
        if not isinstance(body, dict):
            return "the body is not a JSON object"
        if body.get("model") != MODEL:
            return f"model: expected {MODEL!r}, got {body.get('model')!r}"
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages: required"
        if not all(isinstance(m, dict) and m.get("role") and m.get("content") for m in messages):
            return "messages: each needs a role and content"
        if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
            return "max_tokens: expected a bound on the answer"
        schema = schema_of(body)
        if not isinstance(schema, dict) or not schema.get("properties"):
            return "the answer's JSON Schema: not in the response_format nor in the prompt"
        return ""

    def _refusal(self, body: dict[str, Any]) -> Response | None:
        """The error this server's dialect answers a request shape it does not take with."""
        kind = (body.get("response_format") or {}).get("type")
        if self.dialect == "llama-cpp-python" and kind == "json_schema":
            detail = {
                "type": "literal_error",
                "loc": ["body", "response_format", "type"],
                "msg": "Input should be 'text' or 'json_object'",
                "input": "json_schema",
            }
            return JSONResponse({"detail": [detail]}, 500)
        if self.dialect == "no-response-format" and kind:
            message = f"response_format of type {kind} is not supported"
            return JSONResponse({"error": {"message": message, "type": "invalid_request"}}, 400)
        return None

    async def _complete(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        problem = self._check(request, body)
        name = schema_name(schema_of(body)) if not problem else "?"
        if problem:
            self.problems.append(problem)
            self.calls.append(Call(name, body or {}, 400))
            return JSONResponse({"error": {"message": problem, "type": "invalid_request"}}, 400)
        refused = self._refusal(body)
        if refused is not None:
            self.calls.append(Call(name, body, refused.status_code))
            return refused
        with self._lock:
            queue = self.scripts[name]
            answer = queue.popleft() if queue else DEFAULTS.get(name)
        reply = answer if isinstance(answer, Reply) else Reply(json=answer)
        self.calls.append(Call(name, body, reply.status))
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.drip:
            return StreamingResponse(
                _dripped(json.dumps(completion_body(MODEL, "{}", 1, 1)), reply.drip),
                media_type="application/json",
            )
        if reply.body is not None:
            text = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
            return Response(text, 200, media_type="application/json")
        if reply.status != 200:
            error = {"error": {"message": f"scripted {reply.status}", "type": "scripted"}}
            return JSONResponse(error, reply.status, headers=reply.headers)
        if reply.json is None and reply.content is None and reply.refusal is None:
            self.problems.append(f"no scripted answer for {name!r}")
            return JSONResponse({"error": {"message": f"nothing scripted for {name}"}}, 400)
        content = reply.content if reply.content is not None else json.dumps(reply.json)
        if self.dialect == "no-response-format" and reply.content is None:
            # A model nothing constrains wraps its JSON in words and a Markdown fence.
            content = f"Here is the {name}:\n```json\n{content}\n```\nAsk if you need more."
        if reply.refusal is not None:
            content = ""
        prompt_tokens = len(json.dumps(body["messages"])) // 4
        completion_tokens = max(1, len(content) // 4)
        body = completion_body(reply.model, content, prompt_tokens, completion_tokens)
        body["id"] = f"chatcmpl-{len(self.calls)}"
        message = body["choices"][0]
        message["message"]["refusal"] = reply.refusal
        message["finish_reason"] = reply.finish_reason
        return JSONResponse(body)


def completion_body(
    model: str, content: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """A chat completion's response body, as a server sends it."""
    return {
        "id": "chatcmpl-0",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content or None, "refusal": None},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


async def _dripped(text: str, seconds: float) -> AsyncIterator[bytes]:
    for byte in text.encode():
        yield bytes([byte])
        await asyncio.sleep(seconds)


def schema_of(body: Any) -> Any:
    """The answer's JSON Schema as the request carries it: in the response format, or (the
    engine's lower rungs) at the end of the system message."""
    if not isinstance(body, dict):
        return None
    form = body.get("response_format") or {}
    if form.get("type") == "json_schema":
        return (form.get("json_schema") or {}).get("schema")
    if form.get("type") == "json_object" and "schema" in form:
        return form["schema"]
    system = next((m for m in body.get("messages", []) if m.get("role") == "system"), None)
    content = str((system or {}).get("content", ""))
    marker = "JSON Schema:\n"
    if marker not in content:
        return None
    try:
        return json.loads(content.rsplit(marker, 1)[1])
    except ValueError:
        return None


def schema_name(schema: Any) -> str:
    """Which script answers a request for `schema` (``plan``, ``step``, ...)."""
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    return next((n for key, n in SCHEMA_NAMES.items() if key in properties), "?")


@pytest.fixture(name="model")
def model_fixture(request: pytest.FixtureRequest) -> Iterator[ModelServer]:
    """The scripted model server; a test may name its dialect (`indirect` parametrization). A
    request it refused fails the test."""
    server = ModelServer(getattr(request, "param", "openai"))
    yield server
    server.stop()
    assert server.problems == [], "the model server refused requests"
