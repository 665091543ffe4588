"""The Worker API on the wire: the request a node gets, and its answers read as the engine's.

Pure functions, no I/O, so the mapping is tested on its own (the ``nodes`` worker sends and
receives). What their worker node actually does, beyond the contract (see the reference's
"Their Worker API as implemented"), decides the reading:

- ``exit_code`` is serialised "omit when empty": an absent exit code is 0 for a job that
  ``completed`` or ``failed``; a ``timeout`` (their -1) has none, as the local sandbox's.
- Extra fields (``sba_result``, ``step_executor_result``, ``run_diagnostics``) are ignored;
  ``artifacts`` are kept as links (their descriptors without inline content).
- Errors are problem documents (``application/problem+json``: ``title``, ``detail``); 401 is
  their only auth answer, 413 a body over their 10 MiB.
"""

from __future__ import annotations

import json
from typing import Any, get_args
from urllib.parse import quote

from workflow_engine.domain.jobs import (
    WORKER_API_VERSION,
    JobRequest,
    JobResult,
    JobStatus,
    TruncatedStreams,
)
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import UnreadableAnswer

RUN_PATH = "/v1/worker/jobs:run"
READY_PATH = "/readyz"
#: Our own node's cancel extension; a node without it answers 404, which is tolerated.
CANCEL_PATH = "/v1/worker/jobs/{job_id}:cancel"
MAX_ARTIFACTS = 100
#: Keys of an artifact descriptor that carry its content rather than point at it.
_INLINE_CONTENT = frozenset({"content", "content_base64", "data", "body"})
_STATUSES: frozenset[str] = frozenset(get_args(JobStatus))
_MAX_MESSAGE = 300


def cancel_path(job_id: str) -> str:
    return CANCEL_PATH.format(job_id=quote(job_id, safe=""))


def request_body(job: JobRequest, timeout_seconds: int) -> JsonObject:
    """The ``POST /v1/worker/jobs:run`` body for `job`, with the timeout the engine waits for.

    The job gets the engine's variables in its environment, as the local sandbox gives them
    (``WORKFLOW_ENGINE_TASK_ID``, ``_JOB_ID``, ``_ATTEMPT``, ``_REMEDIATION``, ``_CONTEXT``);
    the step's own env cannot override them. ``attempt``, ``step_id``, ``remediation``,
    ``context`` and ``run_id`` also go at the top level, for a node of ours; their node ignores
    unknown fields.
    """
    env = {
        **job.sandbox.env,
        "WORKFLOW_ENGINE_TASK_ID": job.task_id,
        "WORKFLOW_ENGINE_JOB_ID": job.job_id,
        "WORKFLOW_ENGINE_ATTEMPT": str(job.attempt),
        "WORKFLOW_ENGINE_REMEDIATION": json.dumps(list(job.remediation)),
        "WORKFLOW_ENGINE_CONTEXT": json.dumps(list(job.context)),
    }
    return {
        "version": WORKER_API_VERSION,
        "task_id": job.task_id,
        "job_id": job.job_id,
        "sandbox": {
            "image": job.sandbox.image,
            "command": list(job.sandbox.command),
            "env": env,
            "timeout_seconds": timeout_seconds,
            "network_policy": job.sandbox.network_policy,
            # Ours honours them (within its own settings); the orchestrator's ignores them.
            "limits": job.sandbox.limits.to_json(),
        },
        "attempt": job.attempt,
        "step_id": job.step_id,
        "remediation": list(job.remediation),
        "context": list(job.context),
        # A node of ours keys what the task's jobs share (user, /tmp) by task and run.
        **({"run_id": job.run_id} if job.run_id else {}),
    }


def read_result(job: JobRequest, target: str, data: Any) -> JobResult:
    """A 200 answer's body as the job's result; `UnreadableAnswer` names what does not fit."""
    if not isinstance(data, dict):
        raise UnreadableAnswer("the body is not a JSON object")
    status = data.get("status")
    if status not in _STATUSES:
        raise UnreadableAnswer(f"status: expected completed, failed or timeout, got {status!r}")
    answered_for = data.get("job_id", job.job_id)
    if answered_for != job.job_id:
        raise UnreadableAnswer(f"job_id: answered for job {answered_for!r}")
    exit_code = data.get("exit_code", 0)  # omitted when 0 by their encoder
    if isinstance(exit_code, bool) or not isinstance(exit_code, int):
        raise UnreadableAnswer(f"exit_code: expected a whole number, got {exit_code!r}")
    truncated = data.get("truncated") or {}
    if not isinstance(truncated, dict):
        raise UnreadableAnswer("truncated: expected an object")
    return JobResult(
        task_id=job.task_id,
        job_id=job.job_id,
        status=status,
        exit_code=exit_code if status in ("completed", "failed") else None,
        stdout=_text(data, "stdout"),
        stderr=_text(data, "stderr"),
        started_at=_text(data, "started_at"),
        ended_at=_text(data, "ended_at"),
        truncated=TruncatedStreams(
            stdout=truncated.get("stdout") is True, stderr=truncated.get("stderr") is True
        ),
        work_dir=None,  # on the node: checks that read files cannot see it
        target=target,
        artifacts=_artifact_links(data.get("artifacts")),
    )


def problem_message(status_code: int, reason: str, body: bytes) -> str:
    """An error answer in a line: ``HTTP 401 Unauthorized: Invalid or missing bearer token``.

    From a problem document's ``title`` and ``detail`` when there is one, else the start of the
    body as text.
    """
    head = f"HTTP {status_code} {reason}".rstrip()
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if isinstance(document, dict) and ("title" in document or "detail" in document):
        title = str(document.get("title") or "")
        detail = str(document.get("detail") or "")
        words = ": ".join(w for w in (title if title != reason else "", detail) if w)
    else:
        words = " ".join(body.decode("utf-8", errors="replace").split())
    return _clip(f"{head}: {words}" if words else head)


def _text(data: JsonObject, key: str) -> str:
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UnreadableAnswer(f"{key}: expected a string")
    return value.replace("\x00", "")  # PostgreSQL's jsonb refuses NUL


def _artifact_links(value: Any) -> tuple[JsonObject, ...]:
    if not isinstance(value, list):
        return ()
    links: list[JsonObject] = []
    for item in value[:MAX_ARTIFACTS]:
        if isinstance(item, dict):
            links.append({k: v for k, v in item.items() if k not in _INLINE_CONTENT})
        elif isinstance(item, str):
            links.append({"ref": item})
    return tuple(links)


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."
