"""Keeps secret values out of everything the engine shows: logs, events, answers and errors.

A secret is a value the engine must use but never show: a step's env value named in its
`secret_env`, a caller's token, a model API key, a node's or an MCP server's bearer token.
Where a secret could surface, it is replaced by `MASK`:

- answers (`GetWorkflow`, `ResumeWorkflow`, `UpdateWorkflow`, `CancelWorkflow`, the watch's
  events, `ListWorkflows`): a workflow's own secrets, from its stored state, and the engine's
  own credentials (`EngineSecrets.credentials`) everywhere; in summaries, errors and events
  also every secret the engine knows (its `EngineSecrets`). A workflow's secrets only
  accumulate: the state field `secrets` keeps every secret value its plans ever had (a plan the
  planner revised or an operator edited may lose one; what it printed before stays masked), and
  `state_secrets` adds the current plan's, so a row written before that field existed reads as
  it did;
- logs and error messages: the engine's `EngineSecrets`, which learns a workflow's secrets when
  a run starts from its task or its checkpoint, and the configured credentials at start-up. The
  engine instance owns it (`workflow_engine.context`) and hands it down: two engines in one
  process know each their own. The process's log masks those of every engine that writes to it
  (`logs.mask_in_logs`).

Masking works on raw text, before anything quotes, escapes or cuts it (`Secrets.quoted`,
`Secrets.redact_part`). Text escaped elsewhere (a job that prints its secret as JSON, a
verifier's own quoting) is masked too: each secret is also looked for as a JSON string and a
Python literal write it (`forms`). A text that ends with the start of a workflow's secret, or
starts with its end (output the worker or the engine cut), has that piece masked when it is at
least `MIN_MASKED_CHARS` long; a shorter piece is shown. An engine's `Secrets` (many) are
masked whole only.

The database keeps the values themselves (the job needs them, and whoever can read the
database is trusted: see docs/security.md, "Secrets"). So does a job's environment.
"""

from __future__ import annotations

import json
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


def forms(secret: str) -> set[str]:
    """`secret` as text may carry it: raw, inside a JSON string (ASCII only or not), and inside
    a Python string literal (`repr` or `ascii`; quoted with ``'``, which escapes ``'``, or
    with ``"``, which does not)."""
    found = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    for literal in (repr, ascii):
        chars = [c if c in "'\"" else literal(c)[1:-1] for c in secret]
        found.add("".join(chars))
        found.add("".join("\\'" if c == "'" else e for c, e in zip(secret, chars, strict=True)))
    return found


def _field(step: Any, name: str) -> Any:
    return step.get(name) if isinstance(step, Mapping) else getattr(step, name, None)


class _Masker:
    """Masks a workflow's secrets in text: each of their `forms`, and a piece of one cut at
    either end of the text."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.raw = sorted({s for s in secrets if len(s) >= MIN_MASKED_CHARS}, key=len)
        self.forms = sorted({f for s in self.raw for f in forms(s)}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for form in self.forms:
            if form in text:
                text = text.replace(form, MASK)
        for secret in self.raw:
            start = _cut_start(text, secret)
            if start >= 0:
                text = text[:start] + MASK
            end = _cut_end(text, secret)
            if end:
                text = MASK + text[end:]
        return text


def _cut_start(text: str, secret: str) -> int:
    """Where `text` ends with the first `MIN_MASKED_CHARS` or more characters of `secret`
    (the longest such piece), or -1."""
    head = secret[:MIN_MASKED_CHARS]
    at = text.find(head, max(0, len(text) - len(secret) + 1))
    while at >= 0:
        if secret.startswith(text[at:]):
            return at
        at = text.find(head, at + 1)
    return -1


def _cut_end(text: str, secret: str) -> int:
    """How long a piece of `secret`'s end (`MIN_MASKED_CHARS` or more characters, the longest)
    `text` starts with, or 0."""
    tail = secret[-MIN_MASKED_CHARS:]
    window = text[: len(secret) - 1]
    at = window.rfind(tail)
    while at >= 0:
        end = at + MIN_MASKED_CHARS
        if secret.endswith(text[:end]):
            return end
        at = window.rfind(tail, 0, end - 1)
    return 0


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret of at least `MIN_MASKED_CHARS` characters masked, raw or
    escaped (`forms`), and a piece of one cut at either end (see the module docstring)."""
    return _Masker(secrets)(text)


def redact_json(value: Any, secrets: set[str]) -> Any:
    """`value` (JSON) with every string that is, or holds, a secret masked."""
    if not secrets:
        return value
    masker = _Masker(secrets)

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return MASK if value in secrets else masker(value)
        if isinstance(value, Mapping):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v) for v in value]
        return value

    return walk(value)


class Secrets:
    """The secrets one engine knows of, for its logs and error messages."""

    def __init__(self) -> None:
        self._values: dict[str, None] = {}  # insertion-ordered: the oldest is forgotten first
        self._pattern: re.Pattern[str] | None = None  # all of them, longest first; None: stale
        self._longest = 0  # characters of the longest ever remembered

    def add(self, values: Iterable[str]) -> None:
        """Remember `values`, each in all its `forms`."""
        for value in values:
            if len(value) < MIN_MASKED_CHARS:
                continue
            for form in forms(value):
                if form not in self._values:
                    self._values[form] = None
                    self._pattern = None
                    self._longest = max(self._longest, len(form))
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

    def redact_part(self, text: str, limit: int, keep: str = "head") -> tuple[str, bool]:
        """The first (`keep="head"`) or last (`"tail"`) `limit` characters of `text` once it is
        masked, and whether that left anything out.

        Only as much of `text` is masked as the part needs (a secret cut where the part ends
        is masked whole), so a long output costs no more than a short one.
        """
        need = limit + self._longest
        size = need
        while True:
            window = text[:size] if keep == "head" else text[max(0, len(text) - size) :]
            masked = self.redact(window)
            whole = len(window) == len(text)
            # A secret the window's edge cuts is shown by neither `limit` part once the masked
            # window is still `need` characters long.
            if whole or len(masked) >= need:
                part = masked[:limit] if keep == "head" else masked[-limit:] if limit else ""
                return part, not whole or len(masked) > limit
            size += need - len(masked)

    def redact_json(self, value: Any) -> Any:
        """`value` (JSON) with these secrets masked in every string."""
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

    def quoted(self, text: str, limit: int, *, keep: str = "head") -> str:
        """`text` as a finding or an error quotes it: these secrets masked first, then cut to
        its first (`keep="head"`) or last (`"tail"`) `limit` characters, then `repr`."""
        part, cut = self.redact_part(text, limit, keep)
        if not cut:
            return repr(part)
        if keep == "tail":
            return f"...{part!r} ({len(text)} chars)"
        return f"{part!r}... ({len(text)} chars)"

    def masked_repr(self, exc: BaseException) -> str:
        """An exception as `repr` writes it, its text arguments masked before they are quoted."""
        args = ", ".join(
            repr(self.redact(a)) if isinstance(a, str) else self.redact(repr(a)) for a in exc.args
        )
        return f"{type(exc).__name__}({args})"


class EngineSecrets(Secrets):
    """An engine's secrets (see the module docstring), and among them its own `credentials`
    (callers' tokens, the model's key, nodes' and the MCP server's tokens): few, so every
    answer masks them everywhere, a workflow's whole state included."""

    def __init__(self) -> None:
        super().__init__()
        self.credentials = Secrets()

    def add_credentials(self, values: Iterable[str]) -> None:
        """Remember the engine's own credentials `values` (empty ones are ignored)."""
        values = [v for v in values if v]
        self.credentials.add(values)
        self.add(values)
