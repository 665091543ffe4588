"""The version is said the same everywhere: CHANGELOG.md's newest release is
`workflow_engine.__version__` (written in `workflow_engine/version.py`), which
`workflow-engine --version` prints and the package's
metadata takes; and the changelog keeps its form (Keep a Changelog 1.1.0: a dated release
heading each, newest first)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from workflow_engine import __version__
from workflow_engine.sandbox import _wrapper as wrapper
from workflow_engine.telemetry import _metrics as metrics

ROOT = Path(__file__).resolve().parents[2]
CHANGELOG = ROOT / "CHANGELOG.md"
#: `## [1.2.3] - 2026-11-27`: a release; `## [Unreleased]` may head what is not released yet.
RELEASE = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>.*))?$", re.MULTILINE)
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
DATE = re.compile(r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$")
#: Keep a Changelog's kinds of change, then this project's two: what an operator must do on
#: upgrading, and the figures measured for the release.
SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"} | {
    "Upgrade notes",
    "Measurements",
}


def releases(text: str) -> list[tuple[str, str | None]]:
    """Each ``## [version] - date`` heading of `text`, in order (Unreleased left out)."""
    return [
        (m["version"], m["date"]) for m in RELEASE.finditer(text) if m["version"] != "Unreleased"
    ]


def semver(version: str) -> tuple[int, int, int]:
    match = SEMVER.match(version)
    assert match, f"CHANGELOG.md: {version!r} is not MAJOR.MINOR.PATCH"
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def check_changelog(text: str) -> None:
    """Fail naming the first way `text` is not a Keep a Changelog file of semantic versions."""
    found = releases(text)
    assert found, "CHANGELOG.md has no release heading (## [X.Y.Z] - YYYY-MM-DD)"
    for version, date in found:
        semver(version)
        assert date and DATE.match(date), f"CHANGELOG.md: [{version}] has no ISO date: {date!r}"
    versions = [semver(version) for version, _ in found]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions), (
        "CHANGELOG.md: releases are not newest first, each once"
    )
    dates = [date for _, date in found]
    assert dates == sorted(dates, reverse=True), (
        "CHANGELOG.md: a release is dated before an older one"
    )
    first = RELEASE.search(text)
    assert first is not None
    for heading in re.findall(r"^### (.*)$", text[first.start() :], re.MULTILINE):
        assert heading in SECTIONS, f"CHANGELOG.md: unknown section ### {heading}"


def newest(text: str) -> str:
    return releases(text)[0][0]


def test_the_newest_release_in_the_changelog_is_the_packages_version() -> None:
    assert newest(CHANGELOG.read_text()) == __version__


def test_the_changelog_is_keep_a_changelog_with_dated_releases_newest_first() -> None:
    check_changelog(CHANGELOG.read_text())


@pytest.mark.parametrize(
    ("broken", "says"),
    [
        ("## [0.2.0] - 2026-11-21\n## [0.3.0] - 2026-11-22\n", "newest first"),
        ("## [0.2.0] - 2026-11-21\n## [0.2.0] - 2026-11-20\n", "newest first"),
        ("## [0.2.0] - 21.11.2026\n", "no ISO date"),
        ("## [0.2.0]\n", "no ISO date"),
        ("## [0.2] - 2026-11-21\n", "not MAJOR.MINOR.PATCH"),
        ("## [0.3.0] - 2026-11-20\n## [0.2.0] - 2026-11-21\n", "dated before"),
        ("## [0.2.0] - 2026-11-21\n### Improved\n- x\n", "unknown section"),
    ],
)
def test_a_changelog_out_of_form_is_refused(broken: str, says: str) -> None:
    with pytest.raises(AssertionError, match=says):
        check_changelog(broken)


def test_versions_compare_as_numbers_not_as_text() -> None:
    check_changelog("## [0.10.0] - 2026-11-25\n## [0.9.0] - 2026-11-24\n")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    "command",
    [
        (str(Path(sys.executable).parent / "workflow-engine"), "--version"),
        (sys.executable, "-m", "workflow_engine", "--version"),
    ],
    ids=["console script", "python -m"],
)
def test_workflow_engine_version_prints_the_packages_version(command: tuple[str, ...]) -> None:
    done = _run(*command)
    assert (done.returncode, done.stdout) == (0, f"workflow-engine {__version__}\n"), done.stderr


def test_the_package_metadata_takes_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "workflow_engine.version.__version__"


def test_build_info_names_the_version_and_how_jobwrap_was_built(tmp_path: Path) -> None:
    assert metrics.JOBWRAP == wrapper.JOBWRAP  # the one telemetry names without importing it
    info = metrics.build_info()
    assert info["version"] == __version__ and info["python"] == platform.python_version()
    # make install builds it, static where the C library allows.
    assert info["jobwrap"] in ("static", "dynamic")
    assert metrics.jobwrap_linkage(tmp_path / "missing") == "absent"
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert metrics.jobwrap_linkage(tmp_path / "script") == "unknown"
    assert metrics.jobwrap_linkage(Path(sys.executable).resolve()) == "dynamic"
