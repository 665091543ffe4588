"""Each machine check yields a finding; the verdict passes only when all of them do."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from workflow_engine.capabilities._machine_verifier import MachineVerifier
from workflow_engine.domain import AcceptanceCriterion, Check, Step
from workflow_engine.domain.jobs import JobResult, TruncatedStreams, Verification
from workflow_engine.sandbox import WORKER_NOTE

STEP = Step(id="s", command=("true",))


def result(**changes: Any) -> JobResult:
    base = JobResult(
        task_id="t",
        job_id="j",
        status="completed",
        exit_code=0,
        stdout="",
        stderr="",
        started_at="2024-01-01T00:00:00.000Z",
        ended_at="2024-01-01T00:00:01.000Z",
    )
    if changes.pop("stdout_truncated", False):
        changes["truncated"] = TruncatedStreams(stdout=True)
    return base.model_copy(update=changes)


async def verify(
    *checks: Check,
    criteria: tuple[AcceptanceCriterion, ...] = (),
    **changes: Any,
) -> Verification:
    step = STEP.model_copy(update={"expect": checks})
    return await MachineVerifier().verify(step, result(**changes), criteria)


def only(verification: Verification, name: str) -> bool:
    [finding] = [f for f in verification.findings if f.check == name]
    return finding.passed


async def test_implicit_exit_code_zero() -> None:
    ok = await verify()
    assert ok.status == "pass"
    assert [f.check for f in ok.findings] == ["exit_code"]
    assert ok.recommended_actions == ()

    bad = await verify(status="failed", exit_code=2)
    assert bad.status == "fail"
    assert "expected exit code 0, got 2" in bad.findings[0].detail
    assert len(bad.recommended_actions) == 1


async def test_explicit_exit_code_replaces_the_implicit_one() -> None:
    v = await verify(Check(kind="exit_code", equals=3), status="failed", exit_code=3)
    assert v.status == "pass"
    assert len(v.findings) == 1


async def test_timeout_is_always_a_failed_finding() -> None:
    v = await verify(Check(kind="exit_code", equals=0), status="timeout", exit_code=0)
    assert v.status == "fail"
    assert not only(v, "status")
    assert "timed out" in v.recommended_actions[0]


@pytest.mark.parametrize(
    ("check", "stdout", "stderr", "passed"),
    [
        (Check(kind="stdout_contains", value="lo w"), "hello world", "", True),
        (Check(kind="stdout_contains", value="bye"), "hello world", "", False),
        (Check(kind="stderr_contains", value="warn"), "", "a problem", False),
        (Check(kind="stderr_contains", value="warn"), "", "warn: x", True),
        (Check(kind="stdout_matches", value=r"^\d+ passed$"), "ok\n12 passed\n", "", False),
        (Check(kind="stdout_matches", value=r"(?m)^\d+ passed$"), "ok\n12 passed\n", "", True),
        # As in Python, `$` matches at the end and before a newline that ends the output.
        (Check(kind="stdout_matches", value=r"^\d+ passed$"), "12 passed\n", "", True),
        (Check(kind="stdout_matches", value=r"^\d+ passed$"), "12 passed", "", True),
        (Check(kind="stdout_matches", value=r"^\d+ passed$"), "12 passed\n\n", "", False),
        (Check(kind="stdout_matches", value=r"(a+)+$"), "a" * 100_000 + "!", "", False),
    ],
)
async def test_text_checks(check: Check, stdout: str, stderr: str, passed: bool) -> None:
    v = await verify(check, stdout=stdout, stderr=stderr)
    assert only(v, check.kind) is passed
    assert v.status == ("pass" if passed else "fail")


async def test_long_actual_values_are_truncated_in_details() -> None:
    v = await verify(Check(kind="stdout_contains", value="needle"), stdout="x" * 10_000)
    detail = v.findings[-1].detail
    assert "needle" in detail
    assert len(detail) < 400
    assert "10000 chars" in detail


async def test_file_exists_resolves_relative_paths_in_the_work_dir(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.txt").write_text("x")
    present = Check(kind="file_exists", value="out/report.txt")
    missing = Check(kind="file_exists", value="out/nope.txt")
    # An older engine took absolute paths: one it stored is refused, even for a file that exists.
    absolute = Check.from_json({"kind": "file_exists", "value": str(tmp_path / "out")})

    v = await verify(present, missing, absolute, work_dir=str(tmp_path))

    assert only(v, "exit_code")
    assert [f.passed for f in v.findings if f.check == "file_exists"] == [True, False, False]
    assert "not an absolute one" in v.findings[-1].detail
    assert v.status == "fail"
    assert len(v.recommended_actions) == 2


async def test_file_exists_names_the_file_as_the_check_gave_it(tmp_path: Path) -> None:
    # Findings and actions reach the client; the work dir's absolute path is the server's.
    (tmp_path / "here.txt").write_text("x")
    present = Check(kind="file_exists", value="here.txt")
    missing = Check(kind="file_exists", value="sub/gone.txt")

    v = await verify(present, missing, work_dir=str(tmp_path))

    details = [f.detail for f in v.findings if f.check == "file_exists"]
    assert details == [
        "expected file 'here.txt' to exist in the work dir, found",
        "expected file 'sub/gone.txt' to exist in the work dir, missing",
    ]
    assert not any(str(tmp_path) in text for text in [*details, *v.recommended_actions])


async def test_file_exists_refuses_to_leave_the_work_dir(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "secret").write_text("x")  # exists, but outside the work dir
    stored = Check.from_json({"kind": "file_exists", "value": "../secret"})  # an older engine's
    v = await verify(stored, work_dir=str(work))
    assert not only(v, "file_exists")
    assert "refused" in v.findings[-1].detail


@pytest.mark.parametrize(
    ("path", "passed", "detail"),
    [
        ("alias", True, "found"),  # -> real.txt
        ("up/real.txt", True, "found"),  # -> sub/..: climbs, but not past the work dir
        ("sub/deep/real.txt", True, "found"),  # -> ../..
        ("dangling", False, "missing"),  # -> nothing
        ("real.txt/more", False, "missing"),  # nothing is beneath a file
        ("host", False, "link out of the work dir"),  # -> / : absolute
        ("host/etc/passwd", False, "link out of the work dir"),
        ("sneaky", False, "link out of the work dir"),  # -> sub/../..: above the work dir
        ("sneaky/work/real.txt", False, "link out of the work dir"),  # ...and back into it
        ("loop", False, "cannot be checked"),  # -> loop: too many links
    ],
)
async def test_file_exists_follows_links_only_while_they_stay_in_the_work_dir(
    tmp_path: Path, path: str, passed: bool, detail: str
) -> None:
    work = tmp_path / "work"
    (work / "sub" / "deep").mkdir(parents=True)
    (work / "real.txt").write_text("x")
    links = {
        "alias": "real.txt",
        "up": "sub/..",
        "sub/deep/real.txt": "../../real.txt",
        "dangling": "nothing",
        "host": "/",
        "sneaky": "sub/../..",
        "loop": "loop",
    }
    for name, target in links.items():
        (work / name).symlink_to(target)

    v = await verify(Check(kind="file_exists", value=path), work_dir=str(work))

    assert only(v, "file_exists") is passed
    assert detail in v.findings[-1].detail
    assert str(tmp_path) not in v.findings[-1].detail


async def test_file_exists_without_a_work_dir_fails() -> None:
    v = await verify(Check(kind="file_exists", value="x"), work_dir=None)
    assert not only(v, "file_exists")


@pytest.mark.parametrize(
    ("field", "equals", "passed"),
    [
        ("a.b", 1, True),
        ("a.b", 1.0, True),
        ("a.b", 2, False),
        ("a.b", True, False),  # a boolean is not the number 1
        ("items.1.name", "second", True),
        ("items.0.name", "second", False),
        ("flag", True, True),
        ("nothing", None, True),
        ("obj", {"x": [1, 2.0]}, True),
    ],
)
async def test_json_field_equals(field: str, equals: Any, passed: bool) -> None:
    stdout = json.dumps(
        {
            "a": {"b": 1},
            "items": [{"name": "first"}, {"name": "second"}],
            "flag": True,
            "nothing": None,
            "obj": {"x": [1.0, 2]},
        }
    )
    v = await verify(Check(kind="json_field_equals", field=field, equals=equals), stdout=stdout)
    assert only(v, "json_field_equals") is passed


@pytest.mark.parametrize(
    ("stdout", "field", "error"),
    [
        ("not json", "a", "could not run"),
        ('{"a": 1}', "b", "no key 'b'"),
        ('{"a": [1]}', "a.5", "no list element '5'"),
        ('{"a": [1]}', "a.x", "no list element 'x'"),
        ('{"a": 1}', "a.b", "cannot take 'b'"),
    ],
)
async def test_json_field_problems_are_failed_findings(stdout: str, field: str, error: str) -> None:
    v = await verify(Check(kind="json_field_equals", field=field, equals=1), stdout=stdout)
    assert v.status == "fail"
    assert not only(v, "json_field_equals")
    assert error in v.findings[-1].detail


async def test_json_field_detail_shows_expected_and_actual() -> None:
    check = Check(kind="json_field_equals", field="n", equals=2)
    v = await verify(check, stdout='{"n": "2"}')
    assert v.findings[-1].detail == "expected stdout JSON field 'n' to equal 2, got \"2\""


async def test_json_field_on_truncated_stdout_fails_clearly() -> None:
    check = Check(kind="json_field_equals", field="a", equals=1)
    v = await verify(check, stdout='{"a": 1, "b": "', stdout_truncated=True)
    assert not only(v, "json_field_equals")
    assert "truncated" in v.findings[-1].detail


async def test_a_broken_check_is_a_failed_finding_not_an_exception() -> None:
    # A check the model refuses to build (as a row stored under older rules might hold).
    broken = Check.model_construct(kind="stdout_matches", value="(", field="", equals=None)
    v = await verify(broken, stdout="x")
    assert not only(v, "stdout_matches")
    # One an older engine stored, in Python's syntax, which RE2 does not run: judged as failed.
    python_only = Check.from_json({"kind": "stdout_matches", "value": r"(a)\1"})
    v = await verify(python_only, stdout="aa")
    assert not only(v, "stdout_matches")
    assert "cannot be judged: RE2 refuses it" in v.findings[-1].detail
    v = await verify(Check.model_construct(kind="no_such_kind", value="x", field="", equals=None))
    assert not only(v, "no_such_kind")


async def test_checks_not_judged_in_the_steps_time_fail_saying_so() -> None:
    # Linear, yet slow: RE2 runs this one at a few microseconds per character of output.
    costly = Check(kind="stdout_matches", value="(a|b)*a(a|b){500}c")
    output = "ab" * 40_000
    step = STEP.model_copy(update={"expect": (costly, Check(kind="exit_code", equals=0))})
    verifier = MachineVerifier(timeout_seconds=0.05)

    v = await verifier.verify(step, result(stdout=output), ())

    assert [(f.check, f.passed) for f in v.findings] == [
        ("stdout_matches", False),
        ("exit_code", False),  # the step's time ran out: not judged either
    ]
    assert all(
        "not judged: the step's checks took longer than 0.05 s" in f.detail for f in v.findings
    )


async def test_criteria_with_checks_are_evaluated_too() -> None:
    criteria = (
        AcceptanceCriterion(description="prose only"),
        AcceptanceCriterion(description="says hi", check=Check(kind="stdout_contains", value="hi")),
        AcceptanceCriterion(
            description="says bye", check=Check(kind="stdout_contains", value="bye")
        ),
    )
    v = await verify(criteria=criteria, stdout="hi there")
    assert [f.check for f in v.findings] == [
        "exit_code",
        "criterion[1]:stdout_contains",
        "criterion[2]:stdout_contains",
    ]
    assert [f.passed for f in v.findings] == [True, True, False]
    assert v.status == "fail"
    assert len(v.recommended_actions) == 1
    assert v.recommended_actions[0].startswith("criterion[2]:stdout_contains")


async def test_a_job_that_did_not_run_to_its_end_is_a_finding_with_the_workers_reason() -> None:
    reason = "node gpu-1 refused the job: HTTP 401 Unauthorized: Invalid or missing bearer token"
    v = await verify(status="failed", exit_code=None, stderr=reason)
    assert v.status == "fail"
    status = [f for f in v.findings if f.check == "status"]
    assert len(status) == 1 and reason in status[0].detail and not status[0].passed
    assert any(reason in action for action in v.recommended_actions)
    ran = await verify(status="failed", exit_code=3, stderr="boom")  # it ran: its exit code says
    assert [f.check for f in ran.findings] == ["exit_code"]


async def test_an_exit_code_is_judged_while_other_steps_checks_hold_every_thread() -> None:
    """Another workflow's slow pattern checks (another tenant's, say) take the verifier's
    threads; a step that checks only its exit code is still judged at once, not failed as
    "not judged" when the step's time runs out."""
    costly = Check(kind="stdout_matches", value="(a|b)*a(a|b){500}c")
    slow_step = STEP.model_copy(update={"expect": (costly,)})
    verifier = MachineVerifier(timeout_seconds=0.5, threads=1)
    slow = asyncio.create_task(verifier.verify(slow_step, result(stdout="ab" * 400_000), ()))
    await asyncio.sleep(0.05)  # the slow search has the only thread

    v = await verifier.verify(STEP, result(), ())

    assert [(f.check, f.passed) for f in v.findings] == [("exit_code", True)], v.findings
    assert not slow.done()
    await slow


async def test_an_exit_code_check_on_a_long_stderr_still_finds_the_workers_note() -> None:
    """Past `_INLINE_STDERR_CHARS` the check goes to the threads; its finding is the same."""
    for noise in ("x" * 10 + "\n", "x" * 100_000 + "\n"):
        stderr = noise + f"{WORKER_NOTE}the job used more memory than its limit\n"
        v = await verify(status="failed", exit_code=137, stderr=stderr)
        assert not only(v, "exit_code")
        assert "the worker says: the job used more memory" in v.findings[0].detail
