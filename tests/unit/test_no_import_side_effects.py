"""Importing the engine changes nothing process-wide: JSON adapters are set per connection,
and no hook, handler or metric is registered by an import."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import psycopg
from psycopg.types import json
def state():
    return (json._JsonDumper._dumps, json._JsonLoader._loads,
            psycopg.adapters.get_dumper(json.Jsonb, json.PyFormat.BINARY))
before = state()
import workflow_engine.engine, workflow_engine.cli  # noqa: F401
assert state() == before, (before, state())
print("unchanged")
"""


def test_importing_the_engine_leaves_psycopgs_global_adapters_alone() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=False, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "unchanged", out.stderr[-2000:]


REGISTRATIONS = """
import atexit, os, pkgutil, signal, sys
import prometheus_client, structlog
calls = []
def recorder(name, real=None):
    def record(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.split(".")[0] == "workflow_engine":  # a library's own are its business
            calls.append((name, caller))
        return real(*args, **kwargs) if real else None
    return record
os.register_at_fork = recorder("os.register_at_fork")
atexit.register = recorder("atexit.register")
signal.signal = recorder("signal.signal", signal.signal)
structlog.configure = recorder("structlog.configure")
collectors = set(prometheus_client.REGISTRY._collector_to_names)
import workflow_engine
for module in pkgutil.walk_packages(workflow_engine.__path__, "workflow_engine."):
    if module.name != "workflow_engine.__main__":
        __import__(module.name)
assert calls == [], calls
assert set(prometheus_client.REGISTRY._collector_to_names) == collectors, "a metric at import"
print("nothing registered")
"""


def test_importing_every_module_registers_no_hook_handler_or_metric() -> None:
    """No fork hook, exit hook, signal handler, logging set-up or default-registry metric is
    registered by importing any module of the package: the engine instance does it when it
    needs it (see `sandbox._at_fork`)."""
    out = subprocess.run(
        [sys.executable, "-c", REGISTRATIONS],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "nothing registered", out.stderr[-2000:]
