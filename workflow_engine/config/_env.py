"""Reading `Settings` from the environment: each field is ``WORKFLOW_ENGINE_<FIELD>``, each
section's ``WORKFLOW_ENGINE_<SECTION>_<FIELD>``; no other module reads the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from workflow_engine.config._sections import ENV_PREFIX
from workflow_engine.config._settings import Settings
from workflow_engine.errors import ConfigError


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Build `Settings` from ``WORKFLOW_ENGINE_<FIELD>`` variables; unknown ones are ignored."""
    environ = os.environ if environ is None else environ
    settings: Settings = _from_env(Settings, environ, ENV_PREFIX)
    return settings


def env_names(kind: type = Settings, prefix: str = ENV_PREFIX) -> set[str]:
    """Every variable the settings read."""
    names: set[str] = set()
    for name, hint in _fields(kind).items():
        if is_dataclass(hint):
            names |= env_names(hint, f"{prefix}{name.upper()}_")  # type: ignore[arg-type]
        else:
            names.add(prefix + name.upper())
    return names


def _from_env(kind: type, environ: Mapping[str, str], prefix: str) -> Any:
    values: dict[str, Any] = {}
    for name, hint in _fields(kind).items():
        if is_dataclass(hint):
            values[name] = _from_env(hint, environ, f"{prefix}{name.upper()}_")  # type: ignore[arg-type]
            continue
        raw = environ.get(prefix + name.upper())
        if raw is None or raw == "":
            continue
        values[name] = _parse(prefix + name.upper(), hint.__name__, raw)
    try:
        return kind(**values)
    except ValueError as exc:
        if str(exc).startswith(ENV_PREFIX):
            raise
        # A settings group used under several prefixes names its fields alone (`JobLimits`).
        raise ConfigError(f"{prefix}{exc}") from None


def _fields(kind: type) -> dict[str, Any]:
    """A settings dataclass's fields and their (resolved) types."""
    hints = get_type_hints(kind)
    return {f.name: hints[f.name] for f in fields(kind)}


def _parse(variable: str, kind: str, raw: str) -> Any:
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "Path":
            return Path(raw)
        if kind == "bool":
            if raw.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes", "on")
    except ValueError:
        raise ConfigError(f"{variable}: expected {kind}, got {raw!r}") from None
    return raw
