"""The workflow's state: what every node reads and writes, and what the checkpoint stores.

The state is the `state` column of `workflow_checkpoints`, a JSON object: the first eight keys
are the orchestrator's state model, the rest the engine's own. Its shape is written down here
as typed records (`TypedDict`s), which pydantic validates: once where a checkpoint is read
(`read_state`, called by the run), and where a change from outside brings values in
(`parse_state`). In between, the nodes keep it as the JSON it is: a checkpoint is written after
every node, and a state of plain JSON values is written as it stands, with no conversion of the
keys the node did not change (LangGraph's channels are the same keys).

Every record keeps keys it does not name (`extra="allow"`), so a row written by another version
of the engine reads and writes back unchanged; and every key may be missing (``total=False``), as
in the rows older versions wrote. Values that are a domain model's JSON (a job request, a
plan's steps, a task's criteria and metadata) stay JSON objects here: the nodes read them with
that model (`JobRequest.from_json`, `Step.from_json`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar, cast

from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from workflow_engine._masking import state_secrets
from workflow_engine.domain.deadlines import ExpiryCause, TimeoutAction
from workflow_engine.domain.jobs import JobStatus, VerificationStatus
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.domain.values import DomainModel, JsonObject, parse

#: Where one step is. ``pending``: not dispatched, or to be tried again; ``dispatched``: its job
#: is recorded and may be running; ``collected``: its result awaits verification; ``passed`` and
#: ``failed`` are final.
StepStatus = Literal["pending", "dispatched", "collected", "passed", "failed"]
#: An operator's forced branch.
Branch = Literal["finalize_summary", "mark_failed"]
Verdict = Literal["approve", "reject", "edit"]

R = TypeVar("R")

#: Every record keeps the keys it does not name (another version's), and checks those it does.
_RECORD = ConfigDict(extra="allow")


@with_config(_RECORD)
class JobRecord(TypedDict, total=False):
    """The attempt in flight: the node it runs on, and its `JobRequest` as JSON."""

    target: str
    request: JsonObject


@with_config(_RECORD)
class Truncated(TypedDict, total=False):
    stdout: bool
    stderr: bool


@with_config(_RECORD)
class JobResultRecord(TypedDict, total=False):
    """A `JobResult` as JSON (the Worker API's result)."""

    version: int
    task_id: str
    job_id: str
    status: JobStatus
    exit_code: int | None
    stdout: str
    stderr: str
    started_at: str
    ended_at: str
    truncated: Truncated
    work_dir: str | None
    target: str
    artifacts: list[JsonObject]


@with_config(_RECORD)
class FindingRecord(TypedDict, total=False):
    check: str
    passed: bool
    detail: str


@with_config(_RECORD)
class VerificationRecord(TypedDict, total=False):
    """A `Verification` as JSON: the state model's ``verification``."""

    status: VerificationStatus
    findings: list[FindingRecord]
    recommended_actions: list[str]


@with_config(_RECORD)
class StepState(TypedDict, total=False):
    """One step's progress."""

    status: StepStatus
    attempts: int
    job: JobRecord | None  # the attempt in flight
    result: JobResultRecord | None  # its job result, once collected
    verification: VerificationRecord | None  # the last verification of this step
    error: str  # why it failed, when it did without a verification (e.g. rejected)
    #: Why the command policy makes this model-planned step wait for approval (its rule).
    approval_policy: str


@with_config(_RECORD)
class PlanRecord(TypedDict, total=False):
    """A `Plan` as JSON: its steps (each a `Step`'s JSON) and the planner's assumptions."""

    steps: list[JsonObject]
    assumptions: list[str]


@with_config(_RECORD)
class BudgetRecord(TypedDict, total=False):
    """A `Budget` as JSON; 0 is no limit."""

    max_dispatches: int
    max_consecutive_attempts: int
    deadline_seconds: int
    max_model_tokens: int


@with_config(_RECORD)
class PendingApproval(TypedDict, total=False):
    """The request a WAITING_FOR_APPROVAL workflow waits on."""

    step_id: str
    description: str
    command: list[str]
    env: dict[str, str]
    reason: str
    requested_at: float
    #: When it expires (epoch seconds; absent: never) and what happens then, as stored when
    #: it was made; `domain.deadlines.expiry_of` reads it again with the budget as it is now.
    expires_at: float
    on_timeout: TimeoutAction
    #: The step's (else the task's) approval timeout (0: none) and its action.
    timeout_seconds: int
    timeout_action: TimeoutAction


@with_config(_RECORD)
class WaitExpired(TypedDict, total=False):
    """Why a wait for approval ended the workflow SUSPENDED (its approval request expired, or
    the deadline passed while it waited); cleared when it is resumed."""

    step_id: str
    cause: ExpiryCause
    reason: str


@with_config(_RECORD)
class ApprovalRecord(TypedDict, total=False):
    """The decision that answered a step's approval request (an edit adds what it ran)."""

    verdict: Verdict
    reason: str
    decided_by: str
    decided_at: float
    command: list[str]
    env: dict[str, str]


@with_config(_RECORD)
class ResultRecord(TypedDict, total=False):
    """A passed step's entry in `results`, for clients (no `work_dir`)."""

    step_id: str
    attempt: int
    job_id: str
    status: JobStatus
    exit_code: int | None
    stdout: str
    ended_at: str


@with_config(_RECORD)
class ContextEntry(TypedDict, total=False):
    """A passed step's output, handed to the steps after it."""

    step_id: str
    exit_code: int | None
    output: str


@with_config(_RECORD)
class ModelCallRecord(TypedDict, total=False):
    """One model call of the llm planner or verifier, and the node that made it."""

    node: str
    purpose: str
    model: str
    latency_ms: int
    prompt_tokens: int
    completion_tokens: int


@with_config(_RECORD)
class RevisionRecord(TypedDict, total=False):
    """A step the planner revised after a failed verification (or failed to: `error`)."""

    step_id: str
    after_attempt: int
    reason: str
    command_before: list[str]
    command_after: list[str]
    policy: str  # the command policy's note on the revised command
    error: str


@with_config(_RECORD)
class WorkflowState(TypedDict, total=False):
    # The orchestrator's state model.
    task_id: str
    acceptance_criteria: list[JsonObject]  # each an `AcceptanceCriterion`'s JSON
    preferences_effective: JsonObject
    plan: PlanRecord
    current_step_index: int  # the first step (in plan order) that has not passed
    attempts_by_step: dict[str, int]
    last_result: JobResultRecord | None
    verification: VerificationRecord | None
    # The engine's additions.
    # The run the workflow is (the row's run_id at its start): its job ids and its jobs' user
    # and /tmp are the run's, never another run's of the same task id (see `job_id_for`).
    # Missing in a workflow started before state format 4: its job ids are the task's then.
    run_id: str
    status: str  # a `WorkflowStatus`, `in_state` spelling: running, waiting_for_approval...
    prompt: str
    metadata: JsonObject  # a `TaskMetadata`'s JSON
    max_attempts_per_step: int
    max_parallel_steps: int
    budget: BudgetRecord
    started_at: float  # epoch seconds of the first start, for the deadline
    dispatches: int  # jobs dispatched so far, all steps and attempts
    steps: dict[str, StepState]
    current_job: JobRecord | None  # the job dispatched last
    last_step_id: str  # the step whose result is `last_result`
    approvals: dict[str, ApprovalRecord]  # step id -> the decision that answered its request
    pending_approval: PendingApproval | None
    context: dict[str, ContextEntry]  # step id -> its output, for the steps after it
    forced_next: Branch | None
    results: list[ResultRecord]  # one record per step that passed, in the order they passed
    summary: str
    error: str
    # Every secret value the workflow's plans have had, sorted; it only grows, so what a step
    # printed stays masked after its plan changed (see `workflow_engine._masking`). Not shown.
    secrets: list[str]
    # Model calls (the llm planner and verifier), their tokens in all, and the steps the
    # planner revised after a failed verification.
    model_calls: list[ModelCallRecord]
    model_tokens: int
    revisions: list[RevisionRecord]
    # The task's approval timeout defaults, for every step that waits (model-planned ones
    # included), and why the last wait ended SUSPENDED (see `graph.changes.expire`).
    approval_timeout_seconds: int
    on_approval_timeout: TimeoutAction | None
    wait_expired: WaitExpired | None


STATE_KEYS: frozenset[str] = frozenset(WorkflowState.__annotations__)

#: The state's form, for pydantic.
STATE: TypeAdapter[WorkflowState] = TypeAdapter(WorkflowState)


def read_state(data: object) -> WorkflowState:
    """A stored state (a checkpoint's), checked against its form; `ValidationError` when it
    does not have it. Keys of no known form are kept as they are."""
    return STATE.validate_python(data)


def parse_state(data: Mapping[str, Any], where: str) -> WorkflowState:
    """State keys from outside (an operator's `set_state`), checked against their form;
    `InvalidArgument` at `where` naming the first field that does not have it."""
    state: WorkflowState = parse(STATE, dict(data), where)
    return state


def as_record(kind: type[R], value: DomainModel) -> R:
    """A domain value (a `JobResult`, a `Verification`, a `Plan`, a `Budget`) as the state's
    record of it, `kind`: its JSON, which has that record's form (`test_stored_states` checks
    each pair). Nothing is checked again: the value was when it was built, and the nodes put
    some in the state at every node (checking a result's JSON again costs twice its dump:
    5.8 against 2.8 us).
    """
    return cast(R, value.to_json())


def state_or_empty(data: object) -> WorkflowState:
    """`data` as a state, or an empty one when it is not (a row edited by hand: the run that
    reads it refuses it as its checkpoint)."""
    try:
        return read_state(data)
    except ValidationError:
        return {}


#: What an accepted outside state keeps (see `accepted_state`): the orchestrator's own record of
#: the last result and its verification. Everything else is re-read (task) or re-planned.
ACCEPTED_KEYS = ("last_result", "verification")


def accepted_state(task_id: str, run_id: str, outside: Mapping[str, Any]) -> WorkflowState:
    """The state a blocked workflow starts again from when an operator accepts what another
    writer wrote into it: a fresh start (the task is read again and re-planned) that keeps their
    last result and verification, when they are JSON objects of their form, and every secret it
    has had. `run_id` is the new run's: nothing the run before the block started is its."""
    state = initial_state(task_id, run_id)
    for key in ACCEPTED_KEYS:
        value = outside.get(key)
        if isinstance(value, dict):
            try:
                state.update(read_state({key: value}))
            except ValidationError:
                continue  # not a result (a verification): re-planning makes its own
    if secrets := state_secrets(outside):
        state["secrets"] = sorted(secrets)
    return state


def initial_state(task_id: str, run_id: str) -> WorkflowState:
    """The state run `run_id` of a workflow starts from, before `load_task_context` fills it
    in."""
    return {
        "task_id": task_id,
        "run_id": run_id,
        "status": WorkflowStatus.RUNNING.in_state,
        "acceptance_criteria": [],
        "preferences_effective": {},
        "plan": {"steps": [], "assumptions": []},
        "current_step_index": 0,
        "attempts_by_step": {},
        "last_result": None,
        "verification": None,
        "current_job": None,
        "steps": {},
        "dispatches": 0,
        "approvals": {},
        "pending_approval": None,
        "context": {},
        "results": [],
        "summary": "",
        "error": "",
    }
