"""Each command imports what it runs, and no more.

`workflow-engine --version`, `--help` and the client commands need the contract, gRPC and rich
(about 0.7 s of CPU here), not the engine: importing all of it, LangGraph and the model and MCP
SDKs with it, took about 4.4 s. `serve` with no `llm` capability and no `mcp` task source
needs neither SDK (about 2.5 s of the 5 s it took), and a worker node needs no graph either.
Scripts, operators and the end-to-end tests start these often, so an import that pulls the
rest back in fails here.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

#: The model and MCP SDKs: imported when a capability that speaks to one opens.
SDKS = ("openai", "mcp")
#: What only `serve`, `migrate`, `prune` and `worker-node` need.
ENGINE_ONLY = (
    "langgraph",
    "langchain_core",
    "openai",
    "mcp",
    "opentelemetry",
    "psycopg_pool",
    "starlette",
    "uvicorn",
    "workflow_engine.engine",
    "workflow_engine.graph",
    "workflow_engine.runtime",
    "workflow_engine.service",
    "workflow_engine.storage",
    "workflow_engine.capabilities",
    "workflow_engine.api",
    "workflow_engine._serving",
    "workflow_engine.worker_node",
)


def imported_by(*argv: str) -> set[str]:
    """The modules `python ARGV` imports (``-X importtime``'s list)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode in (0, 8), done.stderr[-2000:]  # 8: no engine at that address
    return {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def among(modules: set[str], packages: tuple[str, ...]) -> set[str]:
    """The `modules` that are one of `packages` or inside one."""
    return {m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)}


@pytest.mark.parametrize(
    "args",
    [
        ("--version",),
        ("--help",),
        ("get", "--help"),
        ("schedule", "list", "--help"),
        # A real call, to an address where nothing listens: the whole client path, channel
        # included, up to UNAVAILABLE (exit 8).
        ("get", "00000000-0000-4000-8000-000000000001", "--address", "127.0.0.1:1"),
    ],
)
def test_a_client_command_does_not_import_the_engine(args: tuple[str, ...]) -> None:
    modules = imported_by("-m", "workflow_engine", *args)
    assert "workflow_engine.cli" in modules  # the probe sees imports at all
    assert among(modules, ENGINE_ONLY) == set()


def test_serve_imports_the_engine_and_no_sdk_it_was_not_configured_for() -> None:
    modules = imported_by("-c", "import workflow_engine._serving")
    # The probe can fail: the engine's modules are there when the engine is.
    assert {"langgraph.graph", "workflow_engine.engine", "workflow_engine.storage"} <= modules
    assert among(modules, SDKS) == set()


def test_a_worker_node_imports_no_graph_and_no_sdk() -> None:
    modules = imported_by("-c", "import workflow_engine.worker_node._server")
    assert "workflow_engine.sandbox._runner" in modules
    assert among(modules, ("langgraph", "workflow_engine.graph", *SDKS)) == set()
