"""Builders for the worker node's tests: Worker API request bodies and ids."""

from __future__ import annotations

import uuid
from typing import Any


def new_id() -> str:
    return str(uuid.uuid4())


def run_body(*command: str, task_id: str = "", job_id: str = "", **sandbox: Any) -> dict[str, Any]:
    """A `POST /v1/worker/jobs:run` body, as the orchestrator's dispatcher sends one."""
    return {
        "version": 1,
        "task_id": task_id or new_id(),
        "job_id": job_id or new_id(),
        "sandbox": {"image": "", "command": list(command), "network_policy": "none", **sandbox},
    }
