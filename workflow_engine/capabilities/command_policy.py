"""What a model-planned command may do: run, wait for a person's approval, or be refused.

A command a model proposes is untrusted input. The policy (``WORKFLOW_ENGINE_COMMAND_POLICY_FILE``,
YAML or JSON) is three lists of glob patterns and a default::

    deny: [rm, sudo, curl, wget, "* --force*"]     # refused, with a finding
    require_approval: [git, "make deploy*"]         # waits for a person (WAITING_FOR_APPROVAL)
    allow: [echo, cat, ls, python3, pytest, make]   # runs
    default: approve                                # anything else: approve | deny | allow

A pattern without a space matches the program's name (``argv[0]``, and its base name, so
``python3`` matches ``/usr/bin/python3``); a pattern with a space matches the whole command
line (the argv joined by spaces). The first list that matches wins, in the order deny,
require_approval, allow; nothing matching gets `default`. No policy file: every model-planned
step waits for approval. Allowing a shell (``sh``, ``bash``) allows whatever it is given.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from workflow_engine.capabilities.base import CapabilityConfigError
from workflow_engine.config import ENV_PREFIX

Verdict = Literal["allow", "approve", "deny"]
_VERDICTS: tuple[Verdict, ...] = ("allow", "approve", "deny")
_LISTS: dict[str, Verdict] = {"deny": "deny", "require_approval": "approve", "allow": "allow"}


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str


@dataclass(frozen=True, slots=True)
class CommandPolicy:
    """The lists of patterns, checked in the order deny, require_approval, allow."""

    deny: tuple[str, ...] = ()
    require_approval: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    default: Verdict = "approve"
    source: str = "the default policy (no WORKFLOW_ENGINE_COMMAND_POLICY_FILE)"

    def decide(self, command: Sequence[str]) -> Decision:
        """What happens to `command`, and why, naming the rule."""
        program = command[0] if command else ""
        line = " ".join(command)
        for name, verdict in _LISTS.items():
            for pattern in getattr(self, name):
                if _matches(pattern, program, line):
                    return Decision(verdict, f"{name} pattern {pattern!r} of {self.source}")
        return Decision(self.default, f"no pattern matches; the default of {self.source}")


def _matches(pattern: str, program: str, line: str) -> bool:
    if " " in pattern:
        return fnmatch.fnmatchcase(line, pattern)
    return fnmatch.fnmatchcase(program, pattern) or fnmatch.fnmatchcase(Path(program).name, pattern)


def load_policy(path: str) -> CommandPolicy:
    """The policy in `path`, or the default one when `path` is empty; `CapabilityConfigError`
    naming the file and the field when it cannot be used."""
    if not path:
        return CommandPolicy()
    where = f"{ENV_PREFIX}COMMAND_POLICY_FILE {path}"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CapabilityConfigError(f"{where}: cannot read it: {exc.strerror}") from None
    try:
        data: Any = yaml.safe_load(text) if not path.endswith(".json") else json.loads(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise CapabilityConfigError(f"{where}: not YAML or JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CapabilityConfigError(f"{where}: expected a mapping of deny, allow, ...")
    unknown = sorted(set(data) - {*_LISTS, "default"})
    if unknown:
        raise CapabilityConfigError(
            f"{where}: {unknown[0]}: unknown field; expected deny, require_approval, allow, default"
        )
    lists: dict[str, tuple[str, ...]] = {}
    for name in _LISTS:
        value = data.get(name) or []
        if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
            raise CapabilityConfigError(f"{where}: {name}: expected a list of patterns")
        lists[name] = tuple(value)
    default = data.get("default", "approve")
    if default not in _VERDICTS:
        raise CapabilityConfigError(
            f"{where}: default: expected one of {', '.join(_VERDICTS)}, got {default!r}"
        )
    return CommandPolicy(**lists, default=default, source=f"the policy {Path(path).name}")
