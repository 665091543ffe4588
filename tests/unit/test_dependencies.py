"""The package's runtime dependencies are what it imports: nothing used undeclared, nothing
declared unused.

Each third-party module the package imports is traced to the distribution that installed it
(by the file it loads from), and that distribution must be in ``[project] dependencies``; each
declared dependency must in turn be imported by some module (or be named below, with why).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from functools import cache
from pathlib import Path

import workflow_engine

PACKAGE = Path(workflow_engine.__file__).parent
PYPROJECT = PACKAGE.parent / "pyproject.toml"
#: Distributions imported directly that come with a declared one, which pins their version.
COMES_WITH = {
    # pydantic pins its own core; `PydanticCustomError` is imported from it, as pydantic's
    # documentation does.
    "pydantic-core": "pydantic",
}
#: Declared dependencies no module imports, and why they are declared all the same.
DECLARED_UNIMPORTED: dict[str, str] = {}


def normalized(name: str) -> str:
    """A distribution's name as the packaging specifications compare them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    """The distributions ``[project] dependencies`` names (extras and versions dropped)."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    return {
        normalized(re.split(r"[\[<>=!~;\s]", dep, maxsplit=1)[0]) for dep in project["dependencies"]
    }


def imported_modules() -> dict[str, Path]:
    """Each third-party module (dotted, as written) the package imports, and one importer."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top not in (
                    "workflow_engine",
                    "__future__",
                ):
                    found.setdefault(name, path)
    return found


@cache
def top_level_distributions() -> dict[str, list[str]]:
    """Each top-level module name installed, and the distributions that install under it."""
    return importlib.metadata.packages_distributions()


@cache
def files_of(dist: str) -> frozenset[Path]:
    """The files distribution `dist` installed."""
    files = importlib.metadata.distribution(dist).files or ()
    return frozenset(Path(str(file.locate())).resolve() for file in files)


def distribution_of(module: str) -> str | None:
    """The distribution that installed `module` (its deepest importable part), or None."""
    candidates = top_level_distributions().get(module.partition(".")[0], [])
    parts = module.split(".")
    while parts:
        try:
            spec = importlib.util.find_spec(".".join(parts))
        except ModuleNotFoundError:  # a name inside a module, not a module
            spec = None
        if spec is not None and spec.origin not in (None, "namespace", "built-in", "frozen"):
            origin = Path(spec.origin).resolve()
            owners = [normalized(d) for d in candidates if origin in files_of(d)]
            return owners[0] if owners else None
        parts.pop()
    return None


@cache
def imported_distributions() -> dict[str, str]:
    """Each distribution the package imports from, and one place that does (for messages)."""
    dists: dict[str, str] = {}
    for module, path in imported_modules().items():
        dist = distribution_of(module)
        assert dist is not None, (
            f"{path.relative_to(PACKAGE)}: no installed distribution has {module}"
        )
        dists.setdefault(COMES_WITH.get(dist, dist), f"{path.relative_to(PACKAGE)} ({module})")
    return dists


def test_every_imported_distribution_is_declared() -> None:
    undeclared = {d: where for d, where in imported_distributions().items() if d not in declared()}
    assert not undeclared, f"imported but not in [project] dependencies: {undeclared}"


def test_every_declared_dependency_is_imported() -> None:
    unused = declared() - set(imported_distributions()) - set(DECLARED_UNIMPORTED)
    assert not unused, f"in [project] dependencies but imported by no module: {sorted(unused)}"
