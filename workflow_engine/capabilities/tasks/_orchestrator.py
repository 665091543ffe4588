"""The orchestrator's task, as the engine's `TaskSpec`: one mapping for every task source.

A source hands over what the orchestrator has for a task (a row of its ``tasks`` table, or what
its MCP task tool answers: the same names), and this decides whether it may be started and what
the workflow runs:

- ``prompt`` is the prompt (the static planner takes its ``$ command`` lines as steps);
- ``acceptance_criteria`` (JSON): a list of strings (descriptions), or of objects as the
  engine's `AcceptanceCriterion` (``description``, ``check``), or null;
- ``created_by`` and ``project_id`` become the metadata's ``user_id`` and ``project_id``;
  the string values of ``metadata`` (a JSON object) become labels, and ``summary`` (their
  task's name) the label ``name``. Nothing else is taken from ``metadata``: it has no contract,
  so a ``steps`` or ``budget`` key there is not read as the engine's;
- effective preferences, when the source has them, are the task's one preference layer.

Not startable (`TaskNotStartable`): ``deleted_at`` set, ``closed`` true, or a ``status`` that
says the task is over (`CLOSED_STATUSES`; ``failed`` is not one: a failed task may be tried
again), and a task the engine cannot read (named by field).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workflow_engine.domain.task import TaskSpec
from workflow_engine.domain.values import JsonObject, parse
from workflow_engine.errors import InvalidArgument, TaskNotStartable

#: Their task statuses that say the task is over (their `models.go`: completed, canceled,
#: superseded; the other spellings for other orchestrators).
CLOSED_STATUSES = frozenset({"completed", "canceled", "cancelled", "superseded", "closed"})
#: The label that carries their `summary` (the task's name).
NAME_LABEL = "name"


def task_from_orchestrator(
    task_id: str,
    row: Mapping[str, Any],
    *,
    source: str,
    preferences: JsonObject | None = None,
) -> TaskSpec:
    """The task `row` describes, or `TaskNotStartable` saying why it may not be started."""
    user_id, project_id = row.get("created_by") or "", row.get("project_id") or ""
    # Whose it is goes with a refusal: a caller scoped to others learns nothing from one.
    owner = {"user_id": str(user_id), "project_id": str(project_id)}
    refusal = _why_not_startable(row)
    if refusal:
        raise TaskNotStartable(task_id, refusal, **owner)
    data = {
        "prompt": row.get("prompt") or "",
        "acceptance_criteria": _criteria(row.get("acceptance_criteria")),
        "preferences": [preferences] if preferences else [],
        "metadata": {
            "user_id": user_id,
            "project_id": project_id,
            "labels": _labels(row.get("metadata"), row.get("summary")),
        },
    }
    try:
        task: TaskSpec = parse(TaskSpec, data, "task")
    except InvalidArgument as exc:
        raise TaskNotStartable(task_id, f"as read from {source}, {exc.message}", **owner) from None
    return task


def _why_not_startable(row: Mapping[str, Any]) -> str:
    if row.get("deleted_at") is not None:
        return f"it was deleted (deleted_at {row['deleted_at']})"
    if row.get("closed") is True:
        return "it is closed"
    status = row.get("status")
    if isinstance(status, str) and status.strip().lower() in CLOSED_STATUSES:
        return f"its status is {status[:64]!r}"
    return ""


def _criteria(value: Any) -> Any:
    """Strings become descriptions; anything else is left for the model to accept or name."""
    if value is None:
        return []
    if isinstance(value, list):
        return [{"description": item} if isinstance(item, str) else item for item in value]
    return value


def _labels(metadata: Any, summary: Any) -> dict[str, str]:
    labels = (
        {key: value for key, value in metadata.items() if isinstance(value, str)}
        if isinstance(metadata, Mapping)
        else {}
    )
    if isinstance(summary, str) and summary:
        labels[NAME_LABEL] = summary
    return labels
