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


def test_every_engine_error_is_exported() -> None:
    engine_errors = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.WorkflowEngineError)
    }
    assert engine_errors <= set(workflow_engine.__all__), engine_errors - set(
        workflow_engine.__all__
    )


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
