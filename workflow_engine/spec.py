"""The task a workflow drives: steps, checks, criteria, preferences.

These are plain frozen dataclasses with a JSON form, because the workflow's state (and so its
checkpoint) is JSON. `validate_task` is the one place that decides whether a task can run; it
raises `InvalidArgument` naming the offending field, whichever task source the task came from.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workflow_engine.errors import InvalidArgument

JsonObject = dict[str, Any]

CHECK_KINDS = frozenset(
    {
        "exit_code",
        "stdout_contains",
        "stderr_contains",
        "stdout_matches",
        "file_exists",
        "json_field_equals",
    }
)
#: Kinds whose `equals` must be given: without one there is nothing to compare with. (JSON
#: cannot tell an absent `equals` from a null one, so the request parser enforces this.)
CHECK_KINDS_NEEDING_EQUALS = frozenset({"json_field_equals"})
DEFAULT_MAX_ATTEMPTS = 3

# Bounds on what one task may ask for. They keep a single request from exhausting the engine
# (memory, argv limits of the OS) and are reported as INVALID_ARGUMENT, not as a crash later.
MAX_PROMPT_CHARS = 64 * 1024
MAX_STEPS = 500
MAX_ARGV = 256
MAX_ARG_CHARS = 32 * 1024
MAX_ENV = 256
MAX_CHECKS = 64
MAX_TIMEOUT_SECONDS = 10_800  # the Worker API's node maximum
MAX_ATTEMPTS = 100
DEFAULT_MAX_PARALLEL = 4
MAX_PARALLEL = 64
MAX_BUDGET_VALUE = 10_000_000
MAX_PREFERENCE_DEPTH = 32
_STEP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass(frozen=True, slots=True)
class Check:
    """A machine check on a job result; see the `Check` message in the proto for the kinds."""

    kind: str
    value: str = ""
    field: str = ""
    equals: Any = None

    def to_json(self) -> JsonObject:
        return {"kind": self.kind, "value": self.value, "field": self.field, "equals": self.equals}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Check:
        return cls(
            kind=str(data["kind"]),
            value=str(data.get("value") or ""),
            field=str(data.get("field") or ""),
            equals=data.get("equals"),
        )


@dataclass(frozen=True, slots=True)
class Step:
    """One unit of work: an argv command run by a worker, and the checks its result must pass."""

    id: str
    command: tuple[str, ...]
    description: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: int = 0
    depends_on: tuple[str, ...] = ()
    requires_approval: bool = False
    expect: tuple[Check, ...] = ()
    image: str = ""

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "description": self.description,
            "command": list(self.command),
            "env": dict(self.env),
            "timeout_seconds": self.timeout_seconds,
            "depends_on": list(self.depends_on),
            "requires_approval": self.requires_approval,
            "expect": [check.to_json() for check in self.expect],
            "image": self.image,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Step:
        return cls(
            id=str(data["id"]),
            command=tuple(str(arg) for arg in data["command"]),
            description=str(data.get("description") or ""),
            env={str(k): str(v) for k, v in dict(data.get("env") or {}).items()},
            timeout_seconds=int(data.get("timeout_seconds") or 0),
            depends_on=tuple(str(d) for d in data.get("depends_on") or ()),
            requires_approval=bool(data.get("requires_approval", False)),
            expect=tuple(Check.from_json(c) for c in data.get("expect") or ()),
            image=str(data.get("image") or ""),
        )


@dataclass(frozen=True, slots=True)
class AcceptanceCriterion:
    """What the finished task must satisfy; `check`, when set, is verified by machine."""

    description: str
    check: Check | None = None

    def to_json(self) -> JsonObject:
        return {
            "description": self.description,
            "check": self.check.to_json() if self.check else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AcceptanceCriterion:
        check = data.get("check")
        return cls(
            description=str(data.get("description") or ""),
            check=Check.from_json(check) if check else None,
        )


@dataclass(frozen=True, slots=True)
class TaskMetadata:
    user_id: str = ""
    project_id: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return {"user_id": self.user_id, "project_id": self.project_id, "labels": dict(self.labels)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskMetadata:
        return cls(
            user_id=str(data.get("user_id") or ""),
            project_id=str(data.get("project_id") or ""),
            labels={str(k): str(v) for k, v in dict(data.get("labels") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class Budget:
    """Per-workflow limits whose end suspends the workflow; 0 means no limit."""

    max_dispatches: int = 0
    max_consecutive_attempts: int = 0
    deadline_seconds: int = 0

    def to_json(self) -> JsonObject:
        return {
            "max_dispatches": self.max_dispatches,
            "max_consecutive_attempts": self.max_consecutive_attempts,
            "deadline_seconds": self.deadline_seconds,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Budget:
        return cls(
            max_dispatches=int(data.get("max_dispatches") or 0),
            max_consecutive_attempts=int(data.get("max_consecutive_attempts") or 0),
            deadline_seconds=int(data.get("deadline_seconds") or 0),
        )

    def raised_by(self, other: Budget) -> Budget:
        """This budget with every limit `other` sets (non-zero) replaced by `other`'s."""
        return Budget(
            max_dispatches=other.max_dispatches or self.max_dispatches,
            max_consecutive_attempts=other.max_consecutive_attempts
            or self.max_consecutive_attempts,
            deadline_seconds=other.deadline_seconds or self.deadline_seconds,
        )


def validate_budget(budget: Budget, prefix: str) -> None:
    for name, value in budget.to_json().items():
        if not 0 <= int(value) <= MAX_BUDGET_VALUE:
            raise InvalidArgument(f"{prefix}.{name}", f"must be between 0 and {MAX_BUDGET_VALUE}")


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task as sent inline with StartWorkflow."""

    prompt: str = ""
    acceptance_criteria: tuple[AcceptanceCriterion, ...] = ()
    steps: tuple[Step, ...] = ()
    preferences: tuple[JsonObject, ...] = ()
    metadata: TaskMetadata = field(default_factory=TaskMetadata)
    max_attempts_per_step: int = DEFAULT_MAX_ATTEMPTS
    budget: Budget = field(default_factory=Budget)
    max_parallel_steps: int = DEFAULT_MAX_PARALLEL

    def to_json(self) -> JsonObject:
        return {
            "prompt": self.prompt,
            "acceptance_criteria": [c.to_json() for c in self.acceptance_criteria],
            "steps": [s.to_json() for s in self.steps],
            "preferences": [dict(layer) for layer in self.preferences],
            "metadata": self.metadata.to_json(),
            "max_attempts_per_step": self.max_attempts_per_step,
            "budget": self.budget.to_json(),
            "max_parallel_steps": self.max_parallel_steps,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskSpec:
        return cls(
            prompt=str(data.get("prompt") or ""),
            acceptance_criteria=tuple(
                AcceptanceCriterion.from_json(c) for c in data.get("acceptance_criteria") or ()
            ),
            steps=tuple(Step.from_json(s) for s in data.get("steps") or ()),
            preferences=tuple(dict(layer) for layer in data.get("preferences") or ()),
            metadata=TaskMetadata.from_json(data.get("metadata") or {}),
            max_attempts_per_step=int(data.get("max_attempts_per_step") or DEFAULT_MAX_ATTEMPTS),
            budget=Budget.from_json(data.get("budget") or {}),
            max_parallel_steps=int(data.get("max_parallel_steps") or DEFAULT_MAX_PARALLEL),
        )


def validate_task(task: TaskSpec, *, prefix: str = "task") -> None:
    """Raise `InvalidArgument` naming the first field of `task` that cannot run."""
    nul = find_nul(task.to_json(), prefix)
    if nul:
        raise InvalidArgument(nul, "contains a NUL character, which cannot be stored")
    if len(task.prompt) > MAX_PROMPT_CHARS:
        raise InvalidArgument(f"{prefix}.prompt", f"longer than {MAX_PROMPT_CHARS} characters")
    if not 1 <= task.max_attempts_per_step <= MAX_ATTEMPTS:
        raise InvalidArgument(
            f"{prefix}.max_attempts_per_step", f"must be between 1 and {MAX_ATTEMPTS}"
        )
    if not 1 <= task.max_parallel_steps <= MAX_PARALLEL:
        raise InvalidArgument(
            f"{prefix}.max_parallel_steps", f"must be between 1 and {MAX_PARALLEL}"
        )
    validate_budget(task.budget, f"{prefix}.budget")
    for i, criterion in enumerate(task.acceptance_criteria):
        if criterion.check is not None:
            validate_check(criterion.check, f"{prefix}.acceptance_criteria[{i}].check")
    for i, layer in enumerate(task.preferences):
        _check_json(layer, f"{prefix}.preferences[{i}]", MAX_PREFERENCE_DEPTH)
    validate_steps(task.steps, prefix=f"{prefix}.steps")


def validate_steps(steps: Sequence[Step], *, prefix: str) -> None:
    """Check each step, and that `depends_on` names known steps and forms no cycle."""
    if len(steps) > MAX_STEPS:
        raise InvalidArgument(prefix, f"more than {MAX_STEPS} steps")
    seen: dict[str, int] = {}
    for i, step in enumerate(steps):
        where = f"{prefix}[{i}]"
        if not _STEP_ID.match(step.id):
            raise InvalidArgument(
                f"{where}.id", "must be 1-64 letters, digits, '.', '_' or '-', starting alnum"
            )
        if step.id in seen:
            raise InvalidArgument(f"{where}.id", f"duplicate step id {step.id!r}")
        seen[step.id] = i
        _validate_command(step.command, f"{where}.command")
        if len(step.env) > MAX_ENV:
            raise InvalidArgument(f"{where}.env", f"more than {MAX_ENV} variables")
        for name, value in step.env.items():
            if not _ENV_NAME.match(name):
                raise InvalidArgument(f"{where}.env", f"invalid variable name {name[:64]!r}")
            if "\x00" in value or len(value) > MAX_ARG_CHARS:
                raise InvalidArgument(f"{where}.env[{name}]", "contains NUL or is too long")
        if not 0 <= step.timeout_seconds <= MAX_TIMEOUT_SECONDS:
            raise InvalidArgument(
                f"{where}.timeout_seconds", f"must be at most {MAX_TIMEOUT_SECONDS}"
            )
        if len(step.expect) > MAX_CHECKS:
            raise InvalidArgument(f"{where}.expect", f"more than {MAX_CHECKS} checks")
        for j, check in enumerate(step.expect):
            validate_check(check, f"{where}.expect[{j}]")
    for i, step in enumerate(steps):
        for j, dep in enumerate(step.depends_on):
            if dep not in seen:
                raise InvalidArgument(
                    f"{prefix}[{i}].depends_on[{j}]", f"unknown step id {dep[:64]!r}"
                )
            if dep == step.id:
                raise InvalidArgument(f"{prefix}[{i}].depends_on[{j}]", "a step cannot need itself")
    cycle = _find_cycle(steps)
    if cycle:
        raise InvalidArgument(f"{prefix}.depends_on", "cycle: " + " -> ".join(cycle))


def validate_check(check: Check, where: str) -> None:
    if check.kind not in CHECK_KINDS:
        raise InvalidArgument(
            f"{where}.kind",
            f"unknown check kind {check.kind[:64]!r}; expected one of {sorted(CHECK_KINDS)}",
        )
    if check.kind == "exit_code":
        if check.equals is not None and not _is_exit_code(check.equals):
            raise InvalidArgument(f"{where}.equals", "exit_code needs an integer from -255 to 255")
    elif check.kind == "json_field_equals":
        if not check.field:
            raise InvalidArgument(f"{where}.field", "json_field_equals needs a field path")
        _check_json(check.equals, f"{where}.equals", MAX_PREFERENCE_DEPTH)
    elif not check.value:
        raise InvalidArgument(f"{where}.value", f"{check.kind} needs a value")
    if check.kind == "stdout_matches":
        try:
            re.compile(check.value)
        except re.error as exc:
            raise InvalidArgument(f"{where}.value", f"invalid regular expression: {exc}") from None


def find_nul(value: Any, path: str) -> str | None:
    """The path of the first string (or key) holding NUL; PostgreSQL text and jsonb refuse it."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = (path if "\x00" in str(key) else None) or find_nul(item, f"{path}.{key}")
            if found:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = find_nul(item, f"{path}[{i}]")
            if found:
                return found
    return None


def _is_exit_code(value: Any) -> bool:
    # JSON numbers arrive as floats (and may be inf or nan): accept whole numbers only.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and value == int(value) and -255 <= value <= 255


def _validate_command(command: Sequence[str], where: str) -> None:
    if not command:
        raise InvalidArgument(where, "argv must not be empty")
    if not command[0]:
        raise InvalidArgument(f"{where}[0]", "program must not be empty")
    if len(command) > MAX_ARGV:
        raise InvalidArgument(where, f"more than {MAX_ARGV} arguments")
    for k, arg in enumerate(command):
        if "\x00" in arg:
            raise InvalidArgument(f"{where}[{k}]", "contains a NUL byte")
        if len(arg) > MAX_ARG_CHARS:
            raise InvalidArgument(f"{where}[{k}]", f"longer than {MAX_ARG_CHARS} characters")


def _check_json(value: Any, where: str, budget: int) -> None:
    """Bounded nesting, and only finite numbers: PostgreSQL's JSON has no Infinity or NaN."""
    if budget < 0:
        raise InvalidArgument(where, f"nested deeper than {MAX_PREFERENCE_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(where, "numbers must be finite (no Infinity or NaN)")
    if isinstance(value, Mapping):
        for item in value.values():
            _check_json(item, where, budget - 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_json(item, where, budget - 1)


def _find_cycle(steps: Sequence[Step]) -> list[str]:
    """Return one dependency cycle as a list of step ids (first id repeated last), or []."""
    needs = {step.id: step.depends_on for step in steps}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for dep in needs.get(node, ()):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return []

    for step in steps:
        if step.id not in state and (found := visit(step.id)):
            return found
    return []
