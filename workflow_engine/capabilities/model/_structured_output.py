"""How a model is asked for JSON, on whichever server answers: a ladder walked once per endpoint.

OpenAI-compatible servers each speak their own dialect of structured output. From the most
enforced to the least, the rungs (`OUTPUT_MODES`) are:

1. ``json_schema``: ``response_format: {"type": "json_schema", "json_schema": {...}}`` (OpenAI,
   vLLM, llama.cpp's ``llama-server``, Ollama's and LM Studio's OpenAI endpoints).
2. ``json_object_schema``: ``{"type": "json_object", "schema": {...}}``, the shape
   llama-cpp-python's server takes (it refuses the first with HTTP 500).
3. ``json_object``: any JSON (``{"type": "json_object"}``), the schema in the prompt.
4. ``text``: no ``response_format`` at all, the schema in the prompt, and the first JSON
   object of the answer taken (Markdown fences and prose around it ignored).

A server that answers a rung with an error about the request's shape (`refuses_shape`) moves
its endpoint down one rung, for the life of the process, logged once; the question is asked
again in the new shape at once, which is not a retry. Every other failure is the client's to
retry or report (`_client`).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from workflow_engine.config import OUTPUT_MODES
from workflow_engine.domain.values import JsonObject

if TYPE_CHECKING:
    import openai  # imported when a model client opens (`_client`)

log = structlog.get_logger(__name__)

#: The words of an error about the request's shape, as servers write them: llama-cpp-python
#: ("Input should be 'text' or 'json_object'", "response_format"), llama.cpp ("json_schema",
#: "grammar"), vLLM ("guided decoding"), LM Studio ("'response_format.type' must be"), OpenAI.
_SHAPE_WORDS = (
    "response_format",
    "json_schema",
    "json_object",
    "grammar",
    "'schema'",
    "guided decoding",
    "guided_decoding",
)
#: Statuses a refused request shape comes with: a request the server could not take (400,
#: 415, 422, 501), and llama-cpp-python's validation error, which it answers with 500.
_SHAPE_STATUSES = frozenset({400, 415, 422, 500, 501})
#: What a 500 must say to be about the shape and not the server's own trouble ("Unexpected
#: empty grammar stack" is a crash, not a refusal).
_SHAPE_WORDS_500 = ("response_format", "json_schema")
#: How much of an answer is searched for a JSON object, and from how many of its braces: an
#: answer is bounded by the token limit, but a hostile server's is not.
MAX_SEARCHED_CHARS = 256 * 1024
MAX_OBJECT_STARTS = 32


@dataclass(frozen=True, slots=True)
class Request:
    """What one call sends besides the model and the limits."""

    messages: list[JsonObject]
    response_format: JsonObject | None


def asked_for(
    mode: str, messages: list[JsonObject], schema_name: str, schema: JsonObject
) -> Request:
    """`messages` asked in `mode`: the schema in the response format, or in the prompt."""
    if mode == "json_schema":
        form = {
            "type": "json_schema",
            "json_schema": {"name": schema_name, "schema": schema, "strict": False},
        }
        return Request(messages, form)
    if mode == "json_object_schema":
        return Request(messages, {"type": "json_object", "schema": schema})
    told = with_schema_in_prompt(messages, schema_name, schema)
    return Request(told, {"type": "json_object"} if mode == "json_object" else None)


def with_schema_in_prompt(
    messages: list[JsonObject], schema_name: str, schema: JsonObject
) -> list[JsonObject]:
    """`messages` with the schema appended to the system message, for a server that does not
    enforce it."""
    told = (
        f"\n\nAnswer with one JSON object (the {schema_name}) and nothing else: no Markdown, "
        f"no explanation. It must follow this JSON Schema:\n{json.dumps(schema)}"
    )
    first, rest = messages[0], messages[1:]
    if first.get("role") == "system":
        return [{**first, "content": f"{first['content']}{told}"}, *rest]
    return [{"role": "system", "content": told.strip()}, *messages]


class OutputModes:
    """The rung each endpoint answers, remembered for the life of the process."""

    _lock = threading.Lock()
    _known: dict[str, str] = {}  # noqa: RUF012 (the process's memory, shared by every client)

    def __init__(self, endpoint: str, pinned: str = "auto") -> None:
        self.endpoint = endpoint
        #: A mode the operator chose (`LlmSettings.output_mode`): never walked away from.
        self.pinned = "" if pinned == "auto" else pinned

    def mode(self) -> str:
        if self.pinned:
            return self.pinned
        with self._lock:
            return self._known.get(self.endpoint, OUTPUT_MODES[0])

    def step_down(self, refused: str, why: str) -> bool:
        """Move the endpoint below `refused`; False when there is nowhere to go (the last rung,
        or a pinned mode), so the error is the caller's to report."""
        if self.pinned or refused == OUTPUT_MODES[-1]:
            return False
        lower = OUTPUT_MODES[OUTPUT_MODES.index(refused) + 1]
        with self._lock:
            if self._known.get(self.endpoint, OUTPUT_MODES[0]) == refused:
                self._known[self.endpoint] = lower
                log.warning(
                    "model_output_mode",
                    endpoint=self.endpoint,
                    refused=refused,
                    mode=lower,
                    error=why,
                )
        return True

    @classmethod
    def forget(cls) -> None:
        """Forget every endpoint's rung (tests start each server from the first)."""
        with cls._lock:
            cls._known.clear()


def refuses_shape(exc: openai.APIError) -> bool:
    """Whether the server's error says it does not take the request's response format."""
    import openai

    if not isinstance(exc, openai.APIStatusError) or exc.status_code not in _SHAPE_STATUSES:
        return False
    said = f"{exc.message} {_body_text(exc.body)}".lower()
    words = _SHAPE_WORDS_500 if exc.status_code == 500 else _SHAPE_WORDS
    return any(word in said for word in words)


def _body_text(body: Any) -> str:
    try:
        return json.dumps(body)[:4000]
    except (TypeError, ValueError):
        return str(body)[:4000]


def extract_json(content: str) -> Any:
    """The JSON in a model's answer: all of it, or else its first JSON object (inside Markdown
    fences or prose), control characters in strings allowed. `ValueError` saying why when
    there is none.

    Bounded for a hostile answer: the first `MAX_SEARCHED_CHARS` characters are read whole
    once, then at most `MAX_OBJECT_STARTS` candidate braces scan that many characters more
    between them; JSON nested too deep for the parser is no JSON.
    """
    text = content.strip()[:MAX_SEARCHED_CHARS]
    if not text:
        raise ValueError("the answer is empty")
    # Not strict: a raw tab or newline inside a string (which small models write, and some
    # servers' grammars let through) is kept, not a reason to throw the answer away.
    decoder = json.JSONDecoder(strict=False)
    try:
        return decoder.decode(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError as exc:
        first_problem = str(exc)
    start = text.find("{")
    budget = MAX_SEARCHED_CHARS  # characters the candidates may scan, all of them together
    for _ in range(MAX_OBJECT_STARTS):
        if start < 0 or budget <= 0:
            break
        try:
            found, scanned = decoder.raw_decode(text[start : start + budget])
        except RecursionError:
            raise ValueError("nested too deeply") from None
        except json.JSONDecodeError as exc:
            budget -= max(exc.pos, 1)
            start = text.find("{", start + 1)
            continue
        if isinstance(found, dict):
            return found
        budget -= max(scanned, 1)
        start = text.find("{", start + 1)
    raise ValueError(first_problem)
