"""The OpenAI-compatible backend: OpenAI itself, or any server speaking its chat completions
API (vLLM, Ollama, llama.cpp's server, LM Studio...), through the official ``openai`` SDK.

Only what is OpenAI's lives here: how one request is built and sent, what the SDK's exceptions
mean, and how a response reads. The call loop (concurrency gate, shared rate limit, keepalive,
inline waits on 429, retries) is ``jobs.models.calls``, shared by every backend. The SDK's own
retries are off. How its answers map onto the loop's outcomes:

    429 (not insufficient_quota), with Retry-After    -> RATE_LIMITED, that wait
    429 insufficient_quota                            -> PERMANENT: the account is out of quota
    400 asking for max_completion_tokens              -> RESEND, with that field from now on
    5xx, 408, 409, connection refused                 -> UNAVAILABLE
    timeout                                           -> TIMED_OUT
    400 (context length...), 401, 403, 404, 4xx       -> PERMANENT, saying what to fix
    finish_reason "length"                            -> the answer is CUT_OFF

Its batch side (OpenAI's Batch API, the same request body and the same reading of answers and
errors) is ``jobs.models.batch_api.openai_batch``.
"""

from __future__ import annotations

import openai

from jobs.config import model_calls
from jobs.errors import PermanentError
from jobs.models import backends, structured
from jobs.models.batch_api.openai_batch import OpenAIBatches
from jobs.models.calls import ModelBackend, ModelSettings, ModelUnavailable, match_label
from jobs.models.provider import (
    COMPLETE,
    CUT_OFF,
    PERMANENT,
    RATE_LIMITED,
    RESEND,
    TIMED_OUT,
    Answer,
    CallRequest,
    Failure,
    Usage,
    estimated_usage,
    retry_after_seconds,
    status_failure,
    unreachable,
)

__all__ = ["ModelUnavailable", "OpenAIBackend", "match_label", "retry_after_seconds"]


def _server_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return exc.message


def _looks_like_context_length(exc: openai.APIStatusError, message: str) -> bool:
    text = message.lower()
    return exc.code == "context_length_exceeded" or (
        "context" in text and any(w in text for w in ("length", "window", "token", "too long")))


def _status_failure(exc: openai.APIStatusError, settings: ModelSettings) -> Failure:
    """What an HTTP error answer means (429 is handled by the caller)."""
    message = _server_message(exc)
    return status_failure(exc.status_code, message, model=settings.name,
                          where=settings.url or OpenAIBackend.default_url,
                          too_long=exc.status_code == 400 and _looks_like_context_length(exc, message),
                          url_hint="usually ending in /v1")


class OpenAIBackend(OpenAIBatches, ModelBackend):
    name = "openai"
    default_url = "https://api.openai.com/v1"  # the SDK's, when LEASH_MODEL_URL is unset

    def __init__(self, ctx=None, settings: ModelSettings | None = None):
        super().__init__(ctx, settings)
        s = self.settings
        self.client = openai.OpenAI(
            base_url=s.url, api_key=s.api_key, max_retries=0,
            timeout=openai.Timeout(s.timeout, connect=s.connect_timeout),
        )
        # OpenAI's reasoning models refuse max_tokens and want max_completion_tokens; the first
        # such refusal switches this backend over.
        self.token_limit_field = "max_tokens"

    def _body(self, request: CallRequest) -> dict:
        """The chat completions request for ``request``: what a direct call sends, and a batch
        line's ``body``."""
        body: dict = {"model": self.settings.name, "messages": request.messages,
                      self.token_limit_field: request.max_tokens}
        if self.settings.temperature is not None:
            body["temperature"] = self.settings.temperature
        if request.response_format is not None:
            mode = self.structured_mode()
            if mode == structured.SCHEMA:
                body["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": request.response_format["name"], "schema": request.response_format["schema"],
                    "strict": True}}
            elif mode == structured.JSON_MODE:
                # JSON mode; the schema beside it is enforced by servers that read it (llama-cpp-python's).
                body["response_format"] = {"type": "json_object", "schema": request.response_format["schema"]}
        return body

    @classmethod
    def structured_mode(cls) -> str:
        """OpenAI has strict JSON Schema outputs; a compatible server may have only JSON mode,
        or neither (LEASH_MODEL_STRUCTURED_OUTPUT says which)."""
        mode = (model_calls().model_structured_output or structured.SCHEMA).strip()
        if mode not in structured.STRUCTURED_OUTPUTS:
            raise PermanentError(f"LEASH_MODEL_STRUCTURED_OUTPUT={mode!r} is unknown; choose one of "
                                 f"{', '.join(structured.STRUCTURED_OUTPUTS)}")
        return mode

    @classmethod
    def structured_problem(cls, schema: dict) -> str | None:
        if cls.structured_mode() != structured.SCHEMA:
            return None
        problem = structured.strict_problem(schema)
        return problem and (f"{problem}; or set LEASH_MODEL_STRUCTURED_OUTPUT=json for a server that "
                            "checks no schema")

    def _send(self, request: CallRequest):
        return self.client.chat.completions.create(**self._body(request))

    def _failure(self, exc: Exception) -> Failure | None:
        if isinstance(exc, openai.RateLimitError):
            if exc.code == "insufficient_quota":
                return Failure(PERMANENT, f"the model provider says the account is out of quota (HTTP 429): "
                                          f"{_server_message(exc)}")
            return Failure(RATE_LIMITED, wait=retry_after_seconds(exc.response.headers))
        if isinstance(exc, openai.BadRequestError) and self._switch_token_limit_field(exc):
            return Failure(RESEND)
        if isinstance(exc, openai.APIStatusError):
            return _status_failure(exc, self.settings)
        if isinstance(exc, openai.APITimeoutError):
            return Failure(TIMED_OUT)
        if isinstance(exc, openai.APIConnectionError):
            return unreachable(self.client.base_url, exc)
        return None

    def _read(self, response, request: CallRequest) -> Answer:
        choice = response.choices[0] if response.choices else None
        text = choice.message.content if choice is not None else None
        reason = choice.finish_reason if choice is not None else "no choices"
        return Answer(text, CUT_OFF if reason == "length" else COMPLETE, reason, _usage(response, request, text))

    def _switch_token_limit_field(self, exc: openai.BadRequestError) -> bool:
        """True (and switched) when the server asked for max_completion_tokens instead."""
        if self.token_limit_field == "max_tokens" and "max_completion_tokens" in _server_message(exc):
            self.token_limit_field = "max_completion_tokens"
            return True
        return False


def _usage(response, request: CallRequest, text: str | None) -> Usage:
    usage = getattr(response, "usage", None)
    total = getattr(usage, "total_tokens", None)
    if not total:  # servers that report no usage
        return estimated_usage(request, text)
    # total_tokens = prompt_tokens + completion_tokens: the parts are taken so that they add up
    # to the total the server reported, whatever it left out.
    input_tokens = min(getattr(usage, "prompt_tokens", None) or 0, total)
    details = getattr(usage, "prompt_tokens_details", None)
    return Usage(input_tokens=input_tokens, output_tokens=total - input_tokens,
                 cached_input_tokens=getattr(details, "cached_tokens", None))


def _warm() -> None:
    """The SDK imports a client's parts on first use (about 60 ms): use them once, so a
    work-horse forked afterwards starts with them loaded. Sends nothing."""
    with openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0) as client:
        client.chat.completions  # noqa: B018 (the first access is what imports them)


backends.register("openai", OpenAIBackend, warm=_warm)
