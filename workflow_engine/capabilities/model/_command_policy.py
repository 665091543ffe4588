"""What a model-planned step may do: run, wait for a person's approval, or be refused.

A step a model proposes is untrusted input: its command and its environment. The policy
(``WORKFLOW_ENGINE_COMMAND_POLICY_FILE``, YAML or JSON) is three lists of glob patterns, a
default, and the environment variables a step may set::

    deny: [rm, sudo, curl, wget, "* --force*"]     # refused, with a finding
    require_approval: [git, "make deploy*"]         # waits for a person (WAITING_FOR_APPROVAL)
    allow: [echo, cat, ls, python3, pytest, make]   # runs
    default: approve                                # anything else: approve | deny | allow
    env: [LANG, LC_ALL, TZ, NO_COLOR, PYTHONUNBUFFERED]   # names (globs) a step may set

**The program.** Before anything is matched, the step's program (``argv[0]``) is resolved to
the file it would run: an absolute path as written, or a bare name as found on the sandbox's
PATH (`SAFE_PATH`), and only if neither that file nor any directory above it can be written
by anyone but root, so no job can have put it there or replace it (`resolve`). A step that
sets its own PATH resolves no bare name: the policy cannot know what it finds.

A pattern without a space names the program: with a ``/`` it is a glob on the resolved
absolute path (``/usr/bin/git``, ``/opt/tools/*``); without one, a glob on the name of a
program found in a directory of the safe PATH (``python3`` is ``/usr/bin/python3``, never
``/tmp/x/python3``). A pattern with a space is a glob on the whole command line, the program
spelled either way (``git push*``, ``/usr/bin/git push*``). To allow, the program must be
resolved; to deny or require approval, its name as written matches too (``rm`` denies
``./rm``). A program that does not resolve matches no allow pattern, and when nothing else
matches it waits for approval (is refused when ``default: deny``); `default: allow` never runs
a program jobs could have written.

**The environment.** Every name a step sets must match a pattern of ``env`` (default
`DEFAULT_ENV`); any other makes the step wait for approval (refused when ``default: deny``),
whatever its command. ``PATH`` may not be listed: a step on its own PATH runs programs the
policy never saw (``make`` runs ``cc``). The loader's variables (``LD_PRELOAD``, ...) are no
step's at all (`domain.task.LOADER_VARIABLES`). Listing ``PYTHONPATH``, ``NODE_OPTIONS``,
``BASH_ENV`` and the like lets a step load code into an allowed program.

The first list that matches wins, in the order deny, require_approval, allow; nothing matching
gets `default`; then the environment can only make the verdict stricter. No policy file:
every model-planned step waits for approval. Allowing a shell (``sh``, ``bash``, ``python3``
with ``-c``) allows whatever it is given.

**Options in between.** A deny or require_approval pattern with words also matches word by
word (`_words_match`): ``git push*`` matches ``git -c x.y=z push origin``, and ``* --force*``
matches ``--forc`` (getopt takes a long option abbreviated) and ``--force=yes``. An allow
pattern with words matches only the whole command line as written, so nothing in between
widens it. What no pattern can see: a program's own aliases and configuration
(``git -c alias.p=push p``, a Makefile's recipes). Allowing a program by name allows whatever
its arguments make it do; where the model is not trusted that far, list what it may run with
``default: deny``, and keep programs that run what they are given out of ``allow``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from workflow_engine.config import ENV_PREFIX
from workflow_engine.errors import CapabilityConfigError
from workflow_engine.sandbox import SAFE_PATH

PolicyVerdict = Literal["allow", "approve", "deny"]
_VERDICTS: tuple[PolicyVerdict, ...] = ("allow", "approve", "deny")
_STRICTNESS = {"allow": 0, "approve": 1, "deny": 2}
_LISTS: dict[str, PolicyVerdict] = {"deny": "deny", "require_approval": "approve", "allow": "allow"}
_FIELDS = (*_LISTS, "default", "env")
#: What a model-planned step may set in its env without a person's approval, by default:
#: variables that choose a language, a time zone or how output looks, and load nothing.
DEFAULT_ENV: tuple[str, ...] = ("LANG", "LC_ALL", "TZ", "NO_COLOR", "PYTHONUNBUFFERED")
#: Directories in which a bare program name is looked up: the local sandbox's PATH.
SAFE_DIRS: tuple[str, ...] = tuple(SAFE_PATH.split(":"))


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """What the policy decided about a step, and why (the rule, and the policy it is of)."""

    verdict: PolicyVerdict
    reason: str


@dataclass(frozen=True, slots=True)
class CommandPolicy:
    """The lists of patterns, checked in the order deny, require_approval, allow; and the env
    names a step may set."""

    deny: tuple[str, ...] = ()
    require_approval: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    default: PolicyVerdict = "approve"
    env: tuple[str, ...] = DEFAULT_ENV
    source: str = "the default policy (no WORKFLOW_ENGINE_COMMAND_POLICY_FILE)"

    def decide(
        self, command: Sequence[str], env: Mapping[str, str] | None = None
    ) -> PolicyDecision:
        """What happens to a step running `command` with `env`, and why, naming the rule."""
        env = env or {}
        written = command[0] if command else ""
        path = resolve(written, env)
        decision = self._by_command(command, path)
        unlisted = sorted(n for n in env if not any(fnmatch.fnmatchcase(n, p) for p in self.env))
        if unlisted:
            by_env = PolicyDecision(
                _cautious(self.default),
                f"env {', '.join(unlisted)} not in the env list of {self.source}",
            )
            decision = _stricter(decision, by_env)
        return decision

    def _by_command(self, command: Sequence[str], path: str | None) -> PolicyDecision:
        args = list(command[1:])
        strict = _names(path)
        loose = [*strict, *_written_names(command[0] if command else "")]
        for name, verdict in _LISTS.items():
            cautious = verdict != "allow"
            names = loose if cautious else strict
            for pattern in getattr(self, name):
                if _matches(pattern, names, args) or (
                    cautious and _words_match(pattern, names, args)
                ):
                    return PolicyDecision(verdict, f"{name} pattern {pattern!r} of {self.source}")
        if path is None:
            return PolicyDecision(
                _cautious(self.default),
                f"the program {command[0] if command else ''!r} is no file that jobs cannot "
                f"write (an absolute path, or a name found on {SAFE_PATH}); "
                f"no pattern matches; the default of {self.source}",
            )
        return PolicyDecision(self.default, f"no pattern matches; the default of {self.source}")


def resolve(program: str, env: Mapping[str, str]) -> str | None:
    """The absolute path of the file `program` runs with `env`, if no job can have written it
    or replace it (see `_root_only`); None when it cannot be known or is not such a file.

    A path must be absolute and plain (no ``.``, ``..`` or ``//``: the kernel would resolve
    them after symbolic links); a bare name is looked up on `SAFE_PATH`, and only when `env`
    leaves PATH as the sandbox sets it.
    """
    if "/" in program:
        plain = os.path.normpath(program) == program and not program.startswith("//")
        if not program.startswith("/") or not plain:
            return None
        path = program
    else:
        if env.get("PATH", SAFE_PATH) != SAFE_PATH:
            return None
        found = shutil.which(program, path=SAFE_PATH)
        if found is None:
            return None
        path = found
    return path if _root_only(path) else None


def _root_only(path: str) -> bool:
    """Whether `path` is a file which, like every directory above it (as written, and with
    its links resolved), belongs to root and is writable by root alone."""
    for start in (path, os.path.realpath(path)):
        current = start
        while True:
            try:
                info = os.stat(current)
            except OSError:
                return False
            if info.st_uid != 0 or info.st_mode & 0o022:
                return False
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
    return os.path.isfile(path)


def _names(path: str | None) -> list[str]:
    """What a resolved program is called, for an allow pattern: its path, and its name when it
    is in a directory of the safe PATH."""
    if path is None:
        return []
    directory, name = os.path.split(path)
    return [path, name] if directory in SAFE_DIRS else [path]


def _written_names(program: str) -> list[str]:
    """What a program is called as written, for a deny or require_approval pattern."""
    return [program, os.path.basename(program)] if program else []


def _matches(pattern: str, names: Sequence[str], args: Sequence[str]) -> bool:
    if " " in pattern:
        return any(fnmatch.fnmatchcase(" ".join([name, *args]), pattern) for name in names)
    wants_path = "/" in pattern
    return any(fnmatch.fnmatchcase(name, pattern) for name in names if ("/" in name) == wants_path)


def _words_match(pattern: str, names: Sequence[str], args: Sequence[str]) -> bool:
    """Whether a pattern with words (``git push*``, ``* --force*``) matches a command word by
    word, for deny and require_approval: its first word a name of the program, and each other
    word, in order, an argument of the command, whatever arguments come between them
    (``git -c x.y=z push``). A word that is a long option matches that option abbreviated as
    getopt takes it, to three letters (``--forc`` for ``--force*``), with ``=value`` or not."""
    words = pattern.split()
    if len(words) < 2 or not any(fnmatch.fnmatchcase(name, words[0]) for name in names):
        return False
    rest = iter(args)
    return all(any(_word_matches(word, arg) for arg in rest) for word in words[1:])


def _word_matches(word: str, arg: str) -> bool:
    if fnmatch.fnmatchcase(arg, word):
        return True
    if not word.startswith("--") or not arg.startswith("--"):
        return False
    option = arg.split("=", 1)[0]
    literal = re.split(r"[*?\[]", word, maxsplit=1)[0]  # the option as the word spells it
    return len(option) >= 5 and literal.startswith(option)


def _cautious(default: PolicyVerdict) -> PolicyVerdict:
    """The default, but never `allow`: for what no pattern vouches for."""
    return "deny" if default == "deny" else "approve"


def _stricter(first: PolicyDecision, second: PolicyDecision) -> PolicyDecision:
    if _STRICTNESS[second.verdict] > _STRICTNESS[first.verdict]:
        return second
    if _STRICTNESS[second.verdict] == _STRICTNESS[first.verdict] and first.verdict != "allow":
        return PolicyDecision(first.verdict, f"{first.reason}; and {second.reason}")
    return first


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
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise CapabilityConfigError(
            f"{where}: {unknown[0]}: unknown field; expected {', '.join(_FIELDS)}"
        )
    lists: dict[str, tuple[str, ...]] = {}
    for name in (*_LISTS, "env"):
        value = data.get(name, list(DEFAULT_ENV) if name == "env" else []) or []
        if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
            raise CapabilityConfigError(f"{where}: {name}: expected a list of patterns")
        lists[name] = tuple(value)
    if path_pattern := next((p for p in lists["env"] if fnmatch.fnmatchcase("PATH", p)), None):
        raise CapabilityConfigError(
            f"{where}: env: {path_pattern!r} would let a step set PATH, and run programs the "
            "policy never saw; a model-planned step runs on the sandbox's PATH"
        )
    default = data.get("default", "approve")
    if default not in _VERDICTS:
        raise CapabilityConfigError(
            f"{where}: default: expected one of {', '.join(_VERDICTS)}, got {default!r}"
        )
    return CommandPolicy(**lists, default=default, source=f"the policy {Path(path).name}")
