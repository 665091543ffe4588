"""The embedded verifier: machine checks on a job result, each one a `Finding` with evidence.

Every check yields a finding, passed or not, so the record shows what was verified and not only
what failed; a check that cannot be evaluated (bad JSON, a missing field, a pattern or a path
that an older engine accepted and this one refuses) is a failed finding, never an exception,
because a broken check must fail the step rather than the workflow.

Checks do work that grows with what a tenant wrote and a job printed (a pattern searched through
the output, the output parsed as JSON, the work directory walked), so they run off the event
loop, on threads of the verifier's own, within a time limit per step (docs/task.md). The one
check whose work does not grow so, an exit code (every step has one), is judged on the loop
when the output it reads is small: handing it to a thread and back cost more than judging it.

A finding quotes output and values with their secrets masked before they are quoted, escaped
or cut (`workflow_engine._masking`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from workflow_engine._masking import Secrets, for_workflow, step_secrets
from workflow_engine.domain.jobs import Finding, JobResult, Verification
from workflow_engine.domain.patterns import compile_pattern
from workflow_engine.domain.task import (
    AcceptanceCriterion,
    Check,
    Step,
    relative_path_problem,
)
from workflow_engine.errors import LinkOut, PatternError
from workflow_engine.sandbox import WORKER_NOTE, exists_beneath

log = structlog.get_logger(__name__)

#: How long one step's checks may take together; a check not judged by then fails, saying so.
CHECKS_TIMEOUT_SECONDS = 10.0
#: Threads that judge checks, shared by every workflow of the engine.
CHECK_THREADS = 2
_MAX_SHOWN = 200
_IMPLICIT_EXIT_CODE = Check(kind="exit_code", equals=0)
#: An exit-code check reads the last lines of stderr for the worker's note (`_worker_note`);
#: up to this many characters of stderr, that costs less than a thread's round trip.
_INLINE_STDERR_CHARS = 64 * 1024
# What to do about a failed check of each kind; the next attempt sees these lines.
_ADVICE = {
    "timeout": "make the command finish sooner or raise the step's timeout_seconds",
    "not_run": "see why the job did not run to its end (the worker's message) and try again",
    "exit_code": "make the command exit with the expected code",
    "stdout_contains": "make the command print the expected text on stdout",
    "stderr_contains": "make the command print the expected text on stderr",
    "stdout_matches": "make the command's stdout match the pattern",
    "file_exists": "make the command create the file (relative paths are in its work dir)",
    "json_field_equals": "make the command print JSON on stdout with the expected field value",
}


class MachineVerifier:
    """Judges a result by the step's `expect` checks and the task's machine criteria."""

    def __init__(
        self,
        *,
        timeout_seconds: float = CHECKS_TIMEOUT_SECONDS,
        threads: int = CHECK_THREADS,
        secrets: Secrets | None = None,
    ) -> None:
        self._timeout = timeout_seconds
        #: The engine's secrets: its credentials, and the step's own secrets, are masked in
        #: every finding (before it is quoted or cut); other workflows' are not (`for_workflow`).
        self._secrets = Secrets() if secrets is None else secrets  # an empty one is falsy
        # Threads of its own, not the loop's default executor: costly checks then wait for each
        # other, never for (or in front of) the engine's other work. Idle, they end with it.
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="checks")

    async def verify(
        self,
        step: Step,
        result: JobResult,
        criteria: Sequence[AcceptanceCriterion],
        preferences: Mapping[str, Any] | None = None,
        *,
        run_id: str = "",
        secrets: Collection[str] = (),
    ) -> Verification:
        """Return `pass` iff every check passed; one remediation line per failed finding."""
        findings: list[Finding] = []
        actions: list[str] = []
        masking = for_workflow(self._secrets, {*secrets, *step_secrets([step])})
        if result.status == "timeout":
            stderr = _shown(result.stderr, masking)
            detail = f"expected the job to finish, but it timed out; stderr {stderr}"
            findings.append(Finding(check="status", passed=False, detail=detail))
            actions.append(f"status: {detail}; {_ADVICE['timeout']}")
        elif result.status == "failed" and result.exit_code is None:
            # No exit code: the command never ended by itself (lost, refused by a worker node,
            # a worker error). Its stderr is the worker's reason, which the record must show.
            detail = f"the job did not run to its end: {_shown(result.stderr, masking)}"
            findings.append(Finding(check="status", passed=False, detail=detail))
            actions.append(f"status: {detail}; {_ADVICE['not_run']}")
        checks = step.expect
        if not any(check.kind == "exit_code" for check in checks):
            checks = (_IMPLICIT_EXIT_CODE, *checks)
        named = [(check.kind, check) for check in checks]
        named += [
            (f"criterion[{i}]:{c.check.kind}", c.check)
            for i, c in enumerate(criteria)
            if c.check is not None
        ]
        deadline = asyncio.get_running_loop().time() + self._timeout
        for name, check in named:
            finding = await self._judge(name, check, result, deadline, masking)
            findings.append(finding)
            if not finding.passed:
                advice = _ADVICE.get(check.kind, "fix the check or the command")
                actions.append(f"{name}: {finding.detail}; {advice}")
        verification = Verification(
            status="fail" if actions else "pass",
            findings=tuple(findings),
            recommended_actions=tuple(actions),
        )
        log.info(
            "step_verified",
            step_id=step.id,
            job_id=result.job_id,
            status=verification.status,
            failed=len(actions),
            checks=len(findings),
        )
        return verification

    async def _judge(
        self, name: str, check: Check, result: JobResult, deadline: float, masking: Secrets
    ) -> Finding:
        """`check`'s finding, judged on the verifier's threads (an exit code on small output:
        here, see the module's docstring); failed if not done by `deadline`.

        A search that runs past the deadline is left to finish on its thread (RE2 cannot be
        interrupted); its size is bounded (`domain.patterns`), so the thread comes back.
        """
        loop = asyncio.get_running_loop()
        left = deadline - loop.time()
        if left > 0 and check.kind == "exit_code" and len(result.stderr) <= _INLINE_STDERR_CHARS:
            return _evaluate(name, check, result, masking)
        judged = loop.run_in_executor(self._threads, _evaluate, name, check, result, masking)
        try:
            async with asyncio.timeout(max(0.0, left)):
                return await judged
        except TimeoutError:
            detail = f"not judged: the step's checks took longer than {self._timeout:g} s"
            return Finding(check=name, passed=False, detail=detail)


def _worker_note(stderr: str) -> str:
    """The local worker's last note on how the job ended (e.g. the limit it hit), if any."""
    for line in reversed(stderr.splitlines()[-5:]):
        if line.startswith(WORKER_NOTE):
            return "the worker says: " + line.removeprefix(WORKER_NOTE)
    return ""


def _evaluate(name: str, check: Check, result: JobResult, secrets: Secrets) -> Finding:
    try:
        passed, detail = _run_check(check, result, secrets)
    except Exception as exc:  # a broken check is a failed finding, never a crash
        return Finding(check=name, passed=False, detail=f"check could not run: {exc}")
    return Finding(check=name, passed=passed, detail=detail)


def _run_check(check: Check, result: JobResult, secrets: Secrets) -> tuple[bool, str]:
    kind = check.kind
    if kind == "exit_code":
        expected = 0 if check.equals is None else int(check.equals)
        detail = f"expected exit code {expected}, got {result.exit_code} (status {result.status})"
        note = _worker_note(result.stderr)
        return result.exit_code == expected, f"{detail}; {note}" if note else detail
    if kind in ("stdout_contains", "stderr_contains"):
        stream = "stdout" if kind == "stdout_contains" else "stderr"
        text = result.stdout if stream == "stdout" else result.stderr
        return (
            check.value in text,
            f"expected {stream} to contain {_shown(check.value, secrets)}, "
            f"got {_shown(text, secrets)}",
        )
    if kind == "stdout_matches":
        try:
            pattern = compile_pattern(check.value)
        except PatternError as exc:  # stored by an older engine, which took Python's syntax
            return False, f"pattern /{_clipped(check.value, secrets)}/ cannot be judged: {exc}"
        return (
            pattern.search(result.stdout),
            f"expected stdout to match /{_clipped(check.value, secrets)}/, "
            f"got {_shown(result.stdout, secrets)}",
        )
    if kind == "file_exists":
        return _file_exists(check.value, result.work_dir, secrets)
    if kind == "json_field_equals":
        if result.truncated.stdout:
            return False, "stdout was truncated by the worker, so it cannot be read as JSON"
        actual = _json_field(json.loads(result.stdout), check.field)
        return (
            _json_equal(actual, check.equals),
            f"expected stdout JSON field {check.field!r} to equal "
            f"{_json_shown(check.equals, secrets)}, got {_json_shown(actual, secrets)}",
        )
    return False, f"unknown check kind {kind!r}"


def _file_exists(value: str, work_dir: str | None, secrets: Secrets) -> tuple[bool, str]:
    """Whether `value` names a file in the job's work dir (`beneath`: no link out of it).

    The detail names the file as the check gave it: a client reads it (findings, the error, the
    next attempt's remediation), and the work dir's absolute path is the server's business.
    """
    named = _shown(value, secrets)
    problem = relative_path_problem(value)
    if problem:  # stored by an older engine, which took absolute paths
        return False, f"refused path {named}: {problem}"
    if work_dir is None:
        return False, f"expected file {named}, but the result has no work directory"
    try:
        exists = exists_beneath(work_dir, value)
    except LinkOut:
        return False, (
            f"expected file {named} in the work dir, but its path goes through a symbolic "
            "link out of the work dir, which checks do not follow"
        )
    except OSError as exc:  # its message would carry the absolute path
        return False, f"expected file {named} in the work dir, but it cannot be checked: " + (
            exc.strerror or type(exc).__name__
        )
    return (
        exists,
        f"expected file {named} to exist in the work dir, {'found' if exists else 'missing'}",
    )


def _json_field(document: Any, dotted: str) -> Any:
    value = document
    for segment in dotted.split("."):
        if isinstance(value, list):
            try:
                value = value[int(segment)]
            except (ValueError, IndexError):
                raise LookupError(f"no list element {segment!r} in field {dotted!r}") from None
        elif isinstance(value, dict):
            if segment not in value:
                raise LookupError(f"no key {segment!r} in field {dotted!r}")
            value = value[segment]
        else:
            raise LookupError(f"cannot take {segment!r} of a {type(value).__name__} in {dotted!r}")
    return value


def _json_equal(actual: Any, expected: Any) -> bool:
    """Equality as JSON means it: 1 == 1.0, but booleans are not numbers."""
    if isinstance(actual, bool) or isinstance(expected, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(actual, int | float) and isinstance(expected, int | float):
        return actual == expected  # exact across int and float, unlike comparing floats
    if isinstance(actual, list) and isinstance(expected, list | tuple):
        return len(actual) == len(expected) and all(
            _json_equal(a, e) for a, e in zip(actual, expected, strict=True)
        )
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(
            _json_equal(actual[k], expected[k]) for k in actual
        )
    return bool(actual == expected)


def _clipped(text: str, secrets: Secrets) -> str:
    """`text` unquoted (a pattern between slashes), masked, then cut to its head when long."""
    part, cut = secrets.redact_part(text, _MAX_SHOWN, "head")
    return f"{part}... ({len(text)} chars)" if cut else part


def _shown(text: str, secrets: Secrets) -> str:
    """`text` quoted for a finding's detail, cut to its head when long."""
    return secrets.quoted(text, _MAX_SHOWN)


def _json_shown(value: Any, secrets: Secrets) -> str:
    """`value` as JSON for a finding's detail, cut to its head when long. The secrets are
    masked as JSON writes them (`secrets.forms`), before the text is cut."""
    text = json.dumps(value)
    part, cut = secrets.redact_part(text, _MAX_SHOWN)
    return f"{part}... ({len(text)} chars)" if cut else part
