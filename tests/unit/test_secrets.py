"""What the engine shows instead of a secret, in answers and in log lines."""

from __future__ import annotations

import json

from workflow_engine import _logs as logs
from workflow_engine._context import EngineContext
from workflow_engine._logs import mask_in_logs, unmask_in_logs
from workflow_engine._masking import (
    MASK,
    Secrets,
    accumulated,
    redact,
    redact_json,
    state_secrets,
    step_secrets,
)

SECRET = "hunter2-but-longer"


def test_a_workflows_secrets_come_from_its_planned_steps() -> None:
    steps = [
        {"id": "a", "env": {"TOKEN": SECRET, "REGION": "eu"}, "secret_env": ["TOKEN"]},
        {"id": "b", "env": {"TOKEN": "other"}},  # not marked: not a secret
    ]
    assert step_secrets(steps) == {SECRET}
    assert state_secrets({"plan": {"steps": steps}}) == {SECRET}
    assert state_secrets({}) == set()
    assert state_secrets("a row edited by hand") == set()


def test_answers_mask_whole_values_and_values_inside_text() -> None:
    state = {
        "plan": {"steps": [{"env": {"TOKEN": SECRET, "PIN": "12"}}]},
        "steps": {"a": {"result": {"stdout": f"token={SECRET}\n", "exit_code": 0}}},
        "pending_approval": {"env": {"PIN": "12"}},
    }
    shown = redact_json(state, {SECRET, "12"})
    assert shown["plan"]["steps"][0]["env"] == {"TOKEN": MASK, "PIN": MASK}
    assert shown["steps"]["a"]["result"] == {"stdout": f"token={MASK}\n", "exit_code": 0}
    # A secret too short to look for inside text is masked only as a whole value.
    assert redact("build 12 of 120", {"12"}) == "build 12 of 120"
    assert redact_json(state, set()) is state


def test_log_lines_are_masked_in_every_value() -> None:
    secrets = Secrets()
    line = {"event": "x", "detail": f"a {SECRET} b, nope", "nested": {"k": [SECRET, 3]}}
    assert secrets.redact_event(None, "info", dict(line)) == line  # nothing known yet
    secrets.add([SECRET, "nope"])  # too short to mask inside text: not kept
    masked = secrets.redact_event(None, "info", {**line, "error": ValueError(SECRET)})
    assert masked["detail"] == f"a {MASK} b, nope"
    assert masked["nested"] == {"k": [MASK, 3]}
    assert SECRET not in str(masked) and MASK in masked["error"]


def test_a_workflows_secrets_only_accumulate() -> None:
    first = {"plan": {"steps": [{"env": {"T": SECRET}, "secret_env": ["T"]}]}}
    assert accumulated({}, first) == [SECRET]
    # The plan lost its secret (revised, edited): the state keeps it.
    second = {"plan": {"steps": [{"env": {"T": "public"}}]}, "secrets": [SECRET]}
    assert state_secrets(second) == {SECRET}
    assert accumulated(first, second) is None  # kept already
    # A row written before the field: its plan's secrets, kept from its first write on.
    assert accumulated(first, {**first}) == [SECRET]
    assert accumulated({}, {"plan": {"steps": []}}) is None  # none, no field


def test_a_secret_is_masked_however_json_or_python_quoted_it() -> None:
    secret = "a'b\"c\\d\n\x1b\u00fc\u2603-end"
    quotings = [
        repr(f"x {secret} y"),  # quoted with ', which escapes '
        repr(f"x {secret.replace(chr(34), '')} y"),  # another secret: no " so quoted with "
        ascii(f"x {secret} y"),
        json.dumps(f"x {secret} y"),
        json.dumps(f"x {secret} y", ensure_ascii=False),
    ]
    other = secret.replace('"', "")
    for text in quotings:
        masked = redact(text, {secret, other})
        assert masked[1:-1] == f"x {MASK} y", text


def test_a_piece_of_a_secret_where_a_text_was_cut_is_masked_from_8_characters() -> None:
    assert redact(f"out: {SECRET[:8]}", {SECRET}) == f"out: {MASK}"
    assert redact(f"{SECRET[-9:]} and on", {SECRET}) == f"{MASK} and on"
    assert redact(f"out: {SECRET[:7]}", {SECRET}) == f"out: {SECRET[:7]}"  # too short to tell


def test_a_part_of_a_text_is_masked_before_it_is_cut() -> None:
    secrets = Secrets()
    secrets.add([SECRET])
    for at in range(190, 201):
        text = "x" * at + SECRET + "y" * 5000
        head, cut = secrets.redact_part(text, 200)
        assert cut and SECRET[:4] not in head and len(head) <= 200
        tail, _ = secrets.redact_part("y" * 5000 + SECRET + "x" * at, 200, keep="tail")
        assert SECRET[-4:] not in tail and len(tail) <= 200
    assert secrets.redact_part(f"a {SECRET}", 200) == (f"a {MASK}", False)
    # Masking shortens the text: a secret further on moves up into the part, and is masked too.
    long = "a-long-secret-" + "z" * 46
    secrets.add([long])
    text = long * 3 + "x" * 75 + SECRET + "y" * 500  # SECRET at 255, cut by a window of 260
    head, _ = secrets.redact_part(text, 200)
    assert SECRET[:4] not in head and head.startswith(MASK * 3 + "x" * 75 + MASK)


def test_an_exception_is_quoted_with_its_secrets_masked_first() -> None:
    secret = "it's-a-secret\\value"
    secrets = Secrets()
    secrets.add([secret])
    assert secrets.masked_repr(ValueError(f"bad {secret}", 3)) == f"ValueError('bad {MASK}', 3)"


def test_two_engines_contexts_share_no_secret_and_no_metric() -> None:
    first, second = EngineContext(), EngineContext()
    first.secrets.add_credentials([SECRET])
    assert first.secrets.redact(SECRET) == first.secrets.credentials.redact(SECRET) == MASK
    assert second.secrets.redact(SECRET) == SECRET and not second.secrets.credentials
    registry, other = first.metrics.enable(), second.metrics.enable()
    first.metrics.workflow_started()
    assert registry.get_sample_value("workflow_engine_workflows_started_total") == 1
    assert other.get_sample_value("workflow_engine_workflows_started_total") == 0


def test_the_log_masks_every_live_engines_secrets_and_no_closed_ones() -> None:
    first, second = Secrets(), Secrets()
    first.add([SECRET])
    second.add(["another-engines-secret"])
    mask_in_logs(first)
    mask_in_logs(second)
    try:
        line = {"event": "x", "a": SECRET, "b": "another-engines-secret"}
        assert logs._masked(None, "info", dict(line)) == {"event": "x", "a": MASK, "b": MASK}
        unmask_in_logs(second)
        assert logs._masked(None, "info", dict(line))["b"] == "another-engines-secret"
    finally:
        unmask_in_logs(first)
        unmask_in_logs(second)
