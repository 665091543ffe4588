"""The schemas a model answers in: what every grammar converter takes, and the domain agrees."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from workflow_engine.capabilities.model.answer_schemas import (
    CHECK,
    PROFILES,
    SUMMARY,
    plan_schema,
    step_schema,
    trimmed,
    verification_schema,
)
from workflow_engine.domain import Verification, parse
from workflow_engine.domain.task import CHECK_KINDS, Check, Plan

#: JSON Schema keywords the common converters (llama.cpp's, vLLM's outlines/xgrammar, Ollama's)
#: all take; a schema with any other is at risk of a silent "any JSON" fallback.
TAKEN = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "enum",
    "pattern",
    "anyOf",
}


def schemas() -> Iterator[tuple[str, dict[str, Any]]]:
    for profile in PROFILES:
        yield f"plan/{profile}", plan_schema(profile)
        yield f"step/{profile}", step_schema(profile)
        yield f"verification/{profile}", verification_schema(profile)
    yield "summary", SUMMARY


def nodes(schema: Any, at: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema, with where it is."""
    yield at, schema
    for name, sub in schema.get("properties", {}).items():
        yield from nodes(sub, f"{at}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{at}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{at}{{}}")
    for k, variant in enumerate(schema.get("anyOf", [])):
        yield from nodes(variant, f"{at}|{k}")


@pytest.mark.parametrize(("name", "schema"), list(schemas()), ids=[n for n, _ in schemas()])
def test_every_part_is_typed_bounded_and_plain(name: str, schema: dict[str, Any]) -> None:
    for at, node in nodes(schema):
        assert set(node) <= TAKEN, f"{name}{at}: {sorted(set(node) - TAKEN)}"
        assert "type" in node or "anyOf" in node, f"{name}{at} is untyped"
        if node.get("type") == "string":
            assert node.get("maxLength") or node.get("enum") or node.get("pattern"), at
        if node.get("type") == "array":
            assert node.get("maxItems"), f"{name}{at}: unbounded array"
        if node.get("type") == "object" and node.get("properties"):
            assert node.get("additionalProperties") is False, f"{name}{at}"
            assert set(node["required"]) <= set(node["properties"]), f"{name}{at}"


@pytest.mark.parametrize("profile", PROFILES)
def test_a_plan_has_at_least_one_step(profile: Any) -> None:
    assert plan_schema(profile)["properties"]["steps"]["minItems"] == 1
    assert plan_schema(profile)["required"] == ["steps"]


def test_every_check_kind_has_a_variant() -> None:
    kinds = {k for variant in CHECK["anyOf"] for k in variant["properties"]["kind"]["enum"]}
    assert kinds == CHECK_KINDS


@pytest.mark.parametrize(
    "check",
    [
        {"kind": "exit_code", "equals": 0},
        {"kind": "stdout_contains", "value": "hello"},
        {"kind": "stdout_matches", "value": "^h.llo$"},
        {"kind": "file_exists", "value": "hello.txt"},
        {"kind": "json_field_equals", "field": "a.b", "equals": "x"},
        {"kind": "json_field_equals", "field": "a.b", "equals": None},
    ],
)
def test_what_the_schema_lets_a_model_write_the_domain_takes(check: dict[str, Any]) -> None:
    answer = {"steps": [{"id": "s1", "command": ["true"], "expect": [check]}]}
    for profile in PROFILES:
        plan: Plan = parse(Plan, trimmed(answer, plan_schema(profile)), "plan")
        assert plan.steps[0].expect == (Check(**check),)


def test_a_model_writes_only_what_its_schema_offers() -> None:
    """Whatever the server enforced, a property the schema does not offer is dropped."""
    answer = {
        "steps": [
            {
                "id": "s1",
                "command": ["true"],
                "expect": [{"kind": "exit_code", "equals": 0, "pattern": "x"}],
                "requires_approval": False,
                "secret_env": ["HOME"],
                "limits": {"memory_bytes": 1},
                "image": "evil",
                "env": {"A": "1"},
            }
        ],
        "owner": "root",
    }
    full = trimmed(answer, plan_schema("full"))
    assert full == {
        "steps": [
            {
                "id": "s1",
                "command": ["true"],
                "expect": [{"kind": "exit_code", "equals": 0}],
                "env": {"A": "1"},
            }
        ]
    }
    small = trimmed(answer, plan_schema("small"))
    assert "env" not in small["steps"][0]  # type: ignore[index]


def test_a_verdict_in_the_schema_is_a_verification() -> None:
    answer = {
        "status": "fail",
        "findings": [{"check": "output", "passed": False, "detail": "no hello"}],
        "recommended_actions": ["print hello"],
        "score": 3,
    }
    for profile in PROFILES:
        verdict = parse(Verification, trimmed(answer, verification_schema(profile)), "v")
        assert verdict.status == "fail"
        assert verdict.findings[0].detail == "no hello"
