"""A worker node that answers as the orchestrator's does (`worker_node/cmd/worker-api`).

A real HTTP server (Starlette, served by uvicorn on a free port in a thread with its own event
loop), so the engine's ``nodes`` worker talks to it over real sockets. What it copies from
their implementation (see the reference's "Their Worker API as implemented"):

- ``POST /v1/worker/jobs:run``, bearer token, synchronous; the result with ``exit_code``
  *omitted* when 0 (their Go encoder's ``omitempty``), -1 on timeout, and their extra fields
  (``step_executor_result``, ``artifacts``, ``run_diagnostics``; ``sba_result`` is left out as
  their encoder leaves out a nil one);
- problem documents (``application/problem+json``, type/title/status/detail) for 400, 401
  (never 403), 413 (bodies over ``max_body_bytes``, theirs 10 MiB) and 500;
- ``GET /healthz`` (``ok``) and ``GET /readyz`` (``ready``, or 503 with the reason);
- no cancel endpoint: 404 (Go's ServeMux text), as a node without our extension answers.

What the tests need besides: it deduplicates by ``job_id`` (a repeated id waits for, or
returns, the first run), counts requests and runs per job id, can be told to answer 500 for the
next N requests, to be not ready, or to know only some images (anything else is their 400),
and records each request body, each answer's body, and requests whose client went away.
Commands run as real processes (argv, no shell), in a temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

PROBLEM = "application/problem+json"
THEIR_MAX_BODY = 10 * 1024 * 1024


@dataclass
class TheirWorkerNode:
    """One node's behaviour and what it saw; `serve` puts it on a port."""

    name: str
    token: str
    max_body_bytes: int = THEIR_MAX_BODY
    #: Answer 500 to this many of the next job requests (before running anything).
    fail_next: int = 0
    #: None: ready; otherwise `/readyz` answers 503 with this reason.
    not_ready: str | None = None
    #: None: any image; otherwise an image outside these is their 400.
    images: set[str] | None = None
    requests: Counter[str] = field(default_factory=Counter)
    runs: Counter[str] = field(default_factory=Counter)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    disconnected: set[str] = field(default_factory=set)
    #: Requests to paths it does not serve (a cancel extension it lacks), as "METHOD /path".
    unknown: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    #: The most jobs it ran at once.
    peak: int = 0
    url: str = ""
    _jobs: dict[str, asyncio.Task[dict[str, Any]]] = field(default_factory=dict)
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/worker/jobs:run", self._run, methods=["POST"]),
                Route("/healthz", self._healthz, methods=["GET"]),
                Route("/readyz", self._readyz, methods=["GET"]),
                Route("/{path:path}", self._unknown, methods=["GET", "POST", "PUT", "DELETE"]),
            ]
        )

    def serve(self) -> TheirWorkerNode:
        """Start serving on a free port of 127.0.0.1 (`url`)."""
        config = uvicorn.Config(
            self.app(),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=0,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, f"node {self.name} did not start"
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        """Stop at once: open connections are dropped, as when the node dies."""
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        if self._thread is not None:
            self._thread.join(10)

    async def _unknown(self, request: Request) -> Response:
        self.unknown.append(f"{request.method} {request.url.path}")
        return PlainTextResponse("404 page not found", status_code=404)  # Go's ServeMux

    async def _healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    async def _readyz(self, request: Request) -> Response:
        if self.not_ready is None:
            return PlainTextResponse("ready")
        return PlainTextResponse(self.not_ready, status_code=503)

    async def _run(self, request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return _problem(
                401, "authentication", "Unauthorized", "Invalid or missing bearer token"
            )
        raw = await request.body()
        if len(raw) > self.max_body_bytes:
            return _problem(
                413, "validation", "Request Entity Too Large", "Request body exceeds maximum size"
            )
        try:
            body = json.loads(raw)
            sandbox = body["sandbox"]
            command = [str(arg) for arg in sandbox["command"]]
        except (ValueError, KeyError, TypeError):
            return _problem(400, "validation", "Bad Request", "Invalid request body")
        if body.get("version") != 1:
            return _problem(400, "validation", "Bad Request", "unsupported version")
        if not body.get("task_id") or not body.get("job_id"):
            return _problem(400, "validation", "Bad Request", "task_id and job_id are required")
        if not command:
            return _problem(400, "validation", "Bad Request", "sandbox.command is required")
        image = str(sandbox.get("image") or "")
        if self.images is not None and image not in self.images:
            return _problem(400, "validation", "Bad Request", f"image not found: {image}")
        job_id = str(body["job_id"])
        self.requests[job_id] += 1
        self.bodies.append(body)
        if self.fail_next > 0:
            self.fail_next -= 1
            return _problem(500, "internal", "Internal Server Error", "Job execution failed")
        job = self._jobs.get(job_id)
        if job is None:  # the first request for this id runs it; later ones wait for it
            job = asyncio.ensure_future(self._execute(body, command))
            self._jobs[job_id] = job
        while not job.done():
            await asyncio.wait({job}, timeout=0.05)
            if not job.done() and await request.is_disconnected():
                self.disconnected.add(job_id)
                return Response(status_code=499)  # nobody reads it
        answer = job.result()
        self.answers[job_id] = answer
        return JSONResponse(answer)

    async def _execute(self, body: dict[str, Any], command: list[str]) -> dict[str, Any]:
        job_id = str(body["job_id"])
        self.runs[job_id] += 1
        self.running.add(job_id)
        self.peak = max(self.peak, len(self.running))
        sandbox = body["sandbox"]
        timeout = int(sandbox.get("timeout_seconds") or 300)  # their default
        started = _now()
        try:
            with tempfile.TemporaryDirectory(prefix=f"{self.name}-") as work:
                status, exit_code, out, err = await _run_command(
                    command, dict(sandbox.get("env") or {}), work, timeout
                )
        finally:
            self.running.discard(job_id)
        answer: dict[str, Any] = {
            "version": 1,
            "task_id": body["task_id"],
            "job_id": job_id,
            "status": status,
            "stdout": out,
            "stderr": err,
            "started_at": started,
            "ended_at": _now(),
            "truncated": {"stdout": False, "stderr": False},
            "step_executor_result": {"protocol_version": "1", "job_id": job_id, "steps": []},
            "artifacts": [
                {
                    "name": "out.txt",
                    "content_type": "text/plain",
                    "size_bytes": len(out),
                    "content_base64": "aGVsbG8=",
                    "ref": f"{self.url}/artifacts/{job_id}/out.txt",
                }
            ],
            "run_diagnostics": {
                "runtime": "direct",
                "runtime_argv": command,
                "container_started": True,
            },
        }
        if exit_code != 0:  # Go's omitempty: an exit code of 0 is not in the answer
            answer["exit_code"] = exit_code
        return answer


async def _run_command(
    command: list[str], env: dict[str, str], work: str, timeout: int
) -> tuple[str, int, str, str]:
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            cwd=work,
            env={"PATH": "/usr/bin:/bin", **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        return "failed", -1, "", f"runtime exit -1: {exc}"
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return "timeout", -1, "", "timed out"
    except asyncio.CancelledError:  # the server is stopping: the node dies with its jobs
        proc.kill()
        raise
    code = proc.returncode or 0
    return ("completed" if code == 0 else "failed"), code, out.decode(), err.decode()


def _problem(status: int, kind: str, title: str, detail: str) -> Response:
    document = {
        "type": f"urn:cynodeai:error:{kind}",
        "title": title,
        "status": status,
        "detail": detail,
    }
    return Response(json.dumps(document), status_code=status, media_type=PROBLEM)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def nodes_file_entry(node: TheirWorkerNode, token_file: str, **extra: Any) -> dict[str, Any]:
    """The node as an entry of the engine's nodes file (its token in `token_file`)."""
    return {"name": node.name, "url": node.url, "token_file": token_file, **extra}
