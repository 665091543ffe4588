"""A model over any OpenAI-compatible Chat Completions endpoint, answering in JSON.

The official `openai` SDK speaks the protocol (OpenAI, vLLM, llama.cpp's server, Ollama, an
orchestrator's model router: each takes its ``base_url``). How the answer's JSON Schema is
sent depends on what the server takes: `structured_output` walks a ladder of request shapes
and remembers the endpoint's rung. The SDK's own retries are off, because retries live here,
in one place (`_retryable`): a timeout, a connection error, 429 (after its ``Retry-After``) and
5xx are retried with backoff; any other 4xx or a refusal is a `ModelError` whose message a
finding quotes. An answer cut at its purpose's token limit (`LlmSettings.tokens_for`) or holding
no JSON is an `AnswerProblem`, asked for again like an invalid one (`answer_valid`).

Every call that got an answer is recorded (model, latency, prompt and completion tokens) in
the ledger of the node that made it (`recording`), so the node can put it in the state and its
history event without the capability knowing about either: a cut answer's tokens count too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, cast

import structlog
from opentelemetry.trace import SpanKind

from workflow_engine import _secret_files as secret_files
from workflow_engine._context import EngineContext
from workflow_engine._masking import EngineSecrets, Secrets, for_workflow
from workflow_engine.capabilities.model._http_client import MAX_ANSWER_BYTES, capped_http_client
from workflow_engine.capabilities.model._structured_output import (
    OutputModes,
    Request,
    asked_for,
    extract_json,
    refuses_shape,
)
from workflow_engine.config import ENV_PREFIX, LlmSettings
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import (
    AnswerProblem,
    CapabilityConfigError,
    ModelError,
    WorkflowEngineError,
)
from workflow_engine.telemetry import tracing

if TYPE_CHECKING:
    # The SDK is imported when a model client opens (and where its errors are told apart):
    # about 1 s of CPU that an engine with no `llm` capability, and each of its processes,
    # never pays.
    import openai

log = structlog.get_logger(__name__)

#: Longest wait honoured from one ``Retry-After``; a server asking for more is not waited on.
MAX_RETRY_AFTER_SECONDS = 60.0
#: How much of an unusable answer is shown to the model again when it is asked to correct it.
MAX_REPEATED_CHARS = 8000
_QUOTED = 300


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One answered call: what it cost and how long it took."""

    purpose: str
    model: str
    latency_ms: int
    prompt_tokens: int
    completion_tokens: int

    def to_json(self) -> JsonObject:
        return {
            "purpose": self.purpose,
            "model": self.model,
            "latency_ms": self.latency_ms,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


@dataclass
class Ledger:
    """The calls one node made."""

    calls: list[ModelCall] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(c.prompt_tokens + c.completion_tokens for c in self.calls)

    def describe(self) -> str:
        """One line for the node's history event, empty when no call was made."""
        if not self.calls:
            return ""
        ms = sum(c.latency_ms for c in self.calls)
        prompt = sum(c.prompt_tokens for c in self.calls)
        completion = sum(c.completion_tokens for c in self.calls)
        return (
            f"model {self.calls[-1].model}: {len(self.calls)} call(s), "
            f"{prompt}+{completion} tokens, {ms} ms"
        )


_LEDGER: ContextVar[Ledger | None] = ContextVar("model_ledger", default=None)


@contextlib.contextmanager
def recording() -> Iterator[Ledger]:
    """Collect the model calls made inside the block (in this task) into a new ledger."""
    ledger = Ledger()
    token = _LEDGER.set(ledger)
    try:
        yield ledger
    finally:
        _LEDGER.reset(token)


def read_api_key(settings: LlmSettings, secrets: EngineSecrets) -> str:
    """The API key, from the setting or the file it names (one of `secrets`' credentials
    from now on); empty when neither is set."""
    if settings.api_key:
        secrets.add_credentials([settings.api_key])  # never in a log line or an error
        return settings.api_key
    if not settings.api_key_file:
        return ""
    path = settings.api_key_file
    key, mode = secret_files.read_stripped(
        f"{ENV_PREFIX}LLM_API_KEY_FILE", path, CapabilityConfigError
    )
    secrets.add_credentials([key])
    problem = secret_files.exposed(
        f"{ENV_PREFIX}LLM_API_KEY_FILE ({path})", path, mode, holds="the model's API key"
    )
    if problem:
        raise CapabilityConfigError(problem)
    return key


class ModelClient:
    """Structured answers from one model; an async context manager opened with the engine."""

    def __init__(
        self,
        settings: LlmSettings,
        *,
        context: EngineContext | None = None,
        sleep: Any = asyncio.sleep,
    ) -> None:
        context = EngineContext() if context is None else context
        self._settings = settings
        #: The engine's secrets: its key among them; what the model echoes is quoted masked.
        self.secrets = context.secrets
        # What its errors quote (stored in a workflow, shown to its callers) is masked with the
        # engine's credentials, not every workflow's secrets (`secrets.for_workflow`).
        self._shown = for_workflow(self.secrets, ())
        self._metrics = context.metrics
        self._api_key = read_api_key(settings, self.secrets)
        self._sleep = sleep
        self._client: openai.AsyncOpenAI | None = None
        self._stop = settings.stop_sequences()
        #: The structured-output rung this endpoint answers (`structured_output`).
        #: Keyed by the model too: a router serves each model from its own server.
        self._modes = OutputModes(
            f"{settings.base_url.rstrip('/')} {settings.model}", settings.output_mode
        )

    @property
    def model(self) -> str:
        return self._settings.model

    async def __aenter__(self) -> Self:
        import openai

        self._client = openai.AsyncOpenAI(
            base_url=self._settings.base_url,
            # The SDK insists on a key; local servers take any.
            api_key=self._api_key or "none",
            timeout=self._settings.timeout_seconds,
            max_retries=0,  # retries are ours (`answer`), so they are in one place
            http_client=capped_http_client(MAX_ANSWER_BYTES),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def answer(
        self,
        purpose: str,
        messages: list[JsonObject],
        schema_name: str,
        schema: JsonObject,
    ) -> Any:
        """The model's answer to `messages` as JSON (meant to follow `schema`), `ModelError`,
        or `AnswerProblem` for an answer that is there but cut or not JSON."""
        if self._client is None:
            raise ModelError("the model client is not open")
        import openai  # imported by `__aenter__` already: a lookup

        attempts = self._settings.retries + 1
        attempt = 1
        while True:
            mode = self._modes.mode()
            started = time.monotonic()
            try:
                with self._span(purpose) as span:
                    completion = await self._create(
                        purpose, asked_for(mode, messages, schema_name, schema), span
                    )
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                # The SDK could not make sense of the body at all (a list, a wrong type).
                raise ModelError(
                    f"the model server's answer cannot be read ({type(exc).__name__})"
                ) from None
            except openai.APIError as exc:
                self._metrics.model_call(
                    purpose=purpose,
                    model=self._settings.model,
                    seconds=time.monotonic() - started,
                    input_tokens=0,
                    output_tokens=0,
                    error=type(exc).__name__,
                )
                if refuses_shape(exc):
                    if self._modes.step_down(mode, _describe_error(exc, 1, self._shown)):
                        continue  # the same question in the next shape: not a retry
                    raise ModelError(
                        f"{_describe_error(exc, attempt, self._shown)}: the server does not "
                        f"take the {mode} request shape ({ENV_PREFIX}LLM_OUTPUT_MODE)"
                    ) from None
                delay = _retryable(exc, attempt, self._settings.retry_max_seconds)
                if delay is None or attempt == attempts:
                    raise ModelError(_describe_error(exc, attempt, self._shown)) from None
                log.warning(
                    "model_call_retried",
                    purpose=purpose,
                    attempt=attempt,
                    delay=round(delay, 3),
                    error=_describe_error(exc, attempt, self._shown),
                )
                await self._sleep(delay)
                attempt += 1
                continue
            return self._read(purpose, completion, started)

    def _span(self, purpose: str) -> Any:
        """A GenAI client span for one call (OpenTelemetry's conventions: "chat {model}")."""
        return tracing.span(
            f"chat {self._settings.model}",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": self._settings.model,
                "gen_ai.request.max_tokens": self._settings.tokens_for(purpose),
                "workflow_engine.purpose": purpose,
                "workflow_engine.output_mode": self._modes.mode(),
            },
            SpanKind.CLIENT,
        )

    async def _create(self, purpose: str, request: Request, span: Any) -> Any:
        assert self._client is not None
        options: dict[str, Any] = {}
        if request.response_format is not None:
            options["response_format"] = request.response_format
        if self._stop:
            options["stop"] = self._stop
        import openai

        # The SDK's timeout bounds each read, so a server that sends a byte now and then is
        # never timed out by it; this bounds the whole call.
        try:
            async with asyncio.timeout(self._settings.timeout_seconds):
                raw = await self._client.chat.completions.with_raw_response.create(
                    model=self._settings.model,
                    messages=cast(Any, request.messages),
                    max_tokens=self._settings.tokens_for(purpose),
                    temperature=self._settings.temperature,
                    **options,
                )
        except TimeoutError:  # retried and told as the SDK's own timeout (nothing reads request)
            raise openai.APITimeoutError(request=cast(Any, None)) from None
        # The body (at most MAX_ANSWER_BYTES) is parsed off the event loop: megabytes of JSON
        # and the SDK's models of them would hold it for a second and more.
        completion = await asyncio.to_thread(raw.parse)
        usage = getattr(completion, "usage", None)
        span.set_attribute("gen_ai.response.model", str(getattr(completion, "model", "") or ""))
        span.set_attribute("gen_ai.usage.input_tokens", _count(usage, "prompt_tokens"))
        span.set_attribute("gen_ai.usage.output_tokens", _count(usage, "completion_tokens"))
        return completion

    def _read(self, purpose: str, completion: Any, started: float) -> Any:
        """The answer's JSON, once its call is accounted. The server's answer is untrusted:
        the SDK does not check its fields' types, so each is read as what it must be."""
        usage = getattr(completion, "usage", None)
        call = ModelCall(
            purpose=purpose,
            model=str(getattr(completion, "model", "") or self._settings.model)[:200],
            latency_ms=round((time.monotonic() - started) * 1000),
            prompt_tokens=_count(usage, "prompt_tokens"),
            completion_tokens=_count(usage, "completion_tokens"),
        )
        ledger = _LEDGER.get()
        if ledger is not None:
            ledger.calls.append(call)
        # Labelled with the configured model, not the answer's: a label's values must be few,
        # and the server names its model as it likes (the call's record keeps its name).
        self._metrics.model_call(
            purpose=purpose,
            model=self._settings.model,
            seconds=call.latency_ms / 1000,
            input_tokens=call.prompt_tokens,
            output_tokens=call.completion_tokens,
        )
        log.info("model_called", **call.to_json())
        choices = getattr(completion, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise ModelError("the model answered with no choices")
        choice = choices[0]
        message = getattr(choice, "message", None)
        refusal = getattr(message, "refusal", None)
        if refusal:
            raise ModelError(f"the model refused: {_quote(str(refusal), self._shown)}")
        content = getattr(message, "content", None) or ""
        if not isinstance(content, str):
            shown = str(content)[:_QUOTED]
            raise AnswerProblem(
                "the answer's content is not text", shown, _quote(shown, self._shown)
            )
        if getattr(choice, "finish_reason", None) == "length":
            limit = self._settings.tokens_for(purpose)
            raise AnswerProblem(
                f"the model's answer was cut at {call.completion_tokens or limit} tokens "
                f"(the limit is {limit}: {_TOKEN_SETTING.get(purpose, 'MAX_TOKENS')})",
                content,
                _quote(content, self._shown),
            )
        try:
            return extract_json(content)
        except ValueError as exc:
            shown = _quote(content, self._shown)
            raise AnswerProblem(f"the answer is not JSON ({exc})", content, shown) from None


_TOKEN_SETTING = {
    purpose: f"{ENV_PREFIX}LLM_{name}_MAX_TOKENS"
    for purpose, name in (
        ("plan", "PLAN"),
        ("revise", "PLAN"),
        ("verify", "VERIFY"),
        ("summary", "SUMMARY"),
    )
}


#: The most tokens one call is believed to have used: a server's count is untrusted input.
MAX_COUNTED_TOKENS = 10_000_000


def _count(usage: Any, name: str) -> int:
    """A token count of the server's `usage`, as a whole number from 0 to `MAX_COUNTED_TOKENS`
    (0 when it is missing or not a number)."""
    value = getattr(usage, name, None)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if value != value or value < 0:  # NaN, or a negative count that would lower the budget
        return 0
    return int(min(value, MAX_COUNTED_TOKENS))


def _retryable(exc: openai.APIError, attempt: int, max_seconds: float) -> float | None:
    """Seconds to wait before trying again, or None when retrying cannot help.

    Retried: a timeout, a connection error (no answer at all), 429 (after its Retry-After when
    it gives one, at most `MAX_RETRY_AFTER_SECONDS`), and 5xx (the server's trouble). Not
    retried: any other 4xx (the request is wrong: key, model, schema) and an answer the SDK
    could not read.
    """
    import openai

    backoff = float(min(max_seconds, 0.5 * 2 ** (attempt - 1)))
    if isinstance(exc, openai.APITimeoutError | openai.APIConnectionError):
        return backoff
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code == 429:
            after = _retry_after(exc.response.headers.get("retry-after"))
            return backoff if after is None else after
        if exc.status_code >= 500:
            return backoff
    return None


def _retry_after(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from model servers; fall back to backoff
    if seconds is None or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_SECONDS)


def _describe_error(exc: openai.APIError, attempt: int, secrets: Secrets) -> str:
    import openai

    tries = f" (after {attempt} attempt(s))" if attempt > 1 else ""
    if isinstance(exc, openai.APITimeoutError):
        return f"the model did not answer in time{tries}"
    if isinstance(exc, openai.APIConnectionError):
        return f"the model server cannot be reached{tries}: {exc.__cause__ or exc}"
    if isinstance(exc, openai.APIStatusError):
        said = _quote(exc.message, secrets)
        return f"the model server answered HTTP {exc.status_code}{tries}: {said}"
    return f"the model's answer cannot be read: {_quote(str(exc), secrets)}"


def _quote(text: str, secrets: Secrets) -> str:
    return secrets.quoted(str(text), _QUOTED)


async def answer_valid(
    client: ModelClient,
    purpose: str,
    messages: list[JsonObject],
    schema_name: str,
    schema: JsonObject,
    validate: Any,
    attempts: int,
) -> Any:
    """`validate(answer)` of the model's answer, asking again with what was wrong, at most
    `attempts` times; then `ModelError` quoting the last problem.

    `validate` raises `WorkflowEngineError` (an `InvalidArgument` naming the field) for an
    answer that does not hold; an answer cut at the token limit or that holds no JSON is as
    wrong. The model sees the problem and answers again.
    """
    messages = list(messages)
    problem = ""
    for attempt in range(1, attempts + 1):
        try:
            answer = await client.answer(purpose, messages, schema_name, schema)
        except AnswerProblem as exc:
            problem, said = exc.message, exc.content
            again = "Answer again, shorter," if "cut at" in exc.reason else "Answer again"
        else:
            try:
                return validate(answer)
            except WorkflowEngineError as exc:
                problem, said = exc.message, json.dumps(answer)
                again = "Answer again"
        log.warning("model_answer_invalid", purpose=purpose, attempt=attempt, problem=problem)
        messages += [
            {"role": "assistant", "content": said[:MAX_REPEATED_CHARS] or "(nothing)"},
            {
                "role": "user",
                "content": f"That answer is invalid: {problem}. {again} with the whole "
                "corrected JSON object, following the schema.",
            },
        ]
    raise ModelError(f"the model's {schema_name} was invalid {attempts} time(s); last: {problem}")
