"""A fake OpenAI-compatible server for the tests: a real HTTP server on loopback that answers
POST /v1/chat/completions, records when each request arrived, and follows a script.

A test says how the model behaves for an item (the first user message) with ``on``::

    model_server.on("item-b", Error(429, "slow down", headers={"Retry-After": "2"}))
    model_server.on("item-c", Slow(5))

Items without a rule get ``Reply()``: the text after "->" in the item ("great -> positive"
answers "positive"), else "echo: <item>".
A structured request (a JSON Schema in ``response_format``; Anthropic's forced tool) gets an
object built from its schema (``tests.fake_schema``); ``schema_answers = "break_first"`` breaks
the first answer about each item, ``"never"`` every one.

What a call cost: ``billed`` lists the usage of every answer the server delivered (prompt and
completion tokens), and ``hold_after(n)`` holds every request after the n-th delivered answer
until ``release()``; a held request whose client went away meanwhile (a SIGKILLed worker) is
never answered, so it costs nothing, like a provider that stops when its client disconnects
-- or, with ``bills_abandoned = True``, is billed all the same, like a provider that finishes
generating a request whose client went away.

For load: ``latency`` delays every answer (a model that takes 0.5 s a call), ``capacity``
answers 429 with ``Retry-After`` to any request beyond that many in flight (a server or an
account that takes 8 calls at once), and ``max_in_flight`` records the most requests it ever
held at once.

Its batch endpoints (files and batches, answered by the same rules) are ``tests.fake_batches``,
reached as ``server.batches``.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.fake_schema import broken, schema_value

MODEL = "fake-model"
API_KEY = "test-key"


@dataclass
class Seen:
    at: float  # wall clock, when the request arrived
    item: str  # the first user message
    last: str  # the last user message (the correction, on classify's second try)
    body: dict
    authorization: str  # the Authorization header as sent
    api_key: str  # the key, however the protocol sends it


def default_answer(item: str) -> str:
    if "->" in item:
        return item.rsplit("->", 1)[1].strip()
    return f"echo: {item}"


@dataclass
class Reply:
    text: str | None = None
    finish_reason: str | None = None  # None: the protocol's normal end; ``server.cut_off``: hit max_tokens
    report_usage: bool = True  # False: a server that says nothing of usage (leash estimates)

    def result(self, server: FakeOpenAI, seen: Seen) -> tuple[int, dict, tuple[int, int] | None]:
        """The status, body and billed (prompt, completion) tokens of this answer."""
        text = self.text if self.text is not None else server.answer_for(seen)
        finish = self.finish_reason
        # A provider never generates (nor bills) past the request's max_tokens: it cuts there.
        limit = seen.body.get("max_completion_tokens") or seen.body.get("max_tokens")
        while isinstance(limit, int) and text and billed_tokens(text) > limit:
            text, finish = text[:-1], server.cut_off
        usage = (server.billed_tokens(server.prompt_text(seen.body)), billed_tokens(text))
        body = server.answer_body(seen, text, finish, usage if self.report_usage else None)
        return 200, body, usage if self.report_usage else None

    def respond(self, server: FakeOpenAI, handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        status, body, usage = self.result(server, seen)
        if not server.wait_if_held(handler):
            if usage and server.bills_abandoned:  # generated all the same
                server.bill(*usage)
            return
        # Billed before the answer leaves: a client that reads it (and a test that then reads the
        # bill) must find it billed. Taken back if it could not be delivered, unless billed anyway.
        if usage:
            server.bill(*usage)
        if not send_json(handler, status, body) and usage and not server.bills_abandoned:
            server.unbill(usage)


@dataclass
class Error:
    status: int
    message: str
    code: str | None = None
    headers: dict = field(default_factory=dict)

    def result(self, server, seen) -> tuple[int, dict, None]:
        return self.status, server.error_body(self), None

    def respond(self, server, handler, seen) -> None:
        send_json(handler, self.status, server.error_body(self), self.headers)


@dataclass
class Slow:
    """Answer normally, after ``seconds``."""

    seconds: float

    def respond(self, server, handler, seen) -> None:
        if not server.stopping.wait(self.seconds):
            Reply().respond(server, handler, seen)


class Trickle:
    """Start a 200 answer and never finish it: a space every half second keeps the client's
    read timeout from firing (a hung call that only the lease can catch)."""

    def respond(self, server, handler, seen) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.end_headers()
        try:
            while not server.stopping.wait(0.5):
                handler.wfile.write(b" ")
                handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


def billed_tokens(text: str) -> int:
    """What this stand-in bills for ``text``, as a real tokenizer would, roughly: ~4 ASCII
    characters a token, 2 tokens for any other character (common kanji are 1, rarer ones 2-3):
    Japanese costs far more than characters / 4, never more than its UTF-8 bytes."""
    ascii_chars = sum(1 for c in text if c < "\x80")
    return ascii_chars // 4 + 2 * (len(text) - ascii_chars) + 1


def send_json(handler, status: int, body: dict, headers: dict | None = None) -> bool:
    data = json.dumps(body).encode()
    # Like a model server, the request's slot is free once the answer is ready: a client that
    # sends its next call the moment it reads this one must not find the slot still taken.
    getattr(handler, "release_slot", lambda: None)()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    try:
        handler.wfile.write(data)
        handler.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


def seen_of(body: dict, headers, server: FakeOpenAI, at: float) -> Seen:
    """A request as the rules see it (its item is the first user message)."""
    users = [m.get("content", "") for m in body.get("messages", []) if m.get("role") == "user"]
    return Seen(at=at, item=users[0] if users else "", last=users[-1] if users else "", body=body,
                authorization=headers.get("Authorization", ""), api_key=server.api_key_of(headers))


def _client_gone(handler) -> bool:
    """The client closed its end (its process died): the socket reads as end-of-file."""
    readable, _, _ = select.select([handler.connection], [], [], 0)
    if not readable:
        return False
    try:
        return handler.connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # socketserver's 5 drops connections when 64 calls open at once


class FakeOpenAI:
    """The OpenAI chat completions protocol; the rules, holds and bills every fake model server
    shares (a subclass changes only the protocol: ``PATH``, ``url``, the bodies, the key)."""

    BACKEND = "openai"  # LEASH_MODEL_BACKEND for this server
    PATH = "/v1/chat/completions"
    cut_off = "length"  # the finish reason of an answer that hit max_tokens

    def __init__(self, latency: float = 0.0, capacity: int = 0, retry_after: str = "1"):
        self.latency = latency
        self.capacity = capacity
        self.retry_after = retry_after
        self.in_flight = 0
        self.max_in_flight = 0
        self.rate_limited = 0
        self.requests: list[Seen] = []
        self.rules: list[list] = []  # [item, behaviour, times left]
        self.answer = default_answer
        self.down: Error | None = None  # set: every call answers this error (the provider is down)
        self.schema_answers = "valid"  # "break_first" or "never": see answer_for
        self.structured_asked: dict[str, int] = {}  # item -> structured answers given about it
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.billed: list[tuple[int, int]] = []  # (prompt, completion) tokens of each delivered answer
        self.hold_from: int | None = None
        self.bills_abandoned = False  # a held request whose client went away is billed all the same
        self.passed = 0  # answers let through (exactly ``hold_from`` while holding)
        self.released = threading.Event()
        self.httpd = _Server(("127.0.0.1", 0), _handler_for(self))
        self.batches = self.batch_api()
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fake-openai", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    # --- the protocol ---------------------------------------------------------------------

    def api_key_of(self, headers) -> str:
        return headers.get("Authorization", "").removeprefix("Bearer ")

    def batch_api(self):
        from tests.fake_batches import OpenAIBatchAPI  # it builds on this module

        return OpenAIBatchAPI(self)

    def prompt_text(self, body: dict) -> str:
        return "".join(str(m.get("content", "")) for m in body.get("messages", []))

    def prompt_chars(self, body: dict) -> int:
        return len(self.prompt_text(body))

    @staticmethod
    def billed_tokens(text: str) -> int:
        return billed_tokens(text)

    def answer_body(self, seen: Seen, text: str, finish_reason: str | None, usage: tuple[int, int] | None) -> dict:
        answer = {
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
            "model": seen.body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish_reason or "stop"}],
        }
        if usage is not None:
            answer["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
        return answer

    def error_body(self, error: Error) -> dict:
        return {"error": {"message": error.message, "type": "invalid_request_error", "param": None,
                          "code": error.code}}

    # --- structured answers ------------------------------------------------------------------

    def structured_schema(self, body: dict) -> dict | None:
        """The JSON Schema a request asks its answer to follow (OpenAI's ``response_format``)."""
        shape = body.get("response_format") or {}
        if shape.get("type") == "json_schema":
            return (shape.get("json_schema") or {}).get("schema")
        return None

    def answer_for(self, seen: Seen) -> str:
        """The default answer: for a structured request an object built from its schema (broken
        as ``schema_answers`` says: ``"break_first"`` its first answer about each item,
        ``"never"`` every one, ``"never:<text>"`` every one about an item holding that text), else
        ``answer(item)``."""
        schema = self.structured_schema(seen.body)
        if schema is None:
            return self.answer(seen.item)
        with self.lock:
            asked = self.structured_asked.get(seen.item, 0)
            self.structured_asked[seen.item] = asked + 1
        value = schema_value(schema, seen.item)
        never = self.schema_answers == "never" or (
            self.schema_answers.startswith("never:") and self.schema_answers[6:] in seen.item)
        if never or (self.schema_answers == "break_first" and asked == 0):
            value = broken(schema, value)
        return json.dumps(value)

    def on(self, item: str, behaviour, times: int = 1) -> None:
        with self.lock:
            self.rules.append([item, behaviour, times])

    def seen(self, item: str) -> list[Seen]:
        with self.lock:
            return [r for r in self.requests if r.item == item]

    def invalid(self, body: dict) -> Error | None:
        """The 400 the real provider gives a request its API does not accept, or None."""
        return None

    def _next(self, seen: Seen):
        with self.lock:
            self.requests.append(seen)
        return self.behaviour(seen, direct=True)

    def behaviour(self, seen: Seen, direct: bool):
        """How the server answers ``seen``: the provider's refusal, else the item's rule, else
        a reply (after ``latency``, for a direct call). Batches answer by the same rules."""
        if self.down is not None:  # an outage: every request answers this
            return self.down
        refusal = self.invalid(seen.body)
        if refusal is not None:
            return refusal
        with self.lock:
            for rule in self.rules:
                if rule[0] == seen.item and rule[2] > 0:
                    rule[2] -= 1
                    return rule[1]
        if self.latency and direct:
            return Slow(self.latency)
        return Reply()

    def route(self, handler, method: str) -> bool:
        """Another endpoint of the protocol (the batch ones, ``tests.fake_batches``): True
        when it answered."""
        return self.batches.route(handler, method)

    def _enter(self) -> bool:
        """Count a request in; False when it is over ``capacity`` (it gets a 429)."""
        with self.lock:
            if self.capacity and self.in_flight >= self.capacity:
                self.rate_limited += 1
                return False
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            return True

    def _leave(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def bill(self, prompt_tokens: int, completion_tokens: int) -> None:
        with self.lock:
            self.billed.append((prompt_tokens, completion_tokens))

    def unbill(self, usage: tuple[int, int]) -> None:
        with self.lock:
            self.billed.remove(tuple(usage))

    def hold_after(self, delivered: int) -> None:
        """Answer ``delivered`` calls, then hold every later one until ``release()``."""
        with self.lock:
            self.released.clear()
            self.hold_from, self.passed = delivered, 0

    def release(self) -> None:
        self.released.set()

    def wait_if_held(self, handler) -> bool:
        """False when the request was held and its client went away (it is never answered)."""
        with self.lock:
            held = self.hold_from is not None and self.passed >= self.hold_from and not self.released.is_set()
            self.passed += not held
        if not held:
            return True
        deadline = time.monotonic() + 60
        while not self.released.wait(0.05) and time.monotonic() < deadline and not self.stopping.is_set():
            pass
        return not _client_gone(handler)

    def start(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def _handler_for(server: FakeOpenAI):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's naming)
            at = time.time()
            if self.path.rstrip("/") != server.PATH:
                if not server.route(self, "POST"):
                    send_json(self, 404, server.error_body(Error(404, f"no route {self.path}")))
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            seen = seen_of(body, self.headers, server, at)
            if not server._enter():
                return Error(429, f"at most {server.capacity} requests at once",
                             headers={"Retry-After": server.retry_after}).respond(server, self, seen)
            self.holds_slot = True
            try:
                server._next(seen).respond(server, self, seen)
            finally:
                self.release_slot()

        def do_GET(self):  # noqa: N802 (http.server's naming)
            if not server.route(self, "GET"):
                send_json(self, 404, server.error_body(Error(404, f"no route {self.path}")))

        def release_slot(self):
            if getattr(self, "holds_slot", False):
                self.holds_slot = False
                server._leave()

        def log_message(self, format, *args):  # keep test output quiet
            pass

    return Handler


def serving(env, server: FakeOpenAI):
    """Start ``server`` with the LEASH_MODEL_* settings pointing workers at it; stop it after."""
    server.start()
    env.setenv("LEASH_MODEL_URL", server.url)
    env.setenv("LEASH_MODEL_NAME", MODEL)
    env.setenv("LEASH_MODEL_API_KEY", API_KEY)
    env.setenv("LEASH_MODEL_TIMEOUT", "10")
    if server.BACKEND == "openai":
        env.delenv("LEASH_MODEL_BACKEND", raising=False)  # chosen because LEASH_MODEL_URL is set
    else:
        env.setenv("LEASH_MODEL_BACKEND", server.BACKEND)
    env.delenv("LEASH_MODEL_RPM", raising=False)
    env.delenv("LEASH_MODEL_TPM", raising=False)
    yield server
    server.stop()


@pytest.fixture
def model_server(env):
    """A started fake OpenAI-compatible server, with the LEASH_MODEL_* settings pointing workers at it."""
    yield from serving(env, FakeOpenAI())
