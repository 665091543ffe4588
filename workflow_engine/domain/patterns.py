r"""`stdout_matches` patterns: RE2 syntax, searched in time linear in the output.

A pattern is a tenant's (or a model's) input, and the text it is searched in a job's output.
Python's `re` backtracks: ``(a+)+$`` over 26 ``a`` and a ``!`` takes seconds; over 40, days.
RE2 never backtracks; it refuses what needs backtracking (backreferences, lookaround) when
the pattern is compiled, so a task with one is refused at start. Linear is not free, so what
RE2 is given is bounded as well. Compiling is done where the task is checked, at the API edge,
and costs a few microseconds per character, a quarter of a millisecond per large Unicode class
(``\pL``) and tens of microseconds per counted repetition: so one pattern, and the patterns of
one plan together (`check_together`), are bounded in each. A search costs up to the compiled
program's size per character of output (`MAX_PROGRAM_SIZE`).

One difference from Python is smoothed over: as in Python, ``$`` (without ``(?m)``) also
matches before a newline that ends the text, because commands end their output with one.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import re2

from workflow_engine.errors import PatternError

#: The longest pattern.
MAX_PATTERN_CHARS = 1024
#: Unicode property classes (``\pL``, ``\P{Greek}``) one pattern may name.
MAX_UNICODE_CLASSES = 4
#: What the different patterns of one plan (or of one task's criteria) may add up to: at worst
#: some 60 ms of compiling for a request, on the event loop that serves it.
MAX_PATTERNS = 64
MAX_PATTERNS_CHARS = 4096
MAX_PATTERNS_UNICODE_CLASSES = 16
#: The counts of a pattern's counted repetitions (``{n}``, ``{n,m}``), added up; RE2 writes each
#: repetition out that many times.
MAX_COUNTED = 2000
#: The largest compiled program accepted, in RE2 instructions. The worst search costs a few
#: nanoseconds per instruction and character (1 to 2 s for 64 KiB on 2 shared cores at this
#: size); typical patterns are far smaller (``^\d+ passed$`` is 12, ``\pL+`` 1,201).
MAX_PROGRAM_SIZE = 2000
#: RE2's memory budget for one pattern (its program and its DFA cache), instead of 8 MiB. It
#: fits programs of `MAX_PROGRAM_SIZE` and stops compiling larger ones early (3 ms, not 30, for
#: a pattern of 1,000 classes); the `re2` module keeps its last 128 compiled patterns.
_MAX_MEM = 64 << 10
_UNICODE_CLASS = re.compile(r"\\[pP]")
_COUNTED = re.compile(r"\{(\d+)(?:,(\d*))?\}")


@dataclass(frozen=True, slots=True)
class Pattern:
    """A compiled pattern; `search` says whether it matches anywhere in a text."""

    _regexp: Any  # re2's compiled pattern (the module has no type hints)
    #: Whether the pattern may hold a `$` (the text without its final newline is searched too).
    _dollar: bool

    def search(self, text: str) -> bool:
        if self._regexp.search(text) is not None:
            return True
        # Python's `$` also matches before a final newline; RE2's only at the very end. Without
        # a `$`, a match before that newline would have been a match in the whole text.
        return self._dollar and text.endswith("\n") and self._regexp.search(text[:-1]) is not None


def compile_pattern(pattern: str) -> Pattern:
    """`pattern` compiled by RE2; `PatternError` saying why when RE2 will not run it."""
    _within_bounds(pattern)
    options = re2.Options()
    options.max_mem = _MAX_MEM
    options.log_errors = False  # the reason is in the error; RE2 would print it to stderr too
    try:
        regexp = re2.compile(pattern, options)
    except re2.error as exc:
        raise PatternError(_reason(exc)) from None
    if regexp.programsize > MAX_PROGRAM_SIZE:
        raise PatternError(
            f"compiles to {regexp.programsize} RE2 instructions, more than {MAX_PROGRAM_SIZE}"
        )
    return Pattern(regexp, "$" in pattern)


def check_together(patterns: Collection[str]) -> None:
    """`PatternError` when `patterns` (all different) would cost too much to compile together.

    Cheap, so that input is refused before any of its patterns is compiled. A pattern that one
    alone would refuse is left out: its own check names it, and compiles nothing.
    """
    patterns = [pattern for pattern in patterns if _fits(pattern)]
    if len(patterns) > MAX_PATTERNS:
        raise PatternError(f"more than {MAX_PATTERNS} different stdout_matches patterns")
    chars = sum(len(pattern) for pattern in patterns)
    if chars > MAX_PATTERNS_CHARS:
        raise PatternError(f"patterns of {chars} characters in all, more than {MAX_PATTERNS_CHARS}")
    classes = sum(len(_UNICODE_CLASS.findall(pattern)) for pattern in patterns)
    if classes > MAX_PATTERNS_UNICODE_CLASSES:
        raise PatternError(
            f"{classes} Unicode classes (\\p, \\P) in all, more than {MAX_PATTERNS_UNICODE_CLASSES}"
        )


def _within_bounds(pattern: str) -> None:
    """Refuse, before RE2 spends time on it, a pattern that costs too much to compile."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"longer than {MAX_PATTERN_CHARS} characters")
    if len(_UNICODE_CLASS.findall(pattern)) > MAX_UNICODE_CLASSES:
        raise PatternError(f"more than {MAX_UNICODE_CLASSES} Unicode classes (\\p, \\P)")
    counted = sum(int(most or least) for least, most in _COUNTED.findall(pattern))
    if counted > MAX_COUNTED:
        raise PatternError(f"counted repetitions add up to {counted}, more than {MAX_COUNTED}")


def _fits(pattern: str) -> bool:
    try:
        _within_bounds(pattern)
    except PatternError:
        return False
    return True


def _reason(exc: Exception) -> str:
    """RE2's message (bytes, from C++) as text, without the pattern it quotes at length."""
    message = exc.args[0] if exc.args else ""
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    hint = "RE2 syntax: no backreferences, lookaround, atomic groups"
    return f"RE2 refuses it: {str(message)[:200]} ({hint})"
