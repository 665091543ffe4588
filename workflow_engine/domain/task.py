"""The task a workflow drives, and the plan made of it: steps, checks, criteria, budgets.

The steps and their checks are `domain.steps` (named here too, as the task's parts); this
module holds the task around them: its criteria, metadata, budget and limits, and the plan a
planner makes. The API builds a `TaskSpec` from the request with `parse(TaskSpec, data,
"task")`; a planner's `Plan` is checked the same way, whoever made it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from workflow_engine.domain.deadlines import TimeoutAction
from workflow_engine.domain.steps import (
    CHECK_KINDS,
    CHECK_KINDS_NEEDING_EQUALS,
    LOADER_PROBLEM,
    MAX_ARGV,
    MAX_CHECKS,
    MAX_DEPENDS_ON,
    MAX_ENV,
    MAX_LABELS,
    MAX_SECRET_ENV,
    MAX_STEPS,
    MAX_TIMEOUT_SECONDS,
    STEP_ID_PATTERN,
    STEPS,
    Check,
    Step,
    Steps,
    Text,
    approval_timeout_in_range,
    at_most,
    check_argv,
    check_json,
    few_patterns,
    find_nul,
    loader_variables,
    relative_path_problem,
)
from workflow_engine.domain.values import DomainModel, JsonObject, input_rules, invalid

__all__ = [
    "CHECK_KINDS",
    "CHECK_KINDS_NEEDING_EQUALS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_PARALLEL",
    "LOADER_PROBLEM",
    "MAX_ARGV",
    "MAX_ATTEMPTS",
    "MAX_BUDGET_VALUE",
    "MAX_CHECKS",
    "MAX_CRITERIA",
    "MAX_DEPENDS_ON",
    "MAX_ENV",
    "MAX_LABELS",
    "MAX_METADATA_LABELS",
    "MAX_PARALLEL",
    "MAX_PREFERENCES",
    "MAX_PROMPT_CHARS",
    "MAX_SECRET_ENV",
    "MAX_STEPS",
    "MAX_TIMEOUT_SECONDS",
    "STEPS",
    "STEP_ID_PATTERN",
    "AcceptanceCriterion",
    "Budget",
    "Check",
    "Plan",
    "Step",
    "TaskMetadata",
    "TaskSpec",
    "Text",
    "check_argv",
    "check_json",
    "find_nul",
    "loader_variables",
    "relative_path_problem",
]

# Bounds on what one task may ask for, beyond its steps' (`domain.steps`); reported as
# INVALID_ARGUMENT, not as a crash later.
DEFAULT_MAX_ATTEMPTS = 3
MAX_PROMPT_CHARS = 64 * 1024
MAX_CRITERIA = 64  # a task's acceptance criteria (their checks run on the final result)
MAX_PREFERENCES = 32  # preference layers (merged in order)
MAX_METADATA_LABELS = 64  # the free labels of a task's metadata
MAX_ATTEMPTS = 100
DEFAULT_MAX_PARALLEL = 4
MAX_PARALLEL = 64
MAX_BUDGET_VALUE = 10_000_000


class AcceptanceCriterion(DomainModel):
    """What the finished task must satisfy; `check`, when set, is verified by machine."""

    description: Text = ""
    check: Check | None = None


class TaskMetadata(DomainModel):
    user_id: Text = ""
    project_id: Text = ""
    labels: dict[Text, Text] = Field(
        default_factory=dict, json_schema_extra={"maxProperties": MAX_METADATA_LABELS}
    )


class Budget(DomainModel):
    """Per-workflow limits whose end suspends the workflow; 0 means no limit."""

    max_dispatches: int = 0
    max_consecutive_attempts: int = 0
    deadline_seconds: int = 0
    #: Prompt and completion tokens of every model call (the llm planner and verifier).
    max_model_tokens: int = 0

    @field_validator(
        "max_dispatches", "max_consecutive_attempts", "deadline_seconds", "max_model_tokens"
    )
    @classmethod
    def _in_range(cls, value: int) -> int:
        if not 0 <= value <= MAX_BUDGET_VALUE:
            raise invalid("", f"must be between 0 and {MAX_BUDGET_VALUE}")
        return value

    def raised_by(self, other: Budget) -> Budget:
        """This budget with every limit `other` sets (non-zero) replaced by `other`'s."""
        return Budget(
            max_dispatches=other.max_dispatches or self.max_dispatches,
            max_consecutive_attempts=other.max_consecutive_attempts
            or self.max_consecutive_attempts,
            deadline_seconds=other.deadline_seconds or self.deadline_seconds,
            max_model_tokens=other.max_model_tokens or self.max_model_tokens,
        )


class TaskSpec(DomainModel):
    """A task: what to achieve (prompt, criteria), optionally how (steps), and its limits."""

    prompt: Text = ""
    acceptance_criteria: tuple[AcceptanceCriterion, ...] = Field(
        (), json_schema_extra={"maxItems": MAX_CRITERIA}
    )
    steps: Steps = ()
    preferences: tuple[JsonObject, ...] = Field((), json_schema_extra={"maxItems": MAX_PREFERENCES})
    metadata: TaskMetadata = Field(default_factory=TaskMetadata)
    max_attempts_per_step: int = DEFAULT_MAX_ATTEMPTS
    budget: Budget = Field(default_factory=Budget)
    max_parallel_steps: int = DEFAULT_MAX_PARALLEL
    #: Defaults for every step that requires approval and sets none of its own (model-planned
    #: steps the command policy makes wait included): 0 / None, the request never expires
    #: (the action: reject).
    approval_timeout_seconds: int = 0
    on_approval_timeout: TimeoutAction | None = None

    @model_validator(mode="before")
    @classmethod
    def _few_of_each(cls, data: Any, info: ValidationInfo) -> Any:
        """Criteria, preference layers and labels counted as sent (input only: these limits are
        newer than some stored tasks, see `input_rules`), and the criteria's patterns costed
        together, before any of them is validated."""
        if not isinstance(data, Mapping):
            return data
        criteria = data.get("acceptance_criteria")
        if input_rules(info):
            at_most(criteria, MAX_CRITERIA, "acceptance criteria", ".acceptance_criteria")
            layers = data.get("preferences")
            at_most(layers, MAX_PREFERENCES, "preference layers", ".preferences")
            if isinstance(metadata := data.get("metadata"), Mapping):
                labels = metadata.get("labels")
                at_most(labels, MAX_METADATA_LABELS, "labels", ".metadata.labels")
        if isinstance(criteria, list | tuple):
            checks = [c.get("check") for c in criteria if isinstance(c, Mapping)]
            few_patterns(checks, info, ".acceptance_criteria")
        return data

    @field_validator("prompt")
    @classmethod
    def _prompt_fits(cls, prompt: str) -> str:
        if len(prompt) > MAX_PROMPT_CHARS:
            raise invalid("", f"longer than {MAX_PROMPT_CHARS} characters")
        return prompt

    @field_validator("preferences")
    @classmethod
    def _preferences_are_json(cls, layers: tuple[JsonObject, ...]) -> tuple[JsonObject, ...]:
        for i, layer in enumerate(layers):
            check_json(layer, f"[{i}]")
        return layers

    @field_validator("max_attempts_per_step")
    @classmethod
    def _attempts_in_range(cls, value: int) -> int:
        if not 1 <= value <= MAX_ATTEMPTS:
            raise invalid("", f"must be between 1 and {MAX_ATTEMPTS}")
        return value

    @field_validator("approval_timeout_seconds")
    @classmethod
    def _approval_timeout_in_range(cls, value: int) -> int:
        return approval_timeout_in_range(value)

    @field_validator("max_parallel_steps")
    @classmethod
    def _parallel_in_range(cls, value: int) -> int:
        if not 1 <= value <= MAX_PARALLEL:
            raise invalid("", f"must be between 1 and {MAX_PARALLEL}")
        return value


class Plan(DomainModel):
    """Steps a worker can execute, and what the planner assumed to get there."""

    steps: Steps
    assumptions: tuple[Text, ...] = ()
