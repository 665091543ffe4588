"""`workflow_engine`'s public face: what `__all__` names exists, and every error is in it."""

from __future__ import annotations

import inspect
import subprocess
import sys

import workflow_engine
from workflow_engine import errors


def test_everything_public_is_importable() -> None:
    for name in workflow_engine.__all__:
        assert getattr(workflow_engine, name) is not None, name


#: The errors a program that embeds the engine catches: what `Engine.start`, `run`, a
#: `WorkflowHandle` and opening the engine raise. The rest (the worker node's HTTP errors, the
#: gRPC callers', the model's, the configuration's kinds) are importable from
#: `workflow_engine.errors`, where every error lives.
IN_PROCESS_ERRORS = {
    "ConfigError",
    "InvalidArgument",
    "InvalidState",
    "LeaseHeld",
    "ResourceExhausted",
    "ShuttingDown",
    "TaskNotFound",
    "TaskNotStartable",
    "TaskSourceUnavailable",
    "WorkflowEngineError",
    "WorkflowExists",
    "WorkflowNotFound",
}


def test_the_face_offers_the_errors_an_in_process_user_catches() -> None:
    offered = {
        name
        for name in workflow_engine.__all__
        if inspect.isclass(value := getattr(workflow_engine, name))
        and issubclass(value, BaseException)
    }
    assert offered == IN_PROCESS_ERRORS
    for name in offered:
        assert getattr(workflow_engine, name) is getattr(errors, name)
    # Every other error is a `WorkflowEngineError`, so catching that one catches it too.
    for name, value in vars(errors).items():
        if inspect.isclass(value) and issubclass(value, Exception) and name not in offered:
            assert issubclass(value, errors.WorkflowEngineError), name


def test_the_face_is_small() -> None:
    """About what psycopg_pool or Temporal's client offer: adding a name is a decision."""
    assert len(workflow_engine.__all__) <= 25, workflow_engine.__all__


def test_importing_the_package_leaves_the_engine_unimported() -> None:
    """The client commands and the worker node import the package; the engine stays out."""
    probe = (
        "import sys, workflow_engine; "
        "assert 'workflow_engine.engine' not in sys.modules; "
        "from workflow_engine import Engine, Settings; "
        "assert Engine.__module__ == 'workflow_engine.engine'"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
