"""The command policy: which model-planned commands run, wait for approval, or are refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from workflow_engine.capabilities.model._command_policy import (
    DEFAULT_ENV,
    CommandPolicy,
    PolicyDecision,
    load_policy,
    resolve,
)
from workflow_engine.capabilities.model._planner import PolicedPlan, policy_note
from workflow_engine.domain.task import Plan, Step
from workflow_engine.errors import CapabilityConfigError


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
        ("env: [LANG, '']\n", "env: expected a list of patterns"),
        ("env: [LANG, PATH]\n", "env: 'PATH' would let a step set PATH"),
        ("env: ['P*']\n", "env: 'P*' would let a step set PATH"),
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


def test_a_bare_name_is_the_program_of_that_name_on_the_safe_path() -> None:
    policy = CommandPolicy(allow=("ls", "git status*"), default="allow")
    for command in (["ls"], ["/usr/bin/ls"], ["/bin/ls"], ["git", "status"]):
        assert policy.decide(command).verdict == "allow", command
    assert resolve("ls", {}) == shutil.which("ls", path="/usr/local/bin:/usr/bin:/bin")
    # In the work directory, not plain, or looked up on a PATH of the step's: not resolved,
    # so neither the allow pattern nor `default: allow` runs it.
    for command, env in (
        (["./ls"], {}),
        (["/usr/bin/../bin/ls"], {}),
        (["//usr/bin/ls"], {}),
        (["ls"], {"PATH": "/tmp/x:/usr/bin:/bin"}),
    ):
        assert resolve(command[0], env) is None, command
        decision = CommandPolicy(allow=("ls",), default="allow", env=("PATH",)).decide(command, env)
        assert decision.verdict == "approve", command
        assert "is no file that jobs cannot write" in decision.reason
    assert CommandPolicy(default="deny").decide(["./ls"]).verdict == "deny"


def test_an_absolute_pattern_names_a_file_that_only_root_can_change(tmp_path: Path) -> None:
    for spelled in ("touch", "/usr/bin/touch"):  # the same file
        assert CommandPolicy(allow=("/usr/bin/touch",)).decide([spelled]).verdict == "allow"
    assert CommandPolicy(allow=("/usr/bin/touch",)).decide(["/usr/bin/cp"]).verdict == "approve"
    tools = tmp_path / "tools"
    tools.mkdir()
    program = tools / "touch"
    shutil.copy("/usr/bin/touch", program)
    for mode in (0o777, 0o755):  # anyone may replace it; or /tmp above it is anyone's
        tools.chmod(mode)
        assert resolve(str(program), {}) is None
        policy = CommandPolicy(allow=(f"{tools}/*", "touch"), default="allow")
        assert policy.decide([str(program)]).verdict == "approve"
    # Denying goes by the name as written, too.
    assert CommandPolicy(deny=("touch",)).decide([str(program)]).verdict == "deny"
    assert CommandPolicy(deny=("rm -rf*",)).decide(["./rm", "-rf", "/"]).verdict == "deny"


def test_a_step_sets_only_the_env_the_policy_lists() -> None:
    policy = CommandPolicy(allow=("ls",), env=("LANG", "LC_*"))
    assert policy.decide(["ls"], {"LANG": "C", "LC_TIME": "C"}).verdict == "allow"
    decision = policy.decide(["ls"], {"PYTHONPATH": "/x", "LANG": "C", "HOME": "/y"})
    assert decision.verdict == "approve"
    assert decision.reason.startswith("env HOME, PYTHONPATH not in the env list of")
    assert CommandPolicy(default="deny").decide(["ls"], {"FOO": "1"}).verdict == "deny"
    # Never less strict than the command: a denied command stays denied.
    assert CommandPolicy(deny=("ls",)).decide(["ls"], {"FOO": "1"}).verdict == "deny"
    assert CommandPolicy().env == DEFAULT_ENV


def test_the_env_list_comes_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("allow: [ls]\nenv: [LANG, PYTHONPATH]\n")
    assert load_policy(str(path)).decide(["ls"], {"PYTHONPATH": "/x"}).verdict == "allow"
    path.write_text("allow: [ls]\n")
    assert load_policy(str(path)).env == DEFAULT_ENV


def test_the_decisions_travel_with_a_policed_plan_but_are_not_stored_with_it() -> None:
    decision = PolicyDecision("approve", "no pattern matches; the default of the policy p.yaml")
    step = Step(id="a", command=("true",), requires_approval=True)
    plan = PolicedPlan(
        steps=(step,), assumptions=(policy_note("a", decision),), policy={"a": decision}
    )
    assert plan.policy["a"] == decision
    assert plan.to_json() == Plan(steps=(step,), assumptions=plan.assumptions).to_json()
    assert plan.assumptions == (
        "command policy: step a waits for approval "
        "(no pattern matches; the default of the policy p.yaml)",
    )
