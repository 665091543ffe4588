"""`workflow-engine schedule create|list|get|pause|resume|delete` as a person uses them.

The real `workflow-engine` process against a real engine on a free port (as
`test_client_cli.py`): what a script relies on is checked exactly, the `--json` documents
(the contract's `Schedule`), the exit codes, and the engine's own message for a refusal.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from tests.conftest import RunningEngine
from tests.e2e.test_client_cli import cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TASK = """\
prompt: Nightly check
steps:
  - id: hello
    command: [sh, -c, "echo hello"]
"""
UNKNOWN = "00000000-0000-4000-8000-000000000000"


async def test_create_get_list_pause_resume_delete(running: RunningEngine, tmp_path: Path) -> None:
    task_file = tmp_path / "task.yaml"
    task_file.write_text(TASK)
    created = await cli(
        running.address,
        "schedule",
        "create",
        str(task_file),
        "--cron",
        "0 2 * * *",
        "--time-zone",
        "Europe/Berlin",
        "--overlap",
        "allow",
        "--catch-up",
        "run-once",
        "--json",
    )
    assert created.code == 0, created.err
    schedule = created.json()
    schedule_id = schedule["schedule_id"]
    assert schedule["cron"] == "0 2 * * *" and schedule["time_zone"] == "Europe/Berlin"
    assert schedule["overlap"] == "ALLOW" and schedule["catch_up"] == "RUN_ONCE"
    assert schedule["task"]["prompt"] == "Nightly check" and "next_fire_time" in schedule

    shown = await cli(running.address, "schedule", "get", schedule_id)
    assert shown.code == 0, shown.err
    assert schedule_id in shown.out and "active" in shown.out
    assert "0 2 * * *  (Europe/Berlin)" in shown.out and "RUN_ONCE" in shown.out
    assert "02:00 CET" in shown.out  # the next fire time, also in the schedule's zone

    paused = await cli(running.address, "schedule", "pause", schedule_id, "--json")
    assert paused.code == 0, paused.err
    assert paused.json()["paused"] is True and "next_fire_time" not in paused.json()
    listed = await cli(running.address, "schedule", "list")
    assert listed.code == 0 and schedule_id in listed.out and "paused" in listed.out
    resumed = await cli(running.address, "schedule", "resume", schedule_id)
    assert resumed.code == 0, resumed.err
    assert resumed.out.startswith(f"resumed: {schedule_id}  active")

    deleted = await cli(running.address, "schedule", "delete", schedule_id)
    assert deleted.code == 0 and f"deleted: {schedule_id}" in deleted.out
    assert (await cli(running.address, "schedule", "list", "--json")).json() == []
    gone = await cli(running.address, "schedule", "get", schedule_id)
    assert gone.code == 6 and "NOT_FOUND" in gone.err


async def test_a_schedule_fires_and_list_finds_its_workflows(running: RunningEngine) -> None:
    created = await cli(
        running.address,
        "schedule",
        "create",
        "--prompt",
        "$ true",
        "--cron",
        "@every 1s",
        "--json",
    )
    assert created.code == 0, created.err
    schedule_id = created.json()["schedule_id"]
    deadline = time.monotonic() + 30
    started: list[dict[str, str]] = []
    while not started and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        listed = await cli(running.address, "list", "--schedule-id", schedule_id, "--json")
        assert listed.code == 0, listed.err
        started = listed.json()
    assert started, "the schedule started nothing in 30 s"
    assert {w["schedule_id"] for w in started} == {schedule_id}
    shown = await cli(running.address, "get", started[0]["task_id"])
    assert f"schedule   {schedule_id}, slot " in shown.out
    assert (await cli(running.address, "schedule", "pause", schedule_id)).code == 0
    other = await cli(running.address, "list", "--schedule-id", UNKNOWN, "--json")
    assert other.code == 0 and other.json() == []


async def test_refusals_print_the_engines_message_and_exit_non_zero(
    running: RunningEngine,
) -> None:
    bad_cron = await cli(
        running.address, "schedule", "create", "--prompt", "$ true", "--cron", "61 * * * *"
    )
    assert bad_cron.code == 2 and "INVALID_ARGUMENT" in bad_cron.err
    assert "schedule.cron" in bad_cron.err and bad_cron.err.startswith(
        "workflow-engine schedule create: "
    )
    bad_zone = await cli(
        running.address,
        "schedule",
        "create",
        "--prompt",
        "$ true",
        "--cron",
        "@daily",
        "--time-zone",
        "Mars/Olympus",
    )
    assert bad_zone.code == 2 and "schedule.time_zone" in bad_zone.err
    both = await cli(
        running.address,
        "schedule",
        "create",
        "--prompt",
        "$ true",
        "--template-task-id",
        UNKNOWN,
        "--cron",
        "@daily",
    )
    assert both.code == 2 and "not both" in both.err
    nothing = await cli(running.address, "schedule", "create", "--cron", "@daily")
    assert nothing.code == 2 and "--template-task-id" in nothing.err
    missing = await cli(running.address, "schedule", "pause", UNKNOWN)
    assert missing.code == 6 and "NOT_FOUND" in missing.err
    malformed = await cli(running.address, "schedule", "delete", "nope")
    assert malformed.code == 2 and "schedule_id" in malformed.err
    assert (await cli(running.address, "schedule", "list", "--json")).json() == []
    assert json.loads((await cli(running.address, "list", "--json")).out) == []
