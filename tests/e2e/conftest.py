"""Fixtures for tests that drive `workflow-engine serve` processes (`tests.support`)."""

from tests.support.engine_process import processes_fixture  # noqa: F401 (`processes`)
from tests.support.model_server import model_fixture  # noqa: F401 (`model`)
