"""Keeps secret values out of everything the engine shows: logs, events, answers and errors.

A secret is a value the engine must use but never show: a step's env value named in its
`secret_env`, a caller's token, a model API key, a node's or an MCP server's bearer token.
Where a secret could surface, it is replaced by `MASK`:

- answers (`GetWorkflow`, `ResumeWorkflow`, `UpdateWorkflow`, `CancelWorkflow`, the watch's
  events, `ListWorkflows`): a workflow's own secrets, from its stored state, and the process's
  own credentials (`CREDENTIALS`) everywhere; in summaries, errors and events also every secret
  the process knows (`SECRETS`). A workflow's secrets only accumulate: the state field
  `secrets` keeps every secret value its plans ever had (a plan the planner revised or an
  operator edited may lose one; what it printed before stays masked), and `state_secrets` adds
  the current plan's, so a row written before that field existed reads as it did;
- logs and error messages: the process-wide `SECRETS`, which learns a workflow's secrets when a
  run starts from its task or its checkpoint, and the configured credentials at start-up.

The database keeps the values themselves (the job needs them, and whoever can read the
database is trusted: see README, "Security"). So does a job's environment.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

#: What a secret is shown as.
MASK = "[secret]"
#: The state field holding every secret value a workflow has had, sorted (see the docstring).
STATE_FIELD = "secrets"
#: Shorter values are not masked inside other text (a short secret would mask that word
#: everywhere); an env value that short is masked only where it is the whole value.
MIN_MASKED_CHARS = 8
#: Secrets the process remembers for its logs, newest kept.
MAX_REMEMBERED = 50_000


def step_secrets(steps: Iterable[Any]) -> set[str]:
    """The secret env values of `steps` (JSON objects or anything with `env`/`secret_env`)."""
    found: set[str] = set()
    for step in steps:
        env = _field(step, "env") or {}
        for name in _field(step, "secret_env") or ():
            value = env.get(name) if isinstance(env, Mapping) else None
            if isinstance(value, str) and value:
                found.add(value)
    return found


def state_secrets(state: Any) -> set[str]:
    """The secrets of a workflow: those it has had (its state's `secrets`) and its plan's (none
    in a state that is not a JSON object: a row edited by hand is shown as it is, and refused
    when run)."""
    if not isinstance(state, Mapping):
        return set()
    kept = state.get(STATE_FIELD)
    found = {v for v in kept if isinstance(v, str) and v} if isinstance(kept, list) else set()
    plan = state.get("plan")
    steps = plan.get("steps") if isinstance(plan, Mapping) else None
    return found | step_secrets(steps) if isinstance(steps, list) else found


def accumulated(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str] | None:
    """The `secrets` field of a state that went from `before` to `after`: every secret either
    has had, sorted; None when `after` holds them already (or there are none)."""
    found = state_secrets(before) | state_secrets(after)
    kept = after.get(STATE_FIELD)
    if not found or (isinstance(kept, list) and set(kept) == found):
        return None
    return sorted(found)


def _field(step: Any, name: str) -> Any:
    return step.get(name) if isinstance(step, Mapping) else getattr(step, name, None)


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret of at least `MIN_MASKED_CHARS` characters masked."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= MIN_MASKED_CHARS and secret in text:
            text = text.replace(secret, MASK)
    return text


def redact_json(value: Any, secrets: set[str]) -> Any:
    """`value` (JSON) with every string that is, or holds, a secret masked."""
    if not secrets:
        return value
    if isinstance(value, str):
        return MASK if value in secrets else redact(value, secrets)
    if isinstance(value, Mapping):
        return {k: redact_json(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_json(v, secrets) for v in value]
    return value


class Secrets:
    """The secrets this process knows of, for its logs and error messages."""

    def __init__(self) -> None:
        self._values: dict[str, None] = {}  # insertion-ordered: the oldest is forgotten first
        self._pattern: re.Pattern[str] | None = None  # all of them, longest first; None: stale

    def add(self, values: Iterable[str]) -> None:
        for value in values:
            if len(value) >= MIN_MASKED_CHARS and value not in self._values:
                self._values[value] = None
                self._pattern = None
                if len(self._values) > MAX_REMEMBERED:
                    del self._values[next(iter(self._values))]

    def __bool__(self) -> bool:
        return bool(self._values)

    def redact(self, text: str) -> str:
        if not self._values:
            return text
        if self._pattern is None:
            ordered = sorted(self._values, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, ordered)))
        return self._pattern.sub(MASK, text)

    def redact_json(self, value: Any) -> Any:
        """`value` (JSON) with the process's secrets masked in every string."""
        return self._redact_value(value) if self._values else value

    def redact_event(
        self, _logger: Any, _name: str, event: MutableMapping[str, Any]
    ) -> Mapping[str, Any]:
        """A structlog processor: masks the secrets in every value of a log line."""
        if not self._values:
            return event
        return {k: self._redact_value(v) for k, v in event.items()}

    def _redact_value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, Mapping):
            return {k: self._redact_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._redact_value(v) for v in value]
        if isinstance(value, int | float | bool) or value is None:
            return value
        return self.redact(repr(value))  # an exception, a path: shown as its text anyway


#: The process's secrets (see the module docstring): for its logs, errors and short texts.
SECRETS = Secrets()
#: The process's own credentials (callers' tokens, the model's key, nodes' and the MCP server's
#: tokens): few, so every answer masks them everywhere, a workflow's whole state included.
CREDENTIALS = Secrets()


def add_credentials(values: Iterable[str]) -> None:
    """Remember the process's own credentials `values` (empty ones are ignored)."""
    values = [v for v in values if v]
    CREDENTIALS.add(values)
    SECRETS.add(values)
