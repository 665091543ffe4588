"""Run-control signals cannot be swallowed by a capability's `except Exception`."""

from __future__ import annotations

import pytest

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
