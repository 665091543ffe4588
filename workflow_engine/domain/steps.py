"""A step and its checks: what a task or a plan is made of, and the bounds on them.

Each value checks its own invariants when it is built (see `domain.values`): a step's id and
argv, a check's kind and operands, the steps' ids, dependencies and cycles as a whole
(`Steps`), the limits below. `domain.task` builds the task and the plan from these.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)

from workflow_engine.domain.deadlines import MAX_APPROVAL_TIMEOUT_SECONDS, TimeoutAction
from workflow_engine.domain.jobs import Limits
from workflow_engine.domain.patterns import check_together, compile_pattern
from workflow_engine.domain.values import DomainModel, input_rules, invalid
from workflow_engine.errors import PatternError

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

# Bounds on what one task may ask for. They keep a single request from exhausting the engine
# (memory, argv limits of the OS) and are reported as INVALID_ARGUMENT, not as a crash later.
# A list is counted before any of its elements is validated (`at_most`), here and, for a
# request, on the message before it is converted (`api._limits`).
MAX_STEPS = 500
MAX_ARGV = 256
MAX_ARG_CHARS = 32 * 1024
MAX_ENV = 256
#: `secret_env` names `env` variables, so it needs no more names than `env` has variables.
MAX_SECRET_ENV = MAX_ENV
#: Distinct secret values in a task's (or a plan's) steps together, and their characters in
#: all: every answer masks each of them, in several forms, in every string it shows.
MAX_SECRETS = 256
MAX_SECRET_CHARS = 64 * 1024
#: A step may wait for every other step.
MAX_DEPENDS_ON = MAX_STEPS
MAX_CHECKS = 64
MAX_CHECK_TEXT_CHARS = 32 * 1024  # a check's value or field: as long as one argument may be
MAX_LABELS = 64
MAX_LABEL_CHARS = 256
MAX_TIMEOUT_SECONDS = 10_800  # the Worker API's node maximum
MAX_PREFERENCE_DEPTH = 32
_STEP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: A step id: 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit.
STEP_ID_PATTERN = _STEP_ID.pattern
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

#: Variables with which the dynamic loader or the C library load code or read files the
#: environment names: glibc's list of those it drops for setuid programs (`unsecvars.h`) and
#: GLIBC_TUNABLES. Whatever runs before a job drops to its user (as root) would obey them, so
#: no step, EDIT decision or worker-node request may set one (`loader_variables`). TMPDIR, in
#: glibc's list too, is the job's own: the sandbox sets it to the work directory, a step may
#: point it elsewhere.
LOADER_PREFIX = "LD_"
LOADER_VARIABLES = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TZDIR",
    }
)
LOADER_PROBLEM = (
    "is a variable of the dynamic loader or the C library (LD_*, GCONV_PATH, GLIBC_TUNABLES, "
    "LOCPATH, ...), which no job may be given"
)


def loader_variables(env: Mapping[str, str]) -> list[str]:
    """The names in `env` that the loader or the C library obey (`LOADER_VARIABLES`), sorted."""
    return sorted(n for n in env if n.startswith(LOADER_PREFIX) or n in LOADER_VARIABLES)


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise invalid("", "contains a NUL character, which cannot be stored")
    return text


#: Free text that is stored: PostgreSQL's text and jsonb refuse NUL.
Text = Annotated[str, AfterValidator(_no_nul)]


def approval_timeout_in_range(value: int) -> int:
    """An approval timeout (a step's or a task's default): 0 (none) to a leap year."""
    if not 0 <= value <= MAX_APPROVAL_TIMEOUT_SECONDS:
        raise invalid("", f"must be between 0 and {MAX_APPROVAL_TIMEOUT_SECONDS} (366 days)")
    return value


def at_most(value: Any, limit: int, noun: str, at: str = "") -> None:
    """Refuse a list (or object) as sent when it holds more than `limit`: before any of its
    elements is validated, so that refusing it costs nothing per element."""
    if isinstance(value, list | tuple | dict) and len(value) > limit:
        raise invalid(at, f"more than {limit} {noun}")


def check_argv(command: tuple[str, ...]) -> tuple[str, ...]:
    """`command` if it is an argv a worker can execute (a step's, or a Worker API request's)."""
    if not command:
        raise invalid("", "argv must not be empty")
    if not command[0]:
        raise invalid("[0]", "program must not be empty")
    if len(command) > MAX_ARGV:
        raise invalid("", f"more than {MAX_ARGV} arguments")
    for k, arg in enumerate(command):
        if "\x00" in arg:
            raise invalid(f"[{k}]", "contains a NUL byte")
        if len(arg) > MAX_ARG_CHARS:
            raise invalid(f"[{k}]", f"longer than {MAX_ARG_CHARS} characters")
    return command


def relative_path_problem(path: str) -> str | None:
    """Why `path` cannot name a file in a job's work directory (a `file_exists` value), or None.

    The engine, often root, answers the check: a path that could leave the work directory
    would tell a tenant whether any file of the host exists.
    """
    if path.startswith("/"):
        return "must be a path relative to the job's work directory, not an absolute one"
    if ".." in path.split("/"):
        return "may not leave the job's work directory ('..')"
    return None


class Check(DomainModel):
    """A machine check on a job result; see the `Check` message in the proto for the kinds."""

    kind: str = Field(json_schema_extra={"enum": list(sorted(CHECK_KINDS))})
    value: Text = Field(default="", json_schema_extra={"maxLength": MAX_CHECK_TEXT_CHARS})
    field: Text = Field(default="", json_schema_extra={"maxLength": MAX_CHECK_TEXT_CHARS})
    equals: Any = None

    @model_validator(mode="after")
    def _operands_fit_the_kind(self, info: ValidationInfo) -> Self:
        if self.kind not in CHECK_KINDS:
            raise invalid(
                ".kind",
                f"unknown check kind {self.kind[:64]!r}; expected one of {sorted(CHECK_KINDS)}",
            )
        if self.kind == "exit_code":
            if self.equals is not None and not _is_exit_code(self.equals):
                raise invalid(".equals", "exit_code needs an integer from -255 to 255")
        elif self.kind == "json_field_equals":
            if not self.field:
                raise invalid(".field", "json_field_equals needs a field path")
            check_json(self.equals, ".equals")
        elif not self.value:
            raise invalid(".value", f"{self.kind} needs a value")
        if input_rules(info):
            self._operands_are_safe()
        return self

    def _operands_are_safe(self) -> None:
        """Bounded text, a pattern RE2 runs, a path that stays in the work directory."""
        for name in ("value", "field"):
            if len(getattr(self, name)) > MAX_CHECK_TEXT_CHARS:
                raise invalid(f".{name}", f"longer than {MAX_CHECK_TEXT_CHARS} characters")
        if self.kind == "stdout_matches":
            try:
                compile_pattern(self.value)
            except PatternError as exc:
                raise invalid(".value", f"invalid pattern: {exc}") from None
        elif self.kind == "file_exists" and (problem := relative_path_problem(self.value)):
            raise invalid(".value", problem)


class Step(DomainModel):
    """One unit of work: an argv command run by a worker, and the checks its result must pass."""

    id: str = Field(json_schema_extra={"pattern": _STEP_ID.pattern})
    description: Text = ""
    command: tuple[str, ...] = Field(json_schema_extra={"minItems": 1, "maxItems": MAX_ARGV})
    env: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: int = Field(
        0, json_schema_extra={"minimum": 0, "maximum": MAX_TIMEOUT_SECONDS}
    )
    depends_on: tuple[str, ...] = Field((), json_schema_extra={"maxItems": MAX_DEPENDS_ON})
    requires_approval: bool = False
    expect: tuple[Check, ...] = Field((), json_schema_extra={"maxItems": MAX_CHECKS})
    image: Text = ""
    #: Labels a worker node must have to run this step (capabilities, locality, models, as the
    #: node registry spells them); the local sandbox has none, and refuses a step that asks.
    required_labels: tuple[str, ...] = Field((), json_schema_extra={"maxItems": MAX_LABELS})
    #: Names of `env` entries whose values are secret: shown nowhere (see `secrets`).
    secret_env: tuple[str, ...] = Field((), json_schema_extra={"maxItems": MAX_SECRET_ENV})
    #: What its job may use (CPU time, memory, open files, processes, output); 0: the worker's.
    limits: Limits = Field(default_factory=Limits)
    #: With `requires_approval`: seconds its approval request waits for a decision, then
    #: `on_approval_timeout` applies (None: the task's, else reject); 0: the task's default.
    approval_timeout_seconds: int = Field(
        0, json_schema_extra={"minimum": 0, "maximum": MAX_APPROVAL_TIMEOUT_SECONDS}
    )
    on_approval_timeout: TimeoutAction | None = None

    @field_validator("id")
    @classmethod
    def _id_is_a_name(cls, value: str) -> str:
        if not _STEP_ID.match(value):
            raise invalid("", "must be 1-64 letters, digits, '.', '_' or '-', starting alnum")
        return value

    @field_validator("command")
    @classmethod
    def _command_is_argv(cls, command: tuple[str, ...]) -> tuple[str, ...]:
        return check_argv(command)

    @field_validator("env")
    @classmethod
    def _env_is_variables(cls, env: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if len(env) > MAX_ENV:
            raise invalid("", f"more than {MAX_ENV} variables")
        for name, value in env.items():
            if not _ENV_NAME.match(name):
                raise invalid("", f"invalid variable name {name[:64]!r}")
            if "\x00" in value or len(value) > MAX_ARG_CHARS:
                raise invalid(f"[{name}]", "contains NUL or is too long")
        # An earlier version stored such steps: they are read, and refused at dispatch.
        if (refused := loader_variables(env)) and input_rules(info):
            raise invalid(f"[{refused[0]}]", LOADER_PROBLEM)
        return env

    @field_validator("timeout_seconds")
    @classmethod
    def _timeout_in_range(cls, value: int) -> int:
        if not 0 <= value <= MAX_TIMEOUT_SECONDS:
            raise invalid("", f"must be at most {MAX_TIMEOUT_SECONDS}")
        return value

    @field_validator("approval_timeout_seconds")
    @classmethod
    def _approval_timeout_in_range(cls, value: int) -> int:
        return approval_timeout_in_range(value)

    @model_validator(mode="after")
    def _approval_timeout_needs_approval(self, info: ValidationInfo) -> Self:
        """A timeout on a step that never waits would never apply: refused as input, so the
        sender learns it (the task's default is the way to time out model-planned steps)."""
        if self.requires_approval or not input_rules(info):
            return self
        for name in ("approval_timeout_seconds", "on_approval_timeout"):
            if getattr(self, name):
                raise invalid(f".{name}", "applies only to a step with requires_approval")
        return self

    @field_validator("required_labels")
    @classmethod
    def _labels_are_names(cls, labels: tuple[str, ...]) -> tuple[str, ...]:
        if len(labels) > MAX_LABELS:
            raise invalid("", f"more than {MAX_LABELS} labels")
        for k, label in enumerate(labels):
            if not label.strip() or "\x00" in label or len(label) > MAX_LABEL_CHARS:
                raise invalid(f"[{k}]", f"must be 1-{MAX_LABEL_CHARS} characters, not blank")
        return labels

    @model_validator(mode="after")
    def _secrets_name_variables(self) -> Self:
        for k, name in enumerate(self.secret_env):
            if name not in self.env:
                raise invalid(f".secret_env[{k}]", f"names no env variable ({name[:64]!r})")
        return self

    @field_validator("expect", mode="before")
    @classmethod
    def _few_checks(cls, checks: Any, info: ValidationInfo) -> Any:
        """Counted before each check is validated (and its pattern compiled)."""
        at_most(checks, MAX_CHECKS, "checks")
        if isinstance(checks, list | tuple):
            few_patterns(checks, info)
        return checks


def _steps_form_a_plan(steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """Unique ids, `depends_on` naming known other steps, and no cycle."""
    seen: set[str] = set()
    for i, step in enumerate(steps):
        if step.id in seen:
            raise invalid(f"[{i}].id", f"duplicate step id {step.id!r}")
        seen.add(step.id)
    for i, step in enumerate(steps):
        for j, dep in enumerate(step.depends_on):
            if dep not in seen:
                raise invalid(f"[{i}].depends_on[{j}]", f"unknown step id {dep[:64]!r}")
            if dep == step.id:
                raise invalid(f"[{i}].depends_on[{j}]", "a step cannot need itself")
    cycle = _find_cycle(steps)
    if cycle:
        raise invalid(".depends_on", "cycle: " + " -> ".join(cycle))
    return steps


def few_patterns(checks: Any, info: ValidationInfo, at: str = "") -> None:
    """Refuse input whose patterns cost too much to compile together, before any is compiled.

    `checks` are checks as sent (JSON objects); anything else is left to the model to refuse.
    """
    if not input_rules(info):
        return
    patterns = {
        check["value"]
        for check in checks
        if isinstance(check, Mapping)
        and check.get("kind") == "stdout_matches"
        and isinstance(check.get("value"), str)
    }
    try:
        check_together(patterns)
    except PatternError as exc:
        raise invalid(at, str(exc)) from None


def _few_steps(steps: Any, info: ValidationInfo) -> Any:
    """Counted, each step's `depends_on` and `secret_env` too, and their patterns costed
    together, before any step is validated. (Here rather than in `Step`: one validator call
    for all the steps; the two counts are newer than some stored steps, so input only.)"""
    at_most(steps, MAX_STEPS, "steps")
    if not isinstance(steps, list | tuple):
        return steps
    if input_rules(info):
        for i, step in enumerate(steps):
            if isinstance(step, Mapping) and (step.get("depends_on") or step.get("secret_env")):
                at_most(step.get("depends_on"), MAX_DEPENDS_ON, "dependencies", f"[{i}].depends_on")
                at_most(
                    step.get("secret_env"), MAX_SECRET_ENV, "secret variables", f"[{i}].secret_env"
                )
        secrets = _secret_values(steps)
        if len(secrets) > MAX_SECRETS:
            raise invalid("", f"more than {MAX_SECRETS} secret values in all ({len(secrets)})")
        if (chars := sum(map(len, secrets))) > MAX_SECRET_CHARS:
            raise invalid(
                "", f"secret values of more than {MAX_SECRET_CHARS} characters in all ({chars})"
            )
    expects = [step.get("expect") for step in steps if isinstance(step, Mapping)]
    few_patterns([c for e in expects if isinstance(e, list | tuple) for c in e], info)
    return steps


def _secret_values(steps: list[Any] | tuple[Any, ...]) -> set[str]:
    """The distinct values the steps' `secret_env` names, as sent (before validation)."""
    values: set[str] = set()
    for step in steps:
        env = step.get("env") if isinstance(step, Mapping) else None
        names = step.get("secret_env") if isinstance(step, Mapping) else None
        if isinstance(env, Mapping) and isinstance(names, list | tuple):
            found = (env.get(name) for name in names if isinstance(name, str))
            values.update(value for value in found if isinstance(value, str))
    return values


#: The steps of a task or a plan, checked as a whole.
Steps = Annotated[
    tuple[Step, ...],
    Field(json_schema_extra={"maxItems": MAX_STEPS}),
    BeforeValidator(_few_steps),
    AfterValidator(_steps_form_a_plan),
]
STEPS: TypeAdapter[tuple[Step, ...]] = TypeAdapter(Steps)


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


def check_json(value: Any, at: str) -> None:
    """Storable JSON: no NUL, bounded nesting, finite numbers (PostgreSQL has no NaN in JSON)."""
    nul = find_nul(value, at)
    if nul is not None:
        raise invalid(nul, "contains a NUL character, which cannot be stored")
    _check_json(value, at, MAX_PREFERENCE_DEPTH)


def _check_json(value: Any, at: str, budget: int) -> None:
    if budget < 0:
        raise invalid(at, f"nested deeper than {MAX_PREFERENCE_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        raise invalid(at, "numbers must be finite (no Infinity or NaN)")
    if isinstance(value, Mapping):
        for item in value.values():
            _check_json(item, at, budget - 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_json(item, at, budget - 1)


def _is_exit_code(value: Any) -> bool:
    # JSON numbers arrive as floats (and may be inf or nan): accept whole numbers only.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and value == int(value) and -255 <= value <= 255


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
