"""The engine's one error hierarchy: run-control signals cannot be swallowed by a
capability's `except Exception`; every error class lives in `errors`, every configuration
error is a `ConfigError`; the status table gives each mapped class its code."""

from __future__ import annotations

import ast
from pathlib import Path

import grpc
import pytest

import workflow_engine
from workflow_engine import errors
from workflow_engine._faults import FaultPlan
from workflow_engine._logs import configure_logging
from workflow_engine._masking import Secrets
from workflow_engine.api._status_codes import status_for
from workflow_engine.config import settings_from_env
from workflow_engine.errors import LeaseLost, RunControl, RunStopped


@pytest.mark.parametrize("signal", [LeaseLost("t", "holder", 3), RunStopped("t", "cancelled")])
def test_a_broad_except_in_a_capability_lets_run_control_through(signal: RunControl) -> None:
    def careless_capability() -> str:
        try:
            raise signal
        except Exception:
            return "recorded as the task's failure"

    with pytest.raises(RunControl) as caught:
        careless_capability()
    assert caught.value is signal and signal.message


CONFIG_ERRORS = [
    errors.CapabilityConfigError,
    errors.UnknownCapability,
    errors.NodesFileError,
    errors.NodesTableMissing,
    errors.AuthConfigError,
]


@pytest.mark.parametrize("kind", CONFIG_ERRORS)
def test_every_configuration_error_is_a_config_error_of_the_engine(kind: type[Exception]) -> None:
    assert issubclass(kind, errors.ConfigError)
    assert issubclass(kind, errors.WorkflowEngineError)
    assert issubclass(kind, ValueError)  # as before: who catches ValueError still does


@pytest.mark.parametrize(
    "environ",
    [
        {"WORKFLOW_ENGINE_PROCESSES": "0"},
        {"WORKFLOW_ENGINE_LEASE_TTL_SECONDS": "soon"},
        {"WORKFLOW_ENGINE_JOB_RETENTION_SECONDS": "-1"},
    ],
)
def test_a_bad_setting_is_a_config_error(environ: dict[str, str]) -> None:
    with pytest.raises(errors.ConfigError, match=r"^WORKFLOW_ENGINE_"):
        settings_from_env(environ)


def test_a_bad_fault_plan_and_a_bad_log_level_are_config_errors() -> None:
    with pytest.raises(errors.ConfigError, match="WORKFLOW_ENGINE_FAULTS"):
        FaultPlan.parse("explode:before:plan_steps")
    with pytest.raises(errors.ConfigError, match="unknown log level"):
        configure_logging("chatty")


def test_every_error_class_of_the_package_lives_in_errors() -> None:
    """Private control-flow exceptions (`_Retry`...) may stay where they are used; the fault
    suite's `InjectedDatabaseError` must be a psycopg error, so it stays with the faults; the
    storage's `Refused` rolls a transaction back inside the storage package (its two modules
    that claim a lease) and never leaves it."""
    package = Path(workflow_engine.__file__).parent
    elsewhere = []
    for module in package.rglob("*.py"):
        if module.name == "errors.py" or module.name.endswith("_pb2.py"):
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
            if any(base.endswith(("Error", "Exception")) or base in KNOWN for base in bases):
                elsewhere.append(f"{module.relative_to(package)}: {node.name}")
    assert sorted(elsewhere) == [
        "_faults.py: InjectedDatabaseError",
        "storage/_row_writes.py: Refused",
    ]


#: Every class in errors.py, so that a class deriving from one of them is found too.
KNOWN = {name for name, value in vars(errors).items() if isinstance(value, type)}


#: One instance of each class the status table maps, and the code a client gets for it.
MAPPED: list[tuple[BaseException, grpc.StatusCode]] = [
    (errors.InvalidArgument("task.steps", "empty"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.WorkflowNotFound("t"), grpc.StatusCode.NOT_FOUND),
    (errors.OutOfScope("not yours"), grpc.StatusCode.PERMISSION_DENIED),
    (errors.TaskNotFound("t", "tasks"), grpc.StatusCode.NOT_FOUND),
    (errors.TaskNotStartable("t", "closed"), grpc.StatusCode.FAILED_PRECONDITION),
    (errors.TaskSourceUnavailable("t", "mcp", "down"), grpc.StatusCode.UNAVAILABLE),
    (errors.WorkflowExists("t", "RUNNING"), grpc.StatusCode.ALREADY_EXISTS),
    (errors.LeaseHeld("t", "other", None), grpc.StatusCode.FAILED_PRECONDITION),
    (errors.LeaseLost("t", "holder", 2), grpc.StatusCode.ABORTED),
    (errors.InvalidState("not paused"), grpc.StatusCode.FAILED_PRECONDITION),
    (errors.ShuttingDown("draining"), grpc.StatusCode.UNAVAILABLE),
    (errors.ResourceExhausted("WORKFLOW_ENGINE_X", "too many"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.CheckpointCorrupt("unreadable"), grpc.StatusCode.DATA_LOSS),
]


@pytest.mark.parametrize(("error", "code"), MAPPED, ids=lambda v: type(v).__name__)
def test_each_mapped_error_gets_its_status_code_and_message(
    error: BaseException, code: grpc.StatusCode
) -> None:
    assert status_for(error, Secrets()) == (code, getattr(error, "message", ""))


def test_a_configuration_error_reaching_a_call_is_internal_and_not_quoted() -> None:
    code, message = status_for(errors.NodesFileError("WORKFLOW_ENGINE_NODES_FILE: bad"), Secrets())
    assert (code, message) == (grpc.StatusCode.INTERNAL, "internal error")
