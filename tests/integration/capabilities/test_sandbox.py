"""The local sandbox worker, with real processes in a temporary jobs directory.

Commands here that must run at most once append to a marker file outside their work directory,
so a second run would show up as a second line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import granted_confinement, job_pids, unique_sleep
from workflow_engine.capabilities import LocalSandboxWorker
from workflow_engine.domain import JobRequest, Sandbox
from workflow_engine.sandbox import Confinement, Grant, JobRunner
from workflow_engine.sandbox import _files as files

REPO_ROOT = Path(__file__).resolve().parents[3]
# A broken re-attach or lost-job check shows up as a wait that never ends; fail it instead.
pytestmark = pytest.mark.timeout(30)


def job(job_id: str, *command: str, **fields: Any) -> JobRequest:
    """A job; `env`, `timeout_seconds` and `image` go to its sandbox, the rest to the request."""
    sandbox = {k: fields.pop(k) for k in ("env", "timeout_seconds", "image") if k in fields}
    return JobRequest(
        task_id="task-1", job_id=job_id, sandbox=Sandbox(command=command, **sandbox), **fields
    )


_opened: list[LocalSandboxWorker] = []


def worker(tmp_path: Path, **options: Any) -> LocalSandboxWorker:
    """A sandbox on `tmp_path`; `close_workers` closes it after the test."""
    options.setdefault("confinement", granted_confinement())
    sandbox = LocalSandboxWorker(jobs_dir=tmp_path / "jobs", **options)
    _opened.append(sandbox)
    return sandbox


@pytest.fixture(autouse=True)
async def close_workers() -> AsyncIterator[None]:
    """Close every sandbox the test opened, as the engine does on its way out: its runner's
    namespace helper (`jobwrap --namespaces`) and pipe go with it, not at the end of the run."""
    yield
    while _opened:
        await _opened.pop().__aexit__(None, None, None)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def process_gone(pid: int) -> bool:
    """True when `pid` has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


async def exited_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    process = await asyncio.create_subprocess_exec("true")
    await process.wait()
    return process.pid


async def test_select_target_is_local(tmp_path: Path) -> None:
    assert await worker(tmp_path).select_target(job("j", "true")) == "local"


async def test_echo_completes_with_output_and_layout(tmp_path: Path) -> None:
    result = await worker(tmp_path).run(
        "local", job("echo-1", "sh", "-c", "echo hello; echo oops >&2; pwd")
    )
    assert result.status == "completed"
    assert result.exit_code == 0
    assert result.target == "local"
    job_dir = (tmp_path / "jobs" / "echo-1").resolve()
    assert result.work_dir == str(job_dir / "work")
    assert result.stdout == f"hello\n{job_dir / 'work'}\n"
    assert result.stderr == "oops\n"
    assert not result.truncated.stdout
    assert not result.truncated.stderr
    assert result.started_at.endswith("Z")
    assert result.started_at <= result.ended_at
    assert json.loads((job_dir / "request.json").read_text())["job_id"] == "echo-1"
    assert json.loads((job_dir / "result.json").read_text())["status"] == "completed"
    # jobwrap makes its log only when it has something to say: a job that went well has none.
    assert not (job_dir / "supervisor.log").exists()


async def test_non_zero_exit_is_failed(tmp_path: Path) -> None:
    result = await worker(tmp_path).run("local", job("fail-1", "sh", "-c", "exit 3"))
    assert result.status == "failed"
    assert result.exit_code == 3


async def test_argv_is_not_run_through_a_shell(tmp_path: Path) -> None:
    result = await worker(tmp_path).run("local", job("argv-1", "echo", "$HOME; echo injected"))
    assert result.stdout == "$HOME; echo injected\n"


async def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    sleeper = unique_sleep(30)
    script = f"sleep {sleeper} & sleep 5"
    started = time.monotonic()
    result = await worker(tmp_path).run(
        "local", job("timeout-1", "sh", "-c", script, timeout_seconds=1)
    )
    elapsed = time.monotonic() - started
    assert result.status == "timeout"
    assert result.exit_code is None
    assert "timed out after 1 s" in result.stderr
    assert 0.9 <= elapsed < 3
    # SIGKILLed with the group before the result: gone as soon as the kernel has run its exit.
    await wait_until(lambda: not job_pids(sleeper), timeout=2)


async def test_default_timeout_applies_when_the_job_has_none(tmp_path: Path) -> None:
    sandbox = worker(tmp_path, default_timeout_seconds=1)
    result = await sandbox.run("local", job("timeout-2", "sleep", "5"))
    assert result.status == "timeout"


async def test_output_is_truncated_to_the_head(tmp_path: Path) -> None:
    script = (
        "printf 'a%.0s' $(seq 1 500); printf 'b%.0s' $(seq 1 500); printf 'e%.0s' $(seq 1 50) >&2"
    )
    result = await worker(tmp_path, max_output_bytes=100).run(
        "local", job("trunc-1", "sh", "-c", script)
    )
    assert result.stdout == "a" * 100
    assert result.truncated.stdout
    assert result.stderr == "e" * 50
    assert not result.truncated.stderr


async def test_job_environment_is_isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_SECRET_FOR_TEST", "s3cret")
    request = job(
        "env-1",
        "env",
        env={"STEP_VAR": "from-step"},
        attempt=2,
        remediation=("fix exit_code", "fix file"),
    )
    result = await worker(tmp_path).run("local", request)
    env = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert "ENGINE_SECRET_FOR_TEST" not in env
    assert "s3cret" not in result.stdout
    assert env["STEP_VAR"] == "from-step"
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert env["HOME"] == result.work_dir
    assert env["TMPDIR"] == result.work_dir
    assert env["LANG"] == "C.UTF-8"
    assert env["WORKFLOW_ENGINE_TASK_ID"] == "task-1"
    assert env["WORKFLOW_ENGINE_JOB_ID"] == "env-1"
    assert env["WORKFLOW_ENGINE_ATTEMPT"] == "2"
    assert json.loads(env["WORKFLOW_ENGINE_REMEDIATION"]) == ["fix exit_code", "fix file"]


def test_job_env_is_built_only_from_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine also starts the supervisor with a minimal environment; this pins down that the
    # supervisor adds nothing of its own either, whatever it inherited.
    monkeypatch.setenv("ENGINE_SECRET_FOR_TEST", "s3cret")
    request = job("env-2", "env", env={"STEP_VAR": "x", "PATH": "/opt/bin"}).to_json()
    env = files.job_env(request, tmp_path)
    assert set(env) == {
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "PWD",
        "STEP_VAR",
        "WORKFLOW_ENGINE_TASK_ID",
        "WORKFLOW_ENGINE_JOB_ID",
        "WORKFLOW_ENGINE_ATTEMPT",
        "WORKFLOW_ENGINE_REMEDIATION",
        "WORKFLOW_ENGINE_CONTEXT",
    }
    assert env["PATH"] == "/opt/bin"  # the step may choose its own PATH
    assert env["WORKFLOW_ENGINE_REMEDIATION"] == "[]"


async def test_missing_program_is_failed_127(tmp_path: Path) -> None:
    result = await worker(tmp_path).run("local", job("missing-1", "no-such-program-xyz", "arg"))
    assert result.status == "failed"
    assert result.exit_code == 127
    assert "no-such-program-xyz" in result.stderr


async def test_non_executable_program_is_failed_126(tmp_path: Path) -> None:
    program = tmp_path / "not-executable"
    program.write_text("#!/bin/sh\necho hi\n")
    program.chmod(0o644)
    result = await worker(tmp_path).run("local", job("noexec-1", str(program)))
    assert result.status == "failed"
    assert result.exit_code == 126


async def test_same_job_id_runs_once(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    request = job("once-1", "sh", "-c", f"echo ran >> {marker}; echo out")
    first = await worker(tmp_path).run("local", request)
    second = await worker(tmp_path).run("local", request)
    assert first.status == "completed"
    assert second == first
    assert lines(marker) == ["ran"]


async def test_unsafe_job_ids_stay_inside_the_jobs_dir(tmp_path: Path) -> None:
    result = await worker(tmp_path).run("local", job("../../escape", "true"))
    assert result.status == "completed"
    assert not (tmp_path / "escape").exists()
    [job_dir] = [p for p in (tmp_path / "jobs").iterdir() if not p.name.startswith(".")]
    assert job_dir.name.startswith("job-")


async def engine_killed_mid_job(
    jobs_dir: Path, job_id: str, command: tuple[str, ...], marker: Path, **sandbox: Any
) -> None:
    """Start `command` from a separate engine process, SIGKILLed once the job has started.

    That engine is the job's parent and its only waiter, so nothing recorded a result.
    """
    engine = textwrap.dedent(
        f"""
        import asyncio
        from pathlib import Path
        from workflow_engine.domain.jobs import JobRequest, Sandbox
        from workflow_engine.capabilities.workers._local import LocalSandboxWorker
        from workflow_engine.sandbox import Confinement

        job = JobRequest(
            task_id="task-1",
            job_id={job_id!r},
            sandbox=Sandbox(command={command!r}, **{sandbox!r}),
        )
        confinement = Confinement(writable_paths={granted_confinement().writable_paths!r})
        worker = LocalSandboxWorker(jobs_dir=Path({str(jobs_dir)!r}), confinement=confinement)
        asyncio.run(worker.run("local", job))
        """
    )
    doomed = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        engine,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not lines(marker):
            assert time.monotonic() < deadline, "the job never started"
            assert doomed.returncode is None, "the engine process exited early"
            await asyncio.sleep(0.02)
    finally:
        doomed.send_signal(signal.SIGKILL)
        await doomed.wait()
    assert not (jobs_dir / job_id / "result.json").exists()


def wrapper_pid(tmp_path: Path, job_id: str) -> int:
    return int((tmp_path / "jobs" / job_id / "supervisor.pid").read_text())


async def wait_until(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


async def test_reattach_after_the_engine_is_killed(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    command = ("sh", "-c", f"echo ran >> {marker}; sleep 1.5; echo finished")
    await engine_killed_mid_job(tmp_path / "jobs", "reattach-1", command, marker)

    fresh = worker(tmp_path)
    result = await fresh.run("local", job("reattach-1", *command))

    assert result.status == "completed"
    assert result.stdout == "finished\n"
    assert lines(marker) == ["ran"]


async def test_a_job_that_ended_while_no_engine_ran_is_read_from_its_files(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "marker"
    command = ("sh", "-c", f"echo ran >> {marker}; sleep 0.3; echo finished; exit 4")
    await engine_killed_mid_job(tmp_path / "jobs", "ended-1", command, marker)
    job_dir = tmp_path / "jobs" / "ended-1"
    pid = wrapper_pid(tmp_path, "ended-1")
    await wait_until(lambda: process_gone(pid))  # ended with nobody waiting on it
    assert (job_dir / "exit_status").read_text() == "4\n"

    result = await worker(tmp_path).run("local", job("ended-1", *command))

    assert result.status == "failed"
    assert result.exit_code == 4
    assert result.stdout == "finished\n"
    assert result.started_at < result.ended_at
    assert lines(marker) == ["ran"]
    assert json.loads((job_dir / "result.json").read_text())["exit_code"] == 4


async def test_the_deadline_holds_without_an_engine(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    sleeper = unique_sleep(30)
    script = f"sleep {sleeper} & echo ran >> {marker}; sleep 30"
    await engine_killed_mid_job(
        tmp_path / "jobs", "deadline-1", ("sh", "-c", script), marker, timeout_seconds=1
    )
    pid = wrapper_pid(tmp_path, "deadline-1")
    await wait_until(lambda: process_gone(pid), timeout=5)
    await wait_until(lambda: not job_pids(sleeper), timeout=2)

    result = await worker(tmp_path).run(
        "local", job("deadline-1", "sh", "-c", script, timeout_seconds=1)
    )

    assert result.status == "timeout"
    assert "timed out after 1 s" in result.stderr


async def test_a_killed_wrapper_makes_the_job_lost_not_rerun(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    child_pid_file = tmp_path / "child.pid"
    request = job(
        "killed-1", "sh", "-c", f"echo $$ > {child_pid_file}; echo ran >> {marker}; sleep 30"
    )
    command_of = str(child_pid_file)  # in the shell's command line, as the host sees it
    sandbox = worker(tmp_path)
    running = asyncio.ensure_future(sandbox.run("local", request))
    await wait_until(lambda: lines(marker))
    os.kill(wrapper_pid(tmp_path, "killed-1"), signal.SIGKILL)  # the wrapper only

    result = await asyncio.wait_for(running, 10)

    assert result.status == "failed"
    assert "lost" in result.stderr
    assert "ended without recording" in result.stderr
    await wait_until(lambda: not job_pids(command_of), timeout=2)
    assert await worker(tmp_path).run("local", request) == result
    assert lines(marker) == ["ran"]


async def test_a_wrapper_killed_while_no_engine_ran_is_lost_at_reattach(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    command = ("sh", "-c", f"echo ran >> {marker}; sleep 30")
    await engine_killed_mid_job(tmp_path / "jobs", "killed-2", command, marker)
    pid = wrapper_pid(tmp_path, "killed-2")
    os.killpg(pid, signal.SIGKILL)  # the job and its wrapper, before either recorded anything

    result = await worker(tmp_path).run("local", job("killed-2", *command))

    assert result.status == "failed"
    assert "lost" in result.stderr
    assert lines(marker) == ["ran"]


async def test_a_fresh_engine_cancels_a_job_a_killed_engine_started(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    command = ("sh", "-c", f"echo ran >> {marker}; sleep 30")
    await engine_killed_mid_job(tmp_path / "jobs", "cancel-1", command, marker)
    pid = wrapper_pid(tmp_path, "cancel-1")

    fresh = worker(tmp_path)
    await fresh.cancel("local", job("cancel-1", *command))
    await wait_until(lambda: process_gone(pid), timeout=5)
    result = await fresh.run("local", job("cancel-1", *command))

    assert result.status == "cancelled"
    assert "process group was stopped" in result.stderr
    assert lines(marker) == ["ran"]


async def test_cancel_gives_the_command_its_grace_period(tmp_path: Path) -> None:
    """SIGTERM first: a command that cleans up on it (here in 0.5 s) gets to finish that."""
    marker, cleaned = tmp_path / "marker", tmp_path / "cleaned"
    script = (
        f"trap 'sleep 0.5; echo done > {cleaned}; exit 1' TERM; echo ran >> {marker}; "
        "while :; do sleep 0.1; done"
    )
    request = job("grace-1", "sh", "-c", script)
    sandbox = worker(tmp_path)
    running = asyncio.ensure_future(sandbox.run("local", request))
    await wait_until(lambda: lines(marker))

    await sandbox.cancel("local", request)
    result = await asyncio.wait_for(running, 10)

    assert result.status == "cancelled"
    assert cleaned.read_text() == "done\n"


def programs_in_group(pgid: int) -> set[str]:
    """The executables of the processes in process group `pgid`."""
    names = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getpgid(int(entry.name)) == pgid:
                names.add(Path(os.readlink(entry / "exe")).name)
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            pass  # ended meanwhile, or not ours to look at
    return names


async def test_the_engine_starts_no_python_per_job(tmp_path: Path) -> None:
    """The common path is the wrapper (jobwrap) and the command: no interpreter, and no timer
    process (the engine keeps the deadline while it runs)."""
    marker = tmp_path / "marker"
    request = job("cheap-1", "sh", "-c", f"echo ran >> {marker}; sleep 30")
    sandbox = worker(tmp_path)
    running = asyncio.ensure_future(sandbox.run("local", request))
    await wait_until(lambda: lines(marker))
    # The shell has written the mark; `sleep` is its next child, soon (later on a busy machine).
    group = wrapper_pid(tmp_path, "cheap-1")
    await wait_until(lambda: "sleep" in programs_in_group(group))

    programs = programs_in_group(group)

    await sandbox.cancel("local", request)
    assert (await asyncio.wait_for(running, 10)).status == "cancelled"
    # The command is `sh -c '...; sleep 30'`.
    assert programs == {"jobwrap", "dash", "sleep"}, programs


async def test_job_whose_supervisor_died_is_lost_not_rerun(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    request = job("lost-1", "sh", "-c", f"echo ran >> {marker}")
    job_dir = tmp_path / "jobs" / "lost-1"
    job_dir.mkdir(parents=True)
    (job_dir / "request.json").write_text(json.dumps(request.to_json()))
    (job_dir / "supervisor.pid").write_text(str(await exited_pid()))

    result = await worker(tmp_path).run("local", request)

    assert result.status == "failed"
    assert result.exit_code is None
    assert "lost" in result.stderr
    assert not marker.exists()
    stored = json.loads((job_dir / "result.json").read_text())
    assert stored["status"] == "failed"
    again = await worker(tmp_path).run("local", request)
    assert again == result
    assert not marker.exists()


async def test_a_reused_pid_does_not_keep_a_lost_job_waiting(tmp_path: Path) -> None:
    request = job("lost-2", "true")
    job_dir = tmp_path / "jobs" / "lost-2"
    job_dir.mkdir(parents=True)
    # Alive, but not this job's wrapper: as if the pid had been reused.
    (job_dir / "supervisor.pid").write_text(str(os.getpid()))
    result = await worker(tmp_path).run("local", request)
    assert result.status == "failed"
    assert "lost" in result.stderr


async def test_a_lost_jobs_stderr_names_paths_relative_to_its_work_dir(tmp_path: Path) -> None:
    # A wrapper that failed on a file of its job (reported by absolute path), then died: the
    # lost job's stderr quotes its log, with paths relative to the work dir.
    request = job("lost-4", "true")
    job_dir = (tmp_path / "jobs" / "lost-4").resolve()
    job_dir.mkdir(parents=True)
    (job_dir / "supervisor.log").write_text(
        f"jobwrap: cannot create {job_dir}/exit_status: Permission denied\n"
        f"jobwrap: cannot open {job_dir}/work/input: No such file\n"
    )
    (job_dir / "supervisor.pid").write_text(str(await exited_pid()))

    result = await worker(tmp_path).run("local", request)

    assert result.status == "failed"
    assert "lost" in result.stderr
    assert str(tmp_path) not in result.stderr
    assert "cannot create ../exit_status" in result.stderr
    assert "cannot open input" in result.stderr


async def test_launcher_that_died_before_spawning_is_lost(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    request = job("lost-3", "sh", "-c", f"echo ran >> {marker}")
    job_dir = (tmp_path / "jobs" / "lost-3").resolve()
    job_dir.mkdir(parents=True)
    long_ago = time.time() - 3600
    os.utime(job_dir, (long_ago, long_ago))

    result = await worker(tmp_path).run("local", request)

    assert result.status == "failed"
    assert "no wrapper claimed it" in result.stderr
    # The claim is taken, so a launch that comes late never runs the job.
    assert (job_dir / "supervisor.pid").read_text() == files.LOST_MARKER
    grant = Confinement().grant(request)
    assert isinstance(grant, Grant)
    late_runner = JobRunner(jobs_dir=tmp_path / "jobs", confinement=granted_confinement())
    late = late_runner._spawn(request, job_dir, 10, grant, ())
    _, status = await asyncio.to_thread(os.waitpid, late, 0)
    await late_runner.close()
    assert os.waitstatus_to_exitcode(status) == 97  # could not claim it
    assert not marker.exists()


async def test_a_job_whose_work_dir_cannot_be_made_is_lost_and_says_why(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    request = job("no-work", "sh", "-c", f"echo ran >> {marker}")
    job_dir = (tmp_path / "jobs" / "no-work").resolve()
    job_dir.mkdir(parents=True)
    (job_dir / "work").write_text("a file where the work directory goes")
    grant = Confinement().grant(request)
    assert isinstance(grant, Grant)
    runner = JobRunner(jobs_dir=tmp_path / "jobs", confinement=granted_confinement())
    wrapper = runner._spawn(request, job_dir, 10, grant, ())
    _, status = await asyncio.to_thread(os.waitpid, wrapper, 0)
    assert os.waitstatus_to_exitcode(status) == 96

    result = await worker(tmp_path).run("local", request)  # re-attaches: the directory exists

    assert result.status == "failed"
    assert "lost" in result.stderr
    assert "jobwrap: cannot enter work/: Not a directory" in result.stderr
    assert not marker.exists()
    await runner.close()


async def test_a_jobs_dir_under_tmp_is_reachable_from_the_jobs_own_tmp() -> None:
    # A job's /tmp is its task's own: a jobs directory under the host's /tmp (a checkout in
    # /tmp, say) must still be where the job's HOME and working directory say.
    with tempfile.TemporaryDirectory(dir="/tmp") as under_tmp:
        async with LocalSandboxWorker(jobs_dir=Path(under_tmp) / "jobs") as sandbox:
            result = await sandbox.run(
                "local", job("tmp-1", "sh", "-c", 'cd "$HOME" && pwd && echo x > /tmp/mine')
            )
    assert result.status == "completed", result.stderr
    assert result.stdout == f"{result.work_dir}\n"
