"""The Worker API's run request as the node checks it, and its answer, from the domain's jobs.

`RunRequest` is `POST /v1/worker/jobs:run`'s body: the Worker API's fields, each checked so
that a 400 names the field (``sandbox.command``), and unknown fields ignored, as their node
does. It becomes the domain's `JobRequest`, which the local sandbox runs; the engine's own
extras of `JobRequest` (`attempt`, `step_id`, `remediation`, `context`, `run_id`) are accepted
too, so our engine can hand them on to the job's environment (and key its workspace by run).

`response_body` is the answer: the domain's `JobResult` in the Worker API's shape. Unlike their
node, ours always sends `exit_code`: the exit status when the command exited (0 included), null
when it did not (a timeout, a cancel, a lost job). A client that reads an absent `exit_code` as
0, as theirs must, reads ours the same way.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, Strict, ValidationError

from workflow_engine.domain.jobs import WORKER_API_VERSION, JobRequest, JobResult, Limits, Sandbox
from workflow_engine.domain.task import LOADER_PROBLEM, Text, check_argv, loader_variables
from workflow_engine.domain.values import DomainModel, JsonObject, as_invalid_argument, invalid
from workflow_engine.errors import InvalidArgument

NETWORK_POLICIES = ("restricted", "none")
#: What the node's answer leaves out of a `JobResult`: where the job ran on this machine is no
#: client's business, and which node answered is the client's to record.
_LOCAL_FIELDS = frozenset({"work_dir", "target"})


def _version(value: Any) -> Any:
    if type(value) is not int or value != WORKER_API_VERSION:
        raise invalid("", f"must be {WORKER_API_VERSION}, the Worker API version this node speaks")
    return value


def _uuid(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise invalid("", "must be a UUID") from None


def _env(env: dict[str, str]) -> dict[str, str]:
    # What execve can carry: a name without '=' or NUL, a value without NUL.
    for name, value in env.items():
        if not name or "=" in name or "\x00" in name:
            raise invalid("", f"invalid variable name {name[:64]!r}")
        if "\x00" in value:
            raise invalid(f"[{name}]", "contains a NUL byte")
    if refused := loader_variables(env):
        raise invalid(f"[{refused[0]}]", LOADER_PROBLEM)
    return env


def _network_policy(value: str) -> str:
    # An empty string is a client's zero value (Go's, without omitempty): the default.
    value = value or "restricted"
    if value not in NETWORK_POLICIES:
        raise invalid("", f"must be one of {', '.join(NETWORK_POLICIES)}, got {value[:64]!r}")
    return value


def _optional_uuid(value: str) -> str:
    return _uuid(value) if value else value


Uuid = Annotated[str, AfterValidator(_uuid)]


class RunSandbox(DomainModel):
    """The request's `sandbox`: what to run, and within which limits."""

    image: Text = ""
    command: Annotated[tuple[str, ...], AfterValidator(check_argv)]
    env: Annotated[dict[str, str], AfterValidator(_env)] = Field(default_factory=dict)
    #: 0 or absent: the node's default; above the node's maximum: capped to it.
    timeout_seconds: Annotated[int, Strict(), Field(ge=0)] = 0
    network_policy: Annotated[str, AfterValidator(_network_policy)] = "restricted"
    #: Our engine's extra: what the job may use, within the node's own limits (0: the node's).
    limits: Limits = Field(default_factory=Limits)


class RunRequest(DomainModel):
    """A checked `POST /v1/worker/jobs:run` body."""

    version: Annotated[Literal[1], BeforeValidator(_version)]
    task_id: Uuid
    job_id: Uuid
    sandbox: RunSandbox
    # The engine's extras: handed to the job's environment by the local sandbox.
    attempt: Annotated[int, Strict(), Field(ge=1)] = 1
    step_id: Text = ""
    remediation: tuple[Text, ...] = ()
    context: tuple[JsonObject, ...] = ()
    #: The workflow run the job is of: with it, the task's jobs of that run share a user and a
    #: /tmp that no earlier run of the same task id had.
    run_id: Annotated[str, AfterValidator(_optional_uuid)] = ""

    def to_job(self, *, default_timeout: int, max_timeout: int) -> JobRequest:
        """The job to run: this request with its timeout made explicit and capped."""
        timeout = min(self.sandbox.timeout_seconds or default_timeout, max_timeout)
        sandbox = Sandbox(
            image=self.sandbox.image,
            command=self.sandbox.command,
            env=self.sandbox.env,
            timeout_seconds=timeout,
            network_policy=self.sandbox.network_policy,
            limits=self.sandbox.limits,
        )
        return JobRequest(
            task_id=self.task_id,
            job_id=self.job_id,
            sandbox=sandbox,
            attempt=self.attempt,
            step_id=self.step_id,
            remediation=self.remediation,
            context=self.context,
            run_id=self.run_id,
        )


def parse_run_request(data: Any) -> RunRequest:
    """`data` (the decoded body) as a `RunRequest`, or `InvalidArgument` naming the field."""
    if not isinstance(data, dict):
        raise InvalidArgument("body", "must be a JSON object")
    try:
        return RunRequest.model_validate(data)
    except ValidationError as exc:
        error = as_invalid_argument(exc, "")
        raise InvalidArgument(error.field.lstrip("."), error.problem) from None


def check_job_id(value: str) -> str:
    """A job id from a path, as the canonical UUID, or `InvalidArgument`."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidArgument("job_id", "must be a UUID") from None


def response_body(result: JobResult, request: JobRequest) -> JsonObject:
    """The Worker API's answer for `request`: its ids, and the result's fields."""
    body = result.to_json()
    for name in _LOCAL_FIELDS:
        body.pop(name, None)
    if not body.get("artifacts"):
        body.pop("artifacts", None)  # optional in the contract; this node makes none
    body["task_id"] = request.task_id
    body["job_id"] = request.job_id
    return body
