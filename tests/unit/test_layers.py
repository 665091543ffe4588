"""Layers import downward only: what each package of the engine must never import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import workflow_engine

PACKAGE = Path(workflow_engine.__file__).parent
#: The composition root and the process around it, above every package.
TOP = {"engine", "serving"}
#: Package -> the parts of the engine it must not import (they sit above it, or beside it).
FORBIDDEN = {
    "domain": {"storage", "runtime", "api", "graph", "capabilities", "service", "app", "node"}
    | TOP,
    "storage": {"runtime", "api", "graph", "capabilities", "service", "app", "node"} | TOP,
    "capabilities": {"storage", "runtime", "api", "graph", "service", "app", "node"} | TOP,
    "graph": {"storage", "runtime", "api", "service", "app", "node"} | TOP,
    "api": {"storage.records", "storage.leases", "runtime", "app", "node"} | TOP,
    # The worker node is a process of its own: the sandbox and the domain, no engine, no database.
    "node": {"storage", "runtime", "api", "graph", "service", "app"} | TOP,
    # The command line for people is a gRPC client like any other: the contract, no insides.
    "client": {"domain", "storage", "runtime", "api", "graph", "capabilities", "service", "app"}
    | {"node"}
    | TOP,
    # Metrics and traces serve every layer, so they may import none of them.
    "telemetry": {"domain", "storage", "runtime", "api", "graph", "capabilities", "service"}
    | {"app", "node", "client", "config"}
    | TOP,
}


def imported(module: Path) -> set[str]:
    """The engine modules `module` imports, as dotted names below `workflow_engine`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    prefix = "workflow_engine."
    return {name[len(prefix) :] for name in names if name.startswith(prefix)}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer: str) -> None:
    for module in (PACKAGE / layer).rglob("*.py"):
        for name in imported(module):
            bad = [f for f in FORBIDDEN[layer] if name == f or name.startswith(f + ".")]
            assert not bad, f"{module.relative_to(PACKAGE)} imports workflow_engine.{name}"
