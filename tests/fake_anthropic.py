"""A fake Anthropic server for the tests: a real HTTP server on loopback that answers
POST /v1/messages in the shape of Anthropic's Messages API, with the same rules, holds and bills
as ``tests.fake_openai`` (``on(item, behaviour)``, ``latency``, ``billed``...), which it extends:
only the protocol differs.

An answer is ``{"id", "type": "message", "role": "assistant", "content": [{"type": "text",
"text": ...}], "model", "stop_reason", "stop_sequence", "usage": {"input_tokens", "output_tokens",
"cache_creation_input_tokens", "cache_read_input_tokens"}}``; an error is ``{"type": "error",
"error": {"type": ..., "message": ...}}`` with the error type Anthropic gives its status.
``cache_read`` makes every answer report that many of its prompt tokens as read from the cache
(Anthropic counts them apart from ``input_tokens``); ``billed`` still lists whole prompts.

``provider_server`` runs a test once against each fake (the OpenAI-compatible one and this),
with LEASH_MODEL_BACKEND naming the backend that speaks its protocol.
"""

from __future__ import annotations

import pytest

from tests.fake_openai import Error, FakeOpenAI, Seen, serving

#: Anthropic's error type for each status (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 504: "timeout_error", 529: "overloaded_error"}


class FakeAnthropic(FakeOpenAI):
    BACKEND = "anthropic"
    PATH = "/v1/messages"
    cut_off = "max_tokens"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cache_read = 0  # prompt tokens each answer reports as read from the cache
        self.billed_cached: list[int] = []  # the cached part of each billed prompt

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"  # the SDK adds /v1/messages

    def api_key_of(self, headers) -> str:
        # Anthropic's documented header; this SDK sends the key as a Bearer token.
        return headers.get("x-api-key") or super().api_key_of(headers)

    def prompt_chars(self, body: dict) -> int:
        return len(str(body.get("system", ""))) + super().prompt_chars(body)

    def invalid(self, body: dict) -> Error | None:
        # What Anthropic's Messages API refuses that an OpenAI-compatible server takes.
        if "max_tokens" not in body:
            return Error(400, "max_tokens: Field required")
        for i, message in enumerate(body.get("messages", [])):
            if message.get("role") not in ("user", "assistant"):
                return Error(400, f"messages.{i}.role: Input should be 'user' or 'assistant'")
            if not str(message.get("content", "")).strip():
                return Error(400, f"messages.{i}: text content blocks must contain non-whitespace text")
        return None

    def answer_body(self, seen: Seen, text: str, finish_reason: str | None, usage: tuple[int, int] | None) -> dict:
        answer = {
            "id": f"msg_{len(self.requests):024d}", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": text}], "model": seen.body.get("model"),
            "stop_reason": finish_reason or "end_turn", "stop_sequence": None,
        }
        if usage is not None:
            cached = min(self.cache_read, usage[0])
            answer["usage"] = {"input_tokens": usage[0] - cached, "output_tokens": usage[1],
                               "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}
        return answer

    def error_body(self, error: Error) -> dict:
        kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": error.message}}

    def bill(self, prompt_tokens: int, completion_tokens: int) -> None:
        super().bill(prompt_tokens, completion_tokens)
        with self.lock:
            self.billed_cached.append(min(self.cache_read, prompt_tokens))


@pytest.fixture
def anthropic_server(env):
    """A started fake Anthropic server, with LEASH_MODEL_BACKEND=anthropic pointing workers at it."""
    yield from serving(env, FakeAnthropic())


@pytest.fixture(params=[FakeOpenAI, FakeAnthropic], ids=["openai", "anthropic"])
def provider_server(request, env):
    """The test runs once against each provider's fake server and backend."""
    yield from serving(env, request.param())
