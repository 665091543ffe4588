"""Fixtures shared by the tests of the local job path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workflow_engine.sandbox import _wrapper as wrapper


@pytest.fixture(params=["jobwrap", "sh"])
def each_wrapper(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test once with each job wrapper: `jobwrap` (built by `make install`), and the
    shell wrapper that an install without a C compiler falls back to."""
    if request.param == "sh":
        if os.geteuid() == 0:
            pytest.skip(
                "as root the shell wrapper is refused (tests/security/test_sandbox_env.py); "
                "it serves engines that are not root"
            )
        monkeypatch.setattr(wrapper, "JOBWRAP", Path("/nonexistent/jobwrap"))
    else:
        assert os.access(wrapper.JOBWRAP, os.X_OK), "jobwrap is not built: run `make install`"
    return str(request.param)
