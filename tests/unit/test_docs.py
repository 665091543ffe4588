"""The docs say what the code does: the generated pages are current, every setting, metric and
runtime dependency is on its page, and the README stays short with links that resolve.

A failure of the first two after a change to `workflow_engine.config` or a move of a module
means: run `make docs` and commit the pages it writes.
"""

from __future__ import annotations

import re
import tomllib
import unicodedata
from pathlib import Path

from prometheus_client import generate_latest

from tools import gen_docs
from workflow_engine.config import env_names
from workflow_engine.telemetry._metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: A Markdown link to a file of this repository: its path and, maybe, an anchor.
LINK = re.compile(r"\]\((?!https?://)([^)#\s]+)(?:#([^)\s]+))?\)")


def test_the_configuration_page_is_current() -> None:
    page = gen_docs.CONFIGURATION.read_text()
    assert page == gen_docs.configuration_page(), "run `make docs` and commit the page"


def test_the_package_map_is_current() -> None:
    page = gen_docs.ARCHITECTURE.read_text()
    assert page == gen_docs.architecture_page(page), "run `make docs` and commit the page"


def test_the_configuration_page_names_every_variable_the_settings_read() -> None:
    page = gen_docs.CONFIGURATION.read_text()
    rows = set(re.findall(r"^\| `(WORKFLOW_ENGINE_\w+)` \|", page, re.MULTILINE))
    assert rows == env_names()


def test_the_operations_page_names_every_metric_the_engine_serves() -> None:
    served = generate_latest(Metrics().enable()).decode()
    metrics = set(re.findall(r"^# TYPE (\w+) ", served, re.MULTILINE))
    section = (ROOT / "docs" / "operations.md").read_text().split("\n### Metrics\n", 1)[1]
    rows = re.findall(r"^\| (`\w+`(?:, `\w+`)*) \|", section.split("\n\n```", 1)[0], re.M)
    named = {name for row in rows for name in re.findall(r"`(\w+)`", row)}
    assert named == metrics, "a metric to add to (or drop from) docs/operations.md's table"


def test_every_runtime_dependency_has_its_role_on_the_architecture_page() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    page = gen_docs.ARCHITECTURE.read_text()
    roles = set(re.findall(r"^\| `([\w\-\[\]]+)` \| .+ \|$", page, re.MULTILINE))
    for requirement in declared:
        name = re.split(r"[<>=!~ ;]", requirement, maxsplit=1)[0]
        assert name in roles, f"{name}: give it a line in docs/architecture.md's dependencies"


def test_the_readme_is_a_first_screen_not_a_manual() -> None:
    assert len(README.read_text().splitlines()) <= 300


def test_the_readme_settings_are_settings() -> None:
    table = README.read_text().split("## The settings most people need", 1)[1].split("\n## ")[0]
    named = set(re.findall(r"`(WORKFLOW_ENGINE_\w+)`", table))
    assert len(named) >= 6 and named <= env_names()


def test_the_readme_links_reach_files_and_headings() -> None:
    """The docs site checks its own links (`make lint`); the README is outside it."""
    for path, anchor in LINK.findall(README.read_text()):
        target = ROOT / path
        assert target.exists(), path
        if anchor:
            assert anchor in anchors(target), f"{path}#{anchor}"


def anchors(page: Path) -> set[str]:
    """The anchors MkDocs gives a page's headings (Markdown's `toc` slugify)."""
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", page.read_text(), re.MULTILINE):
        text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
        text = re.sub(r"[^\w\s-]", "", text).strip().lower()
        found.add(re.sub(r"[-\s]+", "-", text))
    return found


def test_the_in_process_example_on_its_page_is_the_file() -> None:
    page = (ROOT / "docs" / "python-api.md").read_text()
    shown = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert shown == (ROOT / "examples" / "in_process.py").read_text()
