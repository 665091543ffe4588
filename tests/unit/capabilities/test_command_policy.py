"""The command policy: which model-planned commands run, wait for approval, or are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from workflow_engine.capabilities.base import CapabilityConfigError
from workflow_engine.capabilities.command_policy import CommandPolicy, load_policy


def test_deny_wins_then_approval_then_allow_then_the_default(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "deny: [rm, '* --force*']\n"
        "require_approval: ['git push*']\n"
        "allow: [git, echo, 'python*']\n"
        "default: deny\n"
    )
    policy = load_policy(str(path))
    assert policy.decide(["rm", "-rf", "x"]).verdict == "deny"
    assert policy.decide(["/bin/rm", "x"]).verdict == "deny"  # by its base name too
    assert policy.decide(["git", "push", "--force", "origin"]).verdict == "deny"
    assert policy.decide(["git", "push", "origin"]).verdict == "approve"
    assert policy.decide(["git", "status"]).verdict == "allow"
    assert policy.decide(["/usr/bin/python3", "-c", "1"]).verdict == "allow"
    decision = policy.decide(["curl", "example.invalid"])
    assert decision.verdict == "deny"
    assert decision.reason == "no pattern matches; the default of the policy policy.yaml"


def test_no_policy_file_means_every_command_waits_for_approval() -> None:
    decision = load_policy("").decide(["echo", "hi"])
    assert decision.verdict == "approve"
    assert "the default policy" in decision.reason
    assert CommandPolicy().decide(["ls"]).verdict == "approve"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("allow: echo\n", "allow: expected a list of patterns"),
        ("default: maybe\n", "default: expected one of allow, approve, deny, got 'maybe'"),
        ("alow: [echo]\n", "alow: unknown field"),
        ("[echo]\n", "expected a mapping"),
        ("allow: [\n", "not YAML or JSON"),
    ],
)
def test_a_bad_policy_names_the_file_and_the_field(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(CapabilityConfigError) as err:
        load_policy(str(path))
    assert str(err.value).startswith(f"WORKFLOW_ENGINE_COMMAND_POLICY_FILE {path}: ")
    assert named in str(err.value)


def test_a_missing_policy_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(CapabilityConfigError, match="cannot read it"):
        load_policy(str(tmp_path / "absent.yaml"))
