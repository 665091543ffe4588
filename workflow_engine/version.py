"""The engine's version, written once: the package's metadata (pyproject.toml), `--version`,
the ``workflow_engine_build_info`` metric and the image's tag and labels all take it from here,
and CHANGELOG.md's newest release is it (tests/unit/test_release.py). A module of its own, with
no imports, so that any layer may name it and a build reads it without importing the package.
"""

__version__ = "0.15.0"
