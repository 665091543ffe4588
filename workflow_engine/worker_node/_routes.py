"""The node's HTTP routes: the Worker API as the orchestrator's nodes serve it, and one extension.

- ``POST /v1/worker/jobs:run``: runs a job and answers when it has ended (synchronous), 200
  whenever the job ran, whatever its status. Bearer token; body at most `max_body_bytes`.
- ``POST /v1/worker/jobs/{job_id}:cancel`` (our extension; their nodes have none): stops the
  job for good and answers 202 at once; the run request answers with the cancelled result.
- ``GET /healthz`` (the process serves; ``held`` counts what it holds in memory, structure by
  structure: `domain.held`) and ``GET /readyz`` (it takes jobs: 503 while draining or while
  the not-ready file exists). No token: probes carry none.

Errors are problem documents (`problems.py`): 400 naming the field, 401 for a missing or wrong
token (never 403), 409 for a job_id that belongs to another task, 413 for a body over the
limit, 503 while draining, 500 for anything else.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

import orjson
import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from workflow_engine.config import NodeSettings
from workflow_engine.domain.jobs import WORKER_API_VERSION
from workflow_engine.errors import (
    BodyTooLarge,
    Draining,
    InvalidArgument,
    JobOfAnotherTask,
    Unauthorized,
)
from workflow_engine.worker_node._job_runs import NodeJobs
from workflow_engine.worker_node._problems import problem
from workflow_engine.worker_node._run_request import (
    check_job_id,
    parse_run_request,
    response_body,
)

log = structlog.get_logger(__name__)

RUN_PATH = "/v1/worker/jobs:run"
CANCEL_PATH = "/v1/worker/jobs/{job_id}:cancel"
#: How much of an oversized body is read and dropped so that its client sees the 413.
_DISCARD_BYTES = 64 * 1024 * 1024


def create_app(settings: NodeSettings, jobs: NodeJobs) -> Starlette:
    """The node's ASGI app; `jobs` runs what it accepts."""
    token = settings.token.encode()

    def authorize(request: Request) -> None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
        if not hmac.compare_digest(given.strip().encode(), token):
            raise Unauthorized("wrong bearer token")

    async def read_json(request: Request, *, optional: bool = False) -> Any:
        body = await _read_body(request, settings.max_body_bytes)
        if optional and not body.strip():
            return {}
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidArgument("body", f"not valid JSON ({exc})") from None

    async def run_job(request: Request) -> Response:
        authorize(request)
        run = parse_run_request(await read_json(request))
        job = run.to_job(
            default_timeout=settings.default_timeout_seconds,
            max_timeout=settings.max_timeout_seconds,
        )
        result = await jobs.run(job)
        return JSONResponse(response_body(result, job))

    async def cancel_job(request: Request) -> Response:
        authorize(request)
        job_id = check_job_id(request.path_params["job_id"])
        data = await read_json(request, optional=True)
        if not isinstance(data, dict):
            raise InvalidArgument("body", "must be a JSON object")
        task_id = data.get("task_id")
        if task_id is not None:
            if not isinstance(task_id, str):
                raise InvalidArgument("task_id", "must be a UUID")
            task_id = check_job_id(task_id) if task_id else None
        await jobs.cancel(job_id, task_id)
        body = {"version": WORKER_API_VERSION, "job_id": job_id, "cancel_requested": True}
        return JSONResponse(body, status_code=202)

    async def healthz(request: Request) -> Response:
        held = {h.structure: {"entries": h.entries, "bound": h.bound} for h in jobs.held()}
        return JSONResponse({"status": "ok", "held": held})

    async def readyz(request: Request) -> Response:
        if jobs.draining:
            return problem(503, "the node is draining", instance=request.url.path)
        if _marked_not_ready(settings.not_ready_file):
            detail = "marked not ready (its not-ready file exists)"
            return problem(503, detail, instance=request.url.path)
        return JSONResponse({"status": "ready", "running_jobs": jobs.running})

    return Starlette(
        routes=[
            Route(RUN_PATH, run_job, methods=["POST"]),
            Route(CANCEL_PATH, cancel_job, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
        ],
        exception_handlers={
            InvalidArgument: _invalid,
            Unauthorized: _unauthorized,
            BodyTooLarge: _too_large,
            JobOfAnotherTask: _of_another_task,
            Draining: _draining,
            HTTPException: _http_error,
            ClientDisconnect: _client_gone,
            Exception: _node_error,
        },
    )


def _marked_not_ready(path: str) -> bool:
    # One stat of a local file: cheaper than handing it to a thread.
    return bool(path) and Path(path).exists()


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or `BodyTooLarge` once it is known to exceed `limit`.

    The rest of an oversized body is read and dropped, up to `_DISCARD_BYTES`, before the 413
    goes out: a client that writes its whole request before it reads (as most do) would
    otherwise meet a closed connection instead of the answer. Beyond that, it does.
    """
    declared = request.headers.get("content-length", "")
    too_large = declared.isdigit() and int(declared) > limit
    if too_large and int(declared) > limit + _DISCARD_BYTES:
        raise BodyTooLarge(f"request body of {declared} bytes is over the limit of {limit} bytes")
    size = 0
    chunks: list[bytes] = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit + _DISCARD_BYTES:
            break
        if size > limit:
            too_large = True
            chunks.clear()
        elif not too_large:
            chunks.append(chunk)
    if too_large:
        raise BodyTooLarge(f"request body is over the limit of {limit} bytes")
    return b"".join(chunks)


async def _invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, InvalidArgument)
    log.info("node_request_invalid", path=request.url.path, field=exc.field, problem=exc.problem)
    return problem(400, exc.message, instance=request.url.path, field=exc.field)


async def _unauthorized(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Unauthorized)
    log.warning("node_request_unauthorized", path=request.url.path, why=exc.message)
    headers = {"WWW-Authenticate": 'Bearer realm="workflow-engine worker node"'}
    return problem(401, exc.message, instance=request.url.path, headers=headers)


async def _too_large(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BodyTooLarge)
    log.info("node_request_too_large", path=request.url.path, why=exc.message)
    # What is left of the body is not read: the connection is closed after this answer.
    return problem(413, exc.message, instance=request.url.path, headers={"Connection": "close"})


async def _of_another_task(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, JobOfAnotherTask)
    return problem(409, exc.message, instance=request.url.path, field="job_id")


async def _draining(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Draining)
    return problem(503, exc.message, instance=request.url.path, headers={"Retry-After": "1"})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return problem(exc.status_code, exc.detail, instance=request.url.path, headers=exc.headers)


async def _client_gone(request: Request, exc: Exception) -> Response:
    # Nobody reads this answer; a job it had started runs on (see `NodeJobs.run`).
    log.info("node_client_disconnected", path=request.url.path)
    return problem(400, "the client disconnected before its request was read")


async def _node_error(request: Request, exc: Exception) -> Response:
    log.error("node_error", path=request.url.path, error=repr(exc), exc_info=exc)
    detail = f"node error ({type(exc).__name__}); the node's log has the details"
    return problem(500, detail, instance=request.url.path)
