"""Keeps secret values out of everything the engine shows: logs, events, answers and errors.

A secret is a value the engine must use but never show: a step's env value named in its
`secret_env`, a caller's token, a model API key, a node's or an MCP server's bearer token.
Where a secret could surface, it is replaced by `MASK`:

- answers (`GetWorkflow`, `ResumeWorkflow`, `UpdateWorkflow`, `CancelWorkflow`, the watch's
  events, `ListWorkflows`): a workflow's own secrets, from its stored state, and the engine's
  own credentials (`EngineSecrets.credentials`) everywhere, never another workflow's (see the
  last point). A workflow's secrets only
  accumulate: the state field `secrets` keeps every secret value its plans ever had (a plan the
  planner revised or an operator edited may lose one; what it printed before stays masked), and
  `state_secrets` adds the current plan's, so a row written before that field existed reads as
  it did;
- logs: the engine's `EngineSecrets`, which learns a workflow's secrets when a run starts from
  its task or its checkpoint, and the configured credentials at start-up. The engine instance
  owns it (`workflow_engine._context`) and hands it down: two engines in one process know each
  their own. The process's log masks those of every engine that writes to it
  (`logs.mask_in_logs`).
- everything a caller may read (answers, error messages, what a workflow stores: its
  summary, errors, events, findings; and what goes to a model for it): the workflow's own
  secrets and the engine's credentials (`for_workflow`), never another workflow's. A mask is
  itself an answer: a text of tenant B's masked with tenant A's secret would tell B that the
  guess it printed (or sent as a task id) is A's secret.

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

import functools
import json
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from ahocorasick_rs import AhoCorasick, Implementation, MatchKind

#: What a secret is shown as.
MASK = "[secret]"
#: The state field holding every secret value a workflow has had, sorted (see the docstring).
STATE_FIELD = "secrets"
#: Shorter values are not masked inside other text (a short secret would mask that word
#: everywhere); an env value that short is masked only where it is the whole value.
MIN_MASKED_CHARS = 8
#: Secrets' forms the process remembers for its logs, and their characters, newest kept.
MAX_REMEMBERED = 50_000
MAX_REMEMBERED_CHARS = 16 << 20


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


class _Forms:
    """Finds any of many texts (secrets' `forms`) in a text at once: an Aho-Corasick automaton
    (the Rust `aho-corasick` crate), in time linear in the text however many there are and
    however they repeat themselves.

    Where two overlap in a text both are masked: the stretches the leftmost-longest matches
    cover read forwards, and those they cover read backwards (a second automaton, of the
    reversed texts), are masked as one."""

    def __init__(self, texts: Iterable[str]) -> None:
        self._texts = sorted(set(texts), key=len, reverse=True)
        #: Those UTF-8 cannot hold (a lone surrogate), which the automaton cannot take either.
        self._odd = [t for t in self._texts if not _encodable(t)]
        sound = [t for t in self._texts if _encodable(t)] if self._odd else self._texts
        # A contiguous NFA, not the crate's default DFA: a DFA's construction is quadratic in a
        # secret that repeats itself (2.9 s for 16,000 of one letter), the NFA's linear.
        kind, nfa = MatchKind.LeftmostLongest, Implementation.ContiguousNFA
        self._forwards = AhoCorasick(sound, matchkind=kind, implementation=nfa)
        self._backwards = AhoCorasick([t[::-1] for t in sound], matchkind=kind, implementation=nfa)

    def __len__(self) -> int:
        return len(self._texts)

    def mask(self, text: str) -> str:
        """`text` with every stretch one of the texts covers replaced by `MASK`."""
        try:
            found = [(b, e) for _, b, e in self._forwards.find_matches_as_indexes(text)]
            n = len(text)
            backwards = self._backwards.find_matches_as_indexes(text[::-1])
        except UnicodeEncodeError:  # a lone surrogate, which the automaton's UTF-8 cannot hold
            for form in self._texts:
                text = text.replace(form, MASK)
            return text
        found += [(n - e, n - b) for _, b, e in backwards]
        if found:
            parts: list[str] = []
            at = 0
            for begin, end in _merged(found):
                parts += (text[at:begin], MASK)
                at = end
            parts.append(text[at:])
            text = "".join(parts)
        for form in self._odd:
            text = text.replace(form, MASK)
        return text


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class _Masker:
    """Masks a workflow's secrets in text: each of their `forms` (`_Forms`), and a piece of one
    cut at either end of the text. More than `MAX_CUT_CHECKS` places where a cut piece could
    begin mask the whole end of the text they are in: a text built to make that costly is
    masked more, never less."""

    def __init__(self, secrets: Iterable[str]) -> None:
        raw = sorted({s for s in secrets if len(s) >= MIN_MASKED_CHARS}, key=len)
        self._forms = _Forms(f for s in raw for f in forms(s)) if raw else None
        self._longest = len(raw[-1]) if raw else 0
        self._heads: dict[str, list[str]] = {}
        self._tails: dict[str, list[str]] = {}
        for secret in raw:
            self._heads.setdefault(secret[:MIN_MASKED_CHARS], []).append(secret)
            self._tails.setdefault(secret[-MIN_MASKED_CHARS:], []).append(secret)

    def __call__(self, text: str) -> str:
        if self._forms is None or len(text) < MIN_MASKED_CHARS:
            return text
        text = self._forms.mask(text)
        start = self._cut_start(text)
        if start >= 0:
            text = text[:start] + MASK
        end = self._cut_end(text)
        if end:
            text = MASK + text[end:]
        return text

    def _cut_start(self, text: str) -> int:
        """Where `text` ends with the first `MIN_MASKED_CHARS` or more characters of a secret
        (the longest such piece), or -1."""
        window = max(0, len(text) - self._longest + 1)
        checks = 0
        for at in range(window, len(text) - MIN_MASKED_CHARS + 1):
            for secret in self._heads.get(text[at : at + MIN_MASKED_CHARS], ()):
                piece = len(text) - at  # a piece is shorter than its secret, and ends as `text`
                if piece >= len(secret) or secret[piece - 1] != text[-1]:
                    continue
                checks += 1
                if checks > MAX_CUT_CHECKS:
                    return window
                if text.startswith(secret[:piece], at):
                    return at
        return -1

    def _cut_end(self, text: str) -> int:
        """How long a piece of a secret's end (`MIN_MASKED_CHARS` or more characters, the
        longest) `text` starts with, or 0."""
        window = min(len(text), self._longest - 1)
        checks = 0
        for end in range(window, MIN_MASKED_CHARS - 1, -1):
            for secret in self._tails.get(text[end - MIN_MASKED_CHARS : end], ()):
                if end >= len(secret) or secret[len(secret) - end] != text[0]:
                    continue
                checks += 1
                if checks > MAX_CUT_CHECKS:
                    return window
                if secret.endswith(text[:end]):
                    return end
        return 0


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` ([begin, end) pairs) with those that overlap joined, in order."""
    joined: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if joined and begin < joined[-1][1]:
            joined[-1] = (joined[-1][0], max(end, joined[-1][1]))
        else:
            joined.append((begin, end))
    return joined


#: Places at one end of a text where a cut piece of a secret could begin, checked before
#: that whole end is masked.
MAX_CUT_CHECKS = 64
#: Forms an engine's `Secrets` takes in before it rebuilds its settled matcher.
RECENT_FORMS = 2048


@functools.lru_cache(maxsize=64)
def _masker(secrets: frozenset[str]) -> _Masker:
    """The masker of `secrets`: a workflow read again (a watcher, a poll, its next node)
    reuses its automaton. 64 are kept (each holds its secrets: at most 256 KiB of them)."""
    return _Masker(secrets)


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret of at least `MIN_MASKED_CHARS` characters masked, raw or
    escaped (`forms`), and a piece of one cut at either end (see the module docstring)."""
    return _masker(frozenset(secrets))(text)


def redact_json(value: Any, secrets: set[str]) -> Any:
    """`value` (JSON) with every string that is, or holds, a secret masked."""
    if not secrets:
        return value
    masker = _masker(frozenset(secrets))

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
    """The secrets one engine knows of, for its logs and error messages.

    Every workflow that starts adds its own, and each log line and error is masked with all of
    them, so the matcher is kept in two parts: the settled forms, matched by an automaton
    rebuilt only when `RECENT_FORMS` have come since, and those recent ones, by a small one
    rebuilt as they come. Adding a workflow's secrets costs a rebuild of the small one."""

    def __init__(self) -> None:
        self._values: dict[str, None] = {}  # insertion-ordered: the oldest is forgotten first
        self._chars = 0  # characters of `_values`
        self._settled: _Forms | None = None  # every form but the recent ones
        self._recent: list[str] = []  # forms added since `_settled` was built
        self._recent_forms: _Forms | None = None  # None: stale (or nothing recent)
        self._longest = 0  # characters of the longest ever remembered

    def add(self, values: Iterable[str]) -> None:
        """Remember `values`, each in all its `forms`."""
        for value in values:
            if len(value) < MIN_MASKED_CHARS:
                continue
            for form in forms(value):
                if form not in self._values:
                    self._values[form] = None
                    self._chars += len(form)
                    self._recent.append(form)
                    self._recent_forms = None
                    self._longest = max(self._longest, len(form))
                    while len(self._values) > MAX_REMEMBERED or self._chars > MAX_REMEMBERED_CHARS:
                        oldest = next(iter(self._values))
                        del self._values[oldest]
                        self._chars -= len(oldest)

    def __bool__(self) -> bool:
        return bool(self._values)

    def __len__(self) -> int:
        """How many forms it remembers (at most `MAX_REMEMBERED`)."""
        return len(self._values)

    def redact(self, text: str) -> str:
        if not self._values:
            return text
        if len(self._recent) > RECENT_FORMS:
            self._settled = _Forms(self._values)  # the forgotten ones go now
            self._recent, self._recent_forms = [], None
        if self._recent and self._recent_forms is None:
            self._recent_forms = _Forms(self._recent)
        if self._settled is not None:
            text = self._settled.mask(text)
        return self._recent_forms.mask(text) if self._recent_forms is not None else text

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


class WorkflowSecrets(Secrets):
    """What one workflow's text is masked with wherever a caller may read it (`for_workflow`):
    its own secrets, with the cut pieces `redact` masks, and the engine's credentials."""

    def __init__(self, own: frozenset[str], credentials: Secrets) -> None:
        super().__init__()
        self._own = frozenset(s for s in own if len(s) >= MIN_MASKED_CHARS)
        self._credentials = credentials
        self._own_longest = max((len(f) for s in self._own for f in forms(s)), default=0)

    def __bool__(self) -> bool:
        return bool(self._own) or bool(self._credentials)

    def add(self, values: Iterable[str]) -> None:
        raise TypeError("a workflow's secrets are its state's: make another with for_workflow")

    def redact(self, text: str) -> str:
        return self._credentials.redact(_masker(self._own)(text) if self._own else text)

    def redact_part(self, text: str, limit: int, keep: str = "head") -> tuple[str, bool]:
        # The credentials may have grown since (an engine reads its keys as it starts).
        self._longest = max(self._own_longest, self._credentials._longest)
        return super().redact_part(text, limit, keep)

    def redact_json(self, value: Any) -> Any:
        return self._redact_value(value) if self else value


def for_workflow(engine: Secrets, own: Iterable[str]) -> Secrets:
    """The masking of a workflow whose secrets are `own`, wherever a caller may read its text:
    those and `engine`'s credentials (all of `engine` when it is no `EngineSecrets`: a plain
    one holds no other workflow's)."""
    credentials = engine.credentials if isinstance(engine, EngineSecrets) else engine
    return WorkflowSecrets(frozenset(own), credentials)


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
