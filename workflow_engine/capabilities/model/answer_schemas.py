"""The JSON Schemas a model answers in: small, fully typed, bounded, and grammar-friendly.

A model server that enforces a schema turns it into a grammar (llama.cpp's converter, vLLM's
guided decoding, Ollama's, OpenAI's strict mode). Those converters accept a common subset of
JSON Schema and fall back to "any JSON" in silence on what they do not recognise, so the
schemas here use only that subset: every property typed (`Check.equals` is a JSON scalar
union), strings and arrays bounded, `steps` at least one, no ``$ref``, no ``default``, no
``format``. The domain models (`Plan`, `Step`, `Verification`) still check every answer; these
schemas only say what the model should write, and are far narrower than what a caller may send.

Two profiles (``WORKFLOW_ENGINE_LLM_PROFILE``): ``full`` asks for descriptions, dependencies,
timeouts and assumptions; ``small``, for sub-billion-parameter models, only for what a step
needs to run and be checked (id, command, checks).
"""

from __future__ import annotations

from typing import Literal

from workflow_engine.domain.task import MAX_TIMEOUT_SECONDS, STEP_ID_PATTERN
from workflow_engine.domain.values import JsonObject

Profile = Literal["full", "small"]
PROFILES: tuple[Profile, ...] = ("full", "small")

#: What a model may write, at most; the domain's bounds for a caller are far larger.
MAX_MODEL_STEPS = 20
MAX_MODEL_ARGV = 32
MAX_MODEL_ARG_CHARS = 1000
MAX_MODEL_CHECKS = 8
MAX_MODEL_TEXT_CHARS = 500
MAX_MODEL_ID_CHARS = 64
MAX_MODEL_FINDINGS = 12

#: A JSON scalar, what a `json_field_equals` check compares with (exit codes are integers).
SCALAR: JsonObject = {"type": ["string", "integer", "number", "boolean", "null"]}


def _text(limit: int = MAX_MODEL_TEXT_CHARS, *, required: bool = False) -> JsonObject:
    return {"type": "string", "minLength": 1 if required else 0, "maxLength": limit}


def _list(item: JsonObject, limit: int, *, at_least: int = 0) -> JsonObject:
    return {"type": "array", "items": item, "minItems": at_least, "maxItems": limit}


def _object(properties: JsonObject, required: list[str]) -> JsonObject:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _check(kinds: list[str], operands: JsonObject) -> JsonObject:
    """One variant of a check: its kinds and the operands they take, all required."""
    kind: JsonObject = {"type": "string", "enum": kinds}
    return _object({"kind": kind, **operands}, ["kind", *operands])


#: A machine check, one variant per operand shape: a model cannot write a check with the
#: wrong operands for its kind.
CHECK: JsonObject = {
    "anyOf": [
        _check(["exit_code"], {"equals": {"type": "integer", "minimum": -255, "maximum": 255}}),
        _check(
            ["stdout_contains", "stderr_contains", "stdout_matches", "file_exists"],
            {"value": _text(required=True)},
        ),
        _check(["json_field_equals"], {"field": _text(200, required=True), "equals": SCALAR}),
    ]
}

_STEP_ID_SCHEMA: JsonObject = {"type": "string", "pattern": STEP_ID_PATTERN}
_COMMAND: JsonObject = _list(_text(MAX_MODEL_ARG_CHARS, required=True), MAX_MODEL_ARGV, at_least=1)


def step_schema(profile: Profile) -> JsonObject:
    """One step as a model writes it."""
    properties: JsonObject = {"id": _STEP_ID_SCHEMA}
    if profile == "full":
        properties["description"] = _text(300)
    properties["command"] = _COMMAND
    properties["expect"] = _list(CHECK, MAX_MODEL_CHECKS)
    if profile == "full":
        # The command policy judges it (`CommandPolicy.decide`); the loader's variables are
        # refused whoever writes them.
        properties["env"] = {
            "type": "object",
            "additionalProperties": _text(MAX_MODEL_ARG_CHARS),
        }
        properties["depends_on"] = _list(_STEP_ID_SCHEMA, MAX_MODEL_STEPS)
        properties["timeout_seconds"] = {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_TIMEOUT_SECONDS,
        }
        # Worker nodes' labels; the local sandbox has none and refuses a step that names one.
        properties["required_labels"] = _list(_text(256, required=True), 16)
    return _object(properties, ["id", "command", "expect"])


def plan_schema(profile: Profile) -> JsonObject:
    """A plan: at least one step (and, in the full profile, what the model assumed)."""
    properties: JsonObject = {"steps": _list(step_schema(profile), MAX_MODEL_STEPS, at_least=1)}
    if profile == "full":
        properties["assumptions"] = _list(_text(300), 10)
    return _object(properties, ["steps"])


def verification_schema(profile: Profile) -> JsonObject:
    """A judge's verdict: pass or fail, and a finding per thing it checked."""
    finding = _object(
        {"check": _text(100, required=True), "passed": {"type": "boolean"}, "detail": _text()},
        ["check", "passed", "detail"],
    )
    properties: JsonObject = {
        "status": {"type": "string", "enum": ["pass", "fail"]},
        "findings": _list(finding, 4 if profile == "small" else MAX_MODEL_FINDINGS, at_least=1),
    }
    required = ["status", "findings"]
    if profile == "full":
        properties["recommended_actions"] = _list(_text(300), 5)
    return _object(properties, required)


SUMMARY: JsonObject = _object({"summary": _text(4000, required=True)}, ["summary"])


def trimmed(value: object, schema: JsonObject) -> object:
    """`value` with only the properties `schema` names, at every level: what a model may write.

    A model's answer is untrusted input; a property its schema does not offer (``env``,
    ``requires_approval``, ``limits``, ...) is dropped, not obeyed, whether or not the server
    enforced the schema. Anything that is not the shape the schema expects is left for the
    domain model to refuse.
    """
    if "anyOf" in schema:
        merged: dict[str, JsonObject] = {}
        for variant in schema["anyOf"]:
            merged.update(variant.get("properties", {}))
        schema = {"type": "object", "properties": merged}
    if isinstance(value, dict) and "properties" in schema:
        properties = schema["properties"]
        return {k: trimmed(v, properties[k]) for k, v in value.items() if k in properties}
    if isinstance(value, list) and "items" in schema:
        return [trimmed(item, schema["items"]) for item in value]
    return value
