"""The Anthropic backend: Claude through the official ``anthropic`` SDK's Messages API
(``client.messages.create``), at https://api.anthropic.com or ``LEASH_MODEL_URL``.

Only what is Anthropic's lives here: how one request is built (the system prompt is the
top-level ``system``, ``max_tokens`` is required), what the SDK's exceptions mean, and how a
message reads. The call loop (concurrency gate, shared rate limit, keepalive, inline waits,
retries) is ``jobs.models.calls``, shared by every backend. The SDK's own retries are off. How
its answers map onto the loop's outcomes (the same as the OpenAI backend's):

    429 rate_limit_error, with retry-after            -> RATE_LIMITED, that wait
    529 overloaded_error (with retry-after or not)    -> RATE_LIMITED: every caller pauses, then again
    5xx, 408, 409, connection refused                 -> UNAVAILABLE
    timeout                                           -> TIMED_OUT
    400 "prompt is too long", 413                     -> PERMANENT: shorten the items
    401, 402, 403, 404, other 4xx                     -> PERMANENT, saying what to fix
    stop_reason "max_tokens"                          -> the answer is CUT_OFF

Its batch side (Message Batches, the same request and the same reading of answers and errors)
is ``jobs.models.batch_api.anthropic_batch``.
"""

from __future__ import annotations

import json

import anthropic

from jobs.config import model_calls
from jobs.models import backends, structured
from jobs.models.batch_api.anthropic_batch import AnthropicBatches
from jobs.models.calls import ModelBackend, ModelSettings
from jobs.models.provider import (
    COMPLETE,
    CUT_OFF,
    RATE_LIMITED,
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

__all__ = ["AnthropicBackend"]

#: Anthropic's 529: its servers are overloaded for everyone, not this account's limit.
OVERLOADED = 529


def _server_message(exc: anthropic.APIStatusError) -> str:
    if exc.api_message:  # error.message of {"type": "error", "error": {"type": ..., "message": ...}}
        return str(exc.api_message)
    if isinstance(exc.body, str) and exc.body.strip():
        return exc.body.strip()[:500]
    return exc.message


def _too_long(status: int, message: str) -> bool:
    text = message.lower()
    return status == 413 or (status == 400 and (
        "prompt is too long" in text or ("context" in text and any(w in text for w in ("window", "length", "limit")))))


class AnthropicBackend(AnthropicBatches, ModelBackend):
    name = "anthropic"
    default_url = "https://api.anthropic.com"  # the SDK's; requests go to <url>/v1/messages

    def __init__(self, ctx=None, settings: ModelSettings | None = None):
        super().__init__(ctx, settings)
        s = self.settings
        # base_url always given, so the SDK never reads ANTHROPIC_BASE_URL behind leash's settings.
        self.client = anthropic.Anthropic(
            base_url=s.url or self.default_url, api_key=s.api_key, max_retries=0,
            timeout=anthropic.Timeout(s.timeout, connect=s.connect_timeout),
        )

    def _params(self, request: CallRequest) -> dict:
        """The Messages API request for ``request``: what a direct call sends, and a batch
        request's ``params``."""
        system = "\n\n".join(m["content"] for m in request.messages if m["role"] == "system")
        # Anthropic refuses a blank turn (400), e.g. classify's blank first answer sent back with
        # its correction: it goes as a visible placeholder.
        messages = [{"role": m["role"], "content": m["content"] if m["content"].strip() else "(no answer)"}
                    for m in request.messages if m["role"] != "system"]
        params: dict = {"model": self.settings.name, "max_tokens": request.max_tokens, "messages": messages}
        if system:
            params["system"] = system
        if self.settings.temperature is not None:
            params["temperature"] = self.settings.temperature
        shape = request.response_format
        if shape is not None and self.structured_mode() == structured.SCHEMA:
            # Anthropic's structured answer: the one tool the model must call, its input the object.
            params["tools"] = [{"name": shape["name"], "description": "Record the fields extracted from the text.",
                                "input_schema": shape["schema"]}]
            params["tool_choice"] = {"type": "tool", "name": shape["name"]}
        return params

    @classmethod
    def structured_mode(cls) -> str:
        """A tool's input schema, unless LEASH_MODEL_STRUCTURED_OUTPUT says otherwise (Anthropic
        has no JSON mode: ``json`` is the schema in the prompt, as ``prompt`` is)."""
        mode = (model_calls().model_structured_output or structured.SCHEMA).strip()
        return structured.SCHEMA if mode == structured.SCHEMA else structured.PROMPT

    def _send(self, request: CallRequest):
        return self.client.messages.create(**self._params(request))

    def _failure(self, exc: Exception) -> Failure | None:
        if isinstance(exc, anthropic.APIStatusError):
            if exc.status_code in (429, OVERLOADED):
                return Failure(RATE_LIMITED, wait=retry_after_seconds(exc.response.headers),
                               overloaded=exc.status_code == OVERLOADED)
            message = _server_message(exc)
            return status_failure(exc.status_code, message, model=self.settings.name,
                                  where=self.settings.url or self.default_url,
                                  too_long=_too_long(exc.status_code, message),
                                  url_hint=f"without /v1, e.g. {self.default_url}")
        if isinstance(exc, anthropic.APITimeoutError):
            return Failure(TIMED_OUT)
        if isinstance(exc, anthropic.APIConnectionError):
            return unreachable(self.client.base_url, exc)
        return None

    def _read(self, response, request: CallRequest) -> Answer:
        blocks = response.content or []
        tools = [block.input for block in blocks if getattr(block, "type", None) == "tool_use"]
        parts = [block.text for block in blocks if getattr(block, "type", None) == "text"]
        # A structured answer is the tool's input (an object); its JSON text is the answer.
        text = json.dumps(tools[0], ensure_ascii=False) if tools else "".join(parts) if parts else None
        reason = response.stop_reason
        return Answer(text, CUT_OFF if reason == "max_tokens" else COMPLETE, reason, _usage(response, request, text))


def _usage(response, request: CallRequest, text: str | None) -> Usage:
    usage = getattr(response, "usage", None)
    if usage is None or (not getattr(usage, "input_tokens", None) and not getattr(usage, "output_tokens", None)):
        return estimated_usage(request, text)  # a compatible server that reports none
    # Anthropic counts the prompt tokens read from its cache (and those written to it) apart
    # from input_tokens; leash's Usage counts every prompt token as input, the cached ones a part
    # of it, as OpenAI does and as jobs/usage/prices.py prices them (cached ones at the cached
    # rate). Tokens written to the cache are priced at the input rate (Anthropic charges 1.25 x;
    # leash marks no cache breakpoints, so there are none unless the account caches on its own).
    cached = getattr(usage, "cache_read_input_tokens", None)
    written = getattr(usage, "cache_creation_input_tokens", None) or 0
    return Usage(input_tokens=(usage.input_tokens or 0) + (cached or 0) + written,
                 output_tokens=usage.output_tokens or 0, cached_input_tokens=cached)


def _warm() -> None:
    """The SDK imports a client's parts on first use: use them once, so a work-horse forked
    afterwards starts with them loaded. Sends nothing."""
    with anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="unused", max_retries=0) as client:
        client.messages  # noqa: B018 (the first access is what imports them)


backends.register("anthropic", AnthropicBackend, warm=_warm)
