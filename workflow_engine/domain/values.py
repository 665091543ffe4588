"""What every domain value shares: immutability, its stored JSON form, and field-path errors.

Domain values are pydantic models. A value that exists is valid: its invariants are checked when
it is built, from keywords or from JSON, and a violation names the field by its path
(``task.steps[0].command[1]``), so the API's `INVALID_ARGUMENT` and an LLM planner's retry
prompt say exactly what is wrong.

A rule that needs its own wording raises `invalid(at, problem)` from a validator; `at` is the
path below the model or field being validated (``"[2].id"``, ``".depends_on"``). `parse` turns
the first error of a `ValidationError` into the engine's `InvalidArgument`.
"""

from __future__ import annotations

from typing import Any, Self, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError

from workflow_engine.errors import InvalidArgument

JsonObject = dict[str, Any]
M = TypeVar("M", bound="DomainModel")
T = TypeVar("T")

_INVALID = "workflow_engine_invalid"
#: The validation context of a stored value: see `input_rules`.
_STORED = {"stored": True}


class DomainModel(BaseModel):
    """A frozen value with a JSON form: `to_json` is what is stored, `from_json` reads it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    def to_json(self) -> JsonObject:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: Any) -> Self:
        """Read a stored (trusted) value; `parse` is for input, whose errors name fields."""
        return cls.model_validate(data, context=_STORED)


def input_rules(info: ValidationInfo) -> bool:
    """Whether a validator applies the rules that only input must follow.

    A rule made stricter than an older engine's (a check's pattern in RE2 syntax, its path
    relative) holds for everything built now, but not for what that engine accepted and stored:
    such a value still reads (`from_json`), and what uses it judges it then (the verifier fails
    that check with a finding saying why).
    """
    return not (info.context and info.context.get("stored"))


def invalid(at: str, problem: str) -> PydanticCustomError:
    """The error a validator raises for `problem` at `at`, below the value it validates."""
    return PydanticCustomError(_INVALID, "{problem}", {"problem": problem, "at": at})


def parse(kind: type[M] | TypeAdapter[T], data: Any, where: str) -> Any:
    """`data` as a `kind` (a model or a `TypeAdapter`), or `InvalidArgument` at `where`.

    Only the first error is reported, as a client fixes one field at a time.
    """
    try:
        if isinstance(kind, TypeAdapter):
            return kind.validate_python(data)
        return kind.model_validate(data)
    except ValidationError as exc:
        raise as_invalid_argument(exc, where) from None


def as_invalid_argument(exc: ValidationError, where: str) -> InvalidArgument:
    """The first error of `exc`, as `InvalidArgument` naming its field below `where`."""
    error = exc.errors(include_url=False)[0]
    path = where + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]
    )
    context = error.get("ctx") or {}
    if error["type"] == _INVALID:
        return InvalidArgument(path + str(context.get("at", "")), str(context["problem"]))
    problem = _JSON_WORDING.get(error["type"]) or error["msg"][:1].lower() + error["msg"][1:]
    return InvalidArgument(path, problem)


# Pydantic's type errors in the words of the JSON (or proto) the client sent, not Python's.
_JSON_WORDING = {
    "missing": "required",
    "string_type": "must be a string",
    "tuple_type": "must be a list",
    "list_type": "must be a list",
    "dict_type": "must be a JSON object",
    "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
}
