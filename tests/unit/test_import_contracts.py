"""The import contracts of pyproject.toml can fail: each is broken once, in a copy of the
package, and `lint-imports` must report that contract broken (and only then).

`make lint` runs the contracts on the package itself; a contract that names a module which no
longer exists, or a rule nothing can break, would pass there forever. Here each contract meets
the one import it exists to refuse.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import workflow_engine

ROOT = Path(workflow_engine.__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

#: Contract id -> (the module to break, the import that breaks the contract there).
BREAKS = {
    "layers": ("domain/status.py", "import workflow_engine.storage"),
    "private": ("engine.py", "import workflow_engine.storage._pool"),
    "worker-node": ("worker_node/_server.py", "import workflow_engine.storage"),
    "client": ("client/_render.py", "import langgraph"),
    "telemetry": ("telemetry/_metrics.py", "import workflow_engine.config"),
    "grpc": ("graph/state.py", "import grpc"),
    "database": ("capabilities/_factory.py", "import psycopg"),
    "pure-domain": ("domain/task.py", "import openai"),
}


def lint_imports(tree: Path, contract: str) -> subprocess.CompletedProcess[str]:
    """`lint-imports` of pyproject.toml's `contract`, with the package found in `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    config = str(ROOT / "pyproject.toml")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", config, "--contract", contract],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("contracts")
    shutil.copytree(
        ROOT / "workflow_engine",
        tree / "workflow_engine",
        ignore=shutil.ignore_patterns("__pycache__", "jobwrap", "*.c"),
    )
    return tree


def test_every_contract_has_its_break() -> None:
    configured = set()
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("id = "):
            configured.add(line.split('"')[1])
    assert configured == set(BREAKS)


@pytest.mark.parametrize("contract", sorted(BREAKS))
def test_the_contract_fails_when_broken(package_copy: Path, contract: str) -> None:
    module, statement = BREAKS[contract]
    path = package_copy / "workflow_engine" / module
    whole = path.read_text()
    kept = lint_imports(package_copy, contract)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    path.write_text(whole + f"\n{statement}  # noqa\n")
    try:
        broken = lint_imports(package_copy, contract)
    finally:
        path.write_text(whole)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "BROKEN" in broken.stdout and "1 broken" in broken.stdout, broken.stdout
    # The report names the import that broke it.
    assert statement.split()[-1] in broken.stdout, broken.stdout
