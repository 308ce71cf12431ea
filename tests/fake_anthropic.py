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

import json
import re
import secrets
from datetime import UTC, datetime
from urllib.parse import urlsplit

import pytest

from tests.fake_batches import ENDED, BatchAPI, FakeBatch, body_of, send_bytes
from tests.fake_openai import Error, FakeOpenAI, Seen, send_json, serving

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

    def batch_api(self):
        return AnthropicBatchAPI(self)

    def api_key_of(self, headers) -> str:
        # Anthropic's documented header; this SDK sends the key as a Bearer token.
        return headers.get("x-api-key") or super().api_key_of(headers)

    def prompt_text(self, body: dict) -> str:
        return str(body.get("system", "")) + super().prompt_text(body)

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

    def structured_schema(self, body: dict) -> dict | None:
        """The input schema of the tool a request's ``tool_choice`` makes the model call."""
        choice = body.get("tool_choice") or {}
        if choice.get("type") != "tool":
            return None
        return next((t.get("input_schema") for t in body.get("tools") or [] if t.get("name") == choice.get("name")),
                    None)

    def answer_body(self, seen: Seen, text: str, finish_reason: str | None, usage: tuple[int, int] | None) -> dict:
        content = [{"type": "text", "text": text}]
        if self.structured_schema(seen.body) is not None and finish_reason is None:
            # The forced tool's call: its input is the answer (always an object, as Anthropic's).
            content = [{"type": "tool_use", "id": f"toolu_{len(self.requests):024d}",
                        "name": seen.body["tool_choice"]["name"], "input": json.loads(text)}]
            finish_reason = "tool_use"
        answer = {
            "id": f"msg_{len(self.requests):024d}", "type": "message", "role": "assistant",
            "content": content, "model": seen.body.get("model"),
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


_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _when(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


class AnthropicBatchAPI(BatchAPI):
    """Anthropic's Message Batches API (https://docs.anthropic.com/en/api/creating-message-batches)."""

    def route(self, handler, method: str) -> bool:
        path = urlsplit(handler.path).path.rstrip("/")
        if path == "/v1/messages/batches":
            if method == "POST":
                return self._create(handler)
            with self.lock:
                objects = [self.shape(b) for b in reversed(self.batches.values())]
            return self.page(handler, objects, "after_id") or True
        match = re.fullmatch(r"/v1/messages/batches/([\w-]+)(/cancel|/results)?", path)
        if not match:
            return False
        batch = self.batches.get(match[1])
        if batch is None:
            return send_json(handler, 404, self.server.error_body(Error(404, "batch not found"))) or True
        if match[2] == "/cancel" and method == "POST":
            self.cancel(batch.id)
        elif match[2] == "/results":
            if self.poll_error(handler, results=True):
                return True
            if batch.stage != ENDED:
                error = Error(400, "results are not available until the batch has ended")
                return send_json(handler, 400, self.server.error_body(error)) or True
            lines = [json.dumps({"custom_id": name, "result": self._result(batch, result)}) + "\n"
                     for name, result in batch.results.items()]
            return send_bytes(handler, "".join(lines).encode(), "application/binary") or True
        else:
            if self.poll_error(handler):
                return True
            self.polled(batch)
        return send_json(handler, 200, self.shape(batch)) or True

    def _create(self, handler) -> bool:
        requests = json.loads(body_of(handler)).get("requests") or []
        names = [r.get("custom_id", "") for r in requests]
        bad = [n for n in names if not _CUSTOM_ID.match(str(n))]
        if not requests or bad or len(set(names)) != len(names):
            error = Error(400, f"requests: custom_id must match ^[a-zA-Z0-9_-]{{1,64}}$ and be unique ({bad[:1]})")
            return send_json(handler, 400, self.server.error_body(error)) or True
        batch = self.new(f"msgbatch_{secrets.token_hex(12)}", [(r["custom_id"], r.get("params") or {}) for r in requests])
        return send_json(handler, 200, self.shape(batch)) or True

    def _result(self, batch: FakeBatch, result) -> dict:
        if result is None:
            return {"type": "expired" if batch.ending == "expired" else "canceled"}
        status, body = result
        if status == 200:
            return {"type": "succeeded", "message": body}
        return {"type": "errored", "error": body}

    def shape(self, batch: FakeBatch) -> dict:
        with self.lock:
            ended = batch.stage == ENDED
            kinds = [self._result(batch, r)["type"] for r in batch.results.values()] if ended else []
            status = "ended" if ended else "canceling" if batch.canceling else "in_progress"
            return {
                "id": batch.id, "type": "message_batch", "processing_status": status,
                "request_counts": {"processing": 0 if ended else len(batch.requests),
                                   **{k: kinds.count(k) for k in ("succeeded", "errored", "canceled", "expired")}},
                "ended_at": _when(batch.times.get(batch.ending)) if ended else None,
                "created_at": _when(batch.created_at), "expires_at": _when(batch.created_at + 86400),
                "archived_at": None, "cancel_initiated_at": _when(batch.times.get("cancelling")),
                "results_url": f"{self.server.url}/v1/messages/batches/{batch.id}/results" if ended else None,
            }


@pytest.fixture
def anthropic_server(env):
    """A started fake Anthropic server, with LEASH_MODEL_BACKEND=anthropic pointing workers at it."""
    yield from serving(env, FakeAnthropic())


@pytest.fixture(params=[FakeOpenAI, FakeAnthropic], ids=["openai", "anthropic"])
def provider_server(request, env):
    """The test runs once against each provider's fake server and backend."""
    yield from serving(env, request.param())
