"""A served engine as an attacker meets it: a real gRPC server on a free port, running as this
test's user (root in CI), with a tokens file of scoped callers.

`callers` are named by role and tenant: ``orchestrator`` (everything, every tenant),
``a-orchestrator`` / ``b-orchestrator`` (start and run workflows of project-a / project-b only),
``a-operator`` / ``b-operator`` (decide, override, cancel within their project), ``a-reader``
(read within project-a). `as_caller` gives a call's metadata for one of them; a call without it
is unauthenticated.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.helpers import write_secret
from tests.support.model_server import API_KEY, MODEL, ModelServer, model_fixture  # noqa: F401
from tests.support.node_process import client, node, nodes  # noqa: F401 (fixtures)
from workflow_engine.config import LlmSettings, Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

CALLERS: dict[str, dict[str, object]] = {
    "orchestrator": {"role": "orchestrator"},
    "a-orchestrator": {"role": "orchestrator", "projects": ["project-a"]},
    "b-orchestrator": {"role": "orchestrator", "projects": ["project-b"]},
    "a-operator": {"role": "operator", "projects": ["project-a"]},
    "b-operator": {"role": "operator", "projects": ["project-b"]},
    "a-reader": {"role": "reader", "projects": ["project-a"]},
    # Scoped to a user, not to projects: it may name any project its tasks are of.
    "u-orchestrator": {"role": "orchestrator", "users": ["someone-u"]},
}


def as_caller(name: str) -> list[tuple[str, str]]:
    """The metadata that authenticates `name` (one of `CALLERS`)."""
    assert name in CALLERS, name
    return [("authorization", f"Bearer token-of-{name}-0123456789abcdef")]


def tokens_file(path: Path) -> Path:
    """Write the tokens file of `CALLERS` at `path` (readable by its owner only)."""
    callers = [
        {"identity": name, "token": as_caller(name)[0][1].removeprefix("Bearer "), **fields}
        for name, fields in CALLERS.items()
    ]
    path.write_text(json.dumps({"callers": callers}))
    path.chmod(0o600)
    return path


def tenant_task(project: str, *steps: pb.Step, user: str = "someone") -> pb.TaskSpec:
    """A task of `project` (and `user`) made of `steps`."""
    spec = pb.TaskSpec(steps=list(steps))
    spec.metadata.project_id, spec.metadata.user_id = project, user
    return spec


@pytest.fixture
def secured(settings: Settings, tmp_path: Path) -> Settings:
    """The test's settings with the tokens file of `CALLERS`."""
    return replace(settings, tokens_file=str(tokens_file(tmp_path / "tokens.json")))


@pytest.fixture
async def served(secured: Settings) -> AsyncIterator[RunningEngine]:
    """An engine serving gRPC with the tokens file of `CALLERS`."""
    running = await start_engine(secured)
    try:
        yield running
    finally:
        await stop_engine(running)


async def start_planned(
    settings: Settings,
    model: ModelServer,
    tmp_path: Path,
    policy: dict[str, object],
    **llm_settings: Any,
) -> RunningEngine:
    """An engine whose planner is the scripted `model`, its steps judged by machine checks,
    under the command `policy`; `llm_settings` as given (no retries by default)."""
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(policy))
    key = write_secret(tmp_path / "api-key", API_KEY)
    llm = LlmSettings(
        base_url=model.base_url,
        model=MODEL,
        api_key_file=str(key),
        **{"retries": 0, **llm_settings},
    )
    return await start_engine(
        replace(
            settings,
            planner="llm",
            verifier="checks",
            llm=llm,
            command_policy_file=str(policy_file),
        )
    )
